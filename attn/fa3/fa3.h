/* fa3.h: internals of the Hopper (sm_90a) attention kernel: arguments, mbarrier, TMA and
 * wgmma helpers, the softmax policy and the warp-specialised kernel template. */
#ifndef FATTN_ATTN_FA3_FA3_H
#define FATTN_ATTN_FA3_FA3_H

#include <cuda.h>

#include "attn/fa2/fa2.h"
#include "attn/fa3/wgmma.h"

/* Everything the kernel needs besides the two tensor maps, by value: fa2's arguments (the
 * same derivation, fa2__args_for) and whether the maps are valid (then a whole KV tile comes
 * as one box a page and slab). */
typedef struct fa3__args {
  fa2__args k;
  uint32_t use_tma;
} fa3__args;

/* Launchers per padded head dim (attn/fa3/fa3_hd*.cu): 64, 128 (d 96 and 128), 192 (d_v 128
 * or 192), 256; grid is the persistent CTA count. */
int fa3__launch_hd64(const fa3__args *a, const CUtensorMap *maps, int grid, cudaStream_t st);
int fa3__launch_hd128(const fa3__args *a, const CUtensorMap *maps, int grid, cudaStream_t st);
int fa3__launch_hd192(const fa3__args *a, const CUtensorMap *maps, int grid, cudaStream_t st);
int fa3__launch_hd256(const fa3__args *a, const CUtensorMap *maps, int grid, cudaStream_t st);

/* A head dim rounded up to the 64-dim slabs of the shared-memory tiles (d 96 runs the
 * 128-dim kernel, its upper dims zero), and the KV tile (slots). A TMA box is one page of a
 * tile (at most the tile): pages of 8 slots or more, so that every box starts on a swizzle
 * atom (8 rows of 128 bytes). */
#define FA3__DK(hd) (((hd) + 63u) / 64u * 64u)
#define FA3__BN(hd) (FA3__DK(hd) > 128u ? 64u : 128u)
#define FA3__TMA_MIN_PAGE 8u
#define FA3__BOX(hd, ps) ((ps) < FA3__BN(hd) ? (ps) : FA3__BN(hd))

#ifdef __CUDACC__

/* ---- mbarriers, TMA, cp.async completion, named barriers */

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

/* Shared-memory operand in the 128-byte swizzle (rows of 128 bytes, 8-row groups 1024 bytes
 * apart); lbo is the distance between 64-column slabs, read only for MN-major operands. */
__device__ __forceinline__ uint64_t fa3__desc(const void *p, uint32_t lbo) {
  uint64_t a = fa2__smem(p);
  return ((a & 0x3FFFFull) >> 4) | ((uint64_t)((lbo >> 4) & 0x3FFFu) << 16) |
         ((uint64_t)(1024u >> 4) << 32) | (1ull << 62);
}
/* Byte offset of 16-byte chunk c of row r inside a swizzled slab. */
__device__ __forceinline__ uint32_t fa3__swz(uint32_t r, uint32_t c) { return r * 128u + ((c ^ (r & 7u)) << 4); }

/* ---- the softmax policies. A policy sees a thread's two rows (fragment rows g and g + 8) and
 * the scores of one tile; LAZY says whether its alphas are often exactly 1, so that a warp
 * should vote to skip the rescale of O. */

/* mx: each of the two rows' max, raised to its scores' (s: [BN / 8][row 0 pair, row 1 pair]). */
template <int BN> __device__ __forceinline__ void fa3__rows_max(const float *s, float *mx) {
#pragma unroll
  for (int i = 0; i < BN / 8; i++) {
    mx[0] = fmaxf(mx[0], fmaxf(s[4 * i], s[4 * i + 1]));
    mx[1] = fmaxf(mx[1], fmaxf(s[4 * i + 2], s[4 * i + 3]));
  }
}
/* Raw scores to weights exp2(s mul - base) in place (one FFMA a score: the scale rides on the
 * exp's subtraction), each row's added to its l. */
template <int BN> __device__ __forceinline__ void fa3__rows_exp(float *s, float mul, const float *base, float *l) {
#pragma unroll
  for (int i = 0; i < BN / 8; i++) {
#pragma unroll
    for (int k = 0; k < 4; k++) {
      const float p = fa2__exp2(fmaf(s[4 * i + k], mul, -base[k >> 1]));
      s[4 * i + k] = p;
      l[k >> 1] += p;
    }
  }
}

