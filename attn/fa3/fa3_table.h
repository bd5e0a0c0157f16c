/* fa3_table.h: the dispatch table of the Hopper kernels, a row a head-dim pair and consumer
 * count (tile shape, ring depth, register split, policies), and the shared-memory plan it implies. */
#ifndef FATTN_ATTN_FA3_FA3_TABLE_H
#define FATTN_ATTN_FA3_FA3_TABLE_H

#include <stdint.h>

#include "attn/fa3/fa3_trios.h"
#include "attn/meta.h"

/* X(DK, DV, NC, BN, ST, ST8, P_REGS, C_REGS, SOFTMAX, PV, O), read as a table:
 *   DK, DV   the QK and PV dims of the tiles, in 64-dim slabs (d 96 runs the 128 row with its
 *            upper dims zero; d 192 has rows for d_v 128 and 192)
 *   NC       consumer warpgroups of 64 query rows: a work item is NC planner tiles. d 64 has a
 *            row of three, run where a step's sequences average FATTN__TRIO_MIN_Q query
 *            tokens (fa3__trios): its GEMMs are half as long for the same softmax, so a
 *            third consumer's softmax runs under the other two's GEMMs (1.08-1.17x from 2k
 *            non-causal, 1.03-1.12x from 4k causal, H100, docs/performance.md); shorter
 *            causal rows lose to the wider tile's masked work
 *   BN       KV slots a block (the S GEMM's N)
 *   ST, ST8  K/V ring stages for 16-bit KV and for fp8 KV (whose raw landing area takes the
 *            room of a stage), as deep as 227 KB of shared memory allow
 *   P_REGS, C_REGS  registers a thread of the producer and of each consumer (setmaxnreg).
 *            P + NC C <= (NC + 1) x what the launch gives a thread (168 at 384 threads, 128 at
 *            512): consumers asking for more than the producer freed wait forever. At d 192
 *            the producer's TMA lanes spill at 40 and the consumers fit in 224 (ptxas -v).
 *   SOFTMAX  exact (rescale whenever a max grows) or lazy (FA4's thresholded max; it pays
 *            where O is 128 registers a thread)
 *   PV       where P waits for the P V GEMM: regs (the A fragment, an RS GEMM) or smem (one
 *            stmatrix a k-step into the consumer's area, an SS GEMM), where a consumer's
 *            registers hold S and O but not P beside them (three consumers at 160: RS spilled)
 *   O        how the epilogue stores O: pair (each lane's 4-byte pairs) or quad (a quad
 *            transposes its words and stores 16 bytes a lane, fa3__store_o); quad measured
 *            3-9% faster at d 256 up to 2k and flat beyond, 2-4% slower at d 64 and at d 128
 *            from 2k (H100, docs/performance.md), d 192 not measured */
#define FA3__TABLE(X)                                    \
  /* DK   DV  NC  BN  ST ST8  P    C   softmax  PV    O */  \
  X(64, 64, 2, 128, 4, 4, 40, 232, exact, regs, pair)       \
  X(64, 64, 3, 128, 4, 4, 32, 160, exact, smem, pair)       \
  X(128, 128, 2, 128, 3, 2, 40, 232, exact, regs, pair)     \
  X(192, 128, 2, 64, 4, 3, 56, 224, lazy, regs, pair)       \
  X(192, 192, 2, 64, 3, 3, 56, 224, lazy, regs, pair)       \
  X(256, 256, 2, 64, 2, 2, 40, 232, lazy, regs, quad)

