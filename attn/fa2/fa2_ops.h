/* fa2_ops.h: device helpers of the portable sm_80+ kernels (fa2, and fa3's fallbacks): cp.async,
 * ldmatrix, mma.sync and movmatrix, fp8 widening, a row's sink, warp reductions, visibility, row copies. */
#ifndef FATTN_ATTN_FA2_FA2_OPS_H
#define FATTN_ATTN_FA2_FA2_OPS_H
#ifdef __CUDACC__

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <string.h>

#include <type_traits>

#include "attn/backend.h"

__device__ __forceinline__ uint32_t fa2__smem(const void *p) {
  return (uint32_t)__cvta_generic_to_shared(p);
}
/* 16-byte async copy; src_bytes 0 fills zeros without touching src. */
__device__ __forceinline__ void fa2__cp16(void *dst, const void *src, int ok) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(fa2__smem(dst)),
               "l"(src), "r"(ok ? 16 : 0));
}
__device__ __forceinline__ void fa2__commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> __device__ __forceinline__ void fa2__wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}
__device__ __forceinline__ void fa2__ldm4(uint32_t *r, const void *p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(fa2__smem(p)));
}
__device__ __forceinline__ void fa2__ldm4t(uint32_t *r, const void *p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(fa2__smem(p)));
}
/* c += a * b, m16n8k16, fp32 accumulate. */
template <typename T> __device__ __forceinline__ void fa2__mma(float *c, const uint32_t *a, const uint32_t *b);
template <> __device__ __forceinline__ void fa2__mma<__nv_bfloat16>(float *c, const uint32_t *a, const uint32_t *b) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
template <> __device__ __forceinline__ void fa2__mma<__half>(float *c, const uint32_t *a, const uint32_t *b) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
template <typename T> __device__ __forceinline__ uint32_t fa2__pack(float x, float y);
template <> __device__ __forceinline__ uint32_t fa2__pack<__nv_bfloat16>(float x, float y) {
  __nv_bfloat162 v = __floats2bfloat162_rn(x, y);
  return *(uint32_t *)&v;
}
template <> __device__ __forceinline__ uint32_t fa2__pack<__half>(float x, float y) {
  __half2 v = __floats2half2_rn(x, y);
  return *(uint32_t *)&v;
}
template <typename T> __device__ __forceinline__ T fa2__from_f(float x);
template <> __device__ __forceinline__ __nv_bfloat16 fa2__from_f<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }
template <> __device__ __forceinline__ __half fa2__from_f<__half>(float x) { return __float2half_rn(x); }

/* Two e4m3 bytes (low byte first) to a packed pair of T; exact for bf16 and fp16. */
template <typename T> __device__ __forceinline__ uint32_t fa2__e4m3x2(uint16_t b) {
  __half2_raw h = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)b, __NV_E4M3);
  if constexpr (sizeof(T) == 2 && __is_same(T, __half)) {
    return (uint32_t)h.x | ((uint32_t)h.y << 16);
  } else {
    float2 f = __half22float2(*(__half2 *)&h);
    return fa2__pack<T>(f.x, f.y);
  }
}

/* A packed pair of Q's type as the mma's type (bf16 Q narrows to fp16 beside fp8 KV). */
template <typename T, typename TQ> __device__ __forceinline__ uint32_t fa2__to_mma(uint32_t w) {
  if constexpr (std::is_same<T, TQ>::value) {
    return w;
  } else {
    const __nv_bfloat162 b = *(const __nv_bfloat162 *)&w;
    return fa2__pack<T>(__low2float(b), __high2float(b));
  }
}

/* Sixteen e4m3 values (a 16-byte chunk, lowest byte first) to two chunks of eight fp16, exact. */
__device__ __forceinline__ void fa2__e4m3x16(uint4 w, uint4 *lo, uint4 *hi) {
  const uint32_t x[4] = {w.x, w.y, w.z, w.w};
  uint32_t h[8];
#pragma unroll
  for (int k = 0; k < 4; k++) {
    h[2 * k] = fa2__e4m3x2<__half>((uint16_t)(x[k] & 0xffffu));
    h[2 * k + 1] = fa2__e4m3x2<__half>((uint16_t)(x[k] >> 16));
  }
  *lo = make_uint4(h[0], h[1], h[2], h[3]);
  *hi = make_uint4(h[4], h[5], h[6], h[7]);
}

