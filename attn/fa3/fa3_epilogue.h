/* fa3_epilogue.h: the epilogue of the Hopper kernels: a consumer's finished rows of O, scaled
 * by 1 / l with the sink's mass and fp8's V scale, and their LSE, stored from the fragments. */
#ifndef FATTN_ATTN_FA3_FA3_EPILOGUE_H
#define FATTN_ATTN_FA3_FA3_EPILOGUE_H

#include "attn/fa3/fa3_sched.h"

#ifdef __CUDACC__

/* Output and LSE element pairs in Q's type; fp8 kernels serve bf16 and fp16 Q alike. */
template <typename TM, bool F8> __device__ __forceinline__ uint32_t fa3__out_pair(float x, float y, uint32_t q_dtype) {
  if constexpr (F8) return q_dtype == FATTN_DTYPE_BF16 ? fa2__pack<__nv_bfloat16>(x, y) : fa2__pack<__half>(x, y);
  return fa2__pack<TM>(x, y);
}

/* O (the m64 x DV fragment o of rows R0.., DV / 2 registers) and LSE of a thread's two rows;
 * m and l are the softmax policy's row state. Rows past the entry are not stored; at d 96 the
 * padding dims are not either. */
template <int DV, typename T, bool F8>
__device__ __forceinline__ void fa3__store_o(const fa3__args &a, const fa3__tile &t, const float *m, const float *l_rows,
                                             const float *o, uint32_t R0, uint32_t warp, uint32_t g, uint32_t c4) {
  const fattn__layer_params &l = a.k.l;
  const uint32_t dv = l.head_dim_v;
#pragma unroll
  for (int h = 0; h < 2; h++) {
    const uint32_t q = R0 + warp * 16u + g + 8u * h;
    const float L = fa2__lanes_sum<1, 2>(l_rows[h]);
    if (q >= t.e.q_len) continue;
    /* A row that sees nothing: O = 0, LSE = the sink or -inf. */
    const float s2 = l.sinks ? l.sinks[t.hq] * FA2__LOG2E : -INFINITY;
    float lse2 = s2, inv = 0.f;
    if (m[h] != -INFINITY) inv = fa2__sink_join<true>(m[h], L, s2, a.k.o_mul, lse2);
    const size_t row_o = (size_t)(t.e.q_start + q) * l.num_q_heads + t.hq;
    uint32_t *dst = (uint32_t *)((uint16_t *)a.k.out + row_o * dv + 2u * c4);
#pragma unroll
    for (int i = 0; i < DV / 8; i++)
      if (8u * i < dv) /* d 96: the upper dims are padding */
        dst[4 * i] = fa3__out_pair<T, F8>(o[4 * i + 2 * h] * inv, o[4 * i + 2 * h + 1] * inv, l.q_dtype);
    if (a.k.lse && c4 == 0u) a.k.lse[row_o] = lse2 * FA2__LN2;
  }
}

#endif /* __CUDACC__ */
#endif /* FATTN_ATTN_FA3_FA3_EPILOGUE_H */
