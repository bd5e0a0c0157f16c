/* params.h: the plain parameter structs every attention backend takes by value.
 * One layer, one planned step; pointers are device pointers on GPU backends, host on CPU. */
#ifndef FATTN_ATTN_PARAMS_H
#define FATTN_ATTN_PARAMS_H

#include <stdint.h>

#include "attn/meta.h"

/* Shapes and options fixed for a layer. dtype values are fattn_dtype. */
typedef struct fattn__layer_params {
  uint32_t num_q_heads;
  uint32_t num_kv_heads;
  uint32_t head_dim;   /* Q and K */
  uint32_t head_dim_v; /* V and O */
  uint32_t mla;        /* non-zero: V is the first head_dim_v dims of the K pool (no V pool) */
  uint32_t page_size;
  uint32_t pages_per_seq; /* page-table row stride */
  uint32_t num_pages;
  uint32_t q_dtype;    /* Q, new K/V and O */
  uint32_t kv_dtype;   /* cache */
  uint32_t compute_dtype;  /* GEMM dtype of the prefill-side kernels: q_dtype, or FATTN_DTYPE_FP8_E4M3 */
  float scale;         /* softmax scale applied to q.k */
  float softcap;       /* 0: none */
  int32_t window;      /* FATTN_NO_WINDOW (-1): none; else i sees [i - window, i] */
  uint32_t chunk;      /* 0: none; else i sees only j with j / chunk == i / chunk */
  float k_scale;       /* fp8 dequant scales (1 otherwise) */
  float v_scale;
  const float *sinks;  /* [num_q_heads] or NULL */
  void *k_pool;        /* [num_pages, page_size, num_kv_heads, head_dim] */
  void *v_pool;        /* [num_pages, page_size, num_kv_heads, head_dim_v]; NULL if mla */
  int32_t *page_table; /* [rows, pages_per_seq]; FATTN__PAGE_NONE where unmapped */
  const void *tmaps;   /* fa3: the K and V pools' tensor maps (2 CUtensorMap, host memory), or NULL */
} fattn__layer_params;

/* The planned step as the kernels see it. Counts live in *hdr (device memory on the GPU),
 * so a captured graph replays any batch; cap_* only size the grid. */
typedef struct fattn__step_params {
  uint32_t mode;                /* fattn_mode, on the host too: kernel choice may depend on it */
  const fattn__step_hdr *hdr;
  const fattn__entry *entries;  /* [hdr->num_entries] */
  const uint64_t *mask;         /* tree-mask rows, indexed by entry.mask_row + query */
  uint32_t cap_entries;         /* upper bound of hdr->num_entries */
  uint32_t cap_q_tokens;        /* upper bound of hdr->num_q_tokens */
  uint32_t cap_new_tokens;      /* upper bound of hdr->num_new_tokens */
  uint32_t cap_tiles;           /* upper bound of hdr->num_tiles */
  uint32_t max_splits;          /* the context's split bound (with cap_entries: decode blocks with work) */
  float *split_o;   /* [split_rows_cap, num_q_heads, head_dim_v] */
  float *split_lse; /* [split_rows_cap, num_q_heads] */
  uint32_t *tile_counter; /* [2]: fa3's next work item and its blocks done; 0 between launches */
#ifdef FATTN_STAMPS
  unsigned long long *stamps; /* measurement builds: attn/stamps.h's buffer, or NULL */
#endif
} fattn__step_params;

/* Visibility of KV slot j to a query at absolute slot qpos (tree-mask rows aside).
 * CROSS passes causal = 0: every slot < kv_len is visible, window and chunk do not apply. */
FATTN__HD int fattn__visible(const fattn__layer_params *l, int causal, uint32_t qpos, uint32_t j) {
  if (!causal) return 1;
  if (j > qpos) return 0;
  if (l->window >= 0 && (int64_t)qpos - (int64_t)j > (int64_t)l->window) return 0;
  if (l->chunk != 0u && j / l->chunk != qpos / l->chunk) return 0;
  return 1;
}

/* KV slots that queries [t_lo, t_hi] of an entry may see: [lo_any, hi_any) covers the union of
 * their ranges, and in [lo_all, hi_all) each of them sees every slot (no mask needed there). */
typedef struct fattn__kv_range {
  uint32_t lo_any, hi_any, lo_all, hi_all;
} fattn__kv_range;

FATTN__HD fattn__kv_range fattn__rows_range(const fattn__layer_params *l, int causal, int tree,
                                            uint32_t q_len, uint32_t kv_len, uint32_t t_lo,
                                            uint32_t t_hi) {
  fattn__kv_range r = {0u, kv_len, 0u, kv_len};
  if (!causal) return r;
  const uint32_t prefix = kv_len - q_len, qa = prefix + t_lo, qb = prefix + t_hi;
  uint32_t la = 0u, lb = 0u;
  if (l->window >= 0) {
    la = qa > (uint32_t)l->window ? qa - (uint32_t)l->window : 0u;
    lb = qb > (uint32_t)l->window ? qb - (uint32_t)l->window : 0u;
  }
  if (l->chunk) {
    la = la > qa / l->chunk * l->chunk ? la : qa / l->chunk * l->chunk;
    lb = lb > qb / l->chunk * l->chunk ? lb : qb / l->chunk * l->chunk;
  }
  r.lo_any = la;
  r.lo_all = lb;
  r.hi_any = qb + 1u;
  r.hi_all = qa + 1u;
  if (tree) { /* drafts see some later drafts: only the prefix is mask-free */
    r.lo_any = r.lo_any < prefix ? r.lo_any : prefix;
    r.hi_any = kv_len;
    r.hi_all = r.hi_all < prefix ? r.hi_all : prefix;
  }
  return r;
}

#endif /* FATTN_ATTN_PARAMS_H */
