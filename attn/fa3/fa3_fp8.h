/* fa3_fp8.h: the e4m3 policy's parts of the Hopper kernels: Q quantised in shared memory with
 * a scale a consumer's rows, P packed into the e4m3 A fragment, V transposed to K-major. */
#ifndef FATTN_ATTN_FA3_FA3_FP8_H
#define FATTN_ATTN_FA3_FA3_FP8_H

#include "attn/fa3/fa3_sync.h"

#ifdef __CUDACC__

/* The largest finite e4m3 value: a consumer's |Q| max maps to it. */
#define FA3__E4M3_MAX 448.f

/* Four floats rounded to e4m3 (saturating), a first in the lowest byte. */
__device__ __forceinline__ uint32_t fa3__e4m3x4(float a, float b, float c, float d) {
  uint16_t lo, hi;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;\n" : "=h"(lo) : "f"(b), "f"(a));
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;\n" : "=h"(hi) : "f"(d), "f"(c));
  return (uint32_t)lo | ((uint32_t)hi << 16);
}

/* A word of two 16-bit values (Q's type) as floats. */
__device__ __forceinline__ float2 fa3__q_pair(uint32_t w, bool bf16) {
  if (bf16) return make_float2(__uint_as_float(w << 16), __uint_as_float(w & 0xffff0000u));
  return __half22float2(*(const __half2 *)&w);
}

/* Consumer c's 64 rows of Q, landed in 16 bits ([DK / 64 slabs][64][128 B], swizzled), made
 * e4m3 in place ([DK / 128 slabs][64][128 B]: the first slabs) with one scale for the 64 rows:
 * q8 = q 448 / amax. Returns amax / 448, the factor the scores take back. A thread holds its
 * share in registers between the reads and the writes, so the image may overwrite its source;
 * three barriers of the warpgroup: landed, the max shared, the image whole. A row's 16 dims a
 * unit, rows fastest, so that a quarter-warp's 16-byte accesses fall on distinct chunks. */
template <int DK>
__device__ __forceinline__ float fa3__quantise_q(char *qs, float *amax4, uint32_t q_dtype, int bar, uint32_t tid) {
  constexpr int UNITS = 64 * DK / 16, PER = UNITS / 128;
  static_assert(UNITS % 128 == 0, "whole units a thread");
  const bool bf16 = q_dtype == FATTN_DTYPE_BF16;
  fa3__sync(bar, 128); /* every thread's cp.async has landed */
  uint4 v[PER][2];
  float mx = 0.f;
#pragma unroll
  for (int i = 0; i < PER; i++) {
    const uint32_t u = tid + 128u * (uint32_t)i, r = u % 64u, h = u / 64u;
#pragma unroll
    for (int k = 0; k < 2; k++) {
      const uint32_t ch = 2u * h + (uint32_t)k;
      v[i][k] = *(const uint4 *)(qs + (ch / 8u) * 8192u + fa3__swz(r, ch % 8u));
      const uint32_t w[4] = {v[i][k].x, v[i][k].y, v[i][k].z, v[i][k].w};
#pragma unroll
      for (int j = 0; j < 4; j++) {
        const float2 f = fa3__q_pair(w[j], bf16);
        mx = fmaxf(mx, fmaxf(fabsf(f.x), fabsf(f.y)));
      }
    }
  }
  /* |x| as bits orders as |x| does */
  const uint32_t wmax = __reduce_max_sync(0xffffffffu, __float_as_uint(mx));
  if (tid % 32u == 0u) amax4[tid / 32u] = __uint_as_float(wmax);
  fa3__sync(bar, 128);
  const float amax = fmaxf(fmaxf(amax4[0], amax4[1]), fmaxf(amax4[2], amax4[3]));
  const float mul = amax > 0.f ? FA3__E4M3_MAX / amax : 1.f;
#pragma unroll
  for (int i = 0; i < PER; i++) {
    const uint32_t u = tid + 128u * (uint32_t)i, r = u % 64u, h = u / 64u;
    uint32_t out[4];
#pragma unroll
    for (int k = 0; k < 2; k++) {
      const uint32_t w[4] = {v[i][k].x, v[i][k].y, v[i][k].z, v[i][k].w};
#pragma unroll
      for (int j = 0; j < 2; j++) {
        const float2 f0 = fa3__q_pair(w[2 * j], bf16), f1 = fa3__q_pair(w[2 * j + 1], bf16);
        out[2 * k + j] = fa3__e4m3x4(f0.x * mul, f0.y * mul, f1.x * mul, f1.y * mul);
      }
    }
    *(uint4 *)(qs + (h / 8u) * 8192u + fa3__swz(r, h % 8u)) = make_uint4(out[0], out[1], out[2], out[3]);
  }
  fa3__fence_async(); /* the image is read by wgmma */
  fa3__sync(bar, 128);
  return amax > 0.f ? amax / FA3__E4M3_MAX : 1.f;
}