/* The e4m3 kernels' rows (fattn_config.compute_dtype FP8_E4M3), P in registers, one ring
 * depth. A transposed V row is BN bytes: 128 slots at d 64 and 128 (the 128-byte swizzle), 64
 * at d 192 and 256 (the 64-byte swizzle), where S, O and P of 128 slots would not fit a
 * consumer's registers (at d 256 they spilled 540 bytes). Stages fill 227 KB beside Q, staged
 * in 16 bits, and V's two landing slots. The producer transposes V: 56 registers at d 64 and
 * 128, 72 at d 192 and 256, whose consumers fit 216 without a spill (ptxas -v). d 64 has a row
 * of three consumers, as the 16-bit table (run under FATTN__E4_TRIOS, fa3_trios.h): its P of
 * 128 slots is 16 registers in e4m3, so it stays in registers at 160; at 32 the matrix
 * transposition's producer spills 39 instructions, and consumers at 152 beside a producer of
 * 56 spilled 121 in the block loop (ptxas, against 29 at 160, most in the softcap branch).
 *   VT       how the producer transposes V (fa3_fp8.h): words (16-byte loads and byte
 *            permutes, a 4-byte store each) or matrix (ldmatrix.trans, a permute, stmatrix):
 *            matrix measured 1.03-1.09x at d 128, 1.02-1.04x at d 256 and 0.95-0.98 at d 64
 *            (H100, docs/performance.md); d 192 runs it as d 256, unmeasured */
#define FA3__TABLE_E4M3(X)                            \
  /* DK   DV  NC   BN  ST  P    C   softmax  O    VT */   \
  X(64, 64, 2, 128, 4, 56, 224, exact, pair, words)       \
  X(64, 64, 3, 128, 4, 32, 160, exact, pair, matrix)      \
  X(128, 128, 2, 128, 4, 56, 224, exact, pair, matrix)    \
  X(192, 128, 2, 64, 4, 72, 216, lazy, pair, matrix)      \
  X(192, 192, 2, 64, 3, 72, 216, lazy, pair, matrix)      \
  X(256, 256, 2, 64, 4, 72, 216, lazy, quad, matrix)

/* A head dim rounded up to the 64-dim slabs of the tiles. */
#define FA3__DK(hd) (((hd) + 63u) / 64u * 64u)
/* TMA brings a tile as one box a page and slab: pages of 8 slots or more, so that every box
 * starts on a swizzle atom (8 rows of 128 bytes). */
#define FA3__TMA_MIN_PAGE 8u

/* KV slots a block of the layer's kernels (their table rows; e4m3: the e4m3 policy's), 0
 * where no row serves: the layer's tensor maps are made with it once, so every row of a
 * head-dim pair (two or three consumers) has the same BN (asserted in fa3__cfg). */
static inline constexpr uint32_t fa3__tile_slots(uint32_t head_dim, uint32_t head_dim_v, int e4m3) {
  const uint32_t dk = FA3__DK(head_dim), dv = FA3__DK(head_dim_v);
#define FA3__ROW_BN(DK, DV, NC, BN, ST, ST8, P, C, SM, PV, O) \
  if (!e4m3 && dk == DK && dv == DV) return BN;
  FA3__TABLE(FA3__ROW_BN)
#undef FA3__ROW_BN
#define FA3__E4_ROW_BN(DK, DV, NC, BN, ST, P, C, SM, O, VT) \
  if (e4m3 && dk == DK && dv == DV) return BN;
  FA3__TABLE_E4M3(FA3__E4_ROW_BN)
#undef FA3__E4_ROW_BN
  return 0u;
}

/* Whether the table has a row of three consumers for the head-dim pair (16-bit KV, or e4m3). */
static inline constexpr bool fa3__has_trios(uint32_t head_dim, uint32_t head_dim_v, bool e4m3) {
  const uint32_t dk = FA3__DK(head_dim), dv = FA3__DK(head_dim_v);
#define FA3__ROW_TRIO(DK, DV, NC, BN, ST, ST8, P, C, SM, PV, O) \
  if (!e4m3 && dk == DK && dv == DV && NC == 3) return true;
  FA3__TABLE(FA3__ROW_TRIO)
#undef FA3__ROW_TRIO
#define FA3__E4_ROW_TRIO(DK, DV, NC, BN, ST, P, C, SM, O, VT) \
  if (e4m3 && dk == DK && dv == DV && NC == 3) return true;
  FA3__TABLE_E4M3(FA3__E4_ROW_TRIO)
#undef FA3__E4_ROW_TRIO
  return false;
}
/* Whether a step runs the three-consumer row (FATTN__TRIO_MIN_Q, fa3_trios.h): 16-bit KV, or
 * the e4m3 policy where FATTN__E4_TRIOS (fp8 KV widened has no such row), prefill and cross
 * steps (no graph captures them, so no replay meets a kernel its eager step did not run),
 * sequences of 2k query tokens on average by the caps (below, before the causal skip, 0.86-0.88
 * of the two-consumer kernel at 512 and 1k causal, H100). */
