/* fa2_store.cu: fattn__fa2_store_kv, the new K/V rows of a step into their paged slots
 * (16-byte loads, conversion to the cache dtype, fp8 e4m3 with scale, saturating). */
#include "attn/fa2/fa2.h"

__device__ __forceinline__ float fa2__ld(const void *p, size_t i, uint32_t dt) {
  if (dt == FATTN_DTYPE_BF16) return __bfloat162float(((const __nv_bfloat16 *)p)[i]);
  return __half2float(((const __half *)p)[i]);
}

/* Blocks of 256 threads an SM holds at once: a grid of at most this many a SM starts whole. */
#define FA2__STORE_BLOCKS_PER_SM 8u

/* One CTA per new row; a thread moves 8 elements of one (K or V, kv head) piece. */
__global__ void __launch_bounds__(256) fa2__store(const fattn__layer_params l, const fattn__step_params s,
                                                  const void *k, const void *v, uint32_t early) {
  fattn__pdl_release(); /* the decode kernel after it has work before its own wait */
  FATTN__STAMP(s.stamps, FATTN__K_STORE, FATTN__AT_ENTRY);
  /* A grid that starts whole finds its row's place before the wait, from what only the planner
   * wrote (attn/pdl.h), through L2: only the row's load and write follow the wait. In a larger
   * grid (prefill) most blocks start after the wait has returned, and the same dependent loads
   * through L2, not L1, would lengthen every one of them. */
  if (!early) fattn__pdl_wait_alone();
  auto ld = [early](const uint32_t *p) -> uint32_t { return early ? __ldcg(p) : *p; };
  const uint32_t row = blockIdx.x, n = ld(&s.hdr->num_entries);
  const bool live = n != 0u && row < ld(&s.hdr->num_new_tokens);
  size_t dst_row = 0;
  if (live) {
    uint32_t lo = 0, hi = n;
    while (hi - lo > 1u) {
      uint32_t mid = (lo + hi) >> 1;
      if (ld(&s.entries[mid].new_start) <= row) lo = mid; else hi = mid;
    }
    const fattn__entry e = early ? fa2__entry(s.entries + lo) : s.entries[lo];
    const uint32_t slot = e.kv_len - e.new_len + (row - e.new_start);
    const int32_t *pt = l.page_table + (size_t)e.seq * l.pages_per_seq + slot / l.page_size;
    const uint32_t pg = (uint32_t)(early ? __ldcg(pt) : *pt);
    dst_row = ((size_t)pg * l.page_size + slot % l.page_size) * l.num_kv_heads;
  }
  if (early) fattn__pdl_wait_alone(); /* every block: this grid must not end before the one it follows */
  FATTN__STAMP(s.stamps, FATTN__K_STORE, FATTN__AT_WAITED);
  if (!live) return;
  const uint32_t kc = l.num_kv_heads * l.head_dim / 8u;
  const uint32_t vc = l.mla ? 0u : l.num_kv_heads * l.head_dim_v / 8u;
  for (uint32_t c = threadIdx.x; c < kc + vc; c += blockDim.x) {
    const int isk = c < kc;
    const uint32_t cc = isk ? c : c - kc, d = isk ? l.head_dim : l.head_dim_v;
    const char *src = (const char *)(isk ? k : v) + ((size_t)row * l.num_kv_heads * d + cc * 8u) * 2u;
    const size_t di = dst_row * d + cc * 8u;
    char *pool = (char *)(isk ? l.k_pool : l.v_pool);
    const uint4 in = *(const uint4 *)src;
    if (l.kv_dtype == l.q_dtype) {
      *(uint4 *)(pool + di * 2u) = in;
    } else if (l.kv_dtype == FATTN_DTYPE_FP8_E4M3) {
      const float sc = isk ? l.k_scale : l.v_scale;
      uint8_t b[8];
#pragma unroll
      for (int i = 0; i < 8; i++)
        b[i] = (uint8_t)__nv_cvt_float_to_fp8(fa2__ld(&in, i, l.q_dtype) / sc, __NV_SATFINITE, __NV_E4M3);
      uint2 o;
      o.x = b[0] | (b[1] << 8) | (b[2] << 16) | ((uint32_t)b[3] << 24);
      o.y = b[4] | (b[5] << 8) | (b[6] << 16) | ((uint32_t)b[7] << 24);
      *(uint2 *)(pool + di) = o;
    } else {
      uint32_t w[4];
#pragma unroll
      for (int i = 0; i < 4; i++) {
        float x = fa2__ld(&in, 2 * i, l.q_dtype), y = fa2__ld(&in, 2 * i + 1, l.q_dtype);
        w[i] = l.kv_dtype == FATTN_DTYPE_BF16 ? fa2__pack<__nv_bfloat16>(x, y) : fa2__pack<__half>(x, y);
      }
      *(uint4 *)(pool + di * 2u) = make_uint4(w[0], w[1], w[2], w[3]);
    }
  }
  FATTN__STAMP(s.stamps, FATTN__K_STORE, FATTN__AT_DONE);
}

extern "C" int fattn__fa2_store_kv(fattn__layer_params l, fattn__step_params s, const void *k,
                                   const void *v, void *stream) {
  if (l.head_dim % 8u || l.head_dim_v % 8u || l.page_size == 0u) return (int)cudaErrorInvalidValue;
  if (s.cap_new_tokens == 0u) return (int)cudaSuccess;
  const uint32_t early = s.cap_new_tokens <= FA2__STORE_BLOCKS_PER_SM * (uint32_t)fa2__sm_count();
  return (int)fattn__launch(fa2__store, dim3(s.cap_new_tokens), dim3(256), 0, (cudaStream_t)stream, l, s, k, v,
                            early);
}