/* A 16-byte chunk of eight bf16 narrowed to fp16 (exact for |x| in [2^-14, 65504]): bf16 Q
 * beside fp8 KV, whose MMAs run in fp16. */
__device__ __forceinline__ uint4 fa2__bf16x8_to_f16(uint4 w) {
  return make_uint4(fa2__to_mma<__half, __nv_bfloat16>(w.x), fa2__to_mma<__half, __nv_bfloat16>(w.y),
                    fa2__to_mma<__half, __nv_bfloat16>(w.z), fa2__to_mma<__half, __nv_bfloat16>(w.w));
}

/* 8x8 transpose of 16-bit elements across the warp: a thread's pair of row g becomes the pair
 * of column g, so the transposed scores' accumulator feeds the next mma as its B operand. */
__device__ __forceinline__ uint32_t fa2__transpose8(uint32_t x) {
  uint32_t y;
  asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(y) : "r"(x));
  return y;
}

/* 2^x on the SFU alone. exp2f adds a range test and two multiplies a call so that results
 * under 2^-126 stay subnormal; a softmax weight that small is 0 in bf16 and fp16 anyway. */
__device__ __forceinline__ float fa2__exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

/* A row's online-softmax step: mn is its max over every score seen so far (log2 units, this
 * block's included). Returns the base this block's exps subtract (0 for a row that has seen
 * nothing, so that its -inf scores give 0), moves the running max to mn and leaves in *alpha
 * the factor the row's sum (here) and its O (the caller) take. */
__device__ __forceinline__ float fa2__row_step(float &m, float &l, float mn, float *alpha) {
  const float base = mn == -INFINITY ? 0.f : mn;
  *alpha = fa2__exp2(m - base);
  m = mn;
  l *= *alpha;
  return base;
}

/* A row's softmax denominator with its sink, where m is the largest score the row sees (finite),
 * l the sum of exp(x - m) over its scores and s the sink (-INFINITY: none), all in log2 units
 * where BASE2, else natural ones. The sum is taken against max(m, s): against m the sink's term
 * exp(s - m) overflows float once s passes m by 88 (128 in log2 units), and the LSE with it,
 * which whatever merges by LSE turns into NaN. Where s <= m the sum is l plus the sink's term, so
 * a row without a sink keeps l's bits. Sets lse, the row's LSE, and returns o_mul times the factor
 * that turns the row's sums of exp(x - m) V into its O: 0 where the sink outweighs every score
 * past float's range, as O then is. */
template <bool BASE2>
__device__ __forceinline__ float fa2__sink_join(float m, float l, float s, float o_mul, float &lse) {
  const float top = fmaxf(m, s);
  const float em = top == m ? 1.f : BASE2 ? exp2f(m - top) : expf(m - top);
  const float sum = l * em + (BASE2 ? exp2f(s - top) : expf(s - top));
  lse = top + (BASE2 ? log2f(sum) : logf(sum));
  return o_mul * em / sum;
}

/* Max and sum over the lanes that differ from this one in lane-index bits LO..HI (powers of
 * two): <1, 2> the 4 lanes of a row in an mma fragment, <4, 16> the 8 that share lane & 3 (a
 * transposed tile's slots). */
