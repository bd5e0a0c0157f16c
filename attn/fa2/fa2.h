/* fa2.h: internals of the portable sm_80+ attention kernels: kernel arguments, tile shapes and
 * the one attention kernel template with its launchers (device helpers: fa2_ops.h). */
#ifndef FATTN_ATTN_FA2_FA2_H
#define FATTN_ATTN_FA2_FA2_H

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "attn/backend.h"
#include "attn/fa2/fa2_ops.h"
#include "attn/pdl.h"
#include "attn/stamps.h"

/* Everything a kernel needs, by value. Derived on the host from layer and step params only. */
typedef struct fa2__args {
  fattn__layer_params l;
  fattn__step_params s;
  const void *q;
  void *out;
  float *lse;
  float sl2;        /* scale (times k_scale for fp8) * log2(e) */
  float cap_scale;  /* scale (times k_scale) when softcap > 0 */
  float o_mul;      /* v_scale for fp8, else 1 */
  uint32_t ps_shift; /* log2(page_size) */
  uint32_t num_sms;  /* multiprocessors: the 2-stage decode kind's first wave works early */
} fa2__args;

/* Launchers per head-dim pair (attn/fa2/fa2_hd*.cu). kind 0: decode (GQA-packed, split-KV,
 * 16-row tiles), 1: prefill (query tile per q head), 2: decode with 32-row tiles for entries
 * of more than 16 packed rows (verify), so that a KV block feeds twice the rows, 3: decode
 * with a deeper ring for grids of less than a wave; head dims above 128 run kinds 2 and 3 as
 * kind 0, and fp8 KV runs kind 3 as kind 0. Return cudaError_t values. */
#define FA2__KIND_DECODE 0
#define FA2__KIND_PREFILL 1
#define FA2__KIND_WIDE 2
#define FA2__KIND_DEEP 3
/* Flag on a decode kind: tiles of 8 rows with the products transposed (head dims up to 128). */
#define FA2__NARROW 8
int fa2__launch_hd64(const fa2__args *a, int kind, dim3 grid, cudaStream_t st);
/* Multiprocessors of the current device (read once per device; fa3 sizes its persistent grid by it). */
int fa2__sm_count(void);
int fa2__launch_hd96(const fa2__args *a, int kind, dim3 grid, cudaStream_t st);
int fa2__launch_hd128(const fa2__args *a, int kind, dim3 grid, cudaStream_t st);
int fa2__launch_hd192(const fa2__args *a, int kind, dim3 grid, cudaStream_t st);
int fa2__launch_hd256(const fa2__args *a, int kind, dim3 grid, cudaStream_t st);
/* MLA's absorbed shape: Q and the latent rows are 576 wide (512 latent + 64 rope), V and O are
 * the latent's 512. */
#define FA2__MLA_DK 576
#define FA2__MLA_DV 512
/* The MLA kernel (attn/fa2/fa2_mla.cu) over grid (entries x head groups of
 * fattn__decode_groups, splits, row tiles); returns a cudaError_t value. */
int fa2__launch_mla(const fa2__args *a, dim3 grid, cudaStream_t st);

#ifdef __CUDACC__

/* The split-KV combine (attn/fa2/fa2_attend.cu) after a decode-like kernel whose entries took
 * qpe query tokens each: merges split_o / split_lse into out and lse. Also run after the
 * Hopper MLA kernel (attn/mla/mla90.cu), whose partials have the same layout. */
int fa2__launch_combine(const fa2__args &a, const fattn__step_params &s, uint32_t qpe, cudaStream_t st);

#define FA2__LOG2E 1.4426950408889634f
#define FA2__LN2 0.6931471805599453f

