/* serve_mix.cu: the serving benchmark's stand-in for everything between two attention layers:
 * one small kernel derives the next layer's q, k, v from this layer's output, so data flows. */
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "attn/pdl.h"
#include "attn/stamps.h"

#ifdef FATTN_STAMPS
__device__ unsigned long long *mix_stamps; /* measurement builds: attn/stamps.h's buffer */

extern "C" int fattn_bench_mix_stamps(unsigned long long *buf) {
  return (int)cudaMemcpyToSymbol(mix_stamps, &buf, sizeof buf);
}
#endif

// out [tokens, hq, d] -> q [tokens, hq, d], k and v [tokens, hkv, d]; bf16 throughout.
__global__ void mix_kernel(const __nv_bfloat16 *out, __nv_bfloat16 *q, __nv_bfloat16 *k, __nv_bfloat16 *v,
                           uint32_t tokens, uint32_t hq, uint32_t hkv, uint32_t d, uint32_t salt) {
  /* As a serving engine's own PDL-aware kernels do: the next kernels (the store, then the decode
   * kernel) launch at once and do what needs nothing of this one before their own waits. */
  fattn__pdl_release();
  FATTN__STAMP(mix_stamps, FATTN__K_MIX, FATTN__AT_ENTRY);
  fattn__pdl_wait_alone();
  FATTN__STAMP(mix_stamps, FATTN__K_MIX, FATTN__AT_WAITED);
  uint64_t n = (uint64_t)tokens * hq * d;
  for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < n; i += (uint64_t)gridDim.x * blockDim.x) {
    uint32_t c = (uint32_t)(i % d), h = (uint32_t)(i / d % hq);
    uint64_t t = i / ((uint64_t)d * hq);
    float x = __bfloat162float(out[i]);
    float wave = 0.5f * __sinf(0.37f * (float)(c + 3 * h + salt) + 0.011f * (float)t);
    q[i] = __float2bfloat16(0.5f * x + wave);
    if (h < hkv) {
      uint64_t j = (t * hkv + h) * d + c;
      k[j] = __float2bfloat16(0.25f * x - wave);
      v[j] = __float2bfloat16(x + 0.5f * wave);
    }
  }
  FATTN__STAMP(mix_stamps, FATTN__K_MIX, FATTN__AT_DONE);
}

extern "C" int fattn_bench_mix(const void *out, void *q, void *k, void *v, uint32_t tokens, uint32_t hq,
                               uint32_t hkv, uint32_t d, uint32_t salt, void *stream) {
  uint64_t n = (uint64_t)tokens * hq * d;
  uint32_t blocks = (uint32_t)((n + 255) / 256);
  if (blocks > 4096) blocks = 4096;
  if (blocks == 0) return 0;
  return (int)fattn__launch(mix_kernel, dim3(blocks), dim3(256), 0, (cudaStream_t)stream, (const __nv_bfloat16 *)out,
                            (__nv_bfloat16 *)q, (__nv_bfloat16 *)k, (__nv_bfloat16 *)v, tokens, hq, hkv, d, salt);
}