/* Exact online softmax in exp2, rescaling whenever a row max grows. */
template <int BN> struct fa3__softmax_exact {
  static constexpr bool LAZY = false;
  float m[2], l[2];
  __device__ __forceinline__ void init() { m[0] = m[1] = -INFINITY; l[0] = l[1] = 0.f; }
  /* s: raw scores, -inf where masked, and mul (> 0) the factor to log2 units; m is kept in
   * log2 units. On return p = exp2(s mul - m), alpha the factor the accumulator rows must take.
   * The max is taken on raw scores, since mul > 0 keeps their order. */
  __device__ __forceinline__ void step(float *s, float mul, float *alpha) {
    float mx[2] = {-INFINITY, -INFINITY};
    fa3__rows_max<BN>(s, mx);
    float base[2];
#pragma unroll
    for (int h = 0; h < 2; h++) {
      mx[h] = fmaxf(m[h], fa2__lanes_max<1, 2>(mx[h]) * mul);
      base[h] = mx[h] == -INFINITY ? 0.f : mx[h];
      alpha[h] = fa2__exp2(m[h] - base[h]);
      m[h] = mx[h];
      l[h] *= alpha[h];
    }
    fa3__rows_exp<BN>(s, mul, base, l);
  }
};

/* Bits n of a thread's BN / 4 columns j0 + 8 (n / 2) + 2 c4 + n % 2 that lie in [lo, hi). */
template <int BN> __device__ __forceinline__ uint32_t fa3__run_bits(uint32_t lo, uint32_t hi, uint32_t j0, uint32_t c4) {
  auto below = [&](uint32_t x) -> uint32_t { /* columns under slot x */
    if (x <= j0 + 2u * c4) return 0u;
    const uint32_t y = x - j0 - 2u * c4, n = 2u * (y / 8u) + min(y % 8u, 2u);
    return min(n, (uint32_t)BN / 4u);
  };
  auto ones = [](uint32_t n) -> uint32_t { return n >= 32u ? ~0u : (1u << n) - 1u; };
  return hi > lo ? ones(below(hi)) & ~ones(below(lo)) : 0u;
}

/* FA4's lazy rescaling (docs/credits.md): a row's max moves only when a score passes it by
 * more than 2^TH, so most tiles leave alpha at exactly 1; the weights stay under 2^TH, which
 * bf16 / fp16 P and the fp32 sums hold as well as weights under 1. Built for the 64-slot tiles
 * (d 192 and 256): d 256 measured +3-6%, d 64 / 128 0.97-1.03 (docs/perf.md, session 6). */
template <int BN> struct fa3__softmax_lazy {
  static constexpr bool LAZY = true;
  static constexpr float TH = 8.f;
  float m[2], l[2];
  __device__ __forceinline__ void init() { m[0] = m[1] = -INFINITY; l[0] = l[1] = 0.f; }
  __device__ __forceinline__ void step(float *s, float mul, float *alpha) {
    float mx[2] = {-INFINITY, -INFINITY};
    fa3__rows_max<BN>(s, mx);
    float base[2];
#pragma unroll
    for (int h = 0; h < 2; h++) {
      mx[h] = fa2__lanes_max<1, 2>(mx[h]) * mul;
      const float nm = mx[h] > m[h] + TH ? mx[h] : m[h];
      base[h] = nm == -INFINITY ? 0.f : nm;
      alpha[h] = nm == m[h] ? 1.f : fa2__exp2(m[h] - base[h]);
      m[h] = nm;
      l[h] *= alpha[h];
    }
    fa3__rows_exp<BN>(s, mul, base, l);
  }
};

/* ---- shapes */

/* One unit of work: 128 query rows of one q head (two planner tiles of 64) and its KV range. */
typedef struct fa3__tile {
  fattn__entry e;
  uint32_t hq, R0;      /* q head; first query row of the entry */
  uint32_t kb, ke, nblk; /* blocks start at kb (a multiple of BN), end at slot ke */
  bool tree;
} fa3__tile;

/* DK, DV: the QK and PV head dims of the tiles (multiples of 64); F8: the KV is fp8, gathered
 * raw into a landing area and widened to fp16 into the stage by the producer. */
template <int DK, int DV, int ST, bool F8> struct fa3__cfg {
  static constexpr int BN = FA3__BN(DK), NT = 384, SK = DK / 64, SV = DV / 64;
  static constexpr int Q_WG = SK * 64 * 128;      /* one consumer's 64 rows: [slab][64][128 B] */
  static constexpr int KV_SLAB = BN * 128;        /* [BN slots][128 B] */
  static constexpr int K_BYTES = SK * KV_SLAB;    /* [slab][BN][128 B] */
  static constexpr int V_BYTES = SV * KV_SLAB;
  static constexpr int STAGE = K_BYTES + V_BYTES;
  static constexpr int RAW = F8 ? BN * (DK + DV) : 0; /* fp8 rows as loaded: [BN][DK], [BN][DV] */
  /* mbarriers: full and empty of K and of V a stage, then the work ring's 4; and its 4 words */
  static constexpr int BARS = 4 * ST * 8 + 4 * 8 + 16;
  static constexpr int SMEM = 1024 + 2 * Q_WG + ST * STAGE + RAW + BARS;
  /* Registers a thread of the producer and of each consumer (setmaxnreg). P + 2 C <= 504, the
   * 168 a thread the launch gave each warpgroup: consumers asking for more than the producer
   * freed wait forever (v8b hung at 48 + 2 x 232). At d 192 the producer's TMA lanes spill
   * at 40 and the consumers fit in 224 (ptxas -v). */
  static constexpr int P_REGS = DK == 192 ? 56 : 40, C_REGS = DK == 192 ? 224 : 232;
  static_assert(SMEM <= 227 * 1024, "shared memory");
};