static inline bool fa3__trios(uint32_t head_dim, uint32_t head_dim_v, uint32_t kv_dtype, uint32_t compute_dtype,
                              uint32_t mode, uint32_t cap_q_tokens, uint32_t cap_entries) {
  const bool fp8 = kv_dtype == FATTN_DTYPE_FP8_E4M3, e4m3 = fp8 && compute_dtype == FATTN_DTYPE_FP8_E4M3;
  return (!fp8 || (e4m3 && FATTN__E4_TRIOS)) && fa3__has_trios(head_dim, head_dim_v, e4m3) &&
         (mode == FATTN_MODE_PREFILL || mode == FATTN_MODE_CROSS) &&
         (uint64_t)cap_q_tokens >= (uint64_t)FATTN__TRIO_MIN_Q * cap_entries;
}

#ifdef __CUDACC__

#include "attn/fa3/fa3_sched.h"
#include "attn/fa3/fa3_softmax.h"

template <int DK, int DV, bool E4, int NC> struct fa3__row;
#define FA3__O_pair false
#define FA3__O_quad true
#define FA3__PV_regs false
#define FA3__PV_smem true
#define FA3__VT_words false
#define FA3__VT_matrix true
#define FA3__ROW_TRAITS(E4, DK, DV, NC, BN_, ST_, ST8_, P, C, SM, PV, O, VT)               \
  template <> struct fa3__row<DK, DV, E4, NC> {                                            \
    static constexpr int BN = BN_, ST = ST_, ST8 = ST8_, P_REGS = P, C_REGS = C;           \
    static constexpr bool QUAD_O = FA3__O_##O, P_SMEM = FA3__PV_##PV, V_MATRIX = FA3__VT_##VT; \
    template <int N> using softmax = fa3__softmax_##SM<N>;                                 \
  };
#define FA3__ROW_16(...) FA3__ROW_TRAITS(false, __VA_ARGS__, words)
#define FA3__ROW_E4(DK, DV, NC, BN, ST, P, C, SM, O, VT) \
  FA3__ROW_TRAITS(true, DK, DV, NC, BN, ST, ST, P, C, SM, regs, O, VT)
FA3__TABLE(FA3__ROW_16)
FA3__TABLE_E4M3(FA3__ROW_E4)
#undef FA3__ROW_E4
#undef FA3__ROW_16
#undef FA3__ROW_TRAITS

/* The shapes a kernel derives from its row. 16-bit operands: a row of a slab is 64 dims
 * (128 bytes); e4m3: 128 dims, so DK pads to whole 128-byte slabs (the S GEMM reads only the
 * DK / 32 k-steps that hold dims), V is transposed into a stage as [DV][BN bytes] (one
 * swizzled row a dim: 128- or 64-byte swizzle) from a landing area (RAW) that TMA or the
 * gather fills. */
