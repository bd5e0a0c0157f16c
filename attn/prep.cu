/* prep.cu: the planner's device side. One block reads the staging slot in place from mapped
 * pinned memory, applies its page-table updates and fills, derives the step metadata in
 * parallel and frees the slot; forks' row copies and copy-on-write page copies get launches
 * of their own. */
#include <cuda_runtime.h>

#include "attn/pdl.h"

extern "C" {
#include "attn/plan.h"
}

/* Where things lie; passed by value, so the header costs no read over the bus. */
typedef struct prep_args {
  fattn__step_hdr hdr;        // the staged header
  const uint8_t *slot;        // the staging slot, a device address of pinned host memory
  uint8_t *meta;              // [hdr][entries][mask rows]: the eager inbox or a graph area
  uint64_t off_entries;       // in slot and meta alike
  uint64_t slot_off_mask, meta_off_mask;
  uint64_t off_updates, off_words, off_copies, off_row_ops;
  fattn__page_copy *copies;   // device copy of the slot's copies, for copy_pages_kernel
  uint32_t *table;            // [max_seqs, pages_per_seq]
  uint32_t pages_per_seq;
  uint32_t num_words;
  unsigned long long *done;   // the slot's completion word (device address of pinned memory)
  unsigned long long seq;
  // A graph's prep: slot, header, words, done and seq come from the mailbox at replay.
  fattn__mailbox *box;        // NULL for an eager prep; the prep counts its read there
  const uint8_t *ring;        // [staging_slots][slot_bytes], device address
  uint64_t slot_bytes;
  unsigned long long *done_base; // [staging_slots]
} prep_args;

enum { PREP_THREADS = 1024, PREP_WARPS = PREP_THREADS / 32 };
/* The entries' prefix sums: q tokens, new tokens, tiles, split rows, tile pairs. */
enum { PREP_COUNTERS = 5 };
static_assert(sizeof(fattn__mailbox) % 16 == 0 && sizeof(fattn__post) % 16 == 0, "a mailbox is read as 16-byte words");

/* Exclusive block-wide prefix sums of the counters; totals in tot. All threads call it. */
__device__ void block_scan(const unsigned long long v[PREP_COUNTERS], unsigned long long ex[PREP_COUNTERS],
                           unsigned long long tot[PREP_COUNTERS]) {
  __shared__ unsigned long long warp_sum[PREP_COUNTERS][PREP_WARPS];
  const uint32_t lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  unsigned long long inc[PREP_COUNTERS];
  for (int k = 0; k < PREP_COUNTERS; k++) {
    inc[k] = v[k];
    for (int o = 1; o < 32; o *= 2) {
      unsigned long long y = __shfl_up_sync(0xffffffffu, inc[k], o);
      if (lane >= (uint32_t)o) inc[k] += y;
    }
    if (lane == 31) warp_sum[k][warp] = inc[k];
  }
  __syncthreads();
  if (warp == 0)
    for (int k = 0; k < PREP_COUNTERS; k++) {
      unsigned long long w = warp_sum[k][lane], x = w;
      for (int o = 1; o < 32; o *= 2) {
        unsigned long long y = __shfl_up_sync(0xffffffffu, x, o);
        if (lane >= (uint32_t)o) x += y;
      }
      warp_sum[k][lane] = x - w; /* exclusive over warps */
    }
  __syncthreads();
  for (int k = 0; k < PREP_COUNTERS; k++) ex[k] = warp_sum[k][warp] + inc[k] - v[k];
  __shared__ unsigned long long last[PREP_COUNTERS]; /* the last thread's inclusive sums are the totals */
  if (threadIdx.x == PREP_THREADS - 1)
    for (int k = 0; k < PREP_COUNTERS; k++) last[k] = ex[k] + v[k];
  __syncthreads();
  for (int k = 0; k < PREP_COUNTERS; k++) tot[k] = last[k];
  __syncthreads();
}

