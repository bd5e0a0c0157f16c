/* fa3_softmax.h: the softmax policies of the Hopper kernels (row max, exps, the factor that
 * rescales O) and the row finalisation shared by all of them (sinks, 1 / l, LSE). */
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

/* Exact online softmax in exp2, rescaling whenever a row max grows. */
template <int BN> struct fa3__softmax_exact {
  static constexpr bool LAZY = false;
  float m[2], l[2];
  __device__ __forceinline__ void init() { m[0] = m[1] = -INFINITY; l[0] = l[1] = 0.f; }
  __device__ __forceinline__ void step(float *s, float mul, float *alpha) {
    float mx[2] = {-INFINITY, -INFINITY};
    fa3__rows_max<BN>(s, mx);
    float base[2];
#pragma unroll
    for (int h = 0; h < 2; h++) {
      mx[h] = fmaxf(m[h], fa2__lanes_max<1, 2>(mx[h]) * mul);
      base[h] = mx[h] == -INFINITY ? 0.f : mx[h];
      alpha[h] = fa2__exp2(m[h] - base[h]);
      m[h] = mx[h];
      l[h] *= alpha[h];
    }
    fa3__rows_exp<BN>(s, mul, base, l);
  }
};

/* FA4's lazy rescaling (docs/credits.md): a row's max moves only when a score passes it by
 * more than 2^TH, so most tiles leave alpha at exactly 1; the weights stay under 2^TH, which
 * bf16 / fp16 P and the fp32 sums hold as well as weights under 1. It pays on the 64-slot
 * tiles (d 192 and 256), where O is 128 registers a thread; on the 128-slot tiles the vote
 * costs more than the multiplies it saves (docs/performance.md). */
template <int BN> struct fa3__softmax_lazy {
  static constexpr bool LAZY = true;
  static constexpr float TH = 8.f;
  float m[2], l[2];
  __device__ __forceinline__ void init() { m[0] = m[1] = -INFINITY; l[0] = l[1] = 0.f; }
  __device__ __forceinline__ void step(float *s, float mul, float *alpha) {
    float mx[2] = {-INFINITY, -INFINITY};
    fa3__rows_max<BN>(s, mx);
    float base[2];
#pragma unroll
    for (int h = 0; h < 2; h++) {
      mx[h] = fa2__lanes_max<1, 2>(mx[h]) * mul;
      const float nm = mx[h] > m[h] + TH ? mx[h] : m[h];
      base[h] = nm == -INFINITY ? 0.f : nm;
      alpha[h] = nm == m[h] ? 1.f : fa2__exp2(m[h] - base[h]);
      m[h] = nm;
      l[h] *= alpha[h];
    }
    fa3__rows_exp<BN>(s, mul, base, l);
  }
};

/* How a finished row leaves: O is scaled by inv, LSE is lse2 (log2 units). */
typedef struct fa3__row_end {
  float inv, lse2;
} fa3__row_end;

/* A row's end from its max m and weight sum L (log2 units, the policy's), the sink logit s2
 * in log2 units (-inf without one) and o_mul (fp8's V scale, else 1). The sink joins the
 * denominator relative to the larger of m and s2, so a sink far above every score the row
 * sees gives LSE near s2 and O near 0 instead of an overflowing exp. A row that sees nothing
 * gets O = 0 and LSE = s2. */
__device__ __forceinline__ fa3__row_end fa3__row_finish(float m, float L, float s2, float o_mul) {
  if (m == -INFINITY) return fa3__row_end{0.f, s2};
  const float base = fmaxf(m, s2), rows = exp2f(m - base), total = L * rows + exp2f(s2 - base);
  return fa3__row_end{o_mul * rows / total, base + log2f(total)};
}

#endif /* __CUDACC__ */
#endif /* FATTN_ATTN_FA3_FA3_SOFTMAX_H */