/* The arguments of a step, for fa2's kernels and fa3's alike. */
static inline fa2__args fa2__args_for(const fattn__layer_params &l, const fattn__step_params &s, const void *q, void *out,
                                      float *lse) {
  fa2__args a;
  a.l = l;
  a.s = s;
  a.q = q;
  a.out = out;
  a.lse = lse;
  const int f8 = l.kv_dtype == FATTN_DTYPE_FP8_E4M3;
  a.cap_scale = l.scale * (f8 ? l.k_scale : 1.f);
  a.sl2 = a.cap_scale * FA2__LOG2E;
  a.o_mul = f8 ? (l.mla ? l.k_scale : l.v_scale) : 1.f; /* MLA's V is K's first dims */
  a.num_sms = (uint32_t)fa2__sm_count();
  a.ps_shift = 0;
  while ((1u << a.ps_shift) < l.page_size) a.ps_shift++;
  return a;
}

/* Decode tile shape and residency, fixed at build time (benchmark variants override them).
 * Two stages and three blocks an SM (registers capped at 168) rather than three stages and
 * two: decode is bound by the latency of each block's dependent steps, so more warps per SM
 * pay more than a deeper ring once a block takes longer than a DRAM round trip. The wide
 * (32-row) decode tile splits 64-slot blocks over two column warps, two stages deep (+5% on
 * verify against 32-slot blocks at four: half the steps in the same shared memory), at three
 * blocks an SM too (+13-15% on verify against one at 239 registers). */
#ifndef FA2_DEC_NW
#define FA2_DEC_NW 4
#endif
#ifndef FA2_DEC_BN
#define FA2_DEC_BN 64
#endif
#ifndef FA2_DEC_ST
#define FA2_DEC_ST 2
#endif
#ifndef FA2_DEC_MINB
#define FA2_DEC_MINB FATTN__DECODE_RESIDENT /* the split rule's wave (attn/meta.h) */
#endif
/* fp8 KV's 8-row kind: 4 blocks an SM (128 registers; its 16-bit twin lost 1-2% so). */
#ifndef FA2_DEC_MINB_F8
#define FA2_DEC_MINB_F8 FATTN__DECODE_RESIDENT_F8
#endif
/* With less than a wave of blocks nothing else hides a block's stalls, and a third stage (2
 * blocks an SM) measured +7-9% at bs 1 x 32768 where it lost 6-15% on full grids
 * (docs/performance.md, decode). */
#ifndef FA2_DEEP_ST
#define FA2_DEEP_ST 3
#endif
#ifndef FA2_WIDE_NW
#define FA2_WIDE_NW 2
#endif
#ifndef FA2_WIDE_BN
#define FA2_WIDE_BN 64
#endif
#ifndef FA2_WIDE_ST
#define FA2_WIDE_ST 2
#endif
#ifndef FA2_WIDE_MINB
#define FA2_WIDE_MINB 3
#endif

/* ---- the attention kernel. One CTA computes BM query rows (16-row slabs, MW of them)
 * against a KV range. Decode (NW > 1; BM 8, 16, or 32 for verify): rows are the q heads of one
 * kv head times the entry's queries (GQA packing), the range one split; the NW column warps
 * split each KV block by columns, merged at the end. Prefill (BM 64, NW 1): 64 queries of one
 * q head, whole range.
 * K/V blocks of BN slots are gathered row by row from pages with cp.async, ST stages deep;
 * fp8 blocks land raw and are widened in registers after ldmatrix, so they move half the bytes.
 * TQ: Q's and O's type; KVT: the cache's fattn_dtype. */