/* The S fragment of a block (fp32, [BN / 8][row g pair, row g + 8 pair]) as the A operand of
 * the e4m3 P V GEMM, BN / 32 k-steps of 4 words. A k32 A fragment gives lane c4 the columns
 * 4 c4..4 c4 + 3 (and 16 + those) of its rows; the accumulator gives it 2 c4, 2 c4 + 1 of
 * each 8-column group. Rather than move values between lanes, P's columns are taken in the
 * order the lane holds them: P column 4 c + j of each 16 is slot 2 c + (j & 1) + 8 (j >> 1)
 * of those 16, and V^T's columns follow the same order (fa3__transpose_v). */
template <int BN> __device__ __forceinline__ void fa3__pack_p_e4m3(const float *s, uint32_t (*p)[4]) {
#pragma unroll
  for (int kk = 0; kk < BN / 32; kk++) {
    const float *x = s + 16 * kk;
    p[kk][0] = fa3__e4m3x4(x[0], x[1], x[4], x[5]);
    p[kk][1] = fa3__e4m3x4(x[2], x[3], x[6], x[7]);
    p[kk][2] = fa3__e4m3x4(x[8], x[9], x[12], x[13]);
    p[kk][3] = fa3__e4m3x4(x[10], x[11], x[14], x[15]);
  }
}

/* Words a, b, c, d of four rows (4 bytes each) to four columns: out[i] holds byte i of each. */
__device__ __forceinline__ void fa3__bytes_transpose(uint32_t a, uint32_t b, uint32_t c, uint32_t d, uint32_t *out) {
  const uint32_t ab01 = __byte_perm(a, b, 0x5140), ab23 = __byte_perm(a, b, 0x7362);
  const uint32_t cd01 = __byte_perm(c, d, 0x5140), cd23 = __byte_perm(c, d, 0x7362);
  out[0] = __byte_perm(ab01, cd01, 0x5410);
  out[1] = __byte_perm(ab01, cd01, 0x7632);
  out[2] = __byte_perm(ab23, cd23, 0x5410);
  out[3] = __byte_perm(ab23, cd23, 0x7632);
}

/* V of a block of BN slots (64 or 128), landed as [DV / 128 slabs][BN slots][128 B]
 * (swizzled), written transposed into the stage as V^T [DV][BN bytes] (swizzled at BN bytes),
 * its columns in P's order: column 4 c + j of each 16 holds slot 2 c + (j & 1) + 8 (j >> 1).
 * A unit is four slots (one c of one 16) by 16 dims: four 16-byte reads, 16 four-byte writes;
 * a warp's units cover whole rows of V^T with each write instruction, so at BN 128 a write
 * fills one 128-byte row, bank-conflict free (at 64, two rows 16 dims apart: 2-way). */
