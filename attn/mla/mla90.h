/* mla90.h: the plan of the Hopper (sm_90a) absorbed-MLA kernel (attn/mla/mla90.cu): its tile,
 * warpgroup roles and register split, named barriers, shared-memory layout and work items. */
#ifndef FATTN_ATTN_MLA_MLA90_H
#define FATTN_ATTN_MLA_MLA90_H

#include "attn/fa3/fa3_sync.h"

/* The tile: 64 packed rows (one wgmma M; row R of an entry is q head R % H of query R / H, so
 * 128 heads take 2 tiles a query and 16 heads pack 4 queries a tile) against KV blocks of 64
 * slots, each a latent row of 576 dims stored as 9 slabs of 64 dims x 128 bytes in the 128-byte
 * swizzle; V is the first 8 slabs. Two stages of the ring: a stage is 72 KiB, Q another 72. */
#define MLA90__ROWS 64u
#define MLA90__BN 64u
#define MLA90__ST 2u
#define MLA90__SLABS 9u
#define MLA90__SLAB 8192u /* 64 rows x 128 bytes */
#define MLA90__STAGE (MLA90__SLABS * MLA90__SLAB)
/* Pages of at least a block's slots come by TMA, one box a slab (a block then lies in one page). */
#define MLA90__TMA_MIN_PAGE 64u

/* Q heads a grid's x-group takes: 128 heads run their two 64-row tiles of a query as two
 * groups; fewer heads pack whole queries in one. */
FATTN__HD uint32_t mla90__groups(uint32_t q_heads) { return q_heads > MLA90__ROWS ? q_heads / MLA90__ROWS : 1u; }

#ifdef __CUDACC__

/* Warpgroups: 0 produces (the ring, by TMA or a cp.async gather), 1 and 2 consume. Consumer c
 * owns O[:, 256 c .. 256 c + 256) of all 64 rows (128 fp32 registers a thread) and computes
 * S = Q K^T and the softmax of the blocks i with i % 2 == c. setmaxnreg: P + 2 C <= 504. */
#define MLA90__THREADS 384
#define MLA90__P_REGS 56
#define MLA90__C_REGS 224

/* Named barriers (0 is __syncthreads). x is the consumer that arrives, the other syncs:
 *   MAX + x    x published block i's row max, rescale factor and row sum, and wrote P_i;
 *   PFREE + x  x's P V of its own block completed: the other may overwrite P;
 *   WG + c     consumer c's own 128 threads (its P rows all written);
 *   BOTH       both consumers (Q landed; the item done). */
enum mla90__named_barrier {
  MLA90__BAR_PRODUCER = 1,
  MLA90__BAR_MAX = 2,
  MLA90__BAR_PFREE = 4,
  MLA90__BAR_WG = 6,
  MLA90__BAR_BOTH = 8,
};

/* The shared-memory plan, placed at a 1024-byte boundary (the swizzle atom). */
struct mla90__smem {
  char q[MLA90__SLABS][MLA90__SLAB];                  /* the tile's 64 rows of Q */
  char kv[MLA90__ST][MLA90__STAGE];                   /* the ring of latent blocks */
  char p[MLA90__SLAB];                                /* P of the current block, [64][64] in T */
  float m[2][MLA90__ROWS], alpha[2][MLA90__ROWS];     /* row max and rescale after block i, [i % 2] */
  float lrun[2][MLA90__ROWS];                         /* row sum through block i, [i % 2] */
  uint64_t full[MLA90__ST], empty[MLA90__ST];         /* a stage landed / read (8 consumer warps) */
};
#define MLA90__SMEM (1024 + (int)sizeof(mla90__smem))
static_assert(MLA90__SMEM <= 227 * 1024, "shared memory");

/* One work item: packed rows R0 .. R0 + 63 of entry e over split sp. Slots [kbt, ke) are the
 * union of the rows' ranges within the split; blocks start at kb (kbt rounded down to a block,
 * so that a TMA box starts a page) and slots below kbt are masked; in [lo_f, hif) every row
 * sees every slot. */
struct mla90__item {
  fattn__entry e;
  uint32_t R0, Rend, sp, kbt, kb, ke, lo_f, hif, nblk;
  bool split, tree;
};

__device__ __forceinline__ void mla90__item_of(const fa2__args &a, const fattn__entry &e, int causal, bool tree,
                                               uint32_t R0, uint32_t sp, bool split, mla90__item &it) {
  const uint32_t H = a.l.num_q_heads, total = e.q_len * H;
  it.e = e;
  it.R0 = R0;
  it.Rend = min(R0 + MLA90__ROWS, total);
  it.sp = sp;
  it.split = split;
  it.tree = tree;
  const fattn__kv_range rr = fattn__rows_range(&a.l, causal, tree, e.q_len, e.kv_len, R0 / H, (it.Rend - 1u) / H);
  uint32_t s_lo = 0u, s_hi = e.kv_len;
  if (split) {
    s_lo = sp * e.split_len;
    s_hi = min(s_lo + e.split_len, e.kv_len);
  }
  it.kbt = max(rr.lo_any, s_lo);
  it.ke = min(rr.hi_any, s_hi);
  it.kb = it.kbt / MLA90__BN * MLA90__BN;
  it.lo_f = rr.lo_all;
  it.hif = min(rr.hi_all, it.ke);
  it.nblk = it.ke > it.kbt ? (it.ke - it.kb + MLA90__BN - 1u) / MLA90__BN : 0u;
}

/* Whether block j0 comes by TMA (the async proxy): a tensor map, pages of a whole block, and
 * the block inside the sequence. Gathered blocks are generic-proxy writes that the consumers
 * fence before their wgmmas read them. */
__device__ __forceinline__ bool mla90__by_tma(bool use_tma, const fa2__args &a, const mla90__item &it, uint32_t j0) {
  return use_tma && a.l.page_size >= MLA90__TMA_MIN_PAGE && j0 + MLA90__BN <= it.e.kv_len;
}

#endif /* __CUDACC__ */
#endif /* FATTN_ATTN_MLA_MLA90_H */
