/* pdl.h: programmatic dependent launch for fattn's kernels: a kernel may be launched while the
 * kernel before it in the stream drains, and waits for that one before it touches memory. */
#ifndef FATTN_ATTN_PDL_H
#define FATTN_ATTN_PDL_H

#include <cuda_runtime.h>

#include <utility>

#include "attn/backend.h" /* fattn__pdl_on */
#include "attn/devices.h"

#ifdef __CUDACC__
/* Waits for the grid before (all its writes visible), then lets the next grid be launched, so
 * its blocks are in place when this one ends. Kernels call it before they read anything that
 * the kernels before them in this step may have written. What only the planner wrote (step
 * header, entries, page table) and the pool rows of earlier steps may be read before it, since
 * the planner's kernels let nothing launch before they end (fattn__pdl_wait_alone). Such early
 * reads go around L1 (ld.global.cg), and nothing is written before the wait. */
__device__ __forceinline__ void fattn__pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

/* Lets the next grid launch at once: the first instruction of the store kernel, so that the
 * decode kernel's deep kind does its work before its own wait while the store and the kernel
 * before the store still run, and of the combine, so that a caller's kernel that releases as
 * early lets the next layer's store and decode kernels start under this merge. Both then wait
 * (fattn__pdl_wait_alone); a dependent's wait still covers them, since they end only after
 * that wait. */
__device__ __forceinline__ void fattn__pdl_release() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

/* Waits for the grid before, and lets the next grid launch only once this one has completed
 * (unless it released it already, as the store does): for the planner's kernels, so that
 * every later kernel starts after their writes (step metadata, page table, copied pages) are
 * done. */
__device__ __forceinline__ void fattn__pdl_wait_alone() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

/* kernel<<<grid, block, smem, stream>>>(args...), allowed to overlap the stream's previous
 * kernel where the device supports it (a captured graph keeps the edge as programmatic). */
template <typename... P, typename... A>
static inline cudaError_t fattn__launch(void (*kernel)(P...), dim3 grid, dim3 block, size_t smem, cudaStream_t st,
                                        A &&...args) {
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = st;
  cfg.attrs = attr;
  cfg.numAttrs = fattn__pdl_on() ? 1u : 0u;
  const cudaError_t e = cudaLaunchKernelEx(&cfg, kernel, std::forward<A>(args)...);
  const cudaError_t last = cudaGetLastError(); /* read and cleared, as after <<<>>> */
  return e != cudaSuccess ? e : last;
}
#endif

#endif /* FATTN_ATTN_PDL_H */
