/* fa3.h: the Hopper (sm_90a) attention kernel, assembled from its parts (fa3_table.h,
 * fa3_sched.h, fa3_produce.h, fa3_mainloop.h), and its launchers per head dim. */
#ifndef FATTN_ATTN_FA3_FA3_H
#define FATTN_ATTN_FA3_FA3_H

#include "attn/fa3/fa3_sched.h"
#include "attn/fa3/fa3_table.h"

/* Launchers per padded head dim (attn/fa3/fa3_hd*.cu): 64, 128 (d 96 and 128), 192 (d_v 128
 * or 192), 256; grid is the persistent CTA count. */
int fa3__launch_hd64(const fa3__args *a, const CUtensorMap *maps, int grid, cudaStream_t st);
int fa3__launch_hd128(const fa3__args *a, const CUtensorMap *maps, int grid, cudaStream_t st);
int fa3__launch_hd192(const fa3__args *a, const CUtensorMap *maps, int grid, cudaStream_t st);
int fa3__launch_hd256(const fa3__args *a, const CUtensorMap *maps, int grid, cudaStream_t st);

#ifdef __CUDACC__

#include "attn/fa3/fa3_mainloop.h"
#include "attn/fa3/fa3_produce.h"

/* One persistent block an SM: warpgroup 0 produces (fa3_produce.h), the NC after it consume
 * (fa3_mainloop.h); setmaxnreg moves registers from the first to the others. */
template <int DK, int DV, typename T, int KV, int NC>
__global__ void __launch_bounds__(128 * (NC + 1), 1)
    fa3__attn(const __grid_constant__ fa3__args a, const __grid_constant__ CUtensorMap tk,
              const __grid_constant__ CUtensorMap tv) {
  using C = fa3__cfg<DK, DV, KV, NC>;
  fattn__pdl_wait();
  extern __shared__ __align__(16) char smem_raw[];
  auto *sm = (fa3__smem<DK, DV, KV, NC> *)(((uintptr_t)smem_raw + 1023u) & ~(uintptr_t)1023u); /* swizzle atoms */
  if (threadIdx.x == 0) {
    for (int s = 0; s < C::ST; s++) {
      fa3__bar_init(&sm->full_k[s], 1);
      fa3__bar_init(&sm->full_v[s], 1);
      fa3__bar_init(&sm->empty_k[s], 4 * NC); /* one arrive a consumer warp */
      fa3__bar_init(&sm->empty_v[s], 4 * NC);
    }
    fa3__bar_init(&sm->raw_full[0], 1);
    fa3__bar_init(&sm->raw_full[1], 1);
    for (int s = 0; s < FA3__SCHED_SLOTS; s++) {
      fa3__bar_init(&sm->sched_full[s], 1);
      fa3__bar_init(&sm->sched_empty[s], 4 * NC);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
  const int wg = (int)(threadIdx.x / 128u);
  if (wg == 0) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(C::P_REGS));
    fa3__produce<DK, DV, KV, NC>(a, &tk, &tv, sm);
  } else {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(C::C_REGS));
    fa3__consume<DK, DV, T, KV, NC>(a, wg - 1, sm);
  }
}

template <int DK, int DV, typename T, int KV, int NC>
static int fa3__go(const fa3__args *a, const CUtensorMap *maps, int grid, cudaStream_t st) {
  constexpr int SMEM = fa3__plan<DK, DV, KV, NC>::SMEM;
  auto k = fa3__attn<DK, DV, T, KV, NC>;
  static std::atomic<unsigned char> attr_set[FATTN__MAX_DEVICES]; /* per device */
  const cudaError_t err = fattn__smem_attr(attr_set, k, SMEM);
  if (err != cudaSuccess) return (int)err;
  return (int)fattn__launch(k, dim3(grid), dim3(fa3__cfg<DK, DV, KV, NC>::NT), SMEM, st, *a, maps[0], maps[1]);
}

/* The kernels of one head-dim pair: bf16 and fp16 KV in Q's type (on the row of three
 * consumers where the table has one and a->trios), fp8 KV widened (fp16 MMAs, either Q type),
 * and fp8 KV under the e4m3 policy (e4m3 MMAs, either Q type). */
template <int DK, int DV>
static int fa3__launch(const fa3__args *a, const CUtensorMap *maps, int grid, cudaStream_t st) {
  if (a->k.l.kv_dtype == FATTN_DTYPE_FP8_E4M3) {
    if (a->k.l.compute_dtype == FATTN_DTYPE_FP8_E4M3) {
      if constexpr (fa3__has_trios(DK, DV, true)) {
        if (a->trios) return fa3__go<DK, DV, __nv_fp8_e4m3, FA3__KV_E4M3, 3>(a, maps, grid, st);
      }
      return fa3__go<DK, DV, __nv_fp8_e4m3, FA3__KV_E4M3, 2>(a, maps, grid, st);
    }
    return fa3__go<DK, DV, __half, FA3__KV_WIDEN, 2>(a, maps, grid, st);
  }
  const bool bf16 = a->k.l.q_dtype == FATTN_DTYPE_BF16;
  if constexpr (fa3__has_trios(DK, DV, false)) {
    if (a->trios)
      return bf16 ? fa3__go<DK, DV, __nv_bfloat16, FA3__KV_16BIT, 3>(a, maps, grid, st)
                  : fa3__go<DK, DV, __half, FA3__KV_16BIT, 3>(a, maps, grid, st);
  }
  return bf16 ? fa3__go<DK, DV, __nv_bfloat16, FA3__KV_16BIT, 2>(a, maps, grid, st)
              : fa3__go<DK, DV, __half, FA3__KV_16BIT, 2>(a, maps, grid, st);
}

#endif /* __CUDACC__ */
#endif /* FATTN_ATTN_FA3_FA3_H */
