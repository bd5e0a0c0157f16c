/* fa2_mla.cu: the portable MLA kernel (absorbed DeepSeek-V3 attention: one latent row of 576 a
 * slot is K, its first 512 dims are V, shared by every q head) for every mode, and its launcher. */
#include <type_traits>

#include "attn/fa2/fa2.h"

/* Tile of the MLA kernel. A block takes ROWS packed rows of an entry (row R is q head R % H of
 * query R / H, so a tile holds the heads of one query, or at 8 heads those of two) in 16-row
 * slabs, MW of them, against one split of the entry's KV, BN slots a stage, ST stages. Warps are (slab wm,
 * column wn) with NCOL column warps a slab: for S = Q K^T a warp takes its slab's rows against
 * BN / NCOL slots of the stage; for O += P V it takes the slab's rows against all BN slots and
 * owns DV / NCOL = 128 dims of O, so O (ROWS x 512 fp32) lives in registers split over the
 * warps, 64 floats a thread, and no warp merges O with another. A stage's latent rows are
 * loaded once and read by both products. TQ: Q's and O's type. F8: the latent rows are fp8
 * e4m3; a block lands raw and is widened exactly to fp16 in shared memory (the one 16-bit stage
 * then), and the MMAs run in fp16 with bf16 Q narrowed as it loads; else they run in TQ. */
template <int ROWS, int BN, int ST, typename TQ, bool F8>
struct fa2__mla_cfg {
  using T = std::conditional_t<F8, __half, TQ>; /* the MMAs' and P's type */
  static constexpr int DK = FA2__MLA_DK, DV = FA2__MLA_DV;
  static constexpr int MW = ROWS / 16, NCOL = 4, NT = MW * NCOL * 32;
  static constexpr int WN = BN / NCOL, NS = WN / 8; /* score tiles of 8 slots a warp */
  static constexpr int DW = DV / NCOL, NO = DW / 8; /* O dims a warp, its 8-dim tiles */
  static constexpr int CH = DK * 2 / 16;            /* 16-byte chunks of a latent row */
  /* Q and latent rows are whole 128-byte lines (1152 bytes), stored unpadded and swizzled
   * (fa2__at), so ldmatrix's eight rows fall in eight bank groups. */
  static constexpr int ROW_BYTES = DK * 2;
  /* P rows are padded by 16 bytes: at BN 32 an unpadded 64-byte pitch put four of ldmatrix's
   * rows on the same banks. */
  static constexpr int P_ROW = BN * 2 + 16;
  static constexpr int Q_BYTES = ROWS * ROW_BYTES;
  /* 16-bit stages: the ring's, or with fp8 one, which a landed block is widened into at the top
   * of its iteration while the next block lands raw (so fp8 needs a ring of two). */
  static constexpr int KST = F8 ? 1 : ST;
  static constexpr int KV_BYTES = KST * BN * ROW_BYTES;
  static constexpr int RAW_ROW = DK, RAW_CH = DK / 16;      /* fp8 rows as they land: [BN][576 B] */
  static constexpr int RAW_BYTES = F8 ? BN * RAW_ROW : 0;
  static constexpr int P_BYTES = ROWS * P_ROW;
  static constexpr int RED_BYTES = NCOL * ROWS * 4; /* a row's max, then its sum, per column warp */
  static constexpr int RS_BYTES = ST * BN * 4;      /* pool row of each slot, per stage */
  static constexpr int SMEM = Q_BYTES + KV_BYTES + RAW_BYTES + P_BYTES + RED_BYTES + RS_BYTES;
  /* Two blocks an SM where shared memory allows it (sm_90), so that 128 registers a thread. */
  static constexpr int MINB = 2;
  static_assert(ROWS % 16 == 0 && WN % 8 == 0 && BN % 16 == 0 && BN <= NT, "tile shape");
  static_assert(DK % 32 == 0 && DW % 16 == 0, "two 16-dim steps a K ldmatrix, 16 dims a V one");
  static_assert(!F8 || ST == 2, "fp8: one block lands raw while the one before is read");
};

/* MLA tile shape, fixed at build time (benchmark variants override it): 32 slots a stage, two
 * stages, so that a 32-row block takes 111 KiB (two an SM on sm_90, one on sm_80's 164 KiB). */
#ifndef FA2_MLA_BN
#define FA2_MLA_BN 32
#endif
#ifndef FA2_MLA_ST
#define FA2_MLA_ST 2
#endif

