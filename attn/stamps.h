/* stamps.h: the GPU's global timer, and timestamps inside a step's kernels for measurement
 * builds (-DFATTN_STAMPS): thread 0 of each block writes it and clock64 at named points. */
#ifndef FATTN_ATTN_STAMPS_H
#define FATTN_ATTN_STAMPS_H

/* What one layer of a step leaves: [kernel][block][point][2] words (globaltimer ns, clock64),
 * each launch overwriting the one before, so that after a step the buffer holds its last
 * layer's. `make BUILD=build-stamps CFLAGS='-O2 -g -DFATTN_STAMPS' NVCCFLAGS='-O3 -g -lineinfo
 * -DFATTN_STAMPS'` builds them; `fattn-bench serve` then prints a bs 1 layer's timeline
 * (tools/serve_stamps.c). Builds without the flag compile none of it. */
#define FATTN__STAMP_BLOCKS 1024u /* blocks past this many of a grid leave no stamps */
enum { FATTN__K_STORE, FATTN__K_DECODE, FATTN__K_COMBINE, FATTN__K_MIX, FATTN__STAMP_KERNELS };
enum { FATTN__AT_ENTRY, FATTN__AT_WAITED, FATTN__AT_LOOPED, FATTN__AT_DONE, FATTN__STAMP_POINTS };
#define FATTN__STAMP_WORDS (FATTN__STAMP_KERNELS * FATTN__STAMP_BLOCKS * FATTN__STAMP_POINTS * 2u)

#ifdef __CUDACC__
/* Nanoseconds of the GPU's global timer, one clock for every SM (clock64 is per SM). */
__device__ __forceinline__ unsigned long long fattn__globaltimer(void) {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
#endif

#if defined(__CUDACC__) && defined(FATTN_STAMPS)
__device__ __forceinline__ void fattn__stamp(unsigned long long *buf, unsigned kernel, unsigned point) {
  const unsigned b = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  if (!buf || threadIdx.x != 0u || b >= FATTN__STAMP_BLOCKS) return;
  unsigned long long *p = buf + ((kernel * FATTN__STAMP_BLOCKS + b) * FATTN__STAMP_POINTS + point) * 2u;
  p[0] = fattn__globaltimer();
  p[1] = (unsigned long long)clock64();
}
#define FATTN__STAMP(buf, kernel, point) fattn__stamp(buf, kernel, point)
#else
#define FATTN__STAMP(buf, kernel, point) ((void)0)
#endif

#endif /* FATTN_ATTN_STAMPS_H */