/* Entry i of a slot, staged as one 16-byte word. */
__device__ fattn__entry load_entry(const fattn__step_hdr &h, const uint8_t *entries, uint32_t i) {
  const uint4 w = ((const uint4 *)entries)[i];
  const fattn__staged st = {w.x, w.y, w.z, w.w};
  fattn__entry x;
  fattn__unstage(&h, &st, i, &x);
  return x;
}

__device__ fattn__pt_update load_update(const uint8_t *updates, uint32_t i) {
  uint4 w = ((const uint4 *)updates)[i];
  return fattn__pt_update{w.x, w.y, w.z, w.w};
}

__device__ fattn__row_op load_row_op(const fattn__row_op *ops, uint32_t i) {
  uint4 w = ((const uint4 *)ops)[i];
  return fattn__row_op{w.x, w.y, w.z, w.w};
}

/* One block. Each read of the slot is a round trip over the bus, so every list's first chunk
 * is loaded up front; then page-table words and entries in parallel (the same derivation as
 * fattn__prep, by prefix sums); last, the completion word releases the slot to the host. */
__global__ void __launch_bounds__(PREP_THREADS) prep_kernel(prep_args a) {
  fattn__pdl_wait_alone(); /* the step before may still read the area this one writes */
  __shared__ fattn__pt_update s_up[PREP_THREADS];
  __shared__ fattn__row_op s_fill[PREP_THREADS];
  __shared__ uint4 s_box[sizeof(fattn__mailbox) / 16];
  const uint32_t tid = threadIdx.x;
  if (a.box) { /* one round trip over the bus for everything the launch did not carry */
    if (tid < sizeof(fattn__mailbox) / 16) s_box[tid] = __ldcv((const uint4 *)a.box + tid);
    __syncthreads();
    const fattn__mailbox *m = (const fattn__mailbox *)s_box;
    const fattn__post *p = &m->post[m->read % FATTN__MAILBOX_POSTS];
    a.hdr = p->hdr;
    a.slot = a.ring + (uint64_t)p->index * a.slot_bytes;
    a.done = a.done_base + p->index;
    a.seq = p->seq;
    a.num_words = p->num_words;
    /* The next replay's prep reads it after this kernel ends (replays of a bucket are ordered). */
    if (tid == 0) a.box->read = m->read + 1;
  }
  const fattn__step_hdr h = a.hdr;
  const uint32_t n = h.num_entries, nu = h.num_pt_updates, nf = h.num_row_fills;
  const uint8_t *se = a.slot + a.off_entries, *sup = a.slot + a.off_updates;
  const uint32_t *words = (const uint32_t *)(a.slot + a.off_words);
  const fattn__row_op *sfill = (const fattn__row_op *)(a.slot + a.off_row_ops) + h.num_row_copies;
  fattn__entry x = {};
  fattn__pt_update u = {};
  fattn__row_op f = {};
  if (tid < n) x = load_entry(h, se, tid);
  if (tid < nu) u = load_update(sup, tid);
  if (tid < nf) f = load_row_op(sfill, tid);
  const uint32_t w0 = tid < a.num_words ? words[tid] : 0u;
  const fattn__page_copy *sc = (const fattn__page_copy *)(a.slot + a.off_copies);
  for (uint32_t j = tid; j < h.num_page_copies; j += blockDim.x) a.copies[j] = sc[j];
  const uint64_t *sm = (const uint64_t *)(a.slot + a.slot_off_mask);
  uint64_t *dm = (uint64_t *)(a.meta + a.meta_off_mask);
  for (uint32_t j = tid; j < h.num_mask_rows; j += blockDim.x) dm[j] = sm[j];
  for (uint32_t ub = 0; ub < nu; ub += PREP_THREADS) { /* updates in chunks held in shared memory */
    if (ub && ub + tid < nu) u = load_update(sup, ub + tid);
    if (ub + tid < nu) s_up[tid] = u;
    __syncthreads();
    const uint32_t cnt = nu - ub < PREP_THREADS ? nu - ub : PREP_THREADS;
    const uint32_t w_end = s_up[cnt - 1].payload + s_up[cnt - 1].count;
    for (uint32_t w = s_up[0].payload + tid; w < w_end; w += blockDim.x) {
      uint32_t lo = 0, hi = cnt - 1; /* the update holding word w: payloads are prefix sums */
      while (lo < hi) {
        uint32_t mid = (lo + hi + 1) / 2;
        if (s_up[mid].payload <= w) lo = mid;
        else hi = mid - 1;
      }
      a.table[(size_t)s_up[lo].row * a.pages_per_seq + s_up[lo].index + (w - s_up[lo].payload)] =
          w == tid ? w0 : words[w];
    }
    __syncthreads();
  }
  /* Fills: a warp an op (entries no update of this slot touches). Stores only, no round trips
   * but the op loads. */
  const uint32_t lane = tid % 32, warp = tid / 32;
  for (uint32_t fb = 0; fb < nf; fb += PREP_THREADS) {
    if (fb && fb + tid < nf) f = load_row_op(sfill, fb + tid);
    if (fb + tid < nf) s_fill[tid] = f;
    __syncthreads();
    const uint32_t cnt = nf - fb < PREP_THREADS ? nf - fb : PREP_THREADS;
    for (uint32_t j = warp; j < cnt; j += PREP_WARPS) {
      uint32_t *row = a.table + (size_t)s_fill[j].dst * a.pages_per_seq + s_fill[j].index;
      for (uint32_t k = lane; k < s_fill[j].count; k += 32) row[k] = FATTN__PAGE_NONE;
    }
    __syncthreads();
  }
  fattn__entry *e = (fattn__entry *)(a.meta + a.off_entries);
  unsigned long long carry[PREP_COUNTERS] = {0, 0, 0, 0, 0};
  for (uint32_t base = 0; base < n; base += PREP_THREADS) {
    uint32_t i = base + tid;
    unsigned long long v[PREP_COUNTERS] = {0, 0, 0, 0, 0}, ex[PREP_COUNTERS], tot[PREP_COUNTERS];
    if (base && i < n) x = load_entry(h, se, i);
    if (i < n) {
      fattn__split_of(&h, &x);
      v[0] = x.q_len, v[1] = x.new_len, v[2] = fattn__ceil_div(x.q_len, FATTN__Q_TILE), v[3] = fattn__split_rows(&x);
      v[4] = fattn__ceil_div(x.q_len, FATTN__Q_PAIR);
    }
    block_scan(v, ex, tot);
    if (i < n) {
      x.q_start = (uint32_t)(carry[0] + ex[0]);
      x.new_start = (uint32_t)(carry[1] + ex[1]);
      x.tile_start = (uint32_t)(carry[2] + ex[2]);
      x.split_row = x.num_splits > 1u ? (uint32_t)(carry[3] + ex[3]) : UINT32_MAX;
      x.pair_start = (uint32_t)(carry[4] + ex[4]);
      e[i] = x;
    }
    for (int k = 0; k < PREP_COUNTERS; k++) carry[k] += tot[k];
  }
  const int unsplit = carry[3] > h.split_rows_cap;
  __syncthreads();
  if (unsplit)
    for (uint32_t i = tid; i < n; i += blockDim.x) fattn__unsplit(&e[i]);
  if (tid == 0) {
    fattn__step_hdr o = h;
    o.num_q_tokens = (uint32_t)carry[0];
    o.num_new_tokens = (uint32_t)carry[1];
    o.num_tiles = (uint32_t)carry[2];
    o.num_pairs = (uint32_t)carry[4];
    o.num_split_rows = unsplit ? 0u : (uint32_t)carry[3];
    *(fattn__step_hdr *)a.meta = o;
  }
  /* Every thread's reads of the slot are behind this barrier; the release at system scope
   * orders them before the host can see the word and rewrite the slot. */
  __syncthreads();
  if (tid == 0) asm volatile("st.release.sys.u64 [%0], %1;" ::"l"(a.done), "l"(a.seq) : "memory");
}