template <int HD, int HDV, int ROWS, int NW, int BN, int ST, typename TQ, int KVT>
struct fa2__cfg {
  /* mma type: Q's own, except fp8 KV, which widens exactly to fp16 (one cvt per pair on
   * sm_89+) in registers right after ldmatrix; bf16 Q is then narrowed to fp16 as its
   * fragments load (exact for |q| in [2^-14, 65504]). */
  using T = typename std::conditional<KVT == FATTN_DTYPE_FP8_E4M3, __half, TQ>::type;
  /* Products transposed for tiles of 8 rows (decode steps of at most 8 packed rows: GQA <= 8
   * at one query): S^T = K Q^T and O^T = V^T P^T put a warp's 16 slots (K) or 16 dims (V) on
   * the mma's 16-row side and the rows on its n = 8 side, so that GQA 4 pads 4 of 8 columns
   * where a 16-row tile of Q pads 12 of 16 rows: half the mma, scores and accumulators. A
   * thread holds slots or dims g and g + 8 of rows 2 c4 and 2 c4 + 1. */
  static constexpr bool TR = ROWS == 8;
  static constexpr int MW = TR ? 1 : ROWS / 16;
  static constexpr int NT = MW * NW * 32, BM = ROWS, WN = BN / NW;
  static constexpr int NS = TR ? WN / 16 : WN / 8;   /* score tiles a warp */
  static constexpr int NO = TR ? HDV / 16 : HDV / 8; /* output tiles a warp */
  static constexpr int LDQ = HD + 8, LDO = HDV + 4;
  static constexpr int DK = HD, DV = HDV, NCOL = NW, SLOTS = BN; /* for the parts (fa2_parts.h) */
  static constexpr bool CONV = KVT == FATTN_DTYPE_FP8_E4M3;
  static constexpr int KB = CONV ? 1 : 2;
  static constexpr int CK = HD * KB / 16, CV = HDV * KB / 16; /* 16-byte chunks per row */
  static constexpr int Q_BYTES = BM * LDQ * 2;
  static constexpr int RS_BYTES = ST * BN * 4; /* pool row of each slot, per stage */
  /* Where its blocks are resident at once (bs 1-8 at serving contexts) a decode block's chain
   * of dependent loads is the step's latency: blocks of the 16-row kinds that start with the
   * grid read metadata and start the copies of earlier steps' rows before their
   * fattn__pdl_wait, while the store kernel, the caller's kernel and the merge before them
   * still run. That is every block of the deep kind (its grid is under a wave) and the first
   * RESIDENT x SMs blocks of the 2-stage kind; later blocks start after the wait has returned
   * and read through L1 as before. */
  static constexpr bool EARLY = NW > 1 && MW == 1;
  static constexpr bool ALL_EARLY = EARLY && ST == FA2_DEEP_ST;
  /* blocks an SM of the 2-stage decode kinds; MINB: every kind's, for __launch_bounds__ */
  static constexpr uint32_t RESIDENT = HD > 128 ? 1 : TR && CONV ? FA2_DEC_MINB_F8 : FA2_DEC_MINB;
  static constexpr int MINB = NW == 1 || HD > 128 ? 1 : ROWS == 32 ? FA2_WIDE_MINB : ST == FA2_DEEP_ST ? 2 : RESIDENT;
  /* Q fragments held in registers, except in the 2-stage 16-row decode kind with 16-bit KV and
   * the wide kind: there the 32 registers they take, under a 168-register cap, cost more than
   * an ldmatrix of Q a block (bs 64 x 4096 -8%, with the swizzle below; verify -2%;
   * docs/performance.md, decode). fp8's 16-row fragments are converted as they load, so they
   * stay. */
  static constexpr bool QREG = HD <= 128 && (TR || (ROWS != 32 && (!EARLY || ALL_EARLY || CONV)));
  /* K and V tile rows: unpadded and swizzled where a row is whole 128-byte lines (fa2__at) in
   * the decode kinds, except fp8's 16-row ones (padded rows measured best there); else padded
   * by 16 bytes so that ldmatrix's eight rows hit distinct banks. */
  static constexpr bool SWON = NW > 1 && (!CONV || TR);
  static constexpr bool SWK = SWON && HD * KB % 128 == 0, SWV = SWON && HDV * KB % 128 == 0;
  static constexpr int KROW = HD * KB + (SWK ? 0 : 16), VROW = HDV * KB + (SWV ? 0 : 16);
  static constexpr int TILE_BYTES = BN * (KROW + VROW);
  static constexpr int KV_BYTES = ST * TILE_BYTES;
  static constexpr int EPI_BYTES = NW * BM * (LDO + 2) * 4;
  static constexpr int SMEM = Q_BYTES + RS_BYTES + (KV_BYTES > EPI_BYTES ? KV_BYTES : EPI_BYTES);
  static_assert(WN % 16 == 0 && HD % 16 == 0 && HDV % 16 == 0 && BN <= NT && (TR || ROWS % 16 == 0), "tile shape");
  static_assert(!CONV || (HD % 32 == 0 && HDV % 32 == 0), "fp8 fragments cover 32 dims");
  static_assert(!TR || QREG, "the transposed products read Q^T from registers");
};

