/* support_gpu.cu: the GPU test helpers of tests/support_gpu.h: cuRAND Philox normal fills
 * in bf16 / fp16 / fp8 / float, NaN poisoning (whole buffers or unused pool rows), a stream hold,
 * a copy chained behind the stream's last kernel, and one that releases its dependents early. */
#include "tests/support_gpu.h"

#include "attn/pdl.h"
#include "attn/stamps.h" /* fattn__globaltimer */

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <curand_kernel.h>
#include <math.h>

__device__ static void put(void *p, size_t i, uint32_t dtype, float x) {
  switch (dtype) {
    case 1u: ((__nv_bfloat16 *)p)[i] = __float2bfloat16_rn(x); break;
    case 2u: ((__half *)p)[i] = __float2half_rn(x); break;
    case 3u: ((uint8_t *)p)[i] = (uint8_t)__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3); break;
    default: ((float *)p)[i] = x; break;
  }
}

__global__ static void randn_kernel(void *p, size_t n, uint32_t dtype, float sd, uint64_t seed) {
  size_t tid = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  size_t stride = (size_t)gridDim.x * blockDim.x;
  curandStatePhilox4_32_10_t st;
  curand_init(seed, tid, 0, &st);
  for (size_t base = tid * 4; base < n; base += stride * 4) {
    float4 r = curand_normal4(&st);
    float v[4] = {r.x, r.y, r.z, r.w};
    for (int k = 0; k < 4 && base + k < n; k++) {
      float x = v[k] * sd;
      if (fabsf(x) < sd / 64.f) x = x < 0.f ? -sd / 64.f : sd / 64.f; /* never 0 after rounding */
      put(p, base + k, dtype, x);
    }
  }
}

__global__ static void nan_kernel(void *p, size_t n, uint32_t dtype) {
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    switch (dtype) {
      case 1u: ((uint16_t *)p)[i] = 0x7fc0u; break;
      case 2u: ((uint16_t *)p)[i] = 0x7e00u; break;
      case 3u: ((uint8_t *)p)[i] = 0x7fu; break;
      default: ((uint32_t *)p)[i] = 0x7fc00000u; break;
    }
  }
}

__global__ static void nan_rows_kernel(void *p, const uint8_t *used, size_t rows, size_t re, uint32_t dtype) {
  size_t n = rows * re;
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    if (used[i / re]) continue;
    switch (dtype) {
      case 1u: ((uint16_t *)p)[i] = 0x7fc0u; break;
      case 2u: ((uint16_t *)p)[i] = 0x7e00u; break;
      case 3u: ((uint8_t *)p)[i] = 0x7fu; break;
      default: ((uint32_t *)p)[i] = 0x7fc00000u; break;
    }
  }
}

static unsigned blocks_for(size_t n) {
  size_t b = (n + 255) / 256;
  return (unsigned)(b < 1 ? 1 : b > 4096 ? 4096 : b);
}

extern "C" int fattn_test_gpu_randn(void *dev, size_t n, uint32_t dtype, float stddev, uint64_t seed) {
  if (n == 0) return 0;
  randn_kernel<<<blocks_for((n + 3) / 4), 256>>>(dev, n, dtype, stddev, seed);
  return (int)cudaGetLastError();
}

extern "C" int fattn_test_gpu_nan(void *dev, size_t n, uint32_t dtype) {
  if (n == 0) return 0;
  nan_kernel<<<blocks_for(n), 256>>>(dev, n, dtype);
  return (int)cudaGetLastError();
}

extern "C" int fattn_test_gpu_nan_rows(void *dev, const uint8_t *used_dev, size_t rows, size_t row_elems,
                                       uint32_t dtype) {
  if (rows * row_elems == 0) return 0;
  nan_rows_kernel<<<blocks_for(rows * row_elems), 256>>>(dev, used_dev, rows, row_elems, dtype);
  return (int)cudaGetLastError();
}

__device__ static void spin_for(uint64_t ns) {
  const uint64_t t0 = fattn__globaltimer();
  do __nanosleep(1000);
  while (fattn__globaltimer() - t0 < ns);
}

__global__ static void hold_kernel(uint64_t ns) { spin_for(ns); }

extern "C" int fattn_test_gpu_hold(void *stream, uint32_t us) {
  hold_kernel<<<1, 1, 0, (cudaStream_t)stream>>>((uint64_t)us * 1000u);
  return (int)cudaGetLastError();
}

/* A copy chained behind the stream's last kernel. With late_ns, it releases its dependents at
 * its first instruction and writes late: any read of dst by the kernels after it that does not
 * wait for this grid sees the data from before. */
__global__ static void copy_kernel(uint4 *dst, const uint4 *src, size_t n, uint64_t late_ns) {
  if (late_ns) fattn__pdl_release();
  fattn__pdl_wait(); /* then releases, where it has not */
  if (late_ns) spin_for(late_ns);
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    dst[i] = src[i];
}

static int launch_copy(void *stream, void *dst, const void *src, size_t bytes, uint32_t late_us) {
  if (bytes % 16u) return (int)cudaErrorInvalidValue;
  return (int)fattn__launch(copy_kernel, dim3(blocks_for(bytes / 16u)), dim3(256), 0, (cudaStream_t)stream,
                            (uint4 *)dst, (const uint4 *)src, bytes / 16u, (uint64_t)late_us * 1000u);
}

extern "C" int fattn_test_gpu_copy_after(void *stream, void *dst, const void *src, size_t bytes) {
  return launch_copy(stream, dst, src, bytes, 0u);
}

extern "C" int fattn_test_gpu_copy_late(void *stream, void *dst, const void *src, size_t bytes, uint32_t us) {
  return launch_copy(stream, dst, src, bytes, us);
}

extern "C" size_t fattn_test_count_nan(const void *x, size_t n, uint32_t dtype) {
  size_t c = 0;
  for (size_t i = 0; i < n; i++) {
    switch (dtype) {
      case 1u: c += (((const uint16_t *)x)[i] & 0x7fffu) > 0x7f80u; break;
      case 2u: c += (((const uint16_t *)x)[i] & 0x7fffu) > 0x7c00u; break;
      case 3u: c += (((const uint8_t *)x)[i] & 0x7fu) == 0x7fu; break;
      default: c += isnan(((const float *)x)[i]) != 0; break;
    }
  }
  return c;
}