enum { COPY_THREADS = 256, COPY_UNROLL = 8, COPY_BLOCKS_PER_SM = 4 };

/* Blocks (layer, pool, part). Independent copies (the planner found no page that one copy
 * writes and another reads or writes): part z copies whole pages z, z + parts, ..., each
 * thread COPY_UNROLL 16-byte words in flight, so a 32 KiB page is one round trip of a block.
 * Chained copies (0->1 then 1->2, or a page taken twice) run in queue order in part 0. */
__global__ void __launch_bounds__(COPY_THREADS) copy_pages_kernel(const fattn__page_copy *c, uint32_t n, uint32_t chained,
                                                                  uint8_t *k_pool, uint8_t *v_pool, uint64_t k_layer,
                                                                  uint64_t v_layer, uint64_t k_page, uint64_t v_page) {
  fattn__pdl_wait_alone();
  const int is_v = blockIdx.y;
  const uint64_t page = is_v ? v_page : k_page, words = page / 16;
  uint8_t *base = (is_v ? v_pool + blockIdx.x * v_layer : k_pool + blockIdx.x * k_layer);
  if (chained) {
    if (blockIdx.z) return;
    for (uint32_t i = 0; i < n; i++) {
      const uint4 *src = (const uint4 *)(base + c[i].src * page);
      uint4 *dst = (uint4 *)(base + c[i].dst * page);
      for (uint64_t j = threadIdx.x; j < words; j += blockDim.x) dst[j] = src[j];
      __syncthreads();
    }
    return;
  }
  for (uint32_t i = blockIdx.z; i < n; i += gridDim.z) {
    const fattn__page_copy pc = c[i];
    const uint4 *__restrict__ src = (const uint4 *)(base + pc.src * page);
    uint4 *__restrict__ dst = (uint4 *)(base + pc.dst * page);
    for (uint64_t j0 = threadIdx.x; j0 < words; j0 += COPY_UNROLL * blockDim.x) {
      uint4 v[COPY_UNROLL];
#pragma unroll
      for (int k = 0; k < COPY_UNROLL; k++)
        if (j0 + k * blockDim.x < words) v[k] = src[j0 + k * blockDim.x];
#pragma unroll
      for (int k = 0; k < COPY_UNROLL; k++)
        if (j0 + k * blockDim.x < words) dst[j0 + k * blockDim.x] = v[k];
    }
  }
}