#include "attn/fa2/fa2_parts.h" /* after the config and arguments it takes */

/* One tile of the portable kernels: the K/V copy pipeline (page-table words looked up ahead,
 * cp.async stages) and Q here, then per block the parts of fa2_parts.h. */
template <int HD, int HDV, int ROWS, int NW, int BN, int ST, typename TQ, int KVT>
__device__ __forceinline__ void fa2__work(const fa2__args &a, const fattn__entry &e, int causal,
                                          bool tree, uint32_t hbase, uint32_t G, uint32_t R0,
                                          uint32_t sp, bool split, bool early, char *smem) {
  using C = fa2__cfg<HD, HDV, ROWS, NW, BN, ST, TQ, KVT>;
  using T = typename C::T;
  const fattn__layer_params &l = a.l;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wm = warp % C::MW, wn = warp / C::MW, g = lane >> 2, c4 = lane & 3;
  const uint32_t total = e.q_len * G, kvh = hbase / (l.num_q_heads / l.num_kv_heads);
  const uint32_t Rend = min(R0 + (uint32_t)C::BM, total);
  T *Qs = (T *)smem;
  uint32_t *rs = (uint32_t *)(smem + C::Q_BYTES);
  char *kv = smem + C::Q_BYTES + C::RS_BYTES;

  /* Visible range of the tile's rows (union) and the range where every row sees everything. */
  const uint32_t prefix = e.kv_len - e.q_len;
  const fattn__kv_range rr = fattn__rows_range(&l, causal, tree, e.q_len, e.kv_len, R0 / G, (Rend - 1) / G);
  const uint32_t lo_f = rr.lo_all;
  uint32_t s_lo = 0, s_hi = e.kv_len;
  if (split) { s_lo = sp * e.split_len; s_hi = min(s_lo + e.split_len, e.kv_len); }
  const uint32_t kb = max(rr.lo_any, s_lo), ke = min(rr.hi_any, s_hi);
  const uint32_t hif = min(rr.hi_all, ke);
  const int nblk = ke > kb ? (int)((ke - kb + BN - 1) / BN) : 0;

  const uint32_t psm = (1u << a.ps_shift) - 1u;
  const int32_t *pt = l.page_table + (size_t)e.seq * l.pages_per_seq;
  const char *kpool = (const char *)l.k_pool;
  const char *vpool = l.mla ? kpool : (const char *)l.v_pool;
  const uint32_t vstride = l.mla ? HD : HDV;
  /* Page-table word of slot r of block blk (0 past the range, where nothing is read), and the
   * pool row (page * page_size + offset) it gives, UINT32_MAX past the range. Rows are looked
   * up ST blocks ahead into rs, so that no page-table latency sits before a copy. */
  auto word_of = [&](int blk, int r, bool early) -> uint32_t {
    const uint32_t j = kb + (uint32_t)blk * BN + r;
    if (blk >= nblk || j >= ke) return 0u;
    const int32_t *p = pt + (j >> a.ps_shift);
    return (uint32_t)(early ? __ldcg(p) : *p);
  };
  auto pool_row = [&](int blk, int r, uint32_t word) -> uint32_t {
    const uint32_t j = kb + (uint32_t)blk * BN + r;
    return blk >= nblk || j >= ke ? UINT32_MAX : (word << a.ps_shift) + (j & psm);
  };
  const size_t kst = (size_t)l.num_kv_heads * HD * C::KB, vst = (size_t)l.num_kv_heads * vstride * C::KB;
  const char *ksrc = kpool + (size_t)kvh * HD * C::KB, *vsrc = vpool + (size_t)kvh * vstride * C::KB;
  auto copy = [&](auto range, int blk, int r_lo, int r_hi) {
    constexpr bool RG = decltype(range)::value;
    if (blk < nblk) {
      const int buf = blk % ST;
      const uint32_t *rsb = rs + buf * BN;
      char *kd = kv + buf * C::TILE_BYTES;
      fa2__rows<BN, C::CK, C::NT, C::KROW, C::SWK, RG>(kd, ksrc, kst, rsb, tid, r_lo, r_hi);
      fa2__rows<BN, C::CV, C::NT, C::VROW, C::SWV, RG>(kd + BN * C::KROW, vsrc, vst, rsb, tid, r_lo, r_hi);
    }
  };
  auto load = [&](int blk) {
    copy(std::false_type(), blk, 0, BN);
    fa2__commit();
  };
  /* Rows of block blk below e.kv_len - e.new_len: earlier steps wrote them, the store kernel
   * just before writes the rest. */
  auto old_rows = [&](int blk) -> int {
    const uint32_t j0 = kb + (uint32_t)blk * BN, fresh = e.kv_len - e.new_len;
    return fresh <= j0 ? 0 : fresh - j0 >= (uint32_t)BN ? BN : (int)(fresh - j0);
  };
  /* Q rows (zero for rows past the tile): the caller's kernel before wrote them. */
  auto load_q = [&]() {
    for (int ci = tid; ci < C::BM * (HD / 8); ci += C::NT) {
      int r = ci / (HD / 8), c = ci % (HD / 8);
      uint32_t R = R0 + r;
      const char *src = (const char *)a.q;
      if (R < Rend) {
        uint32_t t = R / G, hq = hbase + R % G;
        src += ((size_t)(e.q_start + t) * l.num_q_heads + hq) * HD * 2 + c * 16;
      }
      fa2__cp16(Qs + r * C::LDQ + c * 8, src, R < Rend);
    }
  };

  /* Per-thread rows: wm * 16 + g and + 8 (transposed: 2 c4 and 2 c4 + 1); their queries for
   * masking. */
  uint32_t qp[2];
  const uint64_t *mr[2];
#pragma unroll
  for (int h = 0; h < 2; h++) {
    uint32_t R = min(R0 + (C::TR ? 2 * c4 + h : wm * 16 + g + h * 8), total - 1);
    uint32_t t = R / G;
    qp[h] = prefix + t;
    mr[h] = tree ? a.s.mask + e.mask_row + t : nullptr;
  }

  float o[C::NO][4];
#pragma unroll
  for (int i = 0; i < C::NO; i++) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
  float m[2] = {-INFINITY, -INFINITY}, ls[2] = {0.f, 0.f};

  /* An early block looks up its first pages and copies the rows earlier steps wrote before its
   * wait, then Q and the rest of its first stages after it. Its groups are the early rows, the
   * rest with Q, and an empty one, so that the loop's first wait (all but the newest group)
   * covers every row of the first stages, as it covers stage 0 in the other kinds. */
  if (!early) load_q();
  for (int r = tid; r < ST * BN; r += C::NT) rs[r] = pool_row(r / BN, r % BN, word_of(r / BN, r % BN, early));
  /* The loop's lookups load their words two blocks before they use them: the compiler puts a
   * word's first use (its shift) right after its load, before the block's math, so a word
   * loaded in the same block stalled warps 0-1 for a miss's whole latency, at page 16 every
   * other block (a 32-byte sector holds two blocks' words; bs 1 x 32768 +5%,
   * docs/performance.md, decode). These are blocks ST and ST + 1's. */
  uint32_t word1 = tid < BN ? word_of(ST, tid, early) : 0u, word2 = tid < BN ? word_of(ST + 1, tid, early) : 0u;
  __syncthreads();
  if (C::EARLY && early) {
#pragma unroll
    for (int s = 0; s < ST - 1; s++) copy(std::true_type(), s, 0, old_rows(s));
    fa2__commit();
    fattn__pdl_wait();
    FATTN__STAMP(a.s.stamps, FATTN__K_DECODE, FATTN__AT_WAITED);
    load_q();
    /* The rest of the first stages' rows (this step's, and zeros past the range) by a loop of
     * its own: as a second ranged copy of the same stages it changed the main loop's code,
     * ~23 more instructions a warp an iteration (docs/performance.md, decode). */
    const uint32_t rows = (uint32_t)min(nblk, ST - 1) * BN;
    const uint32_t f0 = min(max(e.kv_len - e.new_len, kb) - kb, rows);
    constexpr int CH = C::CK + C::CV;
    for (int ci = tid; ci < (int)(rows - f0) * CH; ci += C::NT) {
      const int r = (int)f0 + ci / CH, c = ci % CH;
      const uint32_t sl = rs[r];
      const bool ok = sl != UINT32_MAX;
      const size_t at = ok ? sl : 0u;
      char *kd = kv + (r / BN) * C::TILE_BYTES;
      if (c < C::CK) fa2__cp16(kd + fa2__at<C::KROW, C::SWK>(r % BN, c), ksrc + at * kst + c * 16, ok);
      else fa2__cp16(kd + BN * C::KROW + fa2__at<C::VROW, C::SWV>(r % BN, c - C::CK),
                     vsrc + at * vst + (c - C::CK) * 16, ok);
    }
    fa2__commit();
    fa2__commit(); /* the empty group */
  } else {
#pragma unroll
    for (int s = 0; s < ST - 1; s++) load(s);
  }
  uint32_t qf[C::QREG ? HD / 16 : 1][C::TR ? 2 : 4];
  /* Q fragment of 16-dim step ks for this warp's rows. With fp8 KV the dims are permuted to
   * match the raw-byte K fragments (a thread holds dims 4c..4c+3), and bf16 Q narrows to fp16.
   * Transposed, Q^T is the B operand: row g, dims 2 c4, 2 c4 + 1 and 8 on (fp8: 4 c4 .. + 3). */
  auto qfrag = [&](uint32_t *A, int ks) {
    if constexpr (C::TR) {
      const TQ *q0 = (const TQ *)smem + g * C::LDQ + ks * 16 + (C::CONV ? 4 * c4 : 2 * c4);
      const TQ *src[2] = {q0, q0 + (C::CONV ? 2 : 8)};
#pragma unroll
      for (int k = 0; k < 2; k++) A[k] = fa2__to_mma<T, TQ>(*(const uint32_t *)src[k]);
    } else if constexpr (C::CONV) {
      const TQ *q0 = (const TQ *)smem + (wm * 16 + g) * C::LDQ + ks * 16 + 4 * c4;
      const TQ *src[4] = {q0, q0 + 8 * C::LDQ, q0 + 2, q0 + 8 * C::LDQ + 2};
#pragma unroll
      for (int k = 0; k < 4; k++) A[k] = fa2__to_mma<T, TQ>(*(const uint32_t *)src[k]);
    } else {
      fa2__ldm4(A, Qs + (wm * 16 + (lane & 15)) * C::LDQ + ks * 16 + (lane >> 4) * 8);
    }
  };

  for (int blk = 0; blk < nblk; blk++) {
    fa2__wait<ST - 2>();
    __syncthreads();
    load(blk + ST - 1);
    const uint32_t ahead = tid < BN ? pool_row(blk + ST, tid, word1) : 0u; /* stored after the math */
    word1 = word2;
    word2 = tid < BN ? word_of(blk + ST + 2, tid, false) : 0u;
    const char *Kt = kv + (blk % ST) * C::TILE_BYTES;
    const char *Vt = Kt + BN * C::KROW;
    const uint32_t j0 = kb + blk * BN;
    if constexpr (C::QREG) {
      if (blk == 0) {
#pragma unroll
        for (int ks = 0; ks < HD / 16; ks++) qfrag(qf[ks], ks);
      }
    }

    /* Scores: S = Q K^T (fa2_parts.h). */
    float sc[C::NS][4];
    fa2__scores<C>(sc, qf, qfrag, Kt, wn, lane);
    fa2__softmax<C>(sc, o, m, ls, a, causal, tree, mr, qp, prefix, j0, lo_f, hif, ke, wn, g, c4);
    fa2__pv<C>(o, sc, Vt, wn, lane);
    if (tid < BN) rs[((blk + ST) % ST) * BN + tid] = ahead;
  }
  fa2__wait<0>();
  __syncthreads();
  if constexpr (NW > 1) FATTN__STAMP(a.s.stamps, FATTN__K_DECODE, FATTN__AT_LOOPED);

  fa2__epilogue<C, TQ>(a, e, kv, o, m, ls, R0, Rend, G, hbase, sp, split, tid, wm, wn, g, c4);
  if constexpr (NW > 1) FATTN__STAMP(a.s.stamps, FATTN__K_DECODE, FATTN__AT_DONE);
}

