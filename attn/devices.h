/* devices.h: what the kernels' host code caches per CUDA device (SM count, PDL, fa3, kernel
 * attributes): one slot per device ordinal, filled race-free by whichever thread asks first. */
#ifndef FATTN_ATTN_DEVICES_H
#define FATTN_ATTN_DEVICES_H

/* Device ordinals fattn serves: 0 .. FATTN__MAX_DEVICES - 1 (fattn_create rejects the rest). */
#define FATTN__MAX_DEVICES 64

#include <cuda_runtime_api.h>

/* The calling thread's current CUDA device, -1 where none can be read. */
static inline int fattn__current_device(void) {
  int dev = -1;
  if (cudaGetDevice(&dev) != cudaSuccess) {
    cudaGetLastError();
    return -1;
  }
  return dev;
}

#ifdef __cplusplus
#include <cuda_runtime.h>

#include <atomic>

/* The current device, or -1 where it cannot be read or lies past the tables (then nothing is
 * cached and every ask reads the device again). */
static inline int fattn__device_now() {
  const int dev = fattn__current_device();
  return dev >= 0 && dev < FATTN__MAX_DEVICES ? dev : -1;
}

/* One non-negative int per device; a slot holds value + 1, 0 while unknown. */
typedef std::atomic<int> fattn__device_facts[FATTN__MAX_DEVICES];

/* The current device's fact, read with read(dev) (dev may be -1) the first time. Threads that
 * ask at once may each read it: they store the same value, atomically. */
template <typename F>
static inline int fattn__device_fact(fattn__device_facts &facts, F read) {
  const int dev = fattn__device_now();
  if (dev < 0) return read(dev);
  const int have = facts[dev].load(std::memory_order_relaxed);
  if (have) return have - 1;
  const int v = read(dev);
  facts[dev].store(v + 1, std::memory_order_relaxed);
  return v;
}

/* Kernel k's dynamic shared memory limit, set once per device (a function attribute is the
 * device's); done is that kernel's own table. Setting it twice at once is harmless. */
template <typename K>
static inline cudaError_t fattn__smem_attr(std::atomic<unsigned char> (&done)[FATTN__MAX_DEVICES], K k,
                                           int smem) {
  const int dev = fattn__device_now();
  if (dev >= 0 && done[dev].load(std::memory_order_acquire)) return cudaSuccess;
  const cudaError_t err = cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (err == cudaSuccess && dev >= 0) done[dev].store(1, std::memory_order_release);
  return err;
}
#endif /* __cplusplus */

#endif /* FATTN_ATTN_DEVICES_H */