/* Output and LSE element pairs in Q's type; fp8 kernels serve bf16 and fp16 Q alike. */
template <typename TM, bool F8> __device__ __forceinline__ uint32_t fa3__out_pair(float x, float y, uint32_t q_dtype) {
  if constexpr (F8) return q_dtype == 1u ? fa2__pack<__nv_bfloat16>(x, y) : fa2__pack<__half>(x, y);
  return fa2__pack<TM>(x, y);
}

/* Work item w, largest query index first (causal tiles with most KV go first), of entry ei
 * (found by fa3__claim, which skipped the items that are second halves of 128-row tiles). */
template <int BN>
__device__ __forceinline__ void fa3__tile_of(const fa3__args &a, uint32_t w, uint32_t ei, uint32_t num_tiles,
                                             fa3__tile *t) {
  const fattn__step_hdr *hdr = a.k.s.hdr;
  const uint32_t qh = a.k.l.num_q_heads, b = num_tiles - 1u - w / qh;
  t->e = a.k.s.entries[ei];
  const uint32_t local = b - t->e.tile_start;
  t->hq = w % qh;
  t->R0 = local * 64u;
  t->tree = hdr->mode == 3u && t->e.mask_row != UINT32_MAX && a.k.s.mask;
  const uint32_t last = min(t->R0 + 127u, t->e.q_len - 1u);
  fattn__kv_range r = fattn__rows_range(&a.k.l, (int)hdr->causal, t->tree, t->e.q_len, t->e.kv_len, t->R0, last);
  t->kb = r.lo_any / BN * BN;
  t->ke = r.hi_any;
  t->nblk = t->ke > t->kb ? (t->ke - t->kb + BN - 1u) / BN : 0u;
}

/* ---- the tile scheduler: work items go to blocks as they free up (an atomic counter after
 * each block's first item), so a block that drew short causal tiles takes more of them. The
 * producer runs stages ahead of the consumers, so a claim's round trip hides behind the last
 * stages of the tile before. The producer's thread 0 claims each item (the k-th of its block)
 * and hands it with its entry to the consumers through a ring of two slots (words [w 0, w 1,
 * entry 0, entry 1]; sched: [full 0, full 1, empty 0, empty 1] mbarriers), so that the entry's
 * binary search is made once, ahead, and not on the consumers' path between two tiles. */
typedef struct fa3__item {
  uint32_t w, ei; /* work item (work when none is left) and its entry */
} fa3__item;
static __device__ __noinline__ fa3__item fa3__claim(const fa3__args &a, uint32_t k, uint32_t work, uint32_t num_tiles) {
  const uint32_t qh = a.k.l.num_q_heads, n = a.k.s.hdr->num_entries;
  for (uint32_t w = k ? gridDim.x + atomicAdd(a.k.s.tile_counter, 1u) : blockIdx.x;;
       w = gridDim.x + atomicAdd(a.k.s.tile_counter, 1u)) {
    if (w >= work) return fa3__item{w, 0u};
    const uint32_t b = num_tiles - 1u - w / qh, ei = fa2__find(a.k.s.entries, n, b);
    if (((b - a.k.s.entries[ei].tile_start) & 1u) == 0u) return fa3__item{w, ei}; /* a whole tile starts on an even local index */
  }
}
/* The last block to finish puts both words back to 0 for the next launch: by then every
 * block has made its last claim. */
__device__ __forceinline__ void fa3__retire(uint32_t *counter) {
  __threadfence();
  if (atomicAdd(counter + 1, 1u) == gridDim.x - 1u) {
    counter[0] = 0u;
    counter[1] = 0u;
  }
}
/* A consumer warp takes the k-th item from the ring and frees its slot. */
__device__ __forceinline__ fa3__item fa3__take(uint64_t *sched, uint32_t k) {
  fa3__wait(&sched[k & 1u], (k >> 1) & 1u);
  const uint32_t *ring = (const uint32_t *)(sched + 4);
  const fa3__item item = {ring[k & 1u], ring[2u + (k & 1u)]};
  __syncwarp();
  if (threadIdx.x % 32u == 0u) fa3__arrive(&sched[2u + (k & 1u)]);
  return item;
}

/* ---- producer warpgroup: fills the K and V stages, by TMA where the tile sits in one page
 * and is all inside the sequence, else by a cp.async gather (zeros past the range). */
