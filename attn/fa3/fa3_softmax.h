/* fa3_softmax.h: the softmax policies of the Hopper kernels: a row's max, its exps and the
 * factor that rescales O, block by block (the row's end, with sinks, is fa2__sink_join). */
#ifndef FATTN_ATTN_FA3_FA3_SOFTMAX_H
#define FATTN_ATTN_FA3_FA3_SOFTMAX_H

#include "attn/fa2/fa2.h"

#ifdef __CUDACC__

/* A policy sees a thread's two rows (fragment rows g and g + 8) and the scores of one tile:
 * s[BN / 2] as [BN / 8][row 0 pair, row 1 pair], raw, -inf where masked, and mul (> 0) the
 * factor to log2 units. step() leaves p = exp2(s mul - m) in s and alpha, the factor the
 * accumulator rows must take; m is kept in log2 units. LAZY says whether alpha is often
 * exactly 1, so that a warp should vote to skip the rescale of O. */

/* mx: each of the two rows' max, raised to its scores'. The max is taken on raw scores, since
 * mul > 0 keeps their order. */
template <int BN> __device__ __forceinline__ void fa3__rows_max(const float *s, float *mx) {
#pragma unroll
  for (int i = 0; i < BN / 8; i++) {
    mx[0] = fmaxf(mx[0], fmaxf(s[4 * i], s[4 * i + 1]));
    mx[1] = fmaxf(mx[1], fmaxf(s[4 * i + 2], s[4 * i + 3]));
  }
}
/* Raw scores to weights exp2(s mul - base) in place (one FFMA a score: the scale rides on the
 * exp's subtraction), each row's added to its l. */
template <int BN> __device__ __forceinline__ void fa3__rows_exp(float *s, float mul, const float *base, float *l) {
#pragma unroll
  for (int i = 0; i < BN / 8; i++) {
#pragma unroll
    for (int k = 0; k < 4; k++) {
      const float p = fa2__exp2(fmaf(s[4 * i + k], mul, -base[k >> 1]));
      s[4 * i + k] = p;
      l[k >> 1] += p;
    }
  }
}

/* Online softmax in exp2. Exact (LAZY false): a row's max follows its scores and O is
 * rescaled whenever it grows. Lazy: FA4's rescaling (docs/credits.md): a row's max moves only
 * when a score passes it by more than 2^TH, so most tiles leave alpha at exactly 1 and a warp
 * votes to skip the rescale; the weights stay under 2^TH, which bf16 / fp16 P and the fp32
 * sums hold as well as weights under 1. Lazy pays on the 64-slot tiles (d 192 and 256), where
 * O is 128 registers a thread; on the 128-slot tiles the vote costs more than the multiplies
 * it saves (docs/performance.md). */
template <int BN, bool LAZY_> struct fa3__softmax {
  static constexpr bool LAZY = LAZY_;
  static constexpr float TH = 8.f;
  float m[2], l[2];
  __device__ __forceinline__ void init() { m[0] = m[1] = -INFINITY; l[0] = l[1] = 0.f; }
  __device__ __forceinline__ void step(float *s, float mul, float *alpha) {
    float mx[2] = {-INFINITY, -INFINITY};
    fa3__rows_max<BN>(s, mx);
    float base[2];
#pragma unroll
    for (int h = 0; h < 2; h++) {
      const float seen = fa2__lanes_max<1, 2>(mx[h]) * mul;
      const float nm = LAZY ? (seen > m[h] + TH ? seen : m[h]) : fmaxf(m[h], seen);
      base[h] = nm == -INFINITY ? 0.f : nm;
      alpha[h] = LAZY && nm == m[h] ? 1.f : fa2__exp2(m[h] - base[h]);
      m[h] = nm;
      l[h] *= alpha[h];
    }
    fa3__rows_exp<BN>(s, mul, base, l);
  }
};
template <int BN> using fa3__softmax_exact = fa3__softmax<BN, false>;
template <int BN> using fa3__softmax_lazy = fa3__softmax<BN, true>;

#endif /* __CUDACC__ */
#endif /* FATTN_ATTN_FA3_FA3_SOFTMAX_H */
