/* read_pages.cu: the bandwidth rooflines of the decode benchmark: kernels that only read the K
 * and V pages a step attends to, by plain loads or through a decode block's copy ring; and the
 * kernel that holds the stream while a timed call is queued. */
#include <cuda_runtime.h>

extern "C" {
#include "attn/params.h"
}
#include "attn/stamps.h" /* fattn__globaltimer */

__global__ void read_pages_kernel(fattn__layer_params l, fattn__step_params s, uint32_t elem_bytes, float *sink) {
  const fattn__entry e = s.entries[blockIdx.y];
  uint32_t first = blockIdx.x * l.page_size;
  if (first >= e.kv_len) return;
  uint32_t page = (uint32_t)l.page_table[(size_t)e.seq * l.pages_per_seq + blockIdx.x];
  uint32_t tokens = min(l.page_size, e.kv_len - first);
  uint64_t row = (uint64_t)l.num_kv_heads * l.head_dim * elem_bytes; // bytes of one token's K
  const uint4 *k = (const uint4 *)((const char *)l.k_pool + (uint64_t)page * l.page_size * row);
  const uint4 *v = (const uint4 *)((const char *)l.v_pool + (uint64_t)page * l.page_size * row);
  uint32_t n = (uint32_t)(tokens * row / 16), acc = 0;
  for (uint32_t i = threadIdx.x; i < n; i += blockDim.x) {
    uint4 a = __ldg(k + i), b = l.v_pool ? __ldg(v + i) : make_uint4(0u, 0u, 0u, 0u); /* MLA: no V pool */
    acc ^= a.x ^ a.y ^ a.z ^ a.w ^ b.x ^ b.y ^ b.z ^ b.w;
  }
  if (acc == 0x9e3779b9u) sink[threadIdx.x] = (float)acc; // never true in practice; keeps the loads
}

/* The copy ring of a decode kernel alone (`--roofline ring`): a warp a block an (entry, kv head,
 * split) of the planned step, cp.async of the head's 256-byte rows, 8-token stages 4 deep, the
 * next stage issued before the wait; only a word of each stage is read. d 128, 16-bit KV. */
#define RING_TOK 8
#define RING_ST 4
#ifndef RING_PITCH
#define RING_PITCH 256 /* bytes between a stage's rows; 272, a padded pitch, streams 7% slower (docs/performance.md) */
#endif
#define RING_STAGE (2 * RING_TOK * RING_PITCH)
__global__ void __launch_bounds__(32) ring_pages_kernel(fattn__layer_params l, fattn__step_params s, float *sink) {
  extern __shared__ __align__(16) char ring[];
  const uint32_t lane = threadIdx.x, ei = blockIdx.x / l.num_kv_heads, kvh = blockIdx.x % l.num_kv_heads;
  const fattn__entry e = s.entries[ei];
  const uint32_t nsp = e.num_splits > 1u ? e.num_splits : 1u;
  const int32_t *pt = l.page_table + (size_t)e.seq * l.pages_per_seq;
  const size_t rstride = (size_t)l.num_kv_heads * 256u;
  const uint32_t shift = __ffs(l.page_size) - 1; /* page sizes are powers of two */
  const char *kp = (const char *)l.k_pool + kvh * 256u + (lane & 15u) * 16u;
  const char *vp = (const char *)l.v_pool + kvh * 256u + (lane & 15u) * 16u;
  uint32_t acc = 0;
  for (uint32_t sp = blockIdx.y; sp < nsp; sp += gridDim.y) {
    const uint32_t kb = sp * e.split_len, ke = min(kb + e.split_len, e.kv_len);
    const int nblk = ke > kb ? (int)((ke - kb + RING_TOK - 1) / RING_TOK) : 0;
    auto copy = [&](int blk) {
      if (blk < nblk)
        for (int i = 0; i < RING_TOK / 2; i++) {
          const uint32_t j = min(kb + (uint32_t)blk * RING_TOK + (lane >> 4) + 2u * i, ke - 1u);
          const size_t row = ((size_t)(uint32_t)pt[j >> shift] << shift) + (j & (l.page_size - 1u));
          char *dst = ring + (blk % RING_ST) * RING_STAGE + ((lane >> 4) + 2u * i) * RING_PITCH + (lane & 15u) * 16u;
          asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"((uint32_t)__cvta_generic_to_shared(dst)),
                       "l"(kp + row * rstride));
          asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"((uint32_t)__cvta_generic_to_shared(
                           dst + RING_TOK * RING_PITCH)), "l"(vp + row * rstride));
        }
      asm volatile("cp.async.commit_group;\n");
    };
    for (int b = 0; b < RING_ST - 1; b++) copy(b);
    for (int blk = 0; blk < nblk; blk++) {
      __syncwarp();
      copy(blk + RING_ST - 1);
      asm volatile("cp.async.wait_group %0;\n" ::"n"(RING_ST - 1));
      __syncwarp();
      acc ^= *(const uint32_t *)(ring + (blk % RING_ST) * RING_STAGE + lane * 16u);
    }
    asm volatile("cp.async.wait_group 0;\n");
    __syncwarp();
  }
  if (acc == 0x9e3779b9u) sink[lane] = (float)acc;
}

extern "C" int fattn_bench_ring_pages(const fattn__layer_params *l, const fattn__step_params *s, uint32_t entries,
                                      float *sink, void *stream) {
  if (l->head_dim != 128u || l->kv_dtype == 3u) return (int)cudaErrorInvalidValue;
  dim3 grid(entries * l->num_kv_heads, s->max_splits < 64u ? s->max_splits : 64u);
  ring_pages_kernel<<<grid, 32, RING_ST * RING_STAGE, (cudaStream_t)stream>>>(*l, *s, sink);
  return (int)cudaGetLastError();
}

extern "C" int fattn_bench_read_pages(const fattn__layer_params *l, const fattn__step_params *s, uint32_t entries,
                                      float *sink, void *stream) {
  uint32_t elem = l->kv_dtype == 3u ? 1u : 2u;
  dim3 grid(l->pages_per_seq, entries);
  read_pages_kernel<<<grid, 256, 0, (cudaStream_t)stream>>>(*l, *s, elem, sink);
  return (int)cudaGetLastError();
}

/* Spins one thread for `ns` of the GPU's global timer. Queued before a timed call's start
 * event, it keeps the GPU busy while the host issues the call, so that the events time the
 * GPU's own work, not the host's launch latency (the blocking kernel of NVIDIA's nvbench).
 * It leaves the SM cycles and timer nanoseconds it spun in hold_clock: the SM clock the timed
 * call started at (runs of one binary that differ by 10% may differ in it; docs/performance.md). */
__device__ unsigned long long hold_clock[2];

__global__ void hold_kernel(unsigned long long ns) {
  unsigned long long t;
  const long long c0 = clock64();
  const unsigned long long t0 = fattn__globaltimer();
  do t = fattn__globaltimer(); while (t - t0 < ns);
  hold_clock[0] = (unsigned long long)(clock64() - c0);
  hold_clock[1] = t - t0;
}

extern "C" int fattn_bench_hold(uint32_t us, void *stream) {
  hold_kernel<<<1, 1, 0, (cudaStream_t)stream>>>(1000ull * us);
  return (int)cudaGetLastError();
}

/* The SM clock of the last hold in MHz (0 if it cannot be read); synchronous. */
extern "C" double fattn_bench_hold_mhz(void) {
  unsigned long long h[2];
  if (cudaMemcpyFromSymbol(h, hold_clock, sizeof h) != cudaSuccess || h[1] == 0ull) return 0.;
  return (double)h[0] * 1e3 / (double)h[1];
}
