/* backend.h: what each attention backend offers the step code (attn/step.c) and the tests.
 * Every entry point takes the plain parameter structs of attn/params.h by value. */
#ifndef FATTN_ATTN_BACKEND_H
#define FATTN_ATTN_BACKEND_H

#include "attn/params.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- attn/ref: float64 reference on the host; also the oracle of the GPU tests. */

typedef struct fattn__ref_opts {
  uint32_t p_dtype;    /* 0: P kept exact; else P rounded to this fattn_dtype before P.V */
  uint32_t ignore_splits; /* non-zero: one pass over the KV even where entries have splits */
  double *out_f64;     /* non-NULL: O written here as double [q_tokens, q_heads, head_dim_v]
                          instead of out (then out may be NULL) */
  double *lse_f64;     /* non-NULL: LSE as double [q_tokens, q_heads] (lse may be NULL) */
} fattn__ref_opts;

/* K/V rows [new_tokens, kv_heads, d] (q_dtype) into their page slots (kv_dtype; fp8 is
 * stored = e4m3(x / scale), round to nearest even, saturating). mla: v is ignored. */
void fattn__ref_store_kv(fattn__layer_params l, fattn__step_params s, const void *k, const void *v);

/* O [q_tokens, q_heads, head_dim_v] in q_dtype (or out_f64) and optional LSE. Entries with
 * num_splits > 1 go through split_o / split_lse and a merge, as the GPU kernels do, unless
 * opts->ignore_splits. opts may be NULL (exact P, O in q_dtype). */
void fattn__ref_attend(fattn__layer_params l, fattn__step_params s, const void *q, void *out,
                       float *lse, const fattn__ref_opts *opts);

/* ---- attn/fa2: portable sm_80+ kernels. Return a cudaError_t value (0 on success). */

/* Whether the kernels cover this layer shape (head dims, dtypes, MLA); no device work. */
int fattn__fa2_supports(const fattn__layer_params *l);
int fattn__fa2_store_kv(fattn__layer_params l, fattn__step_params s, const void *k,
                        const void *v, void *stream);
int fattn__fa2_attend(fattn__layer_params l, fattn__step_params s, const void *q, void *out,
                      float *lse, void *stream);

#ifdef __cplusplus
}
#endif
#endif /* FATTN_ATTN_BACKEND_H */
