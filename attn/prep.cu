/* prep.cu: the planner's device side. One small kernel applies the staged page-table updates
 * and derives the step metadata; copy-on-write page copies get their own launch when any. */
#include <cuda_runtime.h>

extern "C" {
#include "attn/plan.h"
}

/* Where things lie in the inbox; passed by value. */
typedef struct prep_args {
  uint8_t *inbox;
  uint64_t off_entries, off_updates, off_words, off_mask;
  uint32_t *table;        // [max_seqs, pages_per_seq]
  uint32_t pages_per_seq;
  uint8_t *dst;           // graph area or NULL
  uint64_t dst_off_mask;
} prep_args;

__global__ void prep_kernel(prep_args a) {
  fattn__step_hdr *h = (fattn__step_hdr *)a.inbox;
  const fattn__pt_update *up = (const fattn__pt_update *)(a.inbox + a.off_updates);
  const uint32_t *words = (const uint32_t *)(a.inbox + a.off_words);
  for (uint32_t i = 0; i < h->num_pt_updates; i++) {
    uint32_t *row = a.table + (size_t)up[i].row * a.pages_per_seq + up[i].index;
    for (uint32_t j = threadIdx.x; j < up[i].count; j += blockDim.x) row[j] = words[up[i].payload + j];
  }
  fattn__entry *e = (fattn__entry *)(a.inbox + a.off_entries);
  if (threadIdx.x == 0) fattn__prep(h, e);
  if (!a.dst) return;
  __syncthreads();
  uint32_t n = h->num_entries, rows = h->num_mask_rows;
  uint32_t *de = (uint32_t *)(a.dst + a.off_entries);
  const uint32_t *se = (const uint32_t *)e;
  for (uint32_t j = threadIdx.x; j < n * (uint32_t)(sizeof(fattn__entry) / 4); j += blockDim.x) de[j] = se[j];
  uint64_t *dm = (uint64_t *)(a.dst + a.dst_off_mask);
  const uint64_t *sm = (const uint64_t *)(a.inbox + a.off_mask);
  for (uint32_t j = threadIdx.x; j < rows; j += blockDim.x) dm[j] = sm[j];
  if (threadIdx.x < sizeof(fattn__step_hdr) / 4) ((uint32_t *)a.dst)[threadIdx.x] = ((const uint32_t *)h)[threadIdx.x];
}

/* Block (layer, pool) performs every copy in queue order: a queue can chain (0->1 then
 * 1->2) or reuse a page, so copies of one layer and pool must not run concurrently. */
__global__ void copy_pages_kernel(const fattn__page_copy *c, uint32_t n, uint8_t *k_pool, uint8_t *v_pool,
                                  uint64_t k_layer, uint64_t v_layer, uint64_t k_page, uint64_t v_page) {
  const int is_v = blockIdx.y;
  uint64_t page = is_v ? v_page : k_page;
  uint8_t *base = (is_v ? v_pool + blockIdx.x * v_layer : k_pool + blockIdx.x * k_layer);
  for (uint32_t i = 0; i < n; i++) {
    const uint4 *src = (const uint4 *)(base + c[i].src * page);
    uint4 *dst = (uint4 *)(base + c[i].dst * page);
    for (uint64_t j = threadIdx.x; j < page / 16; j += blockDim.x) dst[j] = src[j];
    __syncthreads();
  }
}

extern "C" int fattn__prep_launch(fattn_ctx *ctx, uint8_t *inbox, const fattn__plan_target *t,
                                  uint32_t num_copies, void *stream) {
  cudaStream_t s = (cudaStream_t)stream;
  const fattn__norm *n = &ctx->n;
  uint8_t *dev = ctx->dev;
  if (num_copies) {
    uint64_t k_page = (uint64_t)n->cfg.page_size * n->model.num_kv_heads * n->model.head_dim * n->kv_elem_bytes;
    uint64_t v_page = n->model.mla_latent_dim ? 0
                      : (uint64_t)n->cfg.page_size * n->model.num_kv_heads * n->head_dim_v * n->kv_elem_bytes;
    dim3 grid(n->model.num_layers, v_page ? 2 : 1);
    copy_pages_kernel<<<grid, 512, 0, s>>>((const fattn__page_copy *)(inbox + ctx->lay.slot_off_copies), num_copies,
                                           dev + ctx->lay.dev_off[FATTN_REGION_K_POOL],
                                           dev + ctx->lay.dev_off[FATTN_REGION_V_POOL], ctx->lay.k_layer_bytes,
                                           ctx->lay.v_layer_bytes, k_page, v_page);
  }
  prep_args a;
  a.inbox = inbox;
  a.off_entries = fattn__area_entries_off();
  a.off_updates = ctx->lay.slot_off_updates;
  a.off_words = ctx->lay.slot_off_words;
  a.off_mask = ctx->lay.slot_off_mask;
  a.table = (uint32_t *)(dev + ctx->lay.dev_off[FATTN_REGION_PAGE_TABLE]);
  a.pages_per_seq = ctx->lay.pages_per_seq;
  a.dst = t->dst;
  a.dst_off_mask = t->dst ? fattn__area_mask_off(t->cap_entries) : 0;
  prep_kernel<<<1, 256, 0, s>>>(a);
  return (int)cudaGetLastError();
}
