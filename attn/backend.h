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
  void *out_rounded;   /* non-NULL: also O with P rounded to q_dtype, in q_dtype, bit for bit
                          what a second call with p_dtype = q_dtype writes, from the same scores
                          where an entry has no splits (p_dtype must be 0) */
  double *scores;      /* non-NULL: room for scores_cap scores, so that a row's pass over more
                          slots than the stack keeps computes each score once (same results) */
  uint32_t scores_cap;
  uint32_t head_lo, head_hi; /* q heads [head_lo, head_hi) only (head_hi 0: every head), so that
                                threads can share a step whose entries are few */
} fattn__ref_opts;

/* K/V rows [new_tokens, kv_heads, d] (q_dtype) into their page slots (kv_dtype; fp8 is
 * stored = e4m3(x / scale), round to nearest even, saturating). mla: v is ignored. */
void fattn__ref_store_kv(fattn__layer_params l, fattn__step_params s, const void *k, const void *v);

/* O [q_tokens, q_heads, head_dim_v] in q_dtype (or out_f64) and optional LSE. Entries with
 * num_splits > 1 go through split_o / split_lse and a merge, as the GPU kernels do, unless
 * opts->ignore_splits. opts may be NULL (exact P, O in q_dtype). */
void fattn__ref_attend(fattn__layer_params l, fattn__step_params s, const void *q, void *out,
                       float *lse, const fattn__ref_opts *opts);

/* Host policy from the mode and the caps: decode modes, and other steps with at most 128
 * packed rows (q_len x group) per entry, take the GQA-packed split-KV decode kernel; the rest
 * query tiles per q head. Either kernel is correct for any step; the choice must not depend on
 * caps where a graph's caps differ from the eager step's (DRAFT_EXTEND's varying q_len), so
 * that replay is bit-exact. */
static inline int fattn__decode_kind(const fattn__layer_params *l, const fattn__step_params *s) {
  const uint32_t G = l->num_q_heads / l->num_kv_heads;
  return s->mode == FATTN_MODE_DECODE || s->mode == FATTN_MODE_DRAFT_DECODE ||
         (s->mode != FATTN_MODE_DRAFT_EXTEND && (uint64_t)s->cap_q_tokens * G <= 128ull * s->cap_entries);
}

/* ---- attn/fa2: portable sm_80+ kernels. Return a cudaError_t value (0 on success). */

/* Non-zero where the current device takes programmatic dependent launch (compute capability
 * 9.0 and newer; attn/pdl.h). Read once per device, at create, so that no capture asks it. */
int fattn__pdl_on(void);

/* Whether the kernels cover this layer shape (head dims, dtypes, MLA); no device work. */
int fattn__fa2_supports(const fattn__layer_params *l);
int fattn__fa2_store_kv(fattn__layer_params l, fattn__step_params s, const void *k,
                        const void *v, void *stream);
int fattn__fa2_attend(fattn__layer_params l, fattn__step_params s, const void *q, void *out,
                      float *lse, void *stream);

/* ---- attn/fa3: Hopper (sm_90a) kernels for the query-tiled steps; every other step and
 * shape goes to fa2 from inside fattn__fa3_attend, so any supported layer may pick FA3. */

/* Non-zero when this build has the fa3 kernels and the current device runs them. */
int fattn__fa3_available(void);
/* Whether fa3's own kernel (not the fa2 fallback) serves this layer shape. */
int fattn__fa3_supports(const fattn__layer_params *l);
/* Writes the K and V pools' tensor maps (2 CUtensorMap, 128 bytes each) for l into maps;
 * returns a cudaError_t value (cudaErrorNotSupported where tiles cannot use TMA). */
int fattn__fa3_encode_maps(const fattn__layer_params *l, void *maps);
int fattn__fa3_attend(fattn__layer_params l, fattn__step_params s, const void *q, void *out,
                      float *lse, void *stream);

/* ---- attn/mla: the Hopper (sm_90a) absorbed-MLA kernel, built where CUDA_ARCHS has 90a
 * (FATTN_HAVE_SM90A); fa3 runs MLA layers on it (fattn__fa3_attend, fattn__fa3_encode_maps).
 * Callers check fattn__fa3_available(). */

/* Whether the kernel runs layer l: MLA with a latent in Q's type (fp8 latents are fa2's). */
int fattn__mla90_supports(const fattn__layer_params *l);
/* Writes the latent pool's tensor map (one CUtensorMap, 128 bytes) for an MLA layer into map;
 * returns a cudaError_t value (cudaErrorNotSupported below pages of 64 slots: then every block
 * is gathered). */
int fattn__mla90_encode_map(const fattn__layer_params *l, void *map);
/* fattn__fa2_attend's contract for MLA layers (every mode but CROSS), on wgmma; l.tmaps NULL
 * or the map of fattn__mla90_encode_map. */
int fattn__mla90_attend(fattn__layer_params l, fattn__step_params s, const void *q, void *out,
                        float *lse, void *stream);

#ifdef __cplusplus
}
#endif
#endif /* FATTN_ATTN_BACKEND_H */