template <int HD, int HDV, int ROWS, int NW, int BN, int ST, typename T, int KVT>
__global__ void __launch_bounds__(fa2__cfg<HD, HDV, ROWS, NW, BN, ST, T, KVT>::NT,
                                  fa2__cfg<HD, HDV, ROWS, NW, BN, ST, T, KVT>::MINB) fa2__attn(const fa2__args a) {
  using C = fa2__cfg<HD, HDV, ROWS, NW, BN, ST, T, KVT>;
  const uint32_t linear = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  const bool early = C::ALL_EARLY || (C::EARLY && linear < C::RESIDENT * a.num_sms);
  if constexpr (NW > 1) FATTN__STAMP(a.s.stamps, FATTN__K_DECODE, FATTN__AT_ENTRY);
  if (!early) {
    fattn__pdl_wait();
    if constexpr (NW > 1) FATTN__STAMP(a.s.stamps, FATTN__K_DECODE, FATTN__AT_WAITED);
  }
  extern __shared__ __align__(16) char smem[];
  const fattn__step_hdr *hdr = a.s.hdr;
  /* before the wait, the planner's header and entries are read around L1 */
  auto ld = [early](const uint32_t *p) -> uint32_t { return early ? __ldcg(p) : *p; };
  const uint32_t n = ld(&hdr->num_entries);
  const int causal = (int)ld(&hdr->causal);
  const uint32_t G = a.l.num_q_heads / a.l.num_kv_heads;
  if constexpr (NW > 1) { /* decode kinds: GQA-packed row tiles of BM rows */
    constexpr uint32_t BM = C::BM;
    const uint32_t ei = blockIdx.x / a.l.num_kv_heads, kvh = blockIdx.x % a.l.num_kv_heads;
    fattn__entry e;
    /* an early block loads its entry with the header: the slot exists whatever n is */
    if (early) e = fa2__entry(a.s.entries + ei);
    if (ei < n) {
      if (!early) e = a.s.entries[ei];
      const bool tree = ld(&hdr->mode) == FATTN_MODE_TARGET_VERIFY && e.mask_row != UINT32_MAX && a.s.mask;
      const uint32_t ntile = (e.q_len * G + BM - 1u) / BM, nsp = e.num_splits > 1u ? e.num_splits : 1u;
      for (uint32_t rt = blockIdx.z; rt < ntile; rt += gridDim.z)
        for (uint32_t sp = blockIdx.y; sp < nsp; sp += gridDim.y)
          fa2__work<HD, HDV, ROWS, NW, BN, ST, T, KVT>(a, e, causal, tree, kvh * G, G, rt * BM, sp,
                                                     nsp > 1u, early, smem);
    }
    /* Early blocks with work waited in fa2__work. Of those without, only block 0 waits, which
     * is enough for this grid not to end before the one it follows; the rest leave at once. */
    if (early && linear == 0u) fattn__pdl_wait();
  } else {
    const uint32_t b = blockIdx.x;
    if (b >= hdr->num_tiles || n == 0u) return;
    const fattn__entry e = a.s.entries[fa2__find(a.s.entries, n, b)];
    const bool tree = hdr->mode == FATTN_MODE_TARGET_VERIFY && e.mask_row != UINT32_MAX && a.s.mask;
    fa2__work<HD, HDV, ROWS, NW, BN, ST, T, KVT>(a, e, causal, tree, blockIdx.y, 1u,
                                                 (b - e.tile_start) * (uint32_t)C::BM, 0u, false, false, smem);
  }
}

