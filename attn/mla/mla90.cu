/* mla90.cu: the Hopper (sm_90a) absorbed-MLA kernel (one latent row of 576 a slot is K, its
 * first 512 dims V) by wgmma for every mode fa2_mla.cu serves, its tensor map and launcher. */
#include "attn/fa3/wgmma.h"
#include "attn/mla/mla90.h"

/* ---- producer: for each item, its blocks in ring order. A stage is brought once the eight
 * consumer warps freed it (empty) and signalled on full: by TMA (thread 0, one box of 64 slots
 * a slab) where mla90__by_tma, else by a cp.async gather of the 128 threads (two a row, one
 * page-table read each), with zeros outside [kbt, ke). Every thread waits on empty, so that
 * no thread runs more than a phase ahead of the parity it waits on. */
__device__ __forceinline__ void mla90__produce(const fa2__args &a, const CUtensorMap *map, bool use_tma,
                                               const mla90__item &it, mla90__smem *sm, uint32_t gb) {
  const uint32_t tid = threadIdx.x, sh = a.ps_shift, psm = (1u << sh) - 1u;
  const int32_t *pt = a.l.page_table + (size_t)it.e.seq * a.l.pages_per_seq;
  const char *pool = (const char *)a.l.k_pool;
  for (uint32_t blk = 0; blk < it.nblk; blk++) {
    const uint32_t g = gb + blk, s = g & 1u, ph = (g >> 1) & 1u, j0 = it.kb + blk * MLA90__BN;
    char *dst = sm->kv[s];
    if (mla90__by_tma(use_tma, a, it, j0)) {
      const int row = tid == 0u ? (int)(((uint32_t)pt[j0 >> sh] << sh) + (j0 & psm)) : 0;
      fa3__wait(&sm->empty[s], ph ^ 1u);
      if (tid == 0u) {
        fa3__arrive_tx(&sm->full[s], MLA90__STAGE);
#pragma unroll
        for (uint32_t sl = 0; sl < MLA90__SLABS; sl++) fa3__tma3(dst + sl * MLA90__SLAB, map, (int)(sl * 64u), 0, row, &sm->full[s]);
      }
      continue;
    }
    const uint32_t r = tid % MLA90__BN, j = j0 + r;
    const bool ok = j >= it.kbt && j < it.ke;
    const size_t slot = ok ? ((size_t)(uint32_t)pt[j >> sh] << sh) + (j & psm) : 0u;
    const char *src = pool + slot * (MLA90__SLABS * 128u);
    fa3__wait(&sm->empty[s], ph ^ 1u);
#pragma unroll 4
    for (uint32_t c = tid / MLA90__BN; c < MLA90__SLABS * 8u; c += 128u / MLA90__BN)
      fa2__cp16(dst + (c / 8u) * MLA90__SLAB + fa3__swz(r, c % 8u), src + c * 16u, ok);
    fa3__arrive_cp(&sm->full[s]);
    fa3__sync(MLA90__BAR_PRODUCER, 128); /* every pending arrive is counted before the last one */
    if (tid == 0u) fa3__arrive(&sm->full[s]);
  }
}

/* ---- consumers. Block i of an item is owned by consumer i % 2, which issues S_i = Q K_i^T,
 * takes the running row max of block i - 1 from the other consumer (MAX), and does the
 * softmax of block i: the max and rescale factor alpha_i go to shared memory for the other,
 * P_i (in T) into the one P buffer once both consumers' P V of block i - 1 have completed
 * (PFREE from the other; its own by waiting). Both consumers then rescale their half of O by
 * alpha_i and add P_i V_i[:, their 256 dims]. The owner of block i finishes block i - 1 (its
 * P V completed, its stage freed) before it waits for block i to land, so that with two
 * stages the producer's load of block i + 1 runs while block i is computed; waiting for
 * block i first (to issue S_i under the other's softmax) held stage i - 1 until block i had
 * landed, one load in flight at most. Consumer c's order, for its own block i:
 *   1. its P V of block i - 2 completed: frees that stage and arrives PFREE + c (i >= 2);
 *   2. block i - 1's max, alpha and row sum (MAX + other): O rescaled, P_{i-1} V_{i-1} issued
 *      and completed, the stage of block i - 1 freed;
 *   3. S_i issued once the stage landed, and completed;
 *   4. the softmax of block i;
 *   5. the other's P V of block i - 1 completed (PFREE + other);
 *   6. P_i and the row sum through block i written, MAX + c arrived;
 *   7. O rescaled by alpha_i, P_i V_i issued.
 * The tail does the last block's P V on the consumer that did not own it. Row sums l run
 * through the blocks like the max: the owner of block i takes l through block i - 1 with its
 * max, rescales it by alpha_i, adds its P's row sums (quad-reduced) and publishes the result
 * with the max, so that both consumers end with the same bits and no exchange of their own.
 * Issue sequences hold no waits (ptxas would serialise the wgmmas after a spin loop). */