/* One work item: packed rows R0 .. R0 + ROWS - 1 of entry e over split sp. */
template <int ROWS, int BN, int ST, typename TQ, bool F8>
__device__ __forceinline__ void fa2__mla_work(const fa2__args &a, const fattn__entry &e, int causal, bool tree,
                                              uint32_t R0, uint32_t sp, bool split, char *smem) {
  using C = fa2__mla_cfg<ROWS, BN, ST, TQ, F8>;
  using T = typename C::T;
  const fattn__layer_params &l = a.l;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wm = warp / C::NCOL, wn = warp % C::NCOL, g = lane >> 2, c4 = lane & 3;
  const uint32_t H = l.num_q_heads;
  char *Qs = smem, *kv = smem + C::Q_BYTES, *raw = kv + C::KV_BYTES;
  char *Ps = raw + C::RAW_BYTES;
  float *red = (float *)(Ps + C::P_BYTES);
  uint32_t *rs = (uint32_t *)((char *)red + C::RED_BYTES);

  /* The slots this item sees: the union of its queries' ranges within the split; in
   * [lo_f, hif) every row sees every slot, elsewhere each row is masked (causality, the tree). */
  const uint32_t total = e.q_len * H, Rend = min(R0 + (uint32_t)ROWS, total), prefix = e.kv_len - e.q_len;
  const fattn__kv_range rr = fattn__rows_range(&l, causal, tree, e.q_len, e.kv_len, R0 / H, (Rend - 1u) / H);
  uint32_t s_lo = 0u, s_hi = e.kv_len;
  if (split) { s_lo = sp * e.split_len; s_hi = min(s_lo + e.split_len, e.kv_len); }
  const uint32_t kb = max(rr.lo_any, s_lo), ke = min(rr.hi_any, s_hi), lo_f = rr.lo_all, hif = min(rr.hi_all, ke);
  const int nblk = ke > kb ? (int)((ke - kb + BN - 1) / BN) : 0;

  const uint32_t psm = (1u << a.ps_shift) - 1u;
  const int32_t *pt = l.page_table + (size_t)e.seq * l.pages_per_seq;
  const char *pool = (const char *)l.k_pool;
  auto word_of = [&](int blk, int r) -> uint32_t {
    const uint32_t j = kb + (uint32_t)blk * BN + r;
    return blk >= nblk || j >= ke ? 0u : (uint32_t)pt[j >> a.ps_shift];
  };
  auto pool_row = [&](int blk, int r, uint32_t word) -> uint32_t {
    const uint32_t j = kb + (uint32_t)blk * BN + r;
    return blk >= nblk || j >= ke ? UINT32_MAX : (word << a.ps_shift) + (j & psm);
  };
  /* Every group commits, empty or not, so that the loop's wait counts stay fixed. */
  auto load = [&](int blk) {
    if (blk < nblk) {
      if constexpr (F8)
        fa2__rows<BN, C::RAW_CH, C::NT, C::RAW_ROW, false, false, true>(raw, pool, (size_t)C::RAW_ROW,
                                                                        rs + (blk % ST) * BN, tid, 0, BN);
      else
        fa2__rows<BN, C::CH, C::NT, C::ROW_BYTES, true, false, true>(kv + (blk % ST) * BN * C::ROW_BYTES, pool,
                                                               (size_t)C::ROW_BYTES, rs + (blk % ST) * BN, tid, 0, BN);
    }
    fa2__commit();
  };
  /* fp8: the landed block, 16 dims a chunk, to two fp16 chunks of the 16-bit stage (exact; the
   * scale is folded into sl2 and o_mul). */
  auto widen = [&]() {
#pragma unroll 1
    for (int i = tid; i < BN * C::RAW_CH; i += C::NT) {
      const int r = i / C::RAW_CH, c = i % C::RAW_CH;
      fa2__e4m3x16(*(const uint4 *)(raw + r * C::RAW_ROW + c * 16),
                   (uint4 *)(kv + fa2__at<C::ROW_BYTES, true>(r, 2 * c)),
                   (uint4 *)(kv + fa2__at<C::ROW_BYTES, true>(r, 2 * c + 1)));
    }
  };

  /* Q rows ([tokens, heads, 576]: packed row R is the entry's R-th row of 576), zeros past the
   * entry's rows: they score 0 everywhere and are never written. With fp8 latents the MMAs run
   * in fp16, so bf16 Q is narrowed as it loads (exact for |q| in [2^-14, 65504]). */
  const char *q = (const char *)a.q + (size_t)e.q_start * H * C::ROW_BYTES;
  for (int ci = tid; ci < ROWS * C::CH; ci += C::NT) {
    const int r = ci / C::CH, c = ci % C::CH;
    const bool ok = R0 + r < Rend;
    const char *src = q + (ok ? (size_t)(R0 + r) * C::ROW_BYTES : 0u) + c * 16;
    if constexpr (F8 && std::is_same<TQ, __nv_bfloat16>::value) {
      const uint4 w = ok ? *(const uint4 *)src : make_uint4(0u, 0u, 0u, 0u);
      *(uint4 *)(Qs + fa2__at<C::ROW_BYTES, true>(r, c)) = fa2__bf16x8_to_f16(w);
    } else {
      fa2__cp16(Qs + fa2__at<C::ROW_BYTES, true>(r, c), src, ok);
    }
  }
  for (int r = tid; r < ST * BN; r += C::NT) rs[r] = pool_row(r / BN, r % BN, word_of(r / BN, r % BN));
  /* Page-table words two blocks before their use, as fa2__work loads them: a word loaded in the
   * block that uses it stalls its warps for the miss. These are blocks ST and ST + 1's. */
  uint32_t word1 = tid < BN ? word_of(ST, tid) : 0u, word2 = tid < BN ? word_of(ST + 1, tid) : 0u;
  __syncthreads();
#pragma unroll
  for (int s = 0; s < ST - 1; s++) load(s); /* the first group carries Q too */

  float o[C::NO][4];
#pragma unroll
  for (int i = 0; i < C::NO; i++) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
  float m[2] = {-INFINITY, -INFINITY}, ls[2] = {0.f, 0.f};
  const int r0 = wm * 16 + g; /* this thread's rows: r0 and r0 + 8 */
  uint32_t qp[2]; /* their queries' slots, and tree-mask rows, for the masked blocks */
  const uint64_t *mr[2];
#pragma unroll
  for (int h = 0; h < 2; h++) {
    const uint32_t t = min(R0 + (uint32_t)(r0 + 8 * h), total - 1u) / H;
    qp[h] = prefix + t;
    mr[h] = tree ? a.s.mask + e.mask_row + t : nullptr;
  }

  for (int blk = 0; blk < nblk; blk++) {
    fa2__wait<ST - 2>();
    __syncthreads();
    if constexpr (F8) { /* the landed block into the 16-bit stage, and the raw area free again */
      widen();
      __syncthreads();
    }
    load(blk + ST - 1);
    const uint32_t ahead = tid < BN ? pool_row(blk + ST, tid, word1) : 0u; /* stored after the math */
    word1 = word2;
    word2 = tid < BN ? word_of(blk + ST + 2, tid) : 0u;
    const char *Kt = kv + (blk % C::KST) * BN * C::ROW_BYTES;
    const uint32_t j0 = kb + (uint32_t)blk * BN;

    /* S = Q K^T over all 576 dims, this warp's WN slots; one K ldmatrix holds two 16-dim steps
     * of 8 slots. sc[nt][k]: slot nt * 8 + 2 c4 + (k & 1) of row r0 + 8 (k >> 1). */
    float sc[C::NS][4];
#pragma unroll
    for (int i = 0; i < C::NS; i++) sc[i][0] = sc[i][1] = sc[i][2] = sc[i][3] = 0.f;
    /* Unrolled by 3 of 18, and P V's slot steps not at all: fully unrolled, ptxas issued every
     * fragment load of the loop first and spilled 124 bytes at the 32-row tile's 128 registers. */
#pragma unroll 3
    for (int ks = 0; ks < C::DK / 16; ks += 2) {
      uint32_t A0[4], A1[4];
      fa2__ldm4(A0, Qs + fa2__at<C::ROW_BYTES, true>(wm * 16 + (lane & 15), 2 * ks + (lane >> 4)));
      fa2__ldm4(A1, Qs + fa2__at<C::ROW_BYTES, true>(wm * 16 + (lane & 15), 2 * ks + 2 + (lane >> 4)));
#pragma unroll
      for (int nt = 0; nt < C::NS; nt++) {
        uint32_t B[4];
        fa2__ldm4(B, Kt + fa2__at<C::ROW_BYTES, true>(wn * C::WN + nt * 8 + (lane & 7), 2 * ks + (lane >> 3)));
        fa2__mma<T>(sc[nt], A0, B);
        fa2__mma<T>(sc[nt], A1, B + 2);
      }
    }

    /* Scores to log2 units, masked in the blocks that leave [lo_f, hif); each row's max over
     * the block meets the other column warps' in shared memory, so every warp rescales its O
     * slice by the same factor. */
    const bool full = j0 >= lo_f && j0 + BN <= hif;
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int nt = 0; nt < C::NS; nt++)
#pragma unroll
      for (int k = 0; k < 4; k++) {
        float x = sc[nt][k] * a.sl2;
        const uint32_t j = j0 + wn * C::WN + nt * 8 + 2 * c4 + (k & 1);
        if (!full && !(j < ke && ((j >= lo_f && j < hif) ||
                                  fa2__vis(l, causal, tree, mr[k >> 1], prefix, qp[k >> 1], j))))
          x = -INFINITY;
        sc[nt][k] = x;
        mx[k >> 1] = fmaxf(mx[k >> 1], x);
      }
#pragma unroll
    for (int h = 0; h < 2; h++) {
      mx[h] = fa2__lanes_max<1, 2>(mx[h]);
      if (c4 == 0) red[wn * ROWS + r0 + 8 * h] = mx[h];
    }
    __syncthreads();
    float ms[2], al[2];
#pragma unroll
    for (int h = 0; h < 2; h++) {
      float mn = m[h];
#pragma unroll
      for (int w = 0; w < C::NCOL; w++) mn = fmaxf(mn, red[w * ROWS + r0 + 8 * h]);
      ms[h] = fa2__row_step(m[h], ls[h], mn, &al[h]);
    }
    if (__any_sync(0xffffffffu, al[0] != 1.f || al[1] != 1.f)) {
#pragma unroll
      for (int i = 0; i < C::NO; i++)
#pragma unroll
        for (int k = 0; k < 4; k++) o[i][k] *= al[k >> 1];
    }
    /* P = exp2(s - max) to shared memory in T, each warp its slots, for every warp's P V. */
#pragma unroll
    for (int nt = 0; nt < C::NS; nt++)
#pragma unroll
      for (int h = 0; h < 2; h++) {
        const float p0 = fa2__exp2(sc[nt][2 * h] - ms[h]), p1 = fa2__exp2(sc[nt][2 * h + 1] - ms[h]);
        ls[h] += p0 + p1;
        *(uint32_t *)(Ps + (r0 + 8 * h) * C::P_ROW + (wn * C::WN + nt * 8 + 2 * c4) * 2) = fa2__pack<T>(p0, p1);
      }
    __syncthreads();

    /* O[:, this warp's 128 dims] += P V: P as the A operand from shared memory, V (the stage's
     * rows, first 512 dims) by transposed ldmatrix. */
#pragma unroll 1
    for (int kk = 0; kk < BN / 16; kk++) {
      uint32_t A[4];
      fa2__ldm4(A, Ps + (wm * 16 + (lane & 15)) * C::P_ROW + (kk * 16 + (lane >> 4) * 8) * 2);
#pragma unroll
      for (int dp = 0; dp < C::DW / 16; dp++) {
        uint32_t B[4];
        fa2__ldm4t(B, Kt + fa2__at<C::ROW_BYTES, true>(kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8,
                                                       wn * (C::DW / 8) + 2 * dp + (lane >> 4)));
        fa2__mma<T>(o[2 * dp], A, B);
        fa2__mma<T>(o[2 * dp + 1], A, B + 2);
      }
    }
    if (tid < BN) rs[((blk + ST) % ST) * BN + tid] = ahead;
  }
  fa2__wait<0>();
  __syncthreads(); /* every warp is past its last read of red and P */

  /* The end: each row's sum over the column warps (in warp order, so every warp gets the same
   * bits), then O / l and the LSE, or the split's partial O and LSE for the combine. A row that
   * sees nothing gives O = 0 and LSE -inf. */