/* A block a fork's row copy: row dst[0 .. count) = row src[0 .. count), both in the device
 * table, before the prep of the same slot applies its updates (the rows of a slot's copies are
 * disjoint: no copy's source is another's destination). The op is read over the bus. */
__global__ void __launch_bounds__(256) copy_rows_kernel(const fattn__row_op *ops, uint32_t *table, uint32_t pps) {
  enum { UNROLL = 4 };
  const fattn__row_op op = load_row_op(ops, blockIdx.x); /* the host's, so before the wait */
  fattn__pdl_wait_alone();
  const uint32_t *__restrict__ src = table + (size_t)op.src * pps;
  uint32_t *__restrict__ dst = table + (size_t)op.dst * pps;
  for (uint32_t base = 0; base < op.count; base += UNROLL * blockDim.x) {
    uint32_t v[UNROLL];
#pragma unroll
    for (int k = 0; k < UNROLL; k++) {
      const uint32_t i = base + k * blockDim.x + threadIdx.x;
      v[k] = i < op.count ? src[i] : 0u;
    }
#pragma unroll
    for (int k = 0; k < UNROLL; k++) {
      const uint32_t i = base + k * blockDim.x + threadIdx.x;
      if (i < op.count) dst[i] = v[k];
    }
  }
}

/* What every prep knows before it reads a slot: where things lie. */
static prep_args args_for(fattn_ctx *ctx, const fattn__plan_target *t) {
  uint8_t *dev = ctx->dev, *inbox = dev + ctx->lay.dev_off[FATTN_REGION_METADATA];
  prep_args a;
  memset(&a, 0, sizeof a);
  a.meta = t->dst ? t->dst : inbox;
  a.off_entries = fattn__area_entries_off();
  a.slot_off_mask = fattn__area_mask_off(ctx->n.max_entries);
  a.meta_off_mask = t->dst ? fattn__area_mask_off(t->cap_entries) : a.slot_off_mask;
  a.off_updates = ctx->lay.slot_off_updates;
  a.off_words = ctx->lay.slot_off_words;
  a.off_copies = ctx->lay.slot_off_copies;
  a.off_row_ops = ctx->lay.slot_off_row_ops;
  a.copies = (fattn__page_copy *)(inbox + ctx->lay.slot_off_copies);
  a.table = (uint32_t *)(dev + ctx->lay.dev_off[FATTN_REGION_PAGE_TABLE]);
  a.pages_per_seq = ctx->lay.pages_per_seq;
  return a;
}