template <typename T>
__device__ __forceinline__ void mla90__consume(const fa2__args &a, const mla90__item &it, int causal, bool use_tma,
                                               uint32_t c, mla90__smem *sm, uint32_t gb) {
  const fattn__layer_params &l = a.l;
  const uint32_t tid = threadIdx.x % 128u, warp = tid / 32u, lane = tid % 32u, g = lane / 4u, c4 = lane % 4u;
  const uint32_t H = l.num_q_heads, other = c ^ 1u, nblk = fa3__uniform(it.nblk);

  /* Q rows of the tile by both consumers, zeros past the entry's rows ([tokens, H, 576]: the
   * tile's packed rows are consecutive rows of 1152 bytes). */
  {
    const uint32_t ct = threadIdx.x - 128u;
    const char *q = (const char *)a.q + (size_t)it.e.q_start * H * (MLA90__SLABS * 128u);
#pragma unroll 2
    for (uint32_t ci = ct; ci < MLA90__ROWS * MLA90__SLABS * 8u; ci += 256u) {
      const uint32_t r = ci / (MLA90__SLABS * 8u), ch = ci % (MLA90__SLABS * 8u);
      const bool ok = it.R0 + r < it.Rend;
      fa2__cp16(sm->q[ch / 8u] + fa3__swz(r, ch % 8u), q + (ok ? (size_t)(it.R0 + r) * (MLA90__SLABS * 128u) : 0u) + ch * 16u,
                ok);
    }
    fa2__commit();
    fa2__wait<0>();
    fa3__fence_async();
    fa3__sync(MLA90__BAR_BOTH, 256);
  }

  /* This thread's rows (fragment rows g and g + 8 of its warp's 16), their queries' slots and
   * tree-mask rows. */
  const uint32_t total = it.e.q_len * H, prefix = it.e.kv_len - it.e.q_len;
  uint32_t rw[2], qp[2];
  const uint64_t *mr[2];
#pragma unroll
  for (int h = 0; h < 2; h++) {
    rw[h] = warp * 16u + g + 8u * h;
    const uint32_t t = min(it.R0 + rw[h], total - 1u) / H;
    qp[h] = prefix + t;
    mr[h] = it.tree ? a.s.mask + it.e.mask_row + t : nullptr;
  }

  float o[128];
#pragma unroll
  for (int i = 0; i < 128; i++) o[i] = 0.f;
  float m[2] = {-INFINITY, -INFINITY}, ls[2] = {0.f, 0.f}, sc[32];
  uint32_t pk[16];

  auto stage = [&](uint32_t i) -> uint32_t { return fa3__uniform((gb + i) & 1u); };
  auto ready = [&](uint32_t i) {
    const uint32_t gi = gb + i;
    fa3__wait(&sm->full[gi & 1u], (gi >> 1) & 1u);
    if (!mla90__by_tma(use_tma, a, it, it.kb + i * MLA90__BN)) fa3__fence_async();
  };
  auto release = [&](uint32_t i) {
    if (lane == 0u) fa3__arrive(&sm->empty[(gb + i) & 1u]);
  };
  auto issue_s = [&](uint32_t i) {
    uint32_t q_lo = fa3__desc_lo(sm->q[0], 0u);
    asm volatile("" : "+r"(q_lo)); /* else ptxas hoists the 36 Q descriptors out of the loop */
    const uint32_t k_lo = fa3__desc_lo(sm->kv[0], 0u) + stage(i) * (MLA90__STAGE >> 4);
#pragma unroll
    for (int ks = 0; ks < 36; ks++) {
      const uint32_t off = (uint32_t)(ks / 4) * MLA90__SLAB + (uint32_t)(ks % 4) * 32u;
      fa3__mma_ss<64, T>(sc, fa3__desc_at(q_lo, off), fa3__desc_at(k_lo, off), ks > 0);
    }
    fa3__mma_commit();
  };
  /* O[:, 256 c ..] += P V: P K-major from its buffer, V MN-major from the stage's slabs 4c .. 4c + 3. */
  auto issue_pv = [&](uint32_t i) {
    const uint32_t p_lo = fa3__desc_lo(sm->p, 0u);
    const uint32_t v_lo = fa3__desc_lo(sm->kv[0] + 4u * c * MLA90__SLAB, MLA90__SLAB) + stage(i) * (MLA90__STAGE >> 4);
#pragma unroll
    for (int kk = 0; kk < 4; kk++) fa3__mma_sst<256, T>(o, fa3__desc_at(p_lo, kk * 32u), fa3__desc_at(v_lo, kk * 2048u), 1);
    fa3__mma_commit();
  };
  auto rescale = [&](const float *al) {
    if (__any_sync(0xffffffffu, al[0] != 1.f || al[1] != 1.f)) {
#pragma unroll
      for (int k = 0; k < 32; k++) {
        o[4 * k] *= al[0]; o[4 * k + 1] *= al[0];
        o[4 * k + 2] *= al[1]; o[4 * k + 3] *= al[1];
      }
    }
  };
  /* Block i's max, alpha and row sum through it from the other consumer: O takes alpha. */
  auto take_max = [&](uint32_t i) {
    fa3__sync(MLA90__BAR_MAX + other, 256);
    float al[2];
#pragma unroll
    for (int h = 0; h < 2; h++) {
      m[h] = sm->m[i & 1u][rw[h]];
      al[h] = sm->alpha[i & 1u][rw[h]];
      ls[h] = sm->lrun[i & 1u][rw[h]];
    }
    fa3__pin<128>(o);
    rescale(al);
  };

  for (uint32_t i = c; i < nblk; i += 2u) {
    /* Waits on wgmma are unconditional (nothing is pending where the step has no block):
     * behind a branch, ptxas saw O read on a path with P V in flight and serialised every
     * wgmma of the kernel. */
    fa3__pin<128>(o); /* 1 */
    fa3__mma_wait<0>();
    fa3__pin<128>(o);
    if (i >= 2u) {
      release(i - 2u);
      fa3__arrive_bar(MLA90__BAR_PFREE + c, 256);
    }
    if (i >= 1u) { /* 2 */
      take_max(i - 1u);
      fa3__mma_fence();
      issue_pv(i - 1u);
    }
    fa3__pin<128>(o);
    fa3__mma_wait<0>();
    fa3__pin<128>(o);
    if (i >= 1u) release(i - 1u);
    ready(i); /* 3 */
    fa3__mma_fence();
    issue_s(i);
    fa3__pin<32>(sc);
    fa3__mma_wait<0>();
    fa3__pin<32>(sc);

    /* 4: scores to log2 units, masked where the block leaves [lo_f, hif) or starts below kbt;
     * the row max over the four lanes of a row, then exp2 against the new max, as fa2_mla. */
    const uint32_t j0 = it.kb + i * MLA90__BN;
    const bool full = j0 >= it.kbt && j0 >= it.lo_f && j0 + MLA90__BN <= it.hif;
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int k = 0; k < 8; k++)
#pragma unroll
      for (int e = 0; e < 4; e++) {
        float x = sc[4 * k + e] * a.sl2;
        const uint32_t j = j0 + 8u * k + 2u * c4 + (e & 1);
        if (!full && !(j >= it.kbt && j < it.ke &&
                       ((j >= it.lo_f && j < it.hif) || fa2__vis(l, causal, it.tree, mr[e >> 1], prefix, qp[e >> 1], j))))
          x = -INFINITY;
        sc[4 * k + e] = x;
        mx[e >> 1] = fmaxf(mx[e >> 1], x);
      }
    float ms[2], al[2];
#pragma unroll
    for (int h = 0; h < 2; h++) {
      const float mn = fmaxf(m[h], fa2__lanes_max<1, 2>(mx[h]));
      ms[h] = fa2__row_step(m[h], ls[h], mn, &al[h]);
      if (c4 == 0u) {
        sm->m[i & 1u][rw[h]] = mn;
        sm->alpha[i & 1u][rw[h]] = al[h];
      }
    }
    float ps[2] = {0.f, 0.f};
#pragma unroll
    for (int k = 0; k < 8; k++)
#pragma unroll
      for (int h = 0; h < 2; h++) {
        const float p0 = fa2__exp2(sc[4 * k + 2 * h] - ms[h]), p1 = fa2__exp2(sc[4 * k + 2 * h + 1] - ms[h]);
        ps[h] += p0 + p1;
        pk[2 * k + h] = fa2__pack<T>(p0, p1);
      }
#pragma unroll
    for (int h = 0; h < 2; h++) {
      ls[h] += fa2__lanes_sum<1, 2>(ps[h]);
      if (c4 == 0u) sm->lrun[i & 1u][rw[h]] = ls[h];
    }

    if (i >= 1u) fa3__sync(MLA90__BAR_PFREE + other, 256); /* 5 */
    /* 6: P rows in the 128-byte swizzle (a quad's 4 words per 16-byte chunk, conflict-free). */
#pragma unroll
    for (int k = 0; k < 8; k++)
#pragma unroll
      for (int h = 0; h < 2; h++) *(uint32_t *)(sm->p + fa3__swz(rw[h], (uint32_t)k) + 4u * c4) = pk[2 * k + h];
    fa3__fence_async();
    fa3__arrive_bar(MLA90__BAR_MAX + c, 256);
    fa3__sync(MLA90__BAR_WG + c, 128);
    rescale(al); /* 7 */
    fa3__mma_fence();
    issue_pv(i);
  }

  /* The tail: the last block's P V by the consumer that did not own it. */
  fa3__pin<128>(o);
  fa3__mma_wait<0>();
  fa3__pin<128>(o);
  if (nblk > 0u) {
    const uint32_t last = nblk - 1u;
    if ((last & 1u) == c) {
      release(last);
    } else {
      if (last >= 1u) { /* its own block last - 1 */
        release(last - 1u);
        fa3__arrive_bar(MLA90__BAR_PFREE + c, 256);
      }
      take_max(last);
      fa3__mma_fence();
      issue_pv(last);
      fa3__pin<128>(o);
      fa3__mma_wait<0>();
      fa3__pin<128>(o);
      release(last);
    }
  }

  /* The end: O / l and the LSE (consumer 0), or the split's partial O and LSE for the
   * combine; a row that sees nothing gives O = 0 and LSE -inf. Both consumers leave the item
   * together: the next item's Q and P writes then follow every wgmma and every read of m,
   * alpha and lrun of this one, as its own barrier rather than the next item's Q barrier. */
  fa3__sync(MLA90__BAR_BOTH, 256);