#pragma unroll
  for (int h = 0; h < 2; h++) {
    const float lt = fa2__lanes_sum<1, 2>(ls[h]);
    if (c4 == 0) red[wn * ROWS + r0 + 8 * h] = lt;
  }
  __syncthreads();
#pragma unroll
  for (int h = 0; h < 2; h++) {
    const uint32_t R = R0 + r0 + 8 * h, t = R / H, hq = R % H;
    float L = 0.f;
#pragma unroll
    for (int w = 0; w < C::NCOL; w++) L += red[w * ROWS + r0 + 8 * h];
    float lse2 = -INFINITY, inv = 0.f;
    if (m[h] != -INFINITY) inv = fa2__sink_join<true>(m[h], L, -INFINITY, split ? 1.f : a.o_mul, lse2);
    if (R >= Rend) continue;
    if (split) {
      const size_t row = (size_t)(e.split_row + t * e.num_splits + sp) * H + hq;
      float *dst = a.s.split_o + row * C::DV + wn * C::DW + 2 * c4;
#pragma unroll
      for (int i = 0; i < C::NO; i++) *(float2 *)(dst + i * 8) = make_float2(o[i][2 * h] * inv, o[i][2 * h + 1] * inv);
      if (wn == 0 && c4 == 0) a.s.split_lse[row] = lse2 * FA2__LN2;
    } else {
      const size_t row = (size_t)e.q_start * H + R;
      TQ *dst = (TQ *)a.out + row * C::DV + wn * C::DW + 2 * c4;
#pragma unroll
      for (int i = 0; i < C::NO; i++)
        *(uint32_t *)(dst + i * 8) = fa2__pack<TQ>(o[i][2 * h] * inv, o[i][2 * h + 1] * inv);
      if (a.lse && wn == 0 && c4 == 0) a.lse[row] = lse2 * FA2__LN2;
    }
  }
  __syncthreads(); /* the next item's loads overwrite red */
}