template <int HD, int HDV, int ROWS, int NW, int BN, int ST, typename T, int KVT>
static int fa2__go(const fa2__args *a, dim3 grid, cudaStream_t st) {
  using C = fa2__cfg<HD, HDV, ROWS, NW, BN, ST, T, KVT>;
  auto k = fa2__attn<HD, HDV, ROWS, NW, BN, ST, T, KVT>;
  static std::atomic<unsigned char> attr_set[FATTN__MAX_DEVICES]; /* per device */
  const cudaError_t err = fattn__smem_attr(attr_set, k, C::SMEM);
  if (err != cudaSuccess) return (int)err;
  return (int)fattn__launch(k, grid, dim3(C::NT), C::SMEM, st, *a);
}

/* One tile shape's kernels for the step's Q and KV types (F8: with an fp8 KV instance). */
template <int HD, int HDV, int ROWS, int NW, int BN, int ST, bool F8>
static int fa2__go_types(const fa2__args *a, dim3 grid, cudaStream_t st) {
  const bool bf = a->l.q_dtype == FATTN_DTYPE_BF16;
  if constexpr (F8) {
    if (a->l.kv_dtype == FATTN_DTYPE_FP8_E4M3)
      return bf ? fa2__go<HD, HDV, ROWS, NW, BN, ST, __nv_bfloat16, FATTN_DTYPE_FP8_E4M3>(a, grid, st)
                : fa2__go<HD, HDV, ROWS, NW, BN, ST, __half, FATTN_DTYPE_FP8_E4M3>(a, grid, st);
  }
  return bf ? fa2__go<HD, HDV, ROWS, NW, BN, ST, __nv_bfloat16, FATTN_DTYPE_BF16>(a, grid, st)
            : fa2__go<HD, HDV, ROWS, NW, BN, ST, __half, FATTN_DTYPE_FP16>(a, grid, st);
}