template <int LO, int HI> __device__ __forceinline__ float fa2__lanes_max(float x) {
#pragma unroll
  for (int o = LO; o <= HI; o <<= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
  return x;
}
template <int LO, int HI> __device__ __forceinline__ float fa2__lanes_sum(float x) {
#pragma unroll
  for (int o = LO; o <= HI; o <<= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

/* Visibility of slot j for query t of entry e (tree rows included). */
__device__ __forceinline__ bool fa2__vis(const fattn__layer_params &l, int causal, bool tree,
                                         const uint64_t *mrow, uint32_t prefix, uint32_t qpos,
                                         uint32_t j) {
  if (tree && j >= prefix) {
    uint32_t b = j - prefix; /* the bit replaces causality; window and chunk still apply */
    if (b >= 64u || !((*mrow >> b) & 1ull)) return false;
    return (j <= qpos ? fattn__visible(&l, causal, qpos, j) : fattn__visible(&l, causal, j, qpos)) != 0;
  }
  return fattn__visible(&l, causal, qpos, j) != 0;
}

/* An entry read through L2, so that a kernel may read it before fattn__pdl_wait (attn/pdl.h). */
__device__ __forceinline__ fattn__entry fa2__entry(const fattn__entry *p) {
  static_assert(sizeof(fattn__entry) == 48, "an entry is three 16-byte words");
  const uint4 *w = (const uint4 *)p;
  const uint4 x[3] = {__ldcg(w), __ldcg(w + 1), __ldcg(w + 2)};
  fattn__entry e;
  memcpy(&e, x, sizeof e);
  return e;
}

/* Entry owning query tile b: the last entry whose START <= b (tile_start for the planner's
 * tiles, pair_start for the Hopper kernels' tile pairs). */
template <uint32_t fattn__entry::*START = &fattn__entry::tile_start>
__device__ __forceinline__ uint32_t fa2__find(const fattn__entry *e, uint32_t n, uint32_t b) {
  uint32_t lo = 0, hi = n; /* answer in [lo, hi) */
  while (hi - lo > 1u) {
    uint32_t mid = (lo + hi) >> 1;
    if (e[mid].*START <= b) lo = mid; else hi = mid;
  }
  return lo;
}

/* Byte offset of 16-byte chunk c of tile row r. Rows of whole 128-byte lines (SW) are stored
 * unpadded with their chunks XOR-permuted by r & 7, so that ldmatrix's eight rows (r & 7 all
 * different) fall in eight different bank groups: a padded pitch does that too, but leaves rows
 * off 128-byte alignment, and the decode kind streamed 5% slower so (docs/performance.md, decode). */
template <int DROW, bool SW> __device__ __forceinline__ int fa2__at(int r, int c) {
  return r * DROW + (SW ? c ^ (r & 7) : c) * 16;
}

/* Copies one block's rows (16-byte chunks, CH a row; with RANGE only rows [r_lo, r_hi)) for
 * the slots in rsb: chunk c of row r lands at dst + fa2__at<DROW, SW>(r, c). The chunk index
 * per thread is fixed at compile time, so a copy costs one shared load of its slot, one wide
 * multiply-add and the cp.async. ROLLED keeps the loop rolled: each unrolled copy's offsets stay
 * live across the caller's loop, which MLA's long rows (9-18 copies a thread) cannot afford. */
template <int BN, int CH, int NT, int DROW, bool SW, bool RANGE, bool ROLLED = false>
__device__ __forceinline__ void fa2__rows(char *dst, const char *src, size_t stride, const uint32_t *rsb, int tid,
                                          int r_lo, int r_hi) {
#pragma unroll(ROLLED ? 1 : (BN * CH + NT - 1) / NT)
  for (int i = 0; i < (BN * CH + NT - 1) / NT; i++) {
    const int ci = tid + i * NT, r = ci / CH, c = ci % CH;
    if ((BN * CH % NT == 0 || ci < BN * CH) && (!RANGE || (r >= r_lo && r < r_hi))) {
      const uint32_t sl = rsb[r];
      const bool ok = sl != UINT32_MAX;
      fa2__cp16(dst + fa2__at<DROW, SW>(r, c), src + (ok ? (size_t)sl * stride : 0u) + c * 16, ok);
    }
  }
}

#endif /* __CUDACC__ */
#endif /* FATTN_ATTN_FA2_FA2_OPS_H */