#pragma unroll
  for (int h = 0; h < 2; h++) {
    const uint32_t R = it.R0 + rw[h], t = R / H, hq = R % H;
    float lse2 = -INFINITY, inv = 0.f;
    if (m[h] != -INFINITY) inv = fa2__sink_join<true>(m[h], ls[h], -INFINITY, it.split ? 1.f : a.o_mul, lse2);
    if (R >= it.Rend) continue;
    if (it.split) {
      const size_t row = (size_t)(it.e.split_row + t * it.e.num_splits + it.sp) * H + hq;
      float *dst = a.s.split_o + row * FA2__MLA_DV + 256u * c + 2u * c4;
#pragma unroll
      for (int k = 0; k < 32; k++) *(float2 *)(dst + 8 * k) = make_float2(o[4 * k + 2 * h] * inv, o[4 * k + 2 * h + 1] * inv);
      if (c == 0u && c4 == 0u) a.s.split_lse[row] = lse2 * FA2__LN2;
    } else {
      const size_t row = (size_t)it.e.q_start * H + R;
      T *dst = (T *)a.out + row * FA2__MLA_DV + 256u * c + 2u * c4;
#pragma unroll
      for (int k = 0; k < 32; k++) *(uint32_t *)(dst + 8 * k) = fa2__pack<T>(o[4 * k + 2 * h] * inv, o[4 * k + 2 * h + 1] * inv);
      if (a.lse && c == 0u && c4 == 0u) a.lse[row] = lse2 * FA2__LN2;
    }
  }
}