template <int DV, int BN> __device__ __forceinline__ void fa3__transpose_v_words(const char *raw, char *vt, uint32_t tid) {
  constexpr uint32_t UNITS = (BN / 4) * (DV / 16), GROUPS = BN / 16;
#pragma unroll 1
  for (uint32_t u = tid; u < UNITS; u += 128u) {
    const uint32_t c = u % 4u, grp = (u / 4u) % GROUPS, q = u / (BN / 4), r0 = 16u * grp + 2u * c;
    const char *src = raw + (q / 8u) * (BN * 128u);
    const uint4 a = *(const uint4 *)(src + fa3__swz(r0, q % 8u));
    const uint4 b = *(const uint4 *)(src + fa3__swz(r0 + 1u, q % 8u));
    const uint4 x = *(const uint4 *)(src + fa3__swz(r0 + 8u, q % 8u));
    const uint4 y = *(const uint4 *)(src + fa3__swz(r0 + 9u, q % 8u));
    const uint32_t wa[4] = {a.x, a.y, a.z, a.w}, wb[4] = {b.x, b.y, b.z, b.w};
    const uint32_t wx[4] = {x.x, x.y, x.z, x.w}, wy[4] = {y.x, y.y, y.z, y.w};
#pragma unroll
    for (int w = 0; w < 4; w++) {
      uint32_t col[4];
      fa3__bytes_transpose(wa[w], wb[w], wx[w], wy[w], col);
#pragma unroll
      for (int i = 0; i < 4; i++) {
        const uint32_t n = 16u * q + 4u * (uint32_t)w + (uint32_t)i;
        const uint32_t at = BN == 128 ? fa3__swz(n, grp) : fa3__swz64(n, grp);
        *(uint32_t *)(vt + at + 4u * c) = col[i];
      }
    }
  }
}

/* The same transposition a warp's 16 slots by 32 dims at a time, through the matrix load and
 * store: ldmatrix.trans of four 8 x 8 tiles of byte pairs (matrix m: slots 8 (m % 2).. of the
 * 16, dims 16 (m / 2).. of the 32) gives lane t the pairs of dims 2 k, 2 k + 1 (k = t / 4) of
 * slots a, a + 1 (a = 2 (t % 4)) and of a + 8, a + 9; a byte permute makes of each two the
 * even dim's and the odd dim's word of columns 4 (t % 4).. in P's order (a, a + 1, a + 8,
 * a + 9), and stmatrix writes each as row k of a tile of V^T rows (matrix j: dims 2 i + j % 2
 * + 16 (j / 2) of the 32). A quarter of the registers of the word transposition, for a
 * leaner producer. */
template <int DV, int BN> __device__ __forceinline__ void fa3__transpose_v_ldsm(const char *raw, char *vt, uint32_t tid) {
  constexpr uint32_t GROUPS = BN / 16, UNITS = GROUPS * (DV / 32);
  const uint32_t warp = tid / 32u, m = (tid % 32u) / 8u, i = tid % 8u;
#pragma unroll 1
  for (uint32_t u = warp; u < UNITS; u += 4u) {
    const uint32_t grp = u % GROUPS, d0 = 32u * (u / GROUPS) + 16u * (m / 2u), slot = 16u * grp + 8u * (m % 2u) + i;
    uint32_t r[4];
    fa2__ldm4t(r, raw + (d0 / 128u) * (BN * 128u) + fa3__swz(slot, (d0 % 128u) / 16u));
    const uint32_t w[4] = {__byte_perm(r[0], r[1], 0x6420), __byte_perm(r[0], r[1], 0x7531),
                           __byte_perm(r[2], r[3], 0x6420), __byte_perm(r[2], r[3], 0x7531)};
    const uint32_t n = d0 + 2u * i + m % 2u; /* the V^T row whose address this lane gives */
    fa3__stm4(vt + (BN == 128 ? fa3__swz(n, grp) : fa3__swz64(n, grp)), w);
  }
}

/* The transposition the table row names (its VT column): the matrix one or the word one. */
template <int DV, int BN, bool MATRIX> __device__ __forceinline__ void fa3__transpose_v(const char *raw, char *vt, uint32_t tid) {
  if constexpr (MATRIX) fa3__transpose_v_ldsm<DV, BN>(raw, vt, tid);
  else fa3__transpose_v_words<DV, BN>(raw, vt, tid);
}

#endif /* __CUDACC__ */
#endif /* FATTN_ATTN_FA3_FA3_FP8_H */
