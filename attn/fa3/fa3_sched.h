/* fa3_sched.h: the tile scheduler of the Hopper kernels: the order of the work items, their
 * claim by the persistent blocks, and the ring that hands each one to the consumers. */
#ifndef FATTN_ATTN_FA3_FA3_SCHED_H
#define FATTN_ATTN_FA3_FA3_SCHED_H

#include "attn/fa3/fa3_sync.h"
#include "fattn.h"

/* Everything the kernel needs besides the two tensor maps, by value: fa2's arguments (the
 * same derivation, fa2__args_for) and whether the maps are valid (then a whole KV tile comes
 * as one box a page and slab). */
typedef struct fa3__args {
  fa2__args k;
  uint32_t use_tma;
} fa3__args;

#ifdef __CUDACC__

/* One unit of work: 128 query rows of one q head (two planner tiles of 64) and its KV range. */
typedef struct fa3__tile {
  fattn__entry e;
  uint32_t hq, R0;       /* q head; first query row of the entry */
  uint32_t kb, ke, nblk; /* blocks start at kb (a multiple of BN), end at slot ke */
  bool tree;
} fa3__tile;

/* Whether the producer brings block j0 of tile t by TMA: the async proxy, whose writes wgmma
 * reads once the stage's barrier completes. Blocks it gathers with cp.async are generic-proxy
 * writes, which their readers order before wgmma with a proxy fence; fp8 blocks, widened by
 * the producer, are fenced by it. */
template <int BN, bool F8>
__device__ __forceinline__ bool fa3__by_tma(const fa3__args &a, const fa3__tile &t, uint32_t j0) {
  return !F8 && a.use_tma && j0 + BN <= t.e.kv_len;
}

/* A claimed work item (work when none is left) and the entry it falls in. */
typedef struct fa3__item {
  uint32_t w, ei;
} fa3__item;

/* The order of the work items: w is (planner tile b, q head hq), the largest tile index first
 * (causal tiles with most KV go first), the q heads of a tile side by side. */
__device__ __forceinline__ uint32_t fa3__item_at(const fa3__args &a, uint32_t w, uint32_t num_tiles, uint32_t *hq) {
  *hq = w % a.k.l.num_q_heads;
  return num_tiles - 1u - w / a.k.l.num_q_heads;
}

/* Work item w of entry ei, made into its tile: rows, head and KV blocks. */
template <int BN>
__device__ __forceinline__ void fa3__tile_of(const fa3__args &a, uint32_t w, uint32_t ei, uint32_t num_tiles,
                                             fa3__tile *t) {
  const fattn__step_hdr *hdr = a.k.s.hdr;
  const uint32_t b = fa3__item_at(a, w, num_tiles, &t->hq);
  t->e = a.k.s.entries[ei];
  const uint32_t local = b - t->e.tile_start;
  t->R0 = local * 64u;
  t->tree = hdr->mode == FATTN_MODE_TARGET_VERIFY && t->e.mask_row != UINT32_MAX && a.k.s.mask;
  const uint32_t last = min(t->R0 + 127u, t->e.q_len - 1u);
  fattn__kv_range r = fattn__rows_range(&a.k.l, (int)hdr->causal, t->tree, t->e.q_len, t->e.kv_len, t->R0, last);
  t->kb = r.lo_any / BN * BN;
  t->ke = r.hi_any;
  t->nblk = t->ke > t->kb ? (t->ke - t->kb + BN - 1u) / BN : 0u;
}

/* The scheduler's contract. Blocks are persistent; the producer's thread 0 runs it:
 * (sm: the shared-memory plan, whose sched_full / sched_empty mbarriers and ring_w / ring_entry
 * words are the ring)
 *   post(k)  claims the block's k-th item (k = 0: its own index; later ones from an atomic
 *            counter, so a block that drew short causal tiles takes more of them), skips the
 *            items that are second halves of 128-row tiles, finds the item's entry once, and
 *            posts both to a ring of two slots;
 *   take(k)  is each consumer warp's side: the k-th item, its slot freed;
 *   done()   the last block to finish puts the counter back to 0 for the next launch.
 * The producer runs stages ahead of the consumers, so a claim's round trip hides behind the
 * last stages of the tile before, and the entry's binary search is off the consumers' path. */
static __device__ __noinline__ fa3__item fa3__claim(const fa3__args &a, uint32_t k, uint32_t work, uint32_t num_tiles) {
  const uint32_t n = a.k.s.hdr->num_entries;
  for (uint32_t w = k ? gridDim.x + atomicAdd(a.k.s.tile_counter, 1u) : blockIdx.x;;
       w = gridDim.x + atomicAdd(a.k.s.tile_counter, 1u)) {
    if (w >= work) return fa3__item{w, 0u};
    uint32_t hq;
    const uint32_t b = fa3__item_at(a, w, num_tiles, &hq), ei = fa2__find(a.k.s.entries, n, b);
    if (((b - a.k.s.entries[ei].tile_start) & 1u) == 0u) return fa3__item{w, ei}; /* a whole tile starts on an even local index */
  }
}
template <typename P>
__device__ __forceinline__ void fa3__sched_post(const fa3__args &a, P *sm, uint32_t k, uint32_t work, uint32_t num_tiles) {
  const fa3__item item = fa3__claim(a, k, work, num_tiles);
  fa3__wait(&sm->sched_empty[k & 1u], ((k >> 1) & 1u) ^ 1u);
  sm->ring_w[k & 1u] = item.w;
  sm->ring_entry[k & 1u] = item.ei;
  fa3__arrive(&sm->sched_full[k & 1u]);
}
template <typename P> __device__ __forceinline__ fa3__item fa3__sched_take(P *sm, uint32_t k) {
  fa3__wait(&sm->sched_full[k & 1u], (k >> 1) & 1u);
  const fa3__item item = {sm->ring_w[k & 1u], sm->ring_entry[k & 1u]};
  __syncwarp();
  if (threadIdx.x % 32u == 0u) fa3__arrive(&sm->sched_empty[k & 1u]);
  return item;
}
/* By the time the last block finishes, every block has made its last claim. */
__device__ __forceinline__ void fa3__sched_done(uint32_t *counter) {
  __threadfence();
  if (atomicAdd(counter + 1, 1u) == gridDim.x - 1u) {
    counter[0] = 0u;
    counter[1] = 0u;
  }
}

#endif /* __CUDACC__ */
#endif /* FATTN_ATTN_FA3_FA3_SCHED_H */