/* Grid: x = (entry, group g of mla90__groups), y strides over splits, z over the entry's row
 * tiles g, g + groups, ..., as fa2_mla's grid: any grid covers any step of its caps and an
 * item's bytes never depend on the grid. Every warpgroup walks the same items; the producer
 * runs up to the ring's depth ahead, across items too. */
template <typename T>
__global__ void __launch_bounds__(MLA90__THREADS, 1)
    mla90__attn(const __grid_constant__ fa2__args a, const __grid_constant__ CUtensorMap map, uint32_t use_tma) {
  fattn__pdl_wait(); /* Q and the fresh latent rows come from the kernels just before */
  extern __shared__ __align__(16) char smem_raw[];
  auto *sm = (mla90__smem *)(((uintptr_t)smem_raw + 1023u) & ~(uintptr_t)1023u);
  const fattn__step_hdr *hdr = a.s.hdr;
  const uint32_t H = a.l.num_q_heads, groups = mla90__groups(H);
  const uint32_t ei = blockIdx.x / groups, gi = blockIdx.x % groups;
  if (ei >= hdr->num_entries) return;
  const fattn__entry e = a.s.entries[ei];
  const int causal = (int)hdr->causal;
  const bool tree = hdr->mode == FATTN_MODE_TARGET_VERIFY && e.mask_row != UINT32_MAX && a.s.mask;
  const uint32_t nsp = e.num_splits > 1u ? e.num_splits : 1u, tiles = fattn__ceil_div(e.q_len * H, MLA90__ROWS);
  if (threadIdx.x == 0) {
    for (uint32_t s = 0; s < MLA90__ST; s++) {
      fa3__bar_init(&sm->full[s], 1);
      fa3__bar_init(&sm->empty[s], 8); /* one arrive a consumer warp */
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
  /* Each warpgroup walks the items in its own loop: a loop both share after the setmaxnreg
   * branches made ptxas ignore them (one register count at every point of the shared code). */
  const uint32_t wg = fa3__uniform(threadIdx.x / 128u);
  auto items = [&](auto role) {
    uint32_t gb = 0; /* blocks of the ring before this item's first */
    for (uint32_t rt = gi + groups * blockIdx.z; rt < tiles; rt += groups * gridDim.z)
      for (uint32_t sp = blockIdx.y; sp < nsp; sp += gridDim.y) {
        mla90__item it;
        mla90__item_of(a, e, causal, tree, rt * MLA90__ROWS, sp, nsp > 1u, it);
        role(it, gb);
        gb += it.nblk;
      }
  };
  if (wg == 0u) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(MLA90__P_REGS));
    items([&](const mla90__item &it, uint32_t gb) { mla90__produce(a, &map, use_tma != 0u, it, sm, gb); });
  } else {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(MLA90__C_REGS));
    items([&](const mla90__item &it, uint32_t gb) { mla90__consume<T>(a, it, causal, use_tma != 0u, wg - 1u, sm, gb); });
  }
}