template <int DK, int DV, int ST, bool F8>
__device__ __forceinline__ void fa3__produce(const fa3__args &a, const CUtensorMap *tk, const CUtensorMap *tv,
                                             char *kv, char *raw, uint64_t *full_k, uint64_t *full_v, uint64_t *empty_k,
                                             uint64_t *empty_v, uint64_t *sched, uint32_t *ring) {
  using C = fa3__cfg<DK, DV, ST, F8>;
  constexpr int BN = C::BN, EB = F8 ? 1 : 2; /* bytes an element as stored */
  constexpr int CK = DK * EB / 16, CV = DV * EB / 16; /* 16-byte chunks a row as loaded */
  const uint32_t tid = threadIdx.x, G = a.k.l.num_q_heads / a.k.l.num_kv_heads;
  const uint32_t d = a.k.l.head_dim, dv = a.k.l.head_dim_v, nkv = a.k.l.num_kv_heads;
  const uint32_t psm = (1u << a.k.ps_shift) - 1u, num_tiles = a.k.s.hdr->num_tiles;
  const uint32_t work = a.k.s.hdr->num_entries ? num_tiles * a.k.l.num_q_heads : 0u;
  uint32_t it = 0;
  for (uint32_t k = 0;; k++) {
    if (tid == 0u) {
      const fa3__item item = fa3__claim(a, k, work, num_tiles);
      fa3__wait(&sched[2u + (k & 1u)], ((k >> 1) & 1u) ^ 1u);
      ring[k & 1u] = item.w;
      ring[2u + (k & 1u)] = item.ei;
      fa3__arrive(&sched[k & 1u]);
    }
    fa3__sync(1, 128);
    const uint32_t cur = ring[k & 1u]; /* the slot is rewritten two items later, after this barrier's next use */
    if (cur >= work) break;
    fa3__tile t;
    fa3__tile_of<BN>(a, cur, ring[2u + (k & 1u)], num_tiles, &t);
    const uint32_t kvh = t.hq / G;
    const int32_t *pt = a.k.l.page_table + (size_t)t.e.seq * a.k.l.pages_per_seq;
    for (uint32_t blk = 0; blk < t.nblk; blk++, it++) {
      const uint32_t s = it % ST, ph = (it / ST) & 1u, j0 = t.kb + blk * BN;
      char *kd = kv + s * C::STAGE, *vd = kd + C::K_BYTES;
      if (!F8 && a.use_tma && j0 + BN <= t.e.kv_len) {
        /* Lane i of warp 0 brings page i of the tile (boxes past d, at d 96, arrive as zeros);
         * the bytes are expected before any box can land. K goes as soon as the S GEMMs of
         * the stage's last block are done, V once its P V GEMMs are. */
        const uint32_t pb = min(1u << a.k.ps_shift, (uint32_t)BN), lane = tid % 32u, j = j0 + lane * pb;
        /* Every producer thread waits, not only the lanes that issue: a parity wait tells only
         * the last two phases apart, and the gather blocks need all 128 threads in step. */
        const bool mine = tid < 32u && lane < BN / pb;
        const int row = mine ? (int)(((uint32_t)pt[j >> a.k.ps_shift] << a.k.ps_shift) + (j & psm)) : 0;
        fa3__wait(&empty_k[s], ph ^ 1u);
        if (tid == 0u) fa3__arrive_tx(&full_k[s], C::K_BYTES);
        __syncwarp();
        if (mine) {
#pragma unroll
          for (int sl = 0; sl < C::SK; sl++)
            fa3__tma3(kd + sl * C::KV_SLAB + lane * pb * 128u, tk, sl * 64, (int)kvh, row, &full_k[s]);
        }
        fa3__wait(&empty_v[s], ph ^ 1u);
        if (tid == 0u) fa3__arrive_tx(&full_v[s], C::V_BYTES);
        __syncwarp();
        if (mine) {
#pragma unroll
          for (int sl = 0; sl < C::SV; sl++)
            fa3__tma3(vd + sl * C::KV_SLAB + lane * pb * 128u, tv, sl * 64, (int)kvh, row, &full_v[s]);
        }
        continue;
      }
      /* Gather: thread tid keeps row tid % BN, so one page-table read a thread a tile; zeros
       * past the range and past d. */
      const uint32_t r = tid % BN, j = j0 + r;
      const bool ok = j < t.ke && j < t.e.kv_len;
      size_t slot = 0;
      if (ok) slot = (size_t)(((uint32_t)pt[j >> a.k.ps_shift] << a.k.ps_shift) + (j & psm)) * nkv + kvh;
      const char *ks = (const char *)a.k.l.k_pool + slot * d * EB, *vs = (const char *)a.k.l.v_pool + slot * dv * EB;
      if constexpr (F8) {
        fa3__wait(&empty_k[s], ph ^ 1u);
        fa3__wait(&empty_v[s], ph ^ 1u);
        char *rk = raw + r * DK, *rv = raw + BN * DK + r * DV;
#pragma unroll 2
        for (int c = (int)(tid / BN); c < CK; c += 128 / BN) fa2__cp16(rk + c * 16, ks + c * 16, ok && c * 16u < d);
#pragma unroll 2
        for (int c = (int)(tid / BN); c < CV; c += 128 / BN) fa2__cp16(rv + c * 16, vs + c * 16, ok && c * 16u < dv);
        fa2__commit();
        fa2__wait<0>();
        fa3__sync(1, 128);
        /* 16 fp8 dims to two fp16 chunks, exact; the scales are folded into sl2 and o_mul. */
        auto widen = [&](const char *src, int cpr, char *dst) {
#pragma unroll 1
          for (int i = (int)tid; i < BN * cpr; i += 128) {
            const int rr = i / cpr, c = i % cpr;
            const uint4 w = *(const uint4 *)(src + rr * cpr * 16 + c * 16);
            const uint32_t x[4] = {w.x, w.y, w.z, w.w};
            uint32_t h[8];
#pragma unroll
            for (int k = 0; k < 4; k++) {
              h[2 * k] = fa2__e4m3x2<__half>((uint16_t)(x[k] & 0xffffu));
              h[2 * k + 1] = fa2__e4m3x2<__half>((uint16_t)(x[k] >> 16));
            }
            char *o = dst + (c / 4) * C::KV_SLAB;
            *(uint4 *)(o + fa3__swz(rr, (2 * c) % 8)) = make_uint4(h[0], h[1], h[2], h[3]);
            *(uint4 *)(o + fa3__swz(rr, (2 * c + 1) % 8)) = make_uint4(h[4], h[5], h[6], h[7]);
          }
        };
        widen(raw, CK, kd);
        widen(raw + BN * DK, CV, vd);
        fa3__fence_async();
        fa3__sync(1, 128); /* the stage is whole, and the landing area free again */
        if (tid == 0) {
          fa3__arrive(&full_k[s]);
          fa3__arrive(&full_v[s]);
        }
      } else {
        fa3__wait(&empty_k[s], ph ^ 1u);
#pragma unroll 4
        for (int c = (int)(tid / BN); c < CK; c += 128 / BN)
          fa2__cp16(kd + (c / 8) * C::KV_SLAB + fa3__swz(r, c % 8), ks + c * 16, ok && c * 8u < d);
        fa3__arrive_cp(&full_k[s]);
        fa3__wait(&empty_v[s], ph ^ 1u);
#pragma unroll 4
        for (int c = (int)(tid / BN); c < CV; c += 128 / BN)
          fa2__cp16(vd + (c / 8) * C::KV_SLAB + fa3__swz(r, c % 8), vs + c * 16, ok && c * 8u < dv);
        fa3__arrive_cp(&full_v[s]);
        fa3__sync(1, 128); /* every thread's pending arrive is counted before the last one */
        if (tid == 0) {
          fa3__arrive(&full_k[s]);
          fa3__arrive(&full_v[s]);
        }
      }
    }
  }
  if (tid == 0u) fa3__retire(a.k.s.tile_counter);
}

