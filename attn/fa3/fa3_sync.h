/* fa3_sync.h: the Hopper kernels' synchronisation and copy primitives: mbarriers, the named
 * barriers (one enum), TMA box loads, proxy fences and the wgmma ordering instructions. */
#ifndef FATTN_ATTN_FA3_FA3_SYNC_H
#define FATTN_ATTN_FA3_FA3_SYNC_H

#include <cuda.h>

#include "attn/fa2/fa2.h"

#ifdef __CUDACC__
#include <cudaTypedefs.h>

#include <atomic>

/* Named barriers (bar.sync ids; 0 is __syncthreads). A consumer's turn barrier is the one the
 * consumer before it in the ring arrives on once it has issued its GEMMs, so the consumers
 * issue in turn (FA3__MAX_CONSUMERS of them at most). */
enum { FA3__MAX_CONSUMERS = 3 };
enum fa3__named_barrier {
  FA3__BAR_PRODUCER = 1,                    /* the producer warpgroup's 128 threads */
  FA3__BAR_Q = 2,                           /* + c: consumer c's 128 threads, once its Q slabs have landed */
  FA3__BAR_TURN = 2 + FA3__MAX_CONSUMERS,   /* + c: consumer c may issue (256 threads: it and the one before) */
};

__device__ __forceinline__ void fa3__bar_init(uint64_t *b, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(fa2__smem(b)), "r"(count));
}
__device__ __forceinline__ void fa3__arrive(uint64_t *b) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(fa2__smem(b)) : "memory");
}
__device__ __forceinline__ void fa3__arrive_tx(uint64_t *b, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(fa2__smem(b)), "r"(bytes)
               : "memory");
}
/* Arrives once every cp.async this thread issued so far has landed (counted on top). */
__device__ __forceinline__ void fa3__arrive_cp(uint64_t *b) {
  asm volatile("cp.async.mbarrier.arrive.shared::cta.b64 [%0];\n" ::"r"(fa2__smem(b)) : "memory");
}
__device__ __forceinline__ void fa3__wait(uint64_t *b, uint32_t parity) {
  asm volatile(
      "{\n.reg .pred p;\nWAIT_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
      "@!p bra WAIT_%=;\n}\n" ::"r"(fa2__smem(b)),
      "r"(parity)
      : "memory");
}
__device__ __forceinline__ void fa3__tma3(void *dst, const CUtensorMap *map, int c0, int c1, int c2, uint64_t *b) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];\n" ::"r"(
          fa2__smem(dst)),
      "l"((uint64_t)map), "r"(c0), "r"(c1), "r"(c2), "r"(fa2__smem(b))
      : "memory");
}
__device__ __forceinline__ void fa3__sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void fa3__arrive_bar(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
/* Four 8 x 8 matrices of 16-bit pairs to shared memory, one row address a lane (lane i: row
 * i % 8 of matrix i / 8); r[j] is this lane's pair of matrix j (row lane / 4, pair lane % 4). */
__device__ __forceinline__ void fa3__stm4(void *row, const uint32_t (&r)[4]) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(fa2__smem(row)), "r"(r[0]),
               "r"(r[1]), "r"(r[2]), "r"(r[3])
               : "memory");
}
/* Ordinary (and cp.async) writes to shared memory made visible to wgmma and TMA readers. */
__device__ __forceinline__ void fa3__fence_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

/* ---- wgmma ordering and operand descriptors */

__device__ __forceinline__ void fa3__mma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void fa3__mma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void fa3__mma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
/* Keeps the compiler from moving accumulator registers across an asynchronous wgmma. */
template <int N> __device__ __forceinline__ void fa3__pin(float *d) {
#pragma unroll
  for (int i = 0; i < N; i++) asm volatile("" : "+f"(d[i]));
}

/* Shared-memory operand descriptors in the 128-byte swizzle (rows of 128 bytes, 8-row groups
 * 1024 bytes apart), as two words. The high word is the same for every operand; the low one
 * holds the address / 16 (14 bits: shared memory is under 256 KB, so adding an offset inside
 * it never carries out) and the distance between 64-column slabs (read only for MN-major
 * operands). A GEMM's descriptors are then its operand's low word plus constants, which ptxas
 * keeps in uniform registers, not a mask and shift an instruction rebuilt in vector ones. */
constexpr uint32_t FA3__DESC_HI = (1024u >> 4) | (1u << 30);
/* The 64-byte swizzle (rows of 64 bytes, 8-row groups 512 bytes apart): e4m3 V^T of 64-slot blocks. */
constexpr uint32_t FA3__DESC_HI_64B = (512u >> 4) | (2u << 30);
__device__ __forceinline__ uint32_t fa3__desc_lo(const void *p, uint32_t lbo) {
  return ((fa2__smem(p) & 0x3FFFFu) >> 4) | (((lbo >> 4) & 0x3FFFu) << 16);
}
template <uint32_t HI = FA3__DESC_HI> __device__ __forceinline__ uint64_t fa3__desc_at(uint32_t lo, uint32_t byte_offset) {
  return ((uint64_t)HI << 32) | (lo + (byte_offset >> 4));
}

/* x, which every lane of the warp holds, as lane 0's: ptxas then knows it is warp-uniform, and
 * keeps what is computed from it (ring stages, GEMM descriptors) in uniform registers. */
__device__ __forceinline__ uint32_t fa3__uniform(uint32_t x) { return __shfl_sync(0xffffffffu, x, 0); }

/* A block's place in the K/V ring: its stage and the parity of that stage's round. */
template <int ST> struct fa3__ring {
  uint32_t stage = 0, phase = 0;
  __device__ __forceinline__ void next() {
    if (++stage == (uint32_t)ST) stage = 0, phase ^= 1u;
  }
};
/* The driver's cuTensorMapEncodeTiled (host code), looked up once per translation unit's first
 * call (threads may look it up at once: they store the same pointer); NULL where the driver
 * lacks it. */
static inline PFN_cuTensorMapEncodeTiled_v12000 fa3__tmap_encoder() {
  static std::atomic<void *> entry;
  void *fn = entry.load(std::memory_order_acquire);
  if (!fn) {
    cudaDriverEntryPointQueryResult q;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess || !fn)
      return nullptr;
    entry.store(fn, std::memory_order_release);
  }
  return (PFN_cuTensorMapEncodeTiled_v12000)fn;
}

/* Byte offset of 16-byte chunk c of row r inside a swizzled slab. */
__device__ __forceinline__ uint32_t fa3__swz(uint32_t r, uint32_t c) { return r * 128u + ((c ^ (r & 7u)) << 4); }
/* The same in the 64-byte swizzle: chunk bits 4-5 of the address XOR its bits 7-8. */
__device__ __forceinline__ uint32_t fa3__swz64(uint32_t r, uint32_t c) { return r * 64u + ((c ^ ((r >> 1) & 3u)) << 4); }

#endif /* __CUDACC__ */
#endif /* FATTN_ATTN_FA3_FA3_SYNC_H */