template <typename T>
static int mla90__go(const fa2__args &a, const CUtensorMap &map, uint32_t use_tma, dim3 grid, cudaStream_t st) {
  auto k = mla90__attn<T>;
  static std::atomic<unsigned char> attr_set[FATTN__MAX_DEVICES]; /* per device */
  const cudaError_t err = fattn__smem_attr(attr_set, k, MLA90__SMEM);
  if (err != cudaSuccess) return (int)err;
  return (int)fattn__launch(k, grid, dim3(MLA90__THREADS), MLA90__SMEM, st, a, map, use_tma);
}

extern "C" int fattn__mla90_supports(const fattn__layer_params *l) {
  return l->mla && fattn__fa2_supports(l) && l->kv_dtype != FATTN_DTYPE_FP8_E4M3;
}

/* The latent pool as [slots, 1, 576] (the 3-d box load of fa3__tma3), boxes of 64 dims x 64
 * slots in the 128-byte swizzle: one box a slab of a block, where pages hold a block or more. */
extern "C" int fattn__mla90_encode_map(const fattn__layer_params *l, void *map) {
  if (!fattn__mla90_supports(l) || l->page_size < MLA90__TMA_MIN_PAGE) return (int)cudaErrorNotSupported;
  const PFN_cuTensorMapEncodeTiled_v12000 encode = fa3__tmap_encoder();
  if (!encode) return (int)cudaErrorNotSupported;
  const cuuint64_t dims[3] = {FA2__MLA_DK, 1u, (cuuint64_t)l->num_pages * l->page_size};
  const cuuint64_t strides[2] = {FA2__MLA_DK * 2u, FA2__MLA_DK * 2u};
  const cuuint32_t box[3] = {64u, 1u, MLA90__BN}, unit[3] = {1u, 1u, 1u};
  const CUtensorMapDataType dt =
      l->q_dtype == FATTN_DTYPE_BF16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
  if (encode((CUtensorMap *)map, dt, 3, l->k_pool, dims, strides, box, unit, CU_TENSOR_MAP_INTERLEAVE_NONE,
             CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) !=
      CUDA_SUCCESS)
    return (int)cudaErrorInvalidValue;
  return (int)cudaSuccess;
}

