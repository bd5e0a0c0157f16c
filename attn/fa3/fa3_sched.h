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

/* A claimed work item (work when none is left) and the entry it falls in. */
typedef struct fa3__item {
  uint32_t w, ei;
} fa3__item;

/* The order of the work items. Item w is (planner tile b, q head hq). The q heads are taken in
 * passes of whole kv-head groups, each pass walking its tiles from the largest index down
 * (causal tiles with most KV first) with the pass's q heads side by side, so that the blocks at
 * work at once read the KV of few heads, which then stays in L2 (FlashAttention-3 groups its
 * heads for L2 likewise; docs/credits.md). Non-causal tiles all cost the same, so a pass is
 * one kv head's q heads; a causal pass holds at least 16 items a block, so that its longest
 * tile, claimed last of the pass, still ends with the rest of the work. */
__device__ __forceinline__ uint32_t fa3__item_at(const fa3__args &a, uint32_t w, uint32_t num_tiles, uint32_t *hq) {
  const uint32_t qh = a.k.l.num_q_heads, nkv = a.k.l.num_kv_heads, G = qh / nkv;
  uint32_t kv_pass = 1u;
  if (a.k.s.hdr->causal) kv_pass = min(nkv, (16u * gridDim.x + num_tiles * G - 1u) / (num_tiles * G));
  const uint32_t heads = kv_pass * G, pass = w / (heads * num_tiles), r = w - pass * heads * num_tiles;
  const uint32_t in_pass = min(heads, qh - pass * heads);
  *hq = pass * heads + r % in_pass;
  return num_tiles - 1u - r / in_pass;
}

/* Work item w of entry ei, made into its tile: rows (from row off of the item: 128 times the
 * block's rank in a cluster), head and KV blocks. */
template <int BN>
__device__ __forceinline__ void fa3__tile_of(const fa3__args &a, uint32_t w, uint32_t ei, uint32_t num_tiles,
                                             uint32_t off, fa3__tile *t) {
  const fattn__step_hdr *hdr = a.k.s.hdr;
  const uint32_t b = fa3__item_at(a, w, num_tiles, &t->hq);
  t->e = a.k.s.entries[ei];
  const uint32_t local = b - t->e.tile_start;
  t->R0 = local * 64u + off;
  t->tree = hdr->mode == FATTN_MODE_TARGET_VERIFY && t->e.mask_row != UINT32_MAX && a.k.s.mask;
  const uint32_t last = min(t->R0 + 127u, t->e.q_len - 1u);
  fattn__kv_range r = fattn__rows_range(&a.k.l, (int)hdr->causal, t->tree, t->e.q_len, t->e.kv_len, t->R0, last);
  t->kb = r.lo_any / BN * BN;
  t->ke = r.hi_any;
  t->nblk = t->ke > t->kb ? (t->ke - t->kb + BN - 1u) / BN : 0u;
}

/* The scheduler's contract. Blocks are persistent; the producer's thread 0 runs it (sm: the
 * shared-memory plan, whose sched_full / sched_empty mbarriers and ring_w / ring_entry words
 * are the ring):
 *   post(k)  claims the block's k-th item, skips the items that do not start a work unit (a
 *            unit is 128 rows a block of the cluster: items start on local planner tiles that
 *            are multiples of 2 CL), finds the item's entry once, and posts both to a ring of
 *            two slots. Alone (CL 1), the first item is the block's own index and later ones
 *            come from an atomic counter, so a block that drew short causal tiles takes more
 *            of them. A cluster of 2 (non-causal steps, where every unit of an entry costs
 *            the same) walks the items statically, one cluster's after another's, so that
 *            both blocks meet the same items without a word between them;
 *   take(k)  is each consumer warp's side: the k-th item, its slot freed;
 *   done()   the last block to finish puts the counter back to 0 for the next launch.
 * The producer runs stages ahead of the consumers, so a claim's round trip hides behind the
 * last stages of the tile before, and the entry's binary search is off the consumers' path. */
template <int CL>
static __device__ __noinline__ fa3__item fa3__claim(const fa3__args &a, uint32_t k, uint32_t from, uint32_t work,
                                                    uint32_t num_tiles) {
  const uint32_t n = a.k.s.hdr->num_entries, step = CL == 1 ? 0u : gridDim.x / CL;
  uint32_t w = CL == 1 ? (k ? gridDim.x + atomicAdd(a.k.s.tile_counter, 1u) : blockIdx.x) : from;
  for (;;) {
    if (w >= work) return fa3__item{w, 0u};
    uint32_t hq;
    const uint32_t b = fa3__item_at(a, w, num_tiles, &hq), ei = fa2__find(a.k.s.entries, n, b);
    if (((b - a.k.s.entries[ei].tile_start) & (2u * CL - 1u)) == 0u) return fa3__item{w, ei};
    w = CL == 1 ? gridDim.x + atomicAdd(a.k.s.tile_counter, 1u) : w + step;
  }
}
/* Posts the k-th item; from: where a cluster's static walk goes on (its last item + the
 * clusters; its index first). Returns the item posted. */
template <int CL, typename P>
__device__ __forceinline__ uint32_t fa3__sched_post(const fa3__args &a, P *sm, uint32_t k, uint32_t from, uint32_t work,
                                                    uint32_t num_tiles) {
  const fa3__item item = fa3__claim<CL>(a, k, from, work, num_tiles);
  fa3__wait(&sm->sched_empty[k & 1u], ((k >> 1) & 1u) ^ 1u);
  sm->ring_w[k & 1u] = item.w;
  sm->ring_entry[k & 1u] = item.ei;
  fa3__arrive(&sm->sched_full[k & 1u]);
  return item.w;
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
