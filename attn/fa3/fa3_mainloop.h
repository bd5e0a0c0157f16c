/* fa3_mainloop.h: a consumer warpgroup of the Hopper kernels: 64 query rows of each tile, Q
 * loaded ahead, S = Q K^T and O += P V by wgmma, the softmax of one block under the next GEMMs. */
#ifndef FATTN_ATTN_FA3_FA3_MAINLOOP_H
#define FATTN_ATTN_FA3_FA3_MAINLOOP_H

#include "attn/fa3/fa3_epilogue.h"
#include "attn/fa3/fa3_fp8.h"
#include "attn/fa3/fa3_mask.h"
#include "attn/fa3/fa3_table.h"
#include "attn/fa3/wgmma.h"

#ifdef __CUDACC__

/* The mainloop's contract. Consumer c of NC takes every item the scheduler posts and owns
 * rows R0 + 64 c.. of its tile: it waits for a stage's K (full_k) and frees it (empty_k, one
 * arrive a warp) once its S GEMM has completed, V likewise after P V. Block blk's S GEMM is
 * issued with block blk - 1's P V GEMM, so the softmax of S_blk runs under that P V; the
 * consumers take turns to issue round a ring (FA3__BAR_TURN), so one's softmax runs under the
 * others' GEMMs. P reaches the P V GEMM in registers, or (the row's PV smem) through the
 * consumer's area of shared memory, written once that area's last P V has completed and
 * fenced for wgmma before the turn's barrier, which all of the consumer's warps pass. Waits
 * stay out of the issue sequences: a spin loop between wgmma.fence and a wgmma is a divergent
 * path after which ptxas serialises the wgmmas. */
