/* prep.cu: the planner's device side. One block applies the staged page-table updates and
 * derives the step metadata in parallel; copy-on-write page copies get their own launch. */
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

enum { PREP_THREADS = 1024, PREP_WARPS = PREP_THREADS / 32 };

/* Exclusive block-wide prefix sums of four counters; totals in tot. All threads call it. */
__device__ void block_scan4(const unsigned long long v[4], unsigned long long ex[4], unsigned long long tot[4]) {
  __shared__ unsigned long long warp_sum[4][PREP_WARPS];
  const uint32_t lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  unsigned long long inc[4];
  for (int k = 0; k < 4; k++) {
    inc[k] = v[k];
    for (int o = 1; o < 32; o *= 2) {
      unsigned long long y = __shfl_up_sync(0xffffffffu, inc[k], o);
      if (lane >= (uint32_t)o) inc[k] += y;
    }
    if (lane == 31) warp_sum[k][warp] = inc[k];
  }
  __syncthreads();
  if (warp == 0)
    for (int k = 0; k < 4; k++) {
      unsigned long long w = warp_sum[k][lane], x = w;
      for (int o = 1; o < 32; o *= 2) {
        unsigned long long y = __shfl_up_sync(0xffffffffu, x, o);
        if (lane >= (uint32_t)o) x += y;
      }
      warp_sum[k][lane] = x - w; /* exclusive over warps */
    }
  __syncthreads();
  for (int k = 0; k < 4; k++) ex[k] = warp_sum[k][warp] + inc[k] - v[k];
  __shared__ unsigned long long last[4]; /* the last thread's inclusive sums are the totals */
  if (threadIdx.x == PREP_THREADS - 1)
    for (int k = 0; k < 4; k++) last[k] = ex[k] + v[k];
  __syncthreads();
  for (int k = 0; k < 4; k++) tot[k] = last[k];
  __syncthreads();
}

/* One block: every staged page-table word in parallel, then every entry in parallel (the
 * same derivation as fattn__prep, by prefix sums). */
__global__ void __launch_bounds__(PREP_THREADS) prep_kernel(prep_args a) {
  fattn__step_hdr *h = (fattn__step_hdr *)a.inbox;
  const fattn__pt_update *up = (const fattn__pt_update *)(a.inbox + a.off_updates);
  const uint32_t *words = (const uint32_t *)(a.inbox + a.off_words);
  const uint32_t nu = h->num_pt_updates;
  const uint32_t total = nu ? up[nu - 1].payload + up[nu - 1].count : 0u;
  for (uint32_t w = threadIdx.x; w < total; w += blockDim.x) {
    uint32_t lo = 0, hi = nu - 1; /* the update holding word w: payloads are prefix sums */
    while (lo < hi) {
      uint32_t mid = (lo + hi + 1) / 2;
      if (up[mid].payload <= w) lo = mid;
      else hi = mid - 1;
    }
    a.table[(size_t)up[lo].row * a.pages_per_seq + up[lo].index + (w - up[lo].payload)] = words[w];
  }
  fattn__entry *e = (fattn__entry *)(a.inbox + a.off_entries);
  const uint32_t n = h->num_entries;
  unsigned long long carry[4] = {0, 0, 0, 0}; /* q tokens, new tokens, tiles, split rows */
  for (uint32_t base = 0; base < n; base += PREP_THREADS) {
    uint32_t i = base + threadIdx.x;
    fattn__entry x = {};
    unsigned long long v[4] = {0, 0, 0, 0}, ex[4], tot[4];
    if (i < n) {
      x = e[i];
      fattn__split_of(h, &x);
      v[0] = x.q_len, v[1] = x.new_len, v[2] = fattn__ceil_div(x.q_len, FATTN__Q_TILE), v[3] = fattn__split_rows(&x);
    }
    block_scan4(v, ex, tot);
    if (i < n) {
      x.q_start = (uint32_t)(carry[0] + ex[0]);
      x.new_start = (uint32_t)(carry[1] + ex[1]);
      x.tile_start = (uint32_t)(carry[2] + ex[2]);
      x.split_row = x.num_splits > 1u ? (uint32_t)(carry[3] + ex[3]) : UINT32_MAX;
      e[i] = x;
    }
    for (int k = 0; k < 4; k++) carry[k] += tot[k];
  }
  const int unsplit = carry[3] > h->split_rows_cap;
  __syncthreads();
  if (unsplit)
    for (uint32_t i = threadIdx.x; i < n; i += blockDim.x) fattn__unsplit(&e[i]);
  if (threadIdx.x == 0) {
    h->num_q_tokens = (uint32_t)carry[0];
    h->num_new_tokens = (uint32_t)carry[1];
    h->num_tiles = (uint32_t)carry[2];
    h->num_split_rows = unsplit ? 0u : (uint32_t)carry[3];
  }
  if (!a.dst) return;
  __syncthreads();
  uint32_t rows = h->num_mask_rows;
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
  uint8_t *dev = ctx->dev;
  if (num_copies) {
    const uint64_t k_page = ctx->lay.k_page_bytes, v_page = ctx->lay.v_page_bytes;
    dim3 grid(ctx->n.model.num_layers, v_page ? 2 : 1);
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
  a.off_mask = fattn__area_mask_off(ctx->n.max_entries);
  a.table = (uint32_t *)(dev + ctx->lay.dev_off[FATTN_REGION_PAGE_TABLE]);
  a.pages_per_seq = ctx->lay.pages_per_seq;
  a.dst = t->dst;
  a.dst_off_mask = t->dst ? fattn__area_mask_off(t->cap_entries) : 0;
  prep_kernel<<<1, PREP_THREADS, 0, s>>>(a);
  return (int)cudaGetLastError();
}