/* ---- consumer warpgroup c: 64 query rows of each tile; S = Q K^T and O += P V by wgmma. */
template <int DK, int DV, int ST, typename T, bool F8, typename SM>
__device__ __forceinline__ void fa3__consume(const fa3__args &a, int c, char *qs, char *kv, uint64_t *full_k,
                                             uint64_t *full_v, uint64_t *empty_k, uint64_t *empty_v,
                                             uint64_t *sched) {
  using C = fa3__cfg<DK, DV, ST, F8>;
  constexpr int BN = C::BN, CH = DK / 8;
  const fattn__layer_params &l = a.k.l;
  const uint32_t d = l.head_dim, dv = l.head_dim_v;
  const uint32_t tid = threadIdx.x % 128u, warp = tid / 32u, lane = tid % 32u, g = lane / 4u, c4 = lane % 4u;
  const uint32_t num_tiles = a.k.s.hdr->num_tiles, causal = a.k.s.hdr->causal;
  const uint32_t work = a.k.s.hdr->num_entries ? num_tiles * l.num_q_heads : 0u;
  uint32_t it = 0;
  if (c == 1) fa3__arrive_bar(4, 256); /* consumer 0 takes the first turn */
  /* Q rows of this warpgroup for tile t, zeros past the entry and past d, as one cp.async group.
   * With fp8 KV the MMAs run in fp16, so bf16 Q is narrowed as it loads (exact for |q| in
   * [2^-14, 65504]). */
  auto load_q = [&](const fa3__tile &t) {
    const uint32_t R0 = t.R0 + 64u * (uint32_t)c;
#pragma unroll 1 /* rolled: it runs beside the last P V GEMM, where registers are short */
    for (uint32_t ci = tid; ci < 64u * CH; ci += 128u) {
      const uint32_t r = ci / CH, ch = ci % CH, q = R0 + r;
      const bool in = q < t.e.q_len && ch * 8u < d;
      const char *src = (const char *)a.k.q;
      if (in) src += ((size_t)(t.e.q_start + q) * l.num_q_heads + t.hq) * d * 2u + ch * 16u;
      char *dst = qs + (ch / 8u) * 8192u + fa3__swz(r, ch % 8u);
      if (F8 && l.q_dtype == 1u) {
        uint4 w = in ? *(const uint4 *)src : make_uint4(0u, 0u, 0u, 0u);
        uint32_t *x = &w.x;
#pragma unroll
        for (int k = 0; k < 4; k++) {
          const float2 f = __bfloat1622float2(*(const __nv_bfloat162 *)&x[k]);
          x[k] = fa2__pack<__half>(f.x, f.y);
        }
        *(uint4 *)dst = w;
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
    const fa3__item item = fa3__take(sched, k);
    if (item.w < work) {
      fa3__tile t;
      fa3__tile_of<BN>(a, item.w, item.ei, num_tiles, &t);
      load_q(t);
    }
    return item;
  };
  fa3__item item = take(0u);
  for (uint32_t k = 0; item.w < work; k++) { /* whole tiles: the producer skipped halves */
    fa3__tile t;
    fa3__tile_of<BN>(a, item.w, item.ei, num_tiles, &t);
    fa2__wait<0>();
    fa3__fence_async();
    fa3__sync(2 + c, 128);
    const uint32_t R0 = t.R0 + 64u * (uint32_t)c, prefix = t.e.kv_len - t.e.q_len;
    const bool rows = R0 < t.e.q_len;
    const uint32_t last = rows ? min(R0 + 63u, t.e.q_len - 1u) : R0;
    fattn__kv_range mine = fattn__rows_range(&l, (int)causal, t.tree, t.e.q_len, t.e.kv_len, R0, last);
    const uint32_t all_hi = min(mine.hi_all, t.ke);

    uint32_t qpos[2];
    const uint64_t *mrow[2];
#pragma unroll
    for (int h = 0; h < 2; h++) {
      const uint32_t q = min(R0 + warp * 16u + g + 8u * h, t.e.q_len - 1u);
      qpos[h] = prefix + q;
      mrow[h] = t.tree ? a.k.s.mask + t.e.mask_row + q : nullptr;
    }
    /* Without a tree a row sees one range of slots: worked out once a tile, not a block. */
    uint32_t run_lo[2] = {0u, 0u}, run_hi[2] = {0u, 0u};
    if (DK <= 128 && !t.tree) {
#pragma unroll
      for (int h = 0; h < 2; h++) {
        const fattn__kv_range r = fattn__rows_range(&l, (int)causal, 0, t.e.q_len, t.e.kv_len, qpos[h] - prefix,
                                                    qpos[h] - prefix);
        run_lo[h] = r.lo_any;
        run_hi[h] = min(r.hi_any, t.ke);
      }
    }
    float o[DV / 2];
#pragma unroll
    for (int i = 0; i < DV / 2; i++) o[i] = 0.f;
    SM sm;
    sm.init();

    /* Block blk: S_blk = Q K_blk is issued with O += P_{blk-1} V_{blk-1}, so the softmax of
     * S_blk overlaps that P V; the two consumers take turns to issue (named barriers 4 and 5),
     * so one's softmax runs under the other's GEMMs. */
    float sc[BN / 2];
    uint32_t p[BN / 16][4];
    auto issue_s = [&](uint32_t blk) {
      const uint32_t st = (it + blk) % ST;
      const char *kd = kv + st * C::STAGE;
      uint64_t qd = fa3__desc(qs, 0u);
      asm volatile("" : "+l"(qd)); /* else ptxas hoists the DK / 16 Q descriptors and spills them */
#pragma unroll
      for (int ks = 0; ks < DK / 16; ks++)
        fa3__mma_ss<BN, T>(sc, qd + (uint64_t)(((ks / 4) * 8192 + (ks % 4) * 32) >> 4),
                           fa3__desc(kd + (ks / 4) * C::KV_SLAB + (ks % 4) * 32, 0u), ks > 0);
      fa3__mma_commit();
    };
    auto issue_pv = [&](uint32_t blk) {
      const uint32_t st = (it + blk) % ST;
      const char *vd = kv + st * C::STAGE + C::K_BYTES;
#pragma unroll
      for (int kk = 0; kk < BN / 16; kk++) fa3__mma_rs<DV, T>(o, p[kk], fa3__desc(vd + kk * 2048, C::KV_SLAB));
      fa3__mma_commit();
    };
    /* Scores of block blk masked (softcapped ones taken to log2 units first), then the policy's
     * step, which scales raw scores inside its exps. The unrolled loops stay small and
     * branch-free: the mask of a boundary block is worked out first, one bit a score, in a
     * rolled loop (jumping over per-score mask code thrashed the I-cache). */
    const float sl2 = a.k.sl2, softcap = l.softcap, cap_mul = a.k.cap_scale / l.softcap;
    auto soft = [&](uint32_t blk, float *alpha) {
      const uint32_t j0 = t.kb + blk * BN;
      if (softcap > 0.f) {
#pragma unroll
        for (int i = 0; i < BN / 2; i++) sc[i] = softcap * tanhf(sc[i] * cap_mul) * FA2__LOG2E;
      }
      if (!(j0 >= mine.lo_all && j0 + BN <= all_hi)) {
        uint32_t vis[2] = {0u, 0u}; /* bit n: column 8 (n / 2) + 2 c4 + n % 2 of the block */
        if (DK > 128 || t.tree) { /* d 192 and 256: no registers to spare for the run below */
#pragma unroll 1
          for (uint32_t n = 0; n < BN / 4; n++) {
            const uint32_t j = j0 + 8u * (n >> 1) + 2u * c4 + (n & 1u);
#pragma unroll
            for (int h = 0; h < 2; h++)
              if (j < t.ke && fa2__vis(l, (int)causal, t.tree, mrow[h], prefix, qpos[h], j)) vis[h] |= 1u << n;
          }
        } else {
          /* A thread's columns rise with n, so a row's visible bits are one run: two counts
           * instead of a loop. */
#pragma unroll
          for (int h = 0; h < 2; h++) vis[h] = fa3__run_bits<BN>(run_lo[h], run_hi[h], j0, c4);
        }
#pragma unroll
        for (int i = 0; i < BN / 8; i++) {
#pragma unroll
          for (int k = 0; k < 4; k++)
            if (!((vis[k >> 1] >> (2 * i + (k & 1))) & 1u)) sc[4 * i + k] = -INFINITY;
        }
      }
      sm.step(sc, softcap > 0.f ? 1.f : sl2, alpha);
    };
    auto pack_p = [&]() {
#pragma unroll
      for (int kk = 0; kk < BN / 16; kk++) {
#pragma unroll
        for (int r = 0; r < 4; r++) p[kk][r] = fa2__pack<T>(sc[8 * kk + 2 * r], sc[8 * kk + 2 * r + 1]);
      }
    };
    /* Waits stay out of the issue sequences: a spin loop between wgmma.fence and a wgmma is a
     * divergent path after which ptxas serialises the wgmmas. */
    auto ready = [&](uint64_t *bars, uint32_t blk) {
      fa3__wait(&bars[(it + blk) % ST], ((it + blk) / ST) & 1u);
      fa3__fence_async();
    };
    auto release = [&](uint64_t *bars, uint32_t blk) {
      if (lane == 0) fa3__arrive(&bars[(it + blk) % ST]);
    };
    if (t.nblk) {
      float alpha[2];
      ready(full_k, 0);
      fa3__sync(4 + c, 256);
      fa3__mma_fence();
      issue_s(0);
      fa3__arrive_bar(4 + (c ^ 1), 256);
      fa3__pin<BN / 2>(sc);
      fa3__mma_wait<0>();
      fa3__pin<BN / 2>(sc);
      release(empty_k, 0);
      soft(0, alpha);
      pack_p();
      for (uint32_t blk = 1; blk < t.nblk; blk++) {
        ready(full_k, blk);
        ready(full_v, blk - 1);
        fa3__sync(4 + c, 256);
        fa3__pin<DV / 2>(o);
        fa3__mma_fence();
        issue_s(blk);
        issue_pv(blk - 1);
        fa3__arrive_bar(4 + (c ^ 1), 256);
        fa3__pin<BN / 2>(sc);
        fa3__mma_wait<1>();
        fa3__pin<BN / 2>(sc);
        release(empty_k, blk);
        soft(blk, alpha);
        fa3__pin<DV / 2>(o);
        fa3__mma_wait<0>();
        fa3__pin<DV / 2>(o);
        release(empty_v, blk - 1);
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
      ready(full_v, t.nblk - 1);
      fa3__sync(4 + c, 256);
      fa3__pin<DV / 2>(o);
      fa3__mma_fence();
      issue_pv(t.nblk - 1);
      fa3__arrive_bar(4 + (c ^ 1), 256);
      fa3__pin<DV / 2>(o);
      fa3__mma_wait<0>();
      fa3__pin<DV / 2>(o);
      release(empty_v, t.nblk - 1);
      it += t.nblk;
    } else {
      item = take(k + 1u);
    }
    if (!rows) continue;

    /* Epilogue: O / l and LSE straight from the fragments. */
#pragma unroll
    for (int h = 0; h < 2; h++) {
      const uint32_t q = R0 + warp * 16u + g + 8u * h;
      const float L = fa2__lanes_sum<1, 2>(sm.l[h]), M = sm.m[h];
      if (q >= t.e.q_len) continue;
      float lse2 = -INFINITY, inv = 0.f; /* a row that sees nothing: O = 0, LSE = sink or -inf */
      if (M != -INFINITY) {
        const float Lt = L + (l.sinks ? exp2f(l.sinks[t.hq] * FA2__LOG2E - M) : 0.f);
        inv = a.k.o_mul / Lt;
        lse2 = M + log2f(Lt);
      } else if (l.sinks) {
        lse2 = l.sinks[t.hq] * FA2__LOG2E;
      }
      const size_t row_o = (size_t)(t.e.q_start + q) * l.num_q_heads + t.hq;
      uint32_t *dst = (uint32_t *)((uint16_t *)a.k.out + row_o * dv + 2u * c4);
#pragma unroll
      for (int i = 0; i < DV / 8; i++)
        if (8u * i < dv) /* d 96: the upper dims are padding */
          dst[4 * i] = fa3__out_pair<T, F8>(o[4 * i + 2 * h] * inv, o[4 * i + 2 * h + 1] * inv, l.q_dtype);
      if (a.k.lse && c4 == 0u) a.k.lse[row_o] = lse2 * FA2__LN2;
    }
  }
  if (c == 0) fa3__sync(4, 256); /* consumer 1's last turn handed over */
}

template <int DK, int DV, int ST, typename T, bool F8, typename SM>
__global__ void __launch_bounds__(384, 1)
    fa3__attn(const __grid_constant__ fa3__args a, const __grid_constant__ CUtensorMap tk,
              const __grid_constant__ CUtensorMap tv) {
  using C = fa3__cfg<DK, DV, ST, F8>;
  fattn__pdl_wait();
  extern __shared__ __align__(16) char smem_raw[];
  char *smem = (char *)(((uintptr_t)smem_raw + 1023u) & ~(uintptr_t)1023u); /* swizzle atoms */
  char *qs = smem, *kv = smem + 2 * C::Q_WG, *raw = kv + ST * C::STAGE;
  uint64_t *full_k = (uint64_t *)(raw + C::RAW), *full_v = full_k + ST, *empty_k = full_v + ST;
  uint64_t *empty_v = empty_k + ST, *sched = empty_v + ST;
  uint32_t *ring = (uint32_t *)(sched + 4);
  if (threadIdx.x == 0) {
    for (int s = 0; s < ST; s++) {
      fa3__bar_init(&full_k[s], 1);
      fa3__bar_init(&full_v[s], 1);
      fa3__bar_init(&empty_k[s], 8); /* one arrive a consumer warp */
      fa3__bar_init(&empty_v[s], 8);
    }
    for (int s = 0; s < 2; s++) {
      fa3__bar_init(&sched[s], 1);
      fa3__bar_init(&sched[2 + s], 8);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
  const int wg = (int)(threadIdx.x / 128u);
  if (wg == 0) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(C::P_REGS));
    fa3__produce<DK, DV, ST, F8>(a, &tk, &tv, kv, raw, full_k, full_v, empty_k, empty_v, sched, ring);
  } else {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(C::C_REGS));
    fa3__consume<DK, DV, ST, T, F8, SM>(a, wg - 1, qs + (wg - 1) * C::Q_WG, kv, full_k, full_v, empty_k, empty_v,
                                        sched);
  }
}

template <int DK, int DV, int ST, typename T, bool F8>
static int fa3__go(const fa3__args *a, const CUtensorMap *maps, int grid, cudaStream_t st) {
  using C = fa3__cfg<DK, DV, ST, F8>;
  using SM = typename std::conditional<(DK > 128), fa3__softmax_lazy<C::BN>, fa3__softmax_exact<C::BN>>::type;
  auto k = fa3__attn<DK, DV, ST, T, F8, SM>;
  static int attr_set; /* benign race: idempotent */
  if (!attr_set) {
    cudaError_t err = cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, C::SMEM);
    if (err != cudaSuccess) return (int)err;
    attr_set = 1;
  }
  return (int)fattn__launch(k, dim3(grid), dim3(C::NT), C::SMEM, st, *a, maps[0], maps[1]);
}

/* The three kernels of one tile shape: bf16 and fp16 KV in Q's type, and fp8 KV (fp16 MMAs,
 * either Q type; ST8 stages, the landing area taking the rest of shared memory). */
template <int DK, int DV, int ST, int ST8>
static int fa3__launch(const fa3__args *a, const CUtensorMap *maps, int grid, cudaStream_t st) {
  if (a->k.l.kv_dtype == 3u) return fa3__go<DK, DV, ST8, __half, true>(a, maps, grid, st);
  if (a->k.l.q_dtype == 1u) return fa3__go<DK, DV, ST, __nv_bfloat16, false>(a, maps, grid, st);
  return fa3__go<DK, DV, ST, __half, false>(a, maps, grid, st);
}

#endif /* __CUDACC__ */
#endif /* FATTN_ATTN_FA3_FA3_H */