template <int DK, int DV, typename T, int KV, int NC>
__device__ __forceinline__ void fa3__consume(const fa3__args &a, int c, fa3__smem<DK, DV, KV, NC> *sm) {
  using C = fa3__cfg<DK, DV, KV, NC>;
  using SM = typename C::softmax;
  constexpr bool E4 = C::E4;
  constexpr int BN = C::BN, ST = C::ST, CH = DK / 8, KS = C::KSTEP;
  const fattn__layer_params &l = a.k.l;
  const uint32_t d = l.head_dim;
  const uint32_t tid = threadIdx.x % 128u, warp = tid / 32u, lane = tid % 32u, g = lane / 4u, c4 = lane % 4u;
  const uint32_t num_pairs = a.k.s.hdr->num_pairs, causal = a.k.s.hdr->causal, work = fa3__work(a, num_pairs);
  c = (int)fa3__uniform((uint32_t)c); /* as the item and the block count: the issue is uniform */
  char *qs = sm->q[c], *ps = sm->p[C::P_SMEM ? c : 0];
  /* V: MN-major slabs for 16-bit P V, K-major V^T rows for e4m3 */
  const uint32_t kv_lo = fa3__desc_lo(sm->kv[0], 0u), v_lo = fa3__desc_lo(sm->kv[0] + C::K_BYTES, E4 ? 0u : C::KV_SLAB);
  const uint32_t p_lo = fa3__desc_lo(ps, 0u); /* PV smem: P, K-major as Q */
  fa3__ring<ST> ring; /* the next tile's first block */
  if (c == NC - 1) fa3__arrive_bar(FA3__BAR_TURN, 256); /* consumer 0 takes the first turn */
  /* Q rows of this warpgroup for tile t, zeros past the entry and past d, as one cp.async group.
   * With widened fp8 KV the MMAs run in fp16, so bf16 Q is narrowed as it loads (exact for |q|
   * in [2^-14, 65504]); the e4m3 policy quantises it once landed (fa3__quantise_q). */
  auto load_q = [&](const fa3__tile &t) {
    const uint32_t R0 = t.R0 + 64u * (uint32_t)c;
#pragma unroll 1 /* rolled: it runs beside the last P V GEMM, where registers are short */
    for (uint32_t ci = tid; ci < 64u * CH; ci += 128u) {
      const uint32_t r = ci / CH, ch = ci % CH, q = R0 + r;
      const bool in = q < t.e.q_len && ch * 8u < d;
      const char *src = (const char *)a.k.q;
      if (in) src += ((size_t)(t.e.q_start + q) * l.num_q_heads + t.hq) * d * 2u + ch * 16u;
      char *dst = qs + (ch / 8u) * 8192u + fa3__swz(r, ch % 8u);
      if (KV == FA3__KV_WIDEN && l.q_dtype == FATTN_DTYPE_BF16) {
        *(uint4 *)dst = fa2__bf16x8_to_f16(in ? *(const uint4 *)src : make_uint4(0u, 0u, 0u, 0u));
      } else {
        fa2__cp16(dst, src, in);
      }
    }
    fa2__commit();
  };
  /* Takes the k-th item and starts its Q load, so that the Q round trip of the next tile runs
   * under the last P V GEMM and the epilogue of this one. The tile is made again where it is
   * used (its entry then comes from L1): kept in registers across that GEMM and the epilogue,
   * or passed through shared memory, it made the d 128 kernels spill. */
  auto take = [&](uint32_t k) -> fa3__item {
    fa3__item item = fa3__sched_take(sm, k);
    item.w = fa3__uniform(item.w);
    if (item.w < work) {
      fa3__tile t;
      fa3__tile_of<BN, NC>(a, item.w, item.ei, num_pairs, &t);
      load_q(t);
    }
    return item;
  };
  fa3__item item = take(0u);
  for (uint32_t k = 0; item.w < work; k++) {
    fa3__tile t;
    fa3__tile_of<BN, NC>(a, item.w, item.ei, num_pairs, &t);
    t.nblk = fa3__uniform(t.nblk);
    fa2__wait<0>();
    float q_descale = 1.f; /* e4m3: the scores' factor back from Q's scale */
    if constexpr (E4) {
      q_descale = fa3__quantise_q<DK>(qs, sm->q_amax[c], l.q_dtype, FA3__BAR_Q + c, tid);
    } else {
      fa3__fence_async();
      fa3__sync(FA3__BAR_Q + c, 128);
    }
    const uint32_t R0 = t.R0 + 64u * (uint32_t)c;
    const bool rows = R0 < t.e.q_len;
    fa3__mask<BN, DK> mask;
    mask.init(l, causal, t, a.k.s.mask, R0, warp, g);
    float o[DV / 2];
#pragma unroll
    for (int i = 0; i < DV / 2; i++) o[i] = 0.f;
    SM sm_rows;
    sm_rows.init();

    float sc[BN / 2];
    uint32_t p[BN / KS][4];
    auto issue_s = [&](const fa3__ring<ST> &at) {
      uint32_t q_lo = fa3__desc_lo(qs, 0u);
      asm volatile("" : "+r"(q_lo)); /* else ptxas hoists the DK / 16 Q descriptors and spills them */
      const uint32_t k_lo = kv_lo + at.stage * (uint32_t)(C::STAGE >> 4);
#pragma unroll
      for (int ks = 0; ks < DK / KS; ks++)
        fa3__mma_ss<BN, T>(sc, fa3__desc_at(q_lo, (ks / 4) * 8192 + (ks % 4) * 32),
                           fa3__desc_at(k_lo, (ks / 4) * C::KV_SLAB + (ks % 4) * 32), ks > 0);
      fa3__mma_commit();
    };
    auto issue_pv = [&](const fa3__ring<ST> &at) {
      const uint32_t lo = v_lo + at.stage * (uint32_t)(C::STAGE >> 4);
#pragma unroll
      for (int kk = 0; kk < BN / KS; kk++) {
        if constexpr (C::P_SMEM)
          fa3__mma_sst<DV, T>(o, fa3__desc_at(p_lo, (kk / 4) * 8192 + (kk % 4) * 32), fa3__desc_at(lo, kk * 2048), 1);
        else if constexpr (E4 && BN == 64) fa3__mma_rs<DV, T>(o, p[kk], fa3__desc_at<FA3__DESC_HI_64B>(lo, kk * 32));
        else fa3__mma_rs<DV, T>(o, p[kk], fa3__desc_at(lo, E4 ? kk * 32 : kk * 2048));
      }
      fa3__mma_commit();
    };
    /* Scores of block blk masked (softcapped ones taken to log2 units first), then the policy's
     * step, which scales raw scores inside its exps. */
    const float sl2 = a.k.sl2 * q_descale, softcap = l.softcap, cap_mul = a.k.cap_scale * q_descale / l.softcap;
    auto soft = [&](uint32_t blk, float *alpha) {
      if (softcap > 0.f) {
#pragma unroll
        for (int i = 0; i < BN / 2; i++) sc[i] = softcap * tanhf(sc[i] * cap_mul) * FA2__LOG2E;
      }
      mask.apply(sc, l, causal, t, t.kb + blk * BN, c4);
      sm_rows.step(sc, softcap > 0.f ? 1.f : sl2, alpha);
    };
    /* P as the P V GEMM's A operand: the k16 fragments in registers, or stored as [slab][64
     * rows][128 B] in the 128-byte swizzle, as Q is (matrix m of a k-step: rows 8 (m % 2).. of
     * the warp's 16, slots 8 (m / 2).. of the step's 16; lane i gives row i % 8 of matrix i / 8) */
    auto pack_p = [&]() {
      if constexpr (E4) {
        fa3__pack_p_e4m3<BN>(sc, p);
      } else {
#pragma unroll
        for (int kk = 0; kk < BN / 16; kk++) {
#pragma unroll
          for (int r = 0; r < 4; r++) p[kk][r] = fa2__pack<T>(sc[8 * kk + 2 * r], sc[8 * kk + 2 * r + 1]);
          if constexpr (C::P_SMEM) {
            const uint32_t m = lane / 8u, row = 16u * warp + lane % 8u + 8u * (m % 2u);
            fa3__stm4(ps + (kk / 4) * 8192 + fa3__swz(row, (uint32_t)(kk % 4) * 2u + m / 2u), p[kk]);
          }
        }
        if constexpr (C::P_SMEM) fa3__fence_async();
      }
    };
    auto ready = [&](uint64_t *bars, const fa3__ring<ST> &at, uint32_t blk) {
      fa3__wait(&bars[at.stage], at.phase);
      if (KV != FA3__KV_WIDEN && !fa3__by_tma<BN, KV>(a, t, t.kb + blk * BN)) fa3__fence_async();
    };
    auto release = [&](uint64_t *bars, const fa3__ring<ST> &at) {
      if (lane == 0) fa3__arrive(&bars[at.stage]);
    };
    /* Frees a block's K once its softmax is done, on a condition that reads the row sums and
     * always holds: ptxas keeps mbarrier arrives and wgmma waits in program order, but hoists a
     * wait above arithmetic that does not feed it, and the P V wait that follows would rise
     * above the softmax, which then no longer runs under that GEMM. */
    auto release_k_after_softmax = [&](const fa3__ring<ST> &at) {
      if (lane == 0 && !(sm_rows.l[0] + sm_rows.l[1] < 0.f)) fa3__arrive(&sm->empty_k[at.stage]);
    };
    /* the next consumer round the ring; a pair's as c ^ 1, whose SASS is the measured one (the
     * modulo, signed or not, changes the two-consumer kernels' code) */
    const int my_turn = FA3__BAR_TURN + c, their_turn = FA3__BAR_TURN + (NC == 2 ? c ^ 1 : (c + 1) % NC);
    /* Blocks this consumer's GEMMs run: a tile's blocks cover its last row's causal range, and
     * where its rows span more than a block, its first consumers' rows see fewer; their later
     * blocks (nb on) are waited for, freed and their turns passed on, with no GEMM. Not for
     * e4m3 pairs: the d 256 kernel spilled 92 bytes more with it. */
    constexpr bool SKIP = 64 * NC > BN && (NC == 3 || !E4);
    uint32_t nb = t.nblk;
    if constexpr (SKIP) {
      if (causal && !t.tree && rows) {
        const fattn__kv_range own = fattn__rows_range(&l, 1, 0, t.e.q_len, t.e.kv_len, R0, min(R0 + 63u, t.e.q_len - 1u));
        nb = min(t.nblk, max(1u, (own.hi_any - min(own.hi_any, t.kb) + BN - 1u) / BN));
      }
      /* Broadcast after the branch: a value merged from two paths is not known to be
       * warp-uniform, and the block loop's ring, then every GEMM descriptor, would leave the
       * uniform registers (27 R2UR a block at d 64, three consumers). */
      nb = fa3__uniform(nb);
    }
    if (t.nblk) {
      float alpha[2];
      fa3__ring<ST> s_at = ring, v_at = ring; /* block blk's stage, and block blk - 1's */
      ready(sm->full_k, s_at, 0u);
      fa3__sync(my_turn, 256);
      fa3__mma_fence();
      issue_s(s_at);
      fa3__arrive_bar(their_turn, 256);
      fa3__pin<BN / 2>(sc);
      fa3__mma_wait<0>();
      fa3__pin<BN / 2>(sc);
      release(sm->empty_k, s_at);
      soft(0, alpha);
      pack_p();
      for (uint32_t blk = 1; blk < nb; blk++) {
        s_at.next();
        ready(sm->full_k, s_at, blk);
        ready(sm->full_v, v_at, blk - 1u);
        fa3__sync(my_turn, 256);
        fa3__pin<DV / 2>(o);
        fa3__mma_fence();
        issue_s(s_at);
        issue_pv(v_at);
        fa3__arrive_bar(their_turn, 256);
        fa3__pin<BN / 2>(sc);
        fa3__mma_wait<1>();
        fa3__pin<BN / 2>(sc);
        soft(blk, alpha);
        release_k_after_softmax(s_at);
        fa3__pin<DV / 2>(o);
        fa3__mma_wait<0>();
        fa3__pin<DV / 2>(o);
        release(sm->empty_v, v_at);
        v_at = s_at;
        if (!SM::LAZY || __any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f)) {
#pragma unroll
          for (int i = 0; i < DV / 8; i++) {
            o[4 * i] *= alpha[0]; o[4 * i + 1] *= alpha[0];
            o[4 * i + 2] *= alpha[1]; o[4 * i + 3] *= alpha[1];
          }
        }
        pack_p();
      }
      item = take(k + 1u); /* the Q slabs are free: this tile's last S GEMM has completed */
      ready(sm->full_v, v_at, nb - 1u);
      fa3__sync(my_turn, 256);
      fa3__pin<DV / 2>(o);
      fa3__mma_fence();
      issue_pv(v_at);
      fa3__arrive_bar(their_turn, 256);
      fa3__pin<DV / 2>(o);
      fa3__mma_wait<0>();
      fa3__pin<DV / 2>(o);
      release(sm->empty_v, v_at);
      for (uint32_t blk = nb; blk < t.nblk; blk++) { /* the blocks past this consumer's rows */
        v_at.next();
        fa3__wait(&sm->full_k[v_at.stage], v_at.phase); /* landed: the stage's last round is freed */
        fa3__wait(&sm->full_v[v_at.stage], v_at.phase);
        release(sm->empty_k, v_at);
        release(sm->empty_v, v_at);
        fa3__sync(my_turn, 256);
        fa3__arrive_bar(their_turn, 256);
      }
      ring = v_at;
      ring.next();
    } else {
      item = take(k + 1u);
    }
    if (rows) fa3__store_o<DV, T, C::F8, C::QUAD_O>(a, t, sm_rows.m, sm_rows.l, o, R0, warp, g, c4);
  }
  if (c == 0) fa3__sync(FA3__BAR_TURN, 256); /* the last consumer's last turn handed over */
}

#endif /* __CUDACC__ */
#endif /* FATTN_ATTN_FA3_FA3_MAINLOOP_H */