/* Grid: x = (entry, group g of the header's decode_groups) x zc strides over the entry's row
 * tiles g, g + groups, ..., with the stride index fastest; y strides over splits. Any grid
 * covers any step of its caps and an item's bytes never depend on the grid. The row tiles
 * vary fastest so that the blocks reading one split's latent rows for different queries
 * (q_len 2 and more at 16 heads) start together and share those rows through L2, where
 * launched a grid slice apart each read them from DRAM. */
template <int ROWS, int BN, int ST, typename TQ, bool F8>
__global__ void __launch_bounds__(fa2__mla_cfg<ROWS, BN, ST, TQ, F8>::NT, fa2__mla_cfg<ROWS, BN, ST, TQ, F8>::MINB)
    fa2__mla(const fa2__args a) {
  /* Q and the fresh latent rows come from the kernels just before: every block waits first. */
  fattn__pdl_wait();
  extern __shared__ __align__(16) char smem[];
  const fattn__step_hdr *hdr = a.s.hdr;
  const uint32_t groups = fattn__decode_groups(1, a.l.num_q_heads, 1u);
  const uint32_t zc = gridDim.x / (a.s.cap_entries * groups), zi = blockIdx.x % zc, xg = blockIdx.x / zc;
  const uint32_t ei = xg / groups, gi = xg % groups;
  if (ei >= hdr->num_entries) return;
  const fattn__entry e = a.s.entries[ei];
  const int causal = (int)hdr->causal;
  const bool tree = hdr->mode == FATTN_MODE_TARGET_VERIFY && e.mask_row != UINT32_MAX && a.s.mask;
  const uint32_t nsp = e.num_splits > 1u ? e.num_splits : 1u, tiles = fattn__ceil_div(e.q_len * a.l.num_q_heads, ROWS);
  for (uint32_t rt = gi + groups * zi; rt < tiles; rt += groups * zc)
    for (uint32_t sp = blockIdx.y; sp < nsp; sp += gridDim.y)
      fa2__mla_work<ROWS, BN, ST, TQ, F8>(a, e, causal, tree, rt * ROWS, sp, nsp > 1u, smem);
}