extern "C" int fattn__prep_launch_boxed(fattn_ctx *ctx, const fattn__plan_target *t, void *stream) {
  prep_args a = args_for(ctx, t);
  a.box = (fattn__mailbox *)fattn__pinned_dev(ctx, t->box);
  a.ring = (const uint8_t *)fattn__pinned_dev(ctx, ctx->ring);
  a.slot_bytes = ctx->lay.slot_bytes;
  a.done_base = (unsigned long long *)fattn__pinned_dev(ctx, ctx->done);
  return (int)fattn__launch(prep_kernel, dim3(1), dim3(PREP_THREADS), 0, (cudaStream_t)stream, a);
}

extern "C" int fattn__prep_launch(fattn_ctx *ctx, const uint8_t *slot, uint32_t index, uint64_t seq,
                                  uint32_t num_words, const fattn__plan_target *t, void *stream) {
  cudaStream_t s = (cudaStream_t)stream;
  uint8_t *dev = ctx->dev;
  prep_args a = args_for(ctx, t);
  a.hdr = *(const fattn__step_hdr *)slot;
  a.slot = (const uint8_t *)fattn__pinned_dev(ctx, slot);
  a.num_words = num_words;
  a.done = (unsigned long long *)fattn__pinned_dev(ctx, &ctx->done[index]);
  a.seq = seq;
  const uint32_t num_rows = a.hdr.num_row_copies;
  cudaError_t e = cudaSuccess;
  if (num_rows) /* before prep: the copies read their sources' rows before the slot's updates */
    e = fattn__launch(copy_rows_kernel, dim3(num_rows), dim3(256), 0, s,
                      (const fattn__row_op *)(a.slot + a.off_row_ops), a.table, a.pages_per_seq);
  const int rows_pending = num_rows && e == cudaSuccess;
  if (e == cudaSuccess) e = fattn__launch(prep_kernel, dim3(1), dim3(PREP_THREADS), 0, s, a);
  if (e != cudaSuccess) { /* prep will not release the slot */
    if (rows_pending) cudaStreamSynchronize(s); /* the row copies read it: on this failure path only */
    fattn__slot_release(ctx, index, seq);
    return (int)e;
  }
  const uint32_t num_copies = a.hdr.num_page_copies;
  if (num_copies) { /* after prep, which moved the copy list to the device */
    const uint64_t k_page = ctx->lay.k_page_bytes, v_page = ctx->lay.v_page_bytes;
    const uint32_t pools = ctx->n.model.num_layers * (v_page ? 2u : 1u);
    const uint32_t want = COPY_BLOCKS_PER_SM * ctx->num_sms, per_pool = want > pools ? (want + pools - 1) / pools : 1u;
    const uint32_t parts = a.hdr.page_copies_chained ? 1u : per_pool < num_copies ? per_pool : num_copies;
    dim3 grid(ctx->n.model.num_layers, v_page ? 2 : 1, parts);
    return (int)fattn__launch(copy_pages_kernel, grid, dim3(COPY_THREADS), 0, s, (const fattn__page_copy *)a.copies, num_copies,
                              a.hdr.page_copies_chained,
                              dev + ctx->lay.dev_off[FATTN_REGION_K_POOL], dev + ctx->lay.dev_off[FATTN_REGION_V_POOL],
                              ctx->lay.k_layer_bytes, ctx->lay.v_layer_bytes, k_page, v_page);
  }
  return (int)cudaSuccess;
}
