/* fa3_produce.h: the producer warpgroup of the Hopper kernels: it runs the scheduler and fills
 * the K and V stages, by TMA a box a page, by a cp.async gather, or raw fp8 widened to fp16. */
#ifndef FATTN_ATTN_FA3_FA3_PRODUCE_H
#define FATTN_ATTN_FA3_FA3_PRODUCE_H

#include "attn/fa3/fa3_fp8.h"
#include "attn/fa3/fa3_sched.h"
#include "attn/fa3/fa3_table.h"

#ifdef __CUDACC__

/* The producer's contract: for each item the scheduler posts, the stages of its nblk blocks
 * in ring order; a stage's K is brought once empty_k says the consumers' S GEMMs of the
 * stage's last block are done and then signalled on full_k, V likewise (empty_v, full_v), with
 * zeros past the KV range and past d. TMA serves a block that sits inside the sequence, with
 * tensor maps (pages of FA3__TMA_MIN_PAGE slots or more; 16-bit KV, or fp8 under the e4m3
 * policy); the rest is gathered by all 128 threads, a row a thread, so one page-table read a
 * thread a block. Under the e4m3 policy V lands in raw first and the 128 threads transpose it
 * into the stage (fa3__transpose_v). */
template <int DK, int DV, int KV, int NC>
__device__ __forceinline__ void fa3__produce(const fa3__args &a, const CUtensorMap *tk, const CUtensorMap *tv,
                                             fa3__smem<DK, DV, KV, NC> *sm) {
  using C = fa3__cfg<DK, DV, KV, NC>;
  constexpr bool F8 = C::F8, E4 = C::E4;
  constexpr int BN = C::BN, ST = C::ST, EB = F8 ? 1 : 2; /* bytes an element as stored */
  /* 16-byte chunks a row as loaded; e4m3 rows fill whole 128-byte slabs */
  constexpr int CK = E4 ? C::SK * 8 : DK * EB / 16, CV = E4 ? C::SV * 8 : DV * EB / 16;
  const uint32_t tid = threadIdx.x, G = a.k.l.num_q_heads / a.k.l.num_kv_heads;
  const uint32_t d = a.k.l.head_dim, dv = a.k.l.head_dim_v, nkv = a.k.l.num_kv_heads;
  const uint32_t psm = (1u << a.k.ps_shift) - 1u, num_pairs = a.k.s.hdr->num_pairs;
  const uint32_t work = fa3__work(a, num_pairs);
  fa3__ring<ST> at; /* the next block's stage */
  /* e4m3: V of a TMA block lands in raw slot n % 2 (its n-th landing) and is transposed into
   * its stage only once the next block's K and V are issued, so that its landing's latency
   * runs under that issue and not on the producer's path; `pend` is that block. */
  uint32_t raw_n = 0u;
  struct {
    bool on;
    uint32_t n, stage, phase;
  } pend = {false, 0u, 0u, 0u};
  /* e4m3: V landed in src written transposed into stage s, fenced for wgmma; on return the
   * stage's V^T is whole and src free again */
  auto write_vt = [&](const char *src, uint32_t s) {
    fa3__transpose_v<DV, BN, C::V_MATRIX>(src, sm->kv[s] + C::K_BYTES, tid);
    fa3__fence_async();
    fa3__sync(FA3__BAR_PRODUCER, 128);
  };
  auto finish = [&]() { /* the pending block's V^T, into its stage, signalled on full_v */
    if (!pend.on) return;
    const uint32_t slot = pend.n & 1u;
    fa3__wait(&sm->raw_full[slot], (pend.n >> 1) & 1u);
    fa3__wait(&sm->empty_v[pend.stage], pend.phase ^ 1u);
    write_vt(sm->raw + slot * C::RAW_SLOT, pend.stage);
    if (tid == 0u) fa3__arrive(&sm->full_v[pend.stage]);
    pend.on = false;
  };
  for (uint32_t k = 0;; k++) {
    /* Inside the loop: posted before it, the first item tipped the consumers' registers into
     * spilling (ptxas allocates the whole kernel at once). */
    if (k == 0u && tid == 0u) fa3__sched_post(a, sm, 0u, work, num_pairs);
    fa3__sync(FA3__BAR_PRODUCER, 128); /* item k is posted */
    /* the slot is written again for item k + 4, posted during item k + 3: past three more of these barriers */
    const uint32_t slot = k % FA3__SCHED_SLOTS, cur = sm->ring_w[slot];
    if (cur >= work) {
      if constexpr (E4) finish();
      break;
    }
    fa3__tile t;
    fa3__tile_of<BN, NC>(a, cur, sm->ring_entry[slot], num_pairs, &t);
    const uint32_t kvh = t.hq / G;
    const int32_t *pt = a.k.l.page_table + (size_t)t.e.seq * a.k.l.pages_per_seq;
    auto load = [&](uint32_t blk) {
      const uint32_t s = at.stage, ph = at.phase, j0 = t.kb + blk * BN;
      char *kd = sm->kv[s], *vd = kd + C::K_BYTES;
      if (fa3__by_tma<BN, KV>(a, t, j0)) {
        /* Lane i of warp 0 brings page i of the tile (boxes past d, at d 96, arrive as zeros);
         * the bytes are expected before any box can land. K goes as soon as the S GEMMs of
         * the stage's last block are done, V once its P V GEMMs are. */
        const uint32_t pb = min(1u << a.k.ps_shift, (uint32_t)BN), lane = tid % 32u, j = j0 + lane * pb;
        /* Every producer thread waits, not only the lanes that issue: a parity wait tells only
         * the last two phases apart, and the gather blocks need all 128 threads in step. */
        const bool mine = tid < 32u && lane < BN / pb;
        const int row = mine ? (int)(((uint32_t)pt[j >> a.k.ps_shift] << a.k.ps_shift) + (j & psm)) : 0;
        fa3__wait(&sm->empty_k[s], ph ^ 1u);
        if (tid == 0u) fa3__arrive_tx(&sm->full_k[s], C::K_BYTES);
        __syncwarp();
        constexpr int SLAB_DIMS = E4 ? 128 : 64; /* a slab's 128 bytes */
        if (mine) {
#pragma unroll
          for (int sl = 0; sl < C::SK; sl++)
            fa3__tma3(kd + sl * C::KV_SLAB + lane * pb * 128u, tk, sl * SLAB_DIMS, (int)kvh, row, &sm->full_k[s]);
        }
        if constexpr (E4) {
          /* the slot's last landing, two back, was transposed when the block after it was issued */
          const uint32_t rs = raw_n & 1u;
          if (tid == 0u) fa3__arrive_tx(&sm->raw_full[rs], C::RAW_SLOT);
          __syncwarp();
          if (mine) {
#pragma unroll
            for (int sl = 0; sl < C::SV; sl++)
              fa3__tma3(sm->raw + rs * C::RAW_SLOT + sl * C::KV_SLAB + lane * pb * 128u, tv, sl * SLAB_DIMS, (int)kvh,
                        row, &sm->raw_full[rs]);
          }
          finish();
          pend.on = true;
          pend.n = raw_n++;
          pend.stage = s;
          pend.phase = ph;
          return;
        }
        fa3__wait(&sm->empty_v[s], ph ^ 1u);
        if (tid == 0u) fa3__arrive_tx(&sm->full_v[s], C::V_BYTES);
        __syncwarp();
        if (mine) {
#pragma unroll
          for (int sl = 0; sl < C::SV; sl++)
            fa3__tma3(vd + sl * C::KV_SLAB + lane * pb * 128u, tv, sl * 64, (int)kvh, row, &sm->full_v[s]);
        }
        return;
      }
      /* Gather: thread tid keeps row tid % BN; zeros past the range and past d. */
      const uint32_t r = tid % BN, j = j0 + r;
      const bool ok = j < t.ke && j < t.e.kv_len;
      size_t slot = 0;
      if (ok) slot = (size_t)(((uint32_t)pt[j >> a.k.ps_shift] << a.k.ps_shift) + (j & psm)) * nkv + kvh;
      const char *ks = (const char *)a.k.l.k_pool + slot * d * EB, *vs = (const char *)a.k.l.v_pool + slot * dv * EB;
      if constexpr (E4) {
        /* K straight into the stage, V into raw (no landing in flight once the pending block is
         * done), then V^T; fenced here, as the consumers fence only gathered K (fa3__by_tma) */
        finish();
        fa3__wait(&sm->empty_k[s], ph ^ 1u);
        fa3__wait(&sm->empty_v[s], ph ^ 1u);
#pragma unroll 4
        for (int c = (int)(tid / BN); c < CK; c += 128 / BN)
          fa2__cp16(kd + (c / 8) * C::KV_SLAB + fa3__swz(r, c % 8), ks + c * 16, ok && c * 16u < d);
#pragma unroll 4
        for (int c = (int)(tid / BN); c < CV; c += 128 / BN)
          fa2__cp16(sm->raw + (c / 8) * C::KV_SLAB + fa3__swz(r, c % 8), vs + c * 16, ok && c * 16u < dv);
        fa2__commit();
        fa2__wait<0>();
        fa3__sync(FA3__BAR_PRODUCER, 128);
        write_vt(sm->raw, s);
        if (tid == 0) {
          fa3__arrive(&sm->full_k[s]);
          fa3__arrive(&sm->full_v[s]);
        }
      } else if constexpr (F8) {
        fa3__wait(&sm->empty_k[s], ph ^ 1u);
        fa3__wait(&sm->empty_v[s], ph ^ 1u);
        char *rk = sm->raw + r * DK, *rv = sm->raw + BN * DK + r * DV;
#pragma unroll 2
        for (int c = (int)(tid / BN); c < CK; c += 128 / BN) fa2__cp16(rk + c * 16, ks + c * 16, ok && c * 16u < d);
#pragma unroll 2
        for (int c = (int)(tid / BN); c < CV; c += 128 / BN) fa2__cp16(rv + c * 16, vs + c * 16, ok && c * 16u < dv);
        fa2__commit();
        fa2__wait<0>();
        fa3__sync(FA3__BAR_PRODUCER, 128);
        /* 16 fp8 dims to two fp16 chunks, exact; the scales are folded into sl2 and o_mul. */
        auto widen = [&](const char *src, int cpr, char *dst) {
#pragma unroll 1
          for (int i = (int)tid; i < BN * cpr; i += 128) {
            const int rr = i / cpr, c = i % cpr;
            char *o = dst + (c / 4) * C::KV_SLAB;
            fa2__e4m3x16(*(const uint4 *)(src + rr * cpr * 16 + c * 16), (uint4 *)(o + fa3__swz(rr, (2 * c) % 8)),
                         (uint4 *)(o + fa3__swz(rr, (2 * c + 1) % 8)));
          }
        };
        widen(sm->raw, CK, kd);
        widen(sm->raw + BN * DK, CV, vd);
        fa3__fence_async();
        fa3__sync(FA3__BAR_PRODUCER, 128); /* the stage is whole, and the landing area free again */
        if (tid == 0) {
          fa3__arrive(&sm->full_k[s]);
          fa3__arrive(&sm->full_v[s]);
        }
      } else {
        fa3__wait(&sm->empty_k[s], ph ^ 1u);
#pragma unroll 4
        for (int c = (int)(tid / BN); c < CK; c += 128 / BN)
          fa2__cp16(kd + (c / 8) * C::KV_SLAB + fa3__swz(r, c % 8), ks + c * 16, ok && c * 8u < d);
        fa3__arrive_cp(&sm->full_k[s]);
        fa3__wait(&sm->empty_v[s], ph ^ 1u);
#pragma unroll 4
        for (int c = (int)(tid / BN); c < CV; c += 128 / BN)
          fa2__cp16(vd + (c / 8) * C::KV_SLAB + fa3__swz(r, c % 8), vs + c * 16, ok && c * 8u < dv);
        fa3__arrive_cp(&sm->full_v[s]);
        fa3__sync(FA3__BAR_PRODUCER, 128); /* every thread's pending arrive is counted before the last one */
        if (tid == 0) {
          fa3__arrive(&sm->full_k[s]);
          fa3__arrive(&sm->full_v[s]);
        }
      }
    };
    /* Item k + 1 is posted once this item's first block is on its way. */
    for (uint32_t blk = 0; blk < t.nblk || blk == 0u; blk++) {
      if (blk < t.nblk) {
        load(blk);
        at.next();
      }
      if (blk == 0u && tid == 0u) fa3__sched_post(a, sm, k + 1u, work, num_pairs);
    }
  }
  if (tid == 0u) fa3__sched_done(a.k.s.tile_counter);
}

#endif /* __CUDACC__ */
#endif /* FATTN_ATTN_FA3_FA3_PRODUCE_H */