/* The kernels of one head-dim pair: {decode (16 or, transposed, 8 rows; deep or not), prefill,
 * and wide decode for head dims up to 128} x {bf16, fp16} x {same, fp8}. */
template <int HD, int HDV>
static int fa2__launch(const fa2__args *a, int kind, dim3 grid, cudaStream_t st) {
  constexpr int DST = HD <= 128 ? FA2_DEC_ST : 2, PBN = HD <= 128 ? 64 : 32, DNW = FA2_DEC_NW, DBN = FA2_DEC_BN;
  const bool f8 = a->l.kv_dtype == FATTN_DTYPE_FP8_E4M3, narrow = (kind & FA2__NARROW) != 0;
  kind &= ~FA2__NARROW;
  if constexpr (HD <= 128) {
    if (kind == FA2__KIND_DEEP && !f8)
      return narrow ? fa2__go_types<HD, HDV, 8, DNW, DBN, FA2_DEEP_ST, false>(a, grid, st)
                    : fa2__go_types<HD, HDV, 16, DNW, DBN, FA2_DEEP_ST, false>(a, grid, st);
    if (kind == FA2__KIND_WIDE) return fa2__go_types<HD, HDV, 32, FA2_WIDE_NW, FA2_WIDE_BN, FA2_WIDE_ST, true>(a, grid, st);
    if (kind != FA2__KIND_PREFILL && narrow) return fa2__go_types<HD, HDV, 8, DNW, DBN, DST, true>(a, grid, st);
  }
  if (kind != FA2__KIND_PREFILL) return fa2__go_types<HD, HDV, 16, DNW, DBN, DST, true>(a, grid, st);
  return fa2__go_types<HD, HDV, 64, 1, PBN, 2, true>(a, grid, st);
}

#endif /* __CUDACC__ */
#endif /* FATTN_ATTN_FA2_FA2_H */