template <int ROWS, typename TQ, bool F8>
static int fa2__mla_go(const fa2__args *a, dim3 grid, cudaStream_t st) {
  using C = fa2__mla_cfg<ROWS, FA2_MLA_BN, FA2_MLA_ST, TQ, F8>;
  auto k = fa2__mla<ROWS, FA2_MLA_BN, FA2_MLA_ST, TQ, F8>;
  static std::atomic<unsigned char> attr_set[FATTN__MAX_DEVICES]; /* per device */
  const cudaError_t err = fattn__smem_attr(attr_set, k, C::SMEM);
  if (err != cudaSuccess) return (int)err;
  return (int)fattn__launch(k, grid, dim3(C::NT), C::SMEM, st, *a);
}

/* Eight kernels: 16 or 32 rows (fattn__mla_rows) x bf16 or fp16 Q x latent in Q's type or fp8. */
template <int ROWS, bool F8> static int fa2__mla_typed(const fa2__args *a, dim3 grid, cudaStream_t st) {
  return a->l.q_dtype == FATTN_DTYPE_BF16 ? fa2__mla_go<ROWS, __nv_bfloat16, F8>(a, grid, st)
                                          : fa2__mla_go<ROWS, __half, F8>(a, grid, st);
}
int fa2__launch_mla(const fa2__args *a, dim3 grid, cudaStream_t st) {
  const bool f8 = a->l.kv_dtype == FATTN_DTYPE_FP8_E4M3;
  if (fattn__mla_rows(a->l.num_q_heads) == 16u)
    return f8 ? fa2__mla_typed<16, true>(a, grid, st) : fa2__mla_typed<16, false>(a, grid, st);
  return f8 ? fa2__mla_typed<32, true>(a, grid, st) : fa2__mla_typed<32, false>(a, grid, st);
}
