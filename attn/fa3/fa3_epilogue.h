/* fa3_epilogue.h: the epilogue of the Hopper kernels: a consumer's finished rows of O, scaled
 * by 1 / l with the sink's mass and fp8's V scale, and their LSE, stored from the fragments. */
#ifndef FATTN_ATTN_FA3_FA3_EPILOGUE_H
#define FATTN_ATTN_FA3_FA3_EPILOGUE_H

#include "attn/fa3/fa3_sched.h"

#ifdef __CUDACC__

/* Output and LSE element pairs in Q's type; fp8 kernels serve bf16 and fp16 Q alike. */
template <typename TM, bool F8> __device__ __forceinline__ uint32_t fa3__out_pair(float x, float y, uint32_t q_dtype) {
  if constexpr (F8) return q_dtype == FATTN_DTYPE_BF16 ? fa2__pack<__nv_bfloat16>(x, y) : fa2__pack<__half>(x, y);
  else return fa2__pack<TM>(x, y);
}

/* A quad's 4 x 4 block of words transposed by two butterfly rounds: before, w[j] is this
 * lane's pair of column group j (a group is 8 columns, a lane's pair 2 of them); after, w[j]
 * is lane j's pair of group c4, i.e. group c4's 8 columns in order. */
__device__ __forceinline__ void fa3__quad_transpose(uint32_t (&w)[4], uint32_t c4) {
#pragma unroll
  for (uint32_t m = 1u; m <= 2u; m <<= 1) {
    const bool hi = (c4 & m) != 0u;
#pragma unroll
    for (uint32_t j = 0; j < 4u; j++) {
      if (j & m) continue;
      const uint32_t got = __shfl_xor_sync(0xffffffffu, hi ? w[j] : w[j | m], m);
      if (hi) w[j] = got;
      else w[j | m] = got;
    }
  }
}

/* O (the m64 x DV fragment o of rows R0.., DV / 2 registers) and LSE of a thread's two rows;
 * m and l are the softmax policy's row state. Rows past the entry are not stored; at d 96 the
 * padding dims are not either. A quad holds a row's 8-column groups a 4-byte pair a lane.
 * QUAD (the table's O column): transposed four groups at a time, each lane stores one group's
 * 16 bytes and the quad 64 contiguous bytes (two whole sectors), where stored pair by pair
 * each sector takes two half-filled stores; every lane joins the shuffles, only the stores
 * are per row. An out not 16-byte aligned is stored pair by pair. */
template <int DV, typename T, bool F8, bool QUAD>
__device__ __forceinline__ void fa3__store_o(const fa3__args &a, const fa3__tile &t, const float *m, const float *l_rows,
                                             const float *o, uint32_t R0, uint32_t warp, uint32_t g, uint32_t c4) {
  static_assert(DV % 32 == 0, "the quad transpose stores 32 columns at a time");
  const fattn__layer_params &l = a.k.l;
  const uint32_t dv = l.head_dim_v;
  const bool wide = QUAD && ((uintptr_t)a.k.out & 15u) == 0u;
#pragma unroll
  for (int h = 0; h < 2; h++) {
    const uint32_t q = R0 + warp * 16u + g + 8u * h;
    const float L = fa2__lanes_sum<1, 2>(l_rows[h]);
    const bool stored = q < t.e.q_len;
    /* A row that sees nothing: O = 0, LSE = the sink or -inf. */
    const float s2 = l.sinks ? l.sinks[t.hq] * FA2__LOG2E : -INFINITY;
    float lse2 = s2, inv = 0.f;
    if (m[h] != -INFINITY) inv = fa2__sink_join<true>(m[h], L, s2, a.k.o_mul, lse2);
    const size_t row_o = (size_t)(t.e.q_start + (stored ? q : 0u)) * l.num_q_heads + t.hq;
    uint16_t *orow = (uint16_t *)a.k.out + row_o * dv;
#pragma unroll
    for (int b = 0; b < DV / 32; b++) {
      if (32u * b >= dv) continue; /* d 96: the upper dims are padding */
      uint32_t w[4];
#pragma unroll
      for (int j = 0; j < 4; j++) {
        const int i = 4 * b + j;
        w[j] = fa3__out_pair<T, F8>(o[4 * i + 2 * h] * inv, o[4 * i + 2 * h + 1] * inv, l.q_dtype);
      }
      if (wide) {
        fa3__quad_transpose(w, c4);
        if (stored) *(uint4 *)(orow + 32u * b + 8u * c4) = make_uint4(w[0], w[1], w[2], w[3]);
      } else if (stored) {
#pragma unroll
        for (int j = 0; j < 4; j++) *(uint32_t *)(orow + 32u * b + 8u * j + 2u * c4) = w[j];
      }
    }
    if (stored && a.k.lse && c4 == 0u) a.k.lse[row_o] = lse2 * FA2__LN2;
  }
}

#endif /* __CUDACC__ */
#endif /* FATTN_ATTN_FA3_FA3_EPILOGUE_H */
