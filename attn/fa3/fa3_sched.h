/* fa3_sched.h: the tile scheduler of the Hopper kernels: the order of the work items, their
 * claim by the persistent blocks, and the ring that hands each one to the consumers. */
#ifndef FATTN_ATTN_FA3_FA3_SCHED_H
#define FATTN_ATTN_FA3_FA3_SCHED_H

#include "attn/fa3/fa3_sync.h"
#include "attn/fa3/fa3_trios.h"
#include "fattn.h"

/* Everything the kernel needs besides the two tensor maps, by value: fa2's arguments (the
 * same derivation, fa2__args_for), whether the maps are valid (then a whole KV tile comes as
 * one box a page and slab) and whether the table's row of three consumers runs (fa3__trios). */
typedef struct fa3__args {
  fa2__args k;
  uint32_t use_tma, trios;
} fa3__args;

#ifdef __CUDACC__

/* One unit of work: NC planner tiles of 64 query rows of one q head (a pair, or a trio of a
 * three-consumer kernel), and its KV range; an empty item has no blocks and no rows. */
typedef struct fa3__tile {
  fattn__entry e;
  uint32_t hq, R0;       /* q head; first query row of the entry */
  uint32_t kb, ke, nblk; /* blocks start at kb (a multiple of BN), end at slot ke */
  bool tree;
} fa3__tile;

/* The operand policy of a kernel: what the KV cache holds and what the GEMMs run in. */
enum fa3__kv_policy {
  FA3__KV_16BIT = 0,  /* 16-bit KV in Q's type, 16-bit GEMMs */
  FA3__KV_WIDEN = 1,  /* fp8 KV gathered raw and widened to fp16 by the producer, fp16 GEMMs */
  FA3__KV_E4M3 = 2,   /* fp8 KV as stored, Q quantised in the kernel, e4m3 GEMMs (fa3_fp8.h) */
};

/* Whether the producer brings block j0 of tile t by TMA: the async proxy, whose writes wgmma
 * reads once the stage's barrier completes. Blocks it gathers with cp.async are generic-proxy
 * writes, which their readers order before wgmma with a proxy fence; widened fp8 blocks and
 * e4m3 V^T, written by the producer's threads, are fenced by it. */
template <int BN, int KV>
__device__ __forceinline__ bool fa3__by_tma(const fa3__args &a, const fa3__tile &t, uint32_t j0) {
  return KV != FA3__KV_WIDEN && a.use_tma && j0 + BN <= t.e.kv_len;
}

/* A claimed work item (work when none is left) and the entry it falls in. */
typedef struct fa3__item {
  uint32_t w, ei;
} fa3__item;

/* Work items of a step: a tile pair and a q head each. */
__device__ __forceinline__ uint32_t fa3__work(const fa3__args &a, uint32_t num_pairs) {
  return a.k.s.hdr->num_entries ? num_pairs * a.k.l.num_q_heads : 0u;
}

/* The order of the work items: w is (tile pair p, q head hq), the last pair first (causal pairs
 * with most KV go first), the q heads of a pair side by side. */
__device__ __forceinline__ uint32_t fa3__pair_at(const fa3__args &a, uint32_t w, uint32_t num_pairs, uint32_t *hq) {
  *hq = w % a.k.l.num_q_heads;
  return num_pairs - 1u - w / a.k.l.num_q_heads;
}

/* Work item w of entry ei, made into its tile: rows, head and KV blocks. Items stay the pairs
 * prep counts; under three consumers each carries a trio or is empty (fa3__trio_of). */
