/* fa3_mask.h: the mask of the Hopper kernels: which KV slots a consumer's rows see, worked
 * out once a tile, and applied to the scores of boundary blocks only. */
#ifndef FATTN_ATTN_FA3_FA3_MASK_H
#define FATTN_ATTN_FA3_FA3_MASK_H

#include "attn/fa3/fa3_sched.h"

#ifdef __CUDACC__

/* Bits n of a thread's BN / 4 columns j0 + 8 (n / 2) + 2 c4 + n % 2 that lie in [lo, hi). */
template <int BN> __device__ __forceinline__ uint32_t fa3__run_bits(uint32_t lo, uint32_t hi, uint32_t j0, uint32_t c4) {
  auto below = [&](uint32_t x) -> uint32_t { /* columns under slot x */
    if (x <= j0 + 2u * c4) return 0u;
    const uint32_t y = x - j0 - 2u * c4, n = 2u * (y / 8u) + min(y % 8u, 2u);
    return min(n, (uint32_t)BN / 4u);
  };
  auto ones = [](uint32_t n) -> uint32_t { return n >= 32u ? ~0u : (1u << n) - 1u; };
  return hi > lo ? ones(below(hi)) & ~ones(below(lo)) : 0u;
}

/* A thread's two rows (fragment rows g and g + 8 of its warp) in one consumer's 64 rows of a
 * tile. Blocks inside [lo_all, hi_all) need no mask. Without a tree a row sees one run of
 * slots, [run_lo, run_hi), so a boundary block's mask is two counts; a tree row (and d 192 /
 * 256, whose consumers have no registers to spare for the runs) is tested slot by slot in a
 * rolled loop: unrolled per-score mask code thrashed the I-cache. */
template <int BN, int DK> struct fa3__mask {
  uint32_t qpos[2];        /* the rows' absolute query slots */
  const uint64_t *mrow[2]; /* their tree-mask rows, or NULL */
  uint32_t run_lo[2], run_hi[2];
  uint32_t lo_all, hi_all;

  __device__ __forceinline__ void init(const fattn__layer_params &l, uint32_t causal, const fa3__tile &t,
                                       const uint64_t *mask, uint32_t R0, uint32_t warp, uint32_t g) {
    const uint32_t prefix = t.e.kv_len - t.e.q_len;
    const uint32_t last = R0 < t.e.q_len ? min(R0 + 63u, t.e.q_len - 1u) : R0;
    const fattn__kv_range mine = fattn__rows_range(&l, (int)causal, t.tree, t.e.q_len, t.e.kv_len, R0, last);
    lo_all = mine.lo_all;
    hi_all = min(mine.hi_all, t.ke);
#pragma unroll
    for (int h = 0; h < 2; h++) {
      const uint32_t q = min(R0 + warp * 16u + g + 8u * h, t.e.q_len - 1u);
      qpos[h] = prefix + q;
      mrow[h] = t.tree ? mask + t.e.mask_row + q : nullptr;
    }
    run_lo[0] = run_lo[1] = run_hi[0] = run_hi[1] = 0u;
    if (DK <= 128 && !t.tree) {
#pragma unroll
      for (int h = 0; h < 2; h++) {
        const fattn__kv_range r = fattn__rows_range(&l, (int)causal, 0, t.e.q_len, t.e.kv_len, qpos[h] - prefix,
                                                    qpos[h] - prefix);
        run_lo[h] = r.lo_any;
        run_hi[h] = min(r.hi_any, t.ke);
      }
    }
  }

  /* Sets the scores of block j0 that its rows do not see to -inf (s: [BN / 8][row 0 pair,
   * row 1 pair] of thread column c4). */
  __device__ __forceinline__ void apply(float *s, const fattn__layer_params &l, uint32_t causal, const fa3__tile &t,
                                        uint32_t j0, uint32_t c4) const {
    if (j0 >= lo_all && j0 + BN <= hi_all) return;
    uint32_t vis[2] = {0u, 0u}; /* bit n: column 8 (n / 2) + 2 c4 + n % 2 of the block */
    if (DK > 128 || t.tree) {
      const uint32_t prefix = t.e.kv_len - t.e.q_len;
#pragma unroll 1
      for (uint32_t n = 0; n < BN / 4; n++) {
        const uint32_t j = j0 + 8u * (n >> 1) + 2u * c4 + (n & 1u);
#pragma unroll
        for (int h = 0; h < 2; h++)
          if (j < t.ke && fa2__vis(l, (int)causal, t.tree, mrow[h], prefix, qpos[h], j)) vis[h] |= 1u << n;
      }
    } else {
#pragma unroll
      for (int h = 0; h < 2; h++) vis[h] = fa3__run_bits<BN>(run_lo[h], run_hi[h], j0, c4);
    }
#pragma unroll
    for (int i = 0; i < BN / 8; i++) {
#pragma unroll
      for (int k = 0; k < 4; k++)
        if (!((vis[k >> 1] >> (2 * i + (k & 1))) & 1u)) s[4 * i + k] = -INFINITY;
    }
  }
};

#endif /* __CUDACC__ */
#endif /* FATTN_ATTN_FA3_FA3_MASK_H */