template <int DK, int DV, int KV, int NC> struct fa3__cfg {
  static constexpr bool F8 = KV != FA3__KV_16BIT, E4 = KV == FA3__KV_E4M3;
  using R = fa3__row<DK, DV, E4, NC>;
  static constexpr int BN = R::BN, ST = KV == FA3__KV_WIDEN ? R::ST8 : R::ST, NT = 128 * (NC + 1);
  static constexpr int SK = E4 ? (DK + 127) / 128 : DK / 64, SV = E4 ? (DV + 127) / 128 : DV / 64;
  static constexpr int KSTEP = E4 ? 32 : 16;     /* dims a k-step of the S GEMM */
  static constexpr int P_REGS = R::P_REGS, C_REGS = R::C_REGS;
  static constexpr bool QUAD_O = R::QUAD_O, P_SMEM = R::P_SMEM, V_MATRIX = R::V_MATRIX;
  /* one consumer's 64 rows: [slab][64][128 B]; e4m3 Q is staged there in 16 bits first */
  static constexpr int Q_WG = DK / 64 * 64 * 128;
  static constexpr int KV_SLAB = BN * 128;        /* [BN slots][128 B] */
  static constexpr int K_BYTES = SK * KV_SLAB;    /* [slab][BN][128 B] */
  static constexpr int V_BYTES = E4 ? DV * BN : SV * KV_SLAB; /* e4m3: [DV][BN B], else as K */
  static constexpr int STAGE = K_BYTES + V_BYTES;
  static constexpr int RAW_SLOT = SV * KV_SLAB;   /* e4m3: one block's V as landed */
  static constexpr int RAW = KV == FA3__KV_WIDEN ? BN * (DK + DV) : E4 ? 2 * RAW_SLOT : 8;
  /* P of one consumer where it goes through shared memory: [BN / 64 slabs][64 rows][128 B]
   * (else a 16-byte placeholder, since an array may not be empty) */
  static constexpr int P_WG = P_SMEM ? BN / 64 * 64 * 128 : 16;
  static constexpr int LAUNCH_REGS = 65536 / NT / 8 * 8; /* a thread's share of the SM's file */
  using softmax = typename R::template softmax<BN>;
  static_assert(P_REGS + NC * C_REGS <= (NC + 1) * LAUNCH_REGS,
                "the consumers ask for more registers than the producer frees");
  static_assert(!P_SMEM || !E4, "e4m3 P V reads P from registers");
  static_assert(!E4 || BN == 64 || BN == 128, "e4m3 V^T rows are one 64- or 128-byte swizzle row");
  static_assert(BN == (int)fa3__tile_slots(DK, DV, E4),
                "the layer's tensor maps box BN slots for every row of the head-dim pair");
};

/* The shared-memory plan: one struct, placed at a 1024-byte boundary (the swizzle atom), so
 * that every Q slab and K/V stage starts on one. */
template <int DK, int DV, int KV, int NC> struct fa3__smem {
  using C = fa3__cfg<DK, DV, KV, NC>;
  char q[NC][C::Q_WG];        /* consumer c's 64 query rows, [slab][64][128 B] */
  char kv[C::ST][C::STAGE];   /* the ring: K [slab][BN][128 B], then V (e4m3: V^T) */
  char raw[C::RAW];           /* fp8: the producer's landing area (e4m3: two slots) */
  uint64_t full_k[C::ST], full_v[C::ST];   /* a stage's K / V landed (producer arrives) */
  uint64_t empty_k[C::ST], empty_v[C::ST]; /* a stage's K / V read (one arrive a consumer warp) */
  uint64_t raw_full[2];                    /* e4m3: a block's V landed in raw slot i (TMA) */
  uint64_t sched_full[FA3__SCHED_SLOTS], sched_empty[FA3__SCHED_SLOTS]; /* the scheduler's ring */
  uint32_t ring_w[FA3__SCHED_SLOTS], ring_entry[FA3__SCHED_SLOTS];      /* its slots: work item, entry */
  float q_amax[NC][4];                     /* e4m3: each consumer warp's |Q| max of a tile */
  /* PV smem: consumer c's P, [slab][64][128 B], on a swizzle atom; last, so that the rows
   * without it keep every offset above */
  alignas(C::P_SMEM ? 1024 : 1) char p[C::P_SMEM ? NC : 1][C::P_WG];
};
template <int DK, int DV, int KV, int NC> struct fa3__plan {
  using C = fa3__cfg<DK, DV, KV, NC>;
  static constexpr int SMEM = 1024 + (int)sizeof(fa3__smem<DK, DV, KV, NC>);
  static_assert(SMEM <= 227 * 1024, "shared memory");
  static_assert(C::Q_WG % 1024 == 0 && C::STAGE % 1024 == 0 && (!C::P_SMEM || C::P_WG % 1024 == 0),
                "slabs and stages on swizzle atoms");
};

#endif /* __CUDACC__ */
#endif /* FATTN_ATTN_FA3_FA3_TABLE_H */