static uint32_t mla90__clamp(uint32_t x, uint32_t lo, uint32_t hi) { return x < lo ? lo : x > hi ? hi : x; }

/* fattn__fa2_attend's MLA contract on the Hopper kernel: the same arguments (fa2__args_for),
 * the same split partials and the same combine after them. l.tmaps, where non-NULL, holds
 * the latent pool's map (fattn__mla90_encode_map); without it every block is gathered. */
extern "C" int fattn__mla90_attend(fattn__layer_params l, fattn__step_params s, const void *q, void *out, float *lse,
                                   void *stream) {
  if (!fattn__mla90_supports(&l)) return (int)cudaErrorInvalidValue;
  if (s.cap_entries == 0u || s.cap_q_tokens == 0u) return (int)cudaSuccess;
  cudaStream_t st = (cudaStream_t)stream;
  const fa2__args a = fa2__args_for(l, s, q, out, lse);
  const uint32_t qpe = (s.cap_q_tokens + s.cap_entries - 1u) / s.cap_entries;
  const uint32_t groups = mla90__groups(l.num_q_heads), ctas = s.cap_entries * groups;
  const uint32_t tiles = fattn__ceil_div(qpe * l.num_q_heads, MLA90__ROWS);
  const uint32_t z = mla90__clamp(fattn__ceil_div(tiles, groups), 1u, 65535u);
  const uint32_t split_cap = s.max_splits < 64u ? s.max_splits : 64u; /* blocks past it would only exit */
  const uint64_t xz = (uint64_t)ctas * z, want = 2u * a.num_sms; /* one block an SM: two waves' worth */
  const dim3 grid(ctas, xz >= want ? 1u : mla90__clamp((uint32_t)((want + xz - 1u) / xz), 1u, split_cap > 0u ? split_cap : 1u), z);
  CUtensorMap map;
  uint32_t use_tma = 0u;
  if (l.tmaps && l.page_size >= MLA90__TMA_MIN_PAGE) {
    memcpy(&map, l.tmaps, sizeof map);
    use_tma = 1u;
  } else {
    memset(&map, 0, sizeof map);
  }
  const int err = l.q_dtype == FATTN_DTYPE_BF16 ? mla90__go<__nv_bfloat16>(a, map, use_tma, grid, st)
                                                : mla90__go<__half>(a, map, use_tma, grid, st);
  return err || !s.split_o || !fattn__mode_splits(s.mode) ? err : fa2__launch_combine(a, s, qpe, st);
}