template <int BN, int NC>
__device__ __forceinline__ void fa3__tile_of(const fa3__args &a, uint32_t w, uint32_t ei, uint32_t num_pairs,
                                             fa3__tile *t) {
  const fattn__step_hdr *hdr = a.k.s.hdr;
  const uint32_t p = fa3__pair_at(a, w, num_pairs, &t->hq);
  constexpr uint32_t ROWS = NC * FATTN__Q_TILE;
  t->e = a.k.s.entries[ei];
  uint32_t unit = p - t->e.pair_start;
  static_assert(NC == 2 || NC == 3, "work items are pairs or trios");
  if constexpr (NC == 3) {
    unit = fa3__trio_of(t->e.q_len, unit);
    if (unit == UINT32_MAX) {
      t->R0 = t->e.q_len;
      t->tree = false;
      t->kb = t->ke = t->nblk = 0u;
      return;
    }
  }
  t->R0 = unit * ROWS;
  t->tree = hdr->mode == FATTN_MODE_TARGET_VERIFY && t->e.mask_row != UINT32_MAX && a.k.s.mask;
  const uint32_t last = min(t->R0 + ROWS - 1u, t->e.q_len - 1u);
  fattn__kv_range r = fattn__rows_range(&a.k.l, (int)hdr->causal, t->tree, t->e.q_len, t->e.kv_len, t->R0, last);
  t->kb = r.lo_any / BN * BN;
  t->ke = r.hi_any;
  t->nblk = t->ke > t->kb ? (t->ke - t->kb + BN - 1u) / BN : 0u;
}

/* The scheduler's contract. Blocks are persistent; the producer's thread 0 runs it:
 * (sm: the shared-memory plan, whose sched_full / sched_empty mbarriers and ring_w / ring_entry
 * words are a ring of FA3__SCHED_SLOTS)
 *   post(k)  claims the block's k-th item (k = 0: its own index; later ones from an atomic
 *            counter, so a block that drew short causal items takes more of them), finds its
 *            entry and posts both to the ring;
 *   take(k)  is each consumer warp's side: the k-th item, its slot freed;
 *   done()   the last block to finish puts the counter back to 0 for the next launch.
 * The producer posts item k + 1 once item k's first block is on its way (fa3_produce.h), so
 * the claim's round trip and the entry's search run while the stages fill, not between the
 * last load of one item and the first of the next. Items are whole tile pairs: no claim is
 * spent on a half. */
enum { FA3__SCHED_SLOTS = 4 };
/* A call of its own: inlined, its registers tipped the consumers' allocation into spilling
 * (ptxas allocates the whole kernel at once). */
static __device__ __noinline__ fa3__item fa3__claim(const fa3__args &a, uint32_t k, uint32_t work, uint32_t num_pairs) {
  fa3__item item = {k ? gridDim.x + atomicAdd(a.k.s.tile_counter, 1u) : blockIdx.x, 0u};
  if (item.w < work) {
    uint32_t hq;
    const uint32_t p = fa3__pair_at(a, item.w, num_pairs, &hq);
    item.ei = fa2__find<&fattn__entry::pair_start>(a.k.s.entries, a.k.s.hdr->num_entries, p);
  }
  return item;
}
template <typename P>
__device__ __forceinline__ void fa3__sched_post(const fa3__args &a, P *sm, uint32_t k, uint32_t work,
                                                uint32_t num_pairs) {
  const fa3__item item = fa3__claim(a, k, work, num_pairs);
  const uint32_t slot = k % FA3__SCHED_SLOTS, round = k / FA3__SCHED_SLOTS;
  fa3__wait(&sm->sched_empty[slot], (round & 1u) ^ 1u);
  sm->ring_w[slot] = item.w;
  sm->ring_entry[slot] = item.ei;
  fa3__arrive(&sm->sched_full[slot]);
}
template <typename P> __device__ __forceinline__ fa3__item fa3__sched_take(P *sm, uint32_t k) {
  const uint32_t slot = k % FA3__SCHED_SLOTS, round = k / FA3__SCHED_SLOTS;
  fa3__wait(&sm->sched_full[slot], round & 1u);
  const fa3__item item = {sm->ring_w[slot], sm->ring_entry[slot]};
  __syncwarp();
  if (threadIdx.x % 32u == 0u) fa3__arrive(&sm->sched_empty[slot]);
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
