/* fa2_attend.cu: the fa2 entry points fattn__fa2_supports and fattn__fa2_attend: host-side
 * dispatch from layer shape, mode and step caps, and the split-KV combine kernel. */
#include "attn/fa2/fa2.h"

/* MLA: the absorbed shape with its latent in Q's type or fp8 e4m3, one latent head, and none
 * of the options the MLA kernel lacks (softcap, sinks, window, chunk). */
extern "C" int fattn__fa2_supports(const fattn__layer_params *l) {
  uint32_t d = l->head_dim, dv = l->head_dim_v;
  int dims = l->mla ? d == FA2__MLA_DK && dv == FA2__MLA_DV
                    : (d == 64u || d == 96u || d == 128u || d == 192u || d == 256u) &&
                          (dv == d || (d == 192u && dv == 128u));
  int types = (l->q_dtype == FATTN_DTYPE_BF16 || l->q_dtype == FATTN_DTYPE_FP16) &&
              (l->kv_dtype == l->q_dtype || l->kv_dtype == FATTN_DTYPE_FP8_E4M3);
  int ps = l->page_size >= 1u && l->page_size <= 256u && (l->page_size & (l->page_size - 1u)) == 0u;
  int heads = l->num_kv_heads > 0u && l->num_q_heads % l->num_kv_heads == 0u;
  int mla = !l->mla || (l->num_kv_heads == 1u && l->softcap == 0.f && !l->sinks && l->window < 0 && l->chunk == 0u);
  return dims && types && ps && heads && mla;
}

/* Splits of a row whose partial O the combine holds in registers, up to FA2__FEW_ROWS rows a
 * warp (16 float4 a lane in registers, 144 a thread, held 3 blocks an SM, and verify's 16k rows
 * of 3 splits took 22 us after the decode kernel; docs/performance.md, decode). */
#define FA2__FEW_SPLITS 4u
#define FA2__FEW_ROWS 2u
/* Rows of more splits are summed by chunks of FA2__CHUNK splits, in the same order whoever sums
 * them. One warp a row lands FA2__LAND_SPLITS splits at a time in its land ([split][32] float4,
 * 8 KiB, static); four warps a row (the WIDE combine) load two chunks a batch in registers, and
 * their chunk sums meet in dynamic shared memory ([chunk][dv]), at most FA2__CSUM_BYTES. */
#define FA2__CHUNK 4u
#define FA2__LAND_SPLITS 16u
#define FA2__CSUM_BYTES 32768u
#define FA2__WIDE_WARPS 4u
/* The combine's blocks an SM (__launch_bounds__; 4 warps each), which sizes a round of rows. */
#define FA2__COMBINE_BLOCKS 5

/* Merges query t of entry e for q heads hq0 .. hq0 + nr - 1 (nr <= FA2__FEW_ROWS), an entry of
 * at most FA2__FEW_SPLITS splits (one warp): every row's LSEs and partial rows are loaded
 * together (one L2 round trip for them all) and weighed in registers. */
template <typename T>
__device__ __forceinline__ void fa2__merge_few(const fa2__args &a, const fattn__entry &e, uint32_t t, uint32_t hq0,
                                               uint32_t nr, uint32_t lane) {
  constexpr uint32_t B = FA2__FEW_SPLITS, NR = FA2__FEW_ROWS;
  const uint32_t qh = a.l.num_q_heads, dv = a.l.head_dim_v, ns = e.num_splits;
  /* split j of row r at lse[j * qh + r] and po[(j * qh + r) * dv] */
  const size_t first = ((size_t)e.split_row + (size_t)t * ns) * qh + hq0;
  const float *lse = a.s.split_lse + first, *po = a.s.split_o + first * dv;
  /* Unconditional loads (past the last split or row, the last one again, weighted 0 or not
   * stored): guarded ones were issued one after another, each waiting on the one before. */
  auto at = [&](uint32_t r, uint32_t j) -> uint32_t { return (j < ns ? j : ns - 1u) * qh + (r < nr ? r : nr - 1u); };
  float x[NR][B];
  float4 v[NR][B];
  const uint32_t c0 = lane * 4u; /* this lane's first 4 dims; lanes past dv have none */
#pragma unroll
  for (uint32_t r = 0; r < NR; r++)
#pragma unroll
    for (uint32_t j = 0; j < B; j++) {
      x[r][j] = lse[at(r, j)];
      if (c0 < dv) v[r][j] = *(const float4 *)(po + at(r, j) * dv + c0);
    }
  float inv[NR];
  bool seen[NR];
#pragma unroll
  for (uint32_t r = 0; r < NR; r++) { /* x becomes the weights */
    float M = -INFINITY;
#pragma unroll
    for (uint32_t j = 0; j < B; j++) M = j < ns ? fmaxf(M, x[r][j]) : M;
    const uint32_t hq = hq0 + r;
    seen[r] = M != -INFINITY;
    const float sink = a.l.sinks && r < nr ? a.l.sinks[hq] : -INFINITY;
    float L = 0.f, row_lse = sink; /* a row that sees nothing: LSE = sink or -inf */
#pragma unroll
    for (uint32_t j = 0; j < B; j++) {
      x[r][j] = j < ns && seen[r] ? expf(x[r][j] - M) : 0.f;
      L += x[r][j];
    }
    inv[r] = 0.f;
    if (seen[r]) inv[r] = fa2__sink_join<false>(M, L, sink, a.o_mul, row_lse);
    if (a.lse && lane == 0u && r < nr) a.lse[(size_t)(e.q_start + t) * qh + hq] = row_lse;
  }
  for (uint32_t c = c0; c < dv; c += 128u) {
    if (c != c0)
#pragma unroll
      for (uint32_t r = 0; r < NR; r++)
#pragma unroll
        for (uint32_t j = 0; j < B; j++) v[r][j] = *(const float4 *)(po + at(r, j) * dv + c);
#pragma unroll
    for (uint32_t r = 0; r < NR; r++) {
      float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
      for (uint32_t j = 0; j < B; j++) {
        const float wt = x[r][j];
        acc.x += wt * v[r][j].x; acc.y += wt * v[r][j].y; acc.z += wt * v[r][j].z; acc.w += wt * v[r][j].w;
      }
      if (!seen[r]) acc = make_float4(0.f, 0.f, 0.f, 0.f); /* a row that sees nothing: O = 0 */
      T *out = (T *)a.out + ((size_t)(e.q_start + t) * qh + hq0 + r) * dv;
      if (r < nr)
        *(uint2 *)(out + c) = make_uint2(fa2__pack<T>(acc.x * inv[r], acc.y * inv[r]),
                                         fa2__pack<T>(acc.z * inv[r], acc.w * inv[r]));
    }
  }
}

/* One row's scale from its split LSEs (split s at lse[s * qh]) and its sink (-INFINITY: none):
 * m the largest split LSE (-inf: the row sees nothing), which the splits' weights exp(lse_s - m)
 * are taken against; inv, o_mul over the denominator with the sink's term (fa2__sink_join; 0
 * where the row sees nothing); row_lse, the row's LSE (the sink's where it sees nothing). The
 * sum is split s on lane s % 32, then a butterfly; every warp that asks gets the same bits. */
__device__ __forceinline__ void fa2__row_scale(const float *lse, uint32_t qh, uint32_t ns, float sink, float o_mul,
                                               float &m, float &inv, float &row_lse) {
  float M = -INFINITY, L = 0.f; /* this lane's splits, then the warp's */
  for (uint32_t s = threadIdx.x & 31u; s < ns; s += 32u) {
    const float ls = lse[(size_t)s * qh], mm = fmaxf(M, ls);
    L = mm == -INFINITY ? 0.f : L * expf(M - mm) + expf(ls - mm);
    M = mm;
  }
  float Mw = M;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) Mw = fmaxf(Mw, __shfl_xor_sync(0xffffffffu, Mw, o));
  L = M == -INFINITY || Mw == -INFINITY ? 0.f : L * expf(M - Mw);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) L += __shfl_xor_sync(0xffffffffu, L, o);
  m = Mw, inv = 0.f, row_lse = sink;
  if (Mw != -INFINITY) inv = fa2__sink_join<false>(Mw, L, sink, o_mul, row_lse);
}

/* The LSEs and this lane's 4 dims at c of chunks k and k + stride, one batch of loads (past ns
 * the last split again, weighted 0 by fa2__chunk_sums). */
struct fa2__batch {
  float ls[2u * FA2__CHUNK];
  float4 y[2u * FA2__CHUNK];
};
__device__ __forceinline__ uint32_t fa2__batch_split(uint32_t k, uint32_t stride, uint32_t j) {
  return (j < FA2__CHUNK ? k : k + stride) * FA2__CHUNK + j % FA2__CHUNK;
}
__device__ __forceinline__ void fa2__batch_load(fa2__batch &b, const float *lse, const float *po, uint32_t qh,
                                                uint32_t dv, uint32_t ns, uint32_t k, uint32_t stride, uint32_t c) {
#pragma unroll
  for (uint32_t j = 0; j < 2u * FA2__CHUNK; j++) {
    const uint32_t s = fa2__batch_split(k, stride, j);
    const size_t sj = s < ns ? s : ns - 1u;
    b.ls[j] = lse[sj * qh];
    if (c < dv) b.y[j] = *(const float4 *)(po + sj * qh * dv + c);
  }
}
/* Chunks k and k + stride: each weighed in split order from +0. */
__device__ __forceinline__ void fa2__chunk_sums(const fa2__batch &b, uint32_t ns, uint32_t k, uint32_t stride, float m,
                                                float4 (&sum)[2]) {
#pragma unroll
  for (uint32_t h = 0; h < 2u; h++) {
    sum[h] = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (uint32_t j = h * FA2__CHUNK; j < (h + 1u) * FA2__CHUNK; j++) {
      const float wt = fa2__batch_split(k, stride, j) < ns ? expf(b.ls[j] - m) : 0.f;
      sum[h].x += wt * b.y[j].x; sum[h].y += wt * b.y[j].y; sum[h].z += wt * b.y[j].z; sum[h].w += wt * b.y[j].w;
    }
  }
}

/* Merges the split partials of query t of entry e for q head hq (one warp), an entry of more
 * than FA2__FEW_SPLITS splits: the partial O rows land in this warp's land FA2__LAND_SPLITS
 * splits at a time (the first batch issued with the LSE pass), so that a row costs a few L2
 * round trips, not one a split, and are summed as fa2__merge_chunks sums them: each chunk in
 * split order from +0, the row in chunk order from +0. */
template <typename T>
__device__ __forceinline__ void fa2__merge_landed(const fa2__args &a, const fattn__entry &e, uint32_t t, uint32_t hq,
                                                  uint32_t lane, float4 *land) {
  constexpr uint32_t B = FA2__LAND_SPLITS;
  const uint32_t qh = a.l.num_q_heads, dv = a.l.head_dim_v, ns = e.num_splits;
  const size_t base = (size_t)e.split_row + (size_t)t * ns;
  const float *lse = a.s.split_lse + base * qh + hq; /* split s at lse[s * qh] */
  const float *po = a.s.split_o + (base * qh + hq) * dv; /* split s at po[s * qh * dv] */
  auto fetch = [&](uint32_t s0, uint32_t c) { /* the last split again past ns, weighted 0 */
#pragma unroll
    for (uint32_t j = 0; j < B; j++) {
      const size_t sj = s0 + j < ns ? s0 + j : ns - 1u;
      fa2__cp16(land + j * 32u + lane, po + sj * qh * dv + c, 1);
    }
    fa2__commit();
  };
  const uint32_t c0 = lane * 4u; /* this lane's first 4 dims; lanes past dv have none */
  if (c0 < dv) fetch(0u, c0); /* in flight with the LSE pass: one round trip, not two */
  float m, inv, row_lse;
  fa2__row_scale(lse, qh, ns, a.l.sinks ? a.l.sinks[hq] : -INFINITY, a.o_mul, m, inv, row_lse);
  const size_t orow = (size_t)(e.q_start + t) * qh + hq;
  T *out = (T *)a.out + orow * dv;
  if (a.lse && lane == 0u) a.lse[orow] = row_lse;
  if (m == -INFINITY) { /* a row that sees nothing: O = 0 */
    fa2__wait<0>(); /* the next row lands where this one's copies go */
    for (uint32_t c = c0; c < dv; c += 128u) *(uint2 *)(out + c) = make_uint2(0u, 0u);
    return;
  }
  for (uint32_t c = c0; c < dv; c += 128u) {
    float4 total = make_float4(0.f, 0.f, 0.f, 0.f);
    for (uint32_t s0 = 0; s0 < ns; s0 += B) {
      if (s0 != 0u || c != c0) fetch(s0, c); /* the first batch of the first dims is in flight */
      fa2__wait<0>(); /* a lane reads only what its own copies landed */
#pragma unroll
      for (uint32_t j0 = 0; j0 < B; j0 += FA2__CHUNK) {
        if (s0 + j0 >= ns) break; /* fa2__merge_chunks adds no chunk past the last either */
        float4 sum = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
        for (uint32_t j = j0; j < j0 + FA2__CHUNK; j++) {
          /* landed rows' LSEs are read again here, from L1 (the LSE pass read them) */
          const float wt = s0 + j < ns ? expf(lse[(size_t)(s0 + j) * qh] - m) : 0.f;
          const float4 y = land[j * 32u + lane];
          sum.x += wt * y.x; sum.y += wt * y.y; sum.z += wt * y.z; sum.w += wt * y.w;
        }
        total.x += sum.x; total.y += sum.y; total.z += sum.z; total.w += sum.w;
      }
    }
    *(uint2 *)(out + c) = make_uint2(fa2__pack<T>(total.x * inv, total.y * inv),
                                     fa2__pack<T>(total.z * inv, total.w * inv));
  }
}

/* Merges the split partials of query t of entry e for q head hq, an entry of more than
 * FA2__FEW_SPLITS splits, in the WIDE combine. The row is the sum, in chunk order from +0, of
 * its chunks' sums, as fa2__merge_landed sums it, so its bits do not depend on who sums what:
 * the block's FA2__WIDE_WARPS warps (part = the warp: chunks p and p + 4, then p + 8 and
 * p + 12, ...) into csum ([chunk][dv], csum_floats of the block's shared memory), summed after
 * a barrier by every thread of the block, 2 dims each. A warp's first batch is in flight with
 * the LSE pass: one round trip for a row of up to 32 splits. The host sizes csum for
 * max_splits, which bounds every entry's splits; a row past it is left unwritten, not
 * written past csum. */
template <typename T>
__device__ __forceinline__ void fa2__merge_chunks(const fa2__args &a, const fattn__entry &e, uint32_t t, uint32_t hq,
                                                  uint32_t part, float *csum, uint32_t csum_floats) {
  constexpr uint32_t P = FA2__WIDE_WARPS;
  const uint32_t qh = a.l.num_q_heads, dv = a.l.head_dim_v, ns = e.num_splits, lane = threadIdx.x & 31u;
  const uint32_t chunks = (ns + FA2__CHUNK - 1u) / FA2__CHUNK;
  if (chunks * dv > csum_floats) return; /* the whole block alike */
  const size_t base = (size_t)e.split_row + (size_t)t * ns;
  const float *lse = a.s.split_lse + base * qh + hq; /* split s at lse[s * qh] */
  const float *po = a.s.split_o + (base * qh + hq) * dv; /* split s at po[s * qh * dv] */
  const uint32_t c0 = lane * 4u; /* this lane's first 4 dims; lanes past dv have none */
  fa2__batch b;
  if (part < chunks) fa2__batch_load(b, lse, po, qh, dv, ns, part, P, c0);
  float m, inv, row_lse;
  fa2__row_scale(lse, qh, ns, a.l.sinks ? a.l.sinks[hq] : -INFINITY, a.o_mul, m, inv, row_lse);
  const size_t orow = (size_t)(e.q_start + t) * qh + hq;
  T *out = (T *)a.out + orow * dv;
  if (a.lse && part == 0u && lane == 0u) a.lse[orow] = row_lse;
  if (m == -INFINITY) { /* a row that sees nothing: O = 0 (every part returns here alike) */
    if (part == 0u)
      for (uint32_t c = c0; c < dv; c += 128u) *(uint2 *)(out + c) = make_uint2(0u, 0u);
    return;
  }
  for (uint32_t c = c0; c < dv; c += 128u)
    for (uint32_t k = part; k < chunks; k += 2u * P) {
      if (k != part || c != c0) fa2__batch_load(b, lse, po, qh, dv, ns, k, P, c);
      float4 sum[2];
      fa2__chunk_sums(b, ns, k, P, m, sum);
      *(float4 *)(csum + k * dv + c) = sum[0];
      if (k + P < chunks) *(float4 *)(csum + (k + P) * dv + c) = sum[1];
    }
  __syncthreads();
  for (uint32_t d = threadIdx.x * 2u; d < dv; d += 2u * blockDim.x) {
    float2 total = make_float2(0.f, 0.f);
    for (uint32_t k = 0; k < chunks; k++) {
      const float2 s = *(const float2 *)(csum + k * dv + d);
      total.x += s.x; total.y += s.y;
    }
    *(uint32_t *)(out + d) = fa2__pack<T>(total.x * inv, total.y * inv);
  }
  __syncthreads(); /* the next row's sums go where this one's were */
}

/* Warps per (entry, query slot, rpw q heads), qpe query slots an entry: merge the split
 * partials of queries t = slot, slot + qpe, ... of split entries. WIDE false: a warp a unit; two
 * rows a warp (rpw 2) halve the rounds of a grid of more rows than one round holds (verify: 16k
 * rows of 3 splits, tail 16 -> 11.6 us; docs/performance.md, decode). WIDE: a
 * block a unit of one row, whose splits its 4 warps share where there are more than
 * FA2__FEW_SPLITS, for grids of no more rows than SMs (bs 1 x 32768: a warp a row of 32 splits
 * issued 1,557 instructions at 4-6 cycles each; docs/performance.md, decode). Two kernels, so that
 * the one-warp kernel of every larger grid keeps its own registers: one kernel with both paths
 * cost 1-2% of the serve step at bs 8-64 on rows that took neither (docs/performance.md, decode).
 * The entry is indexed, not searched, and read before the wait (attn/pdl.h), so that no chain
 * of loads follows it. Registers for FA2__COMBINE_BLOCKS (5) blocks an SM (96: no spill one
 * warp a row; WIDE spills 12 bytes stored, 20 loaded on sm_90a; two rows' 8 partial rows a
 * lane spilled 48 bytes at 6), against 3 that 144 registers allowed; the lands
 * (32 KiB and the block's 1 KiB reserve, of 228 KiB) would fit 6. */
template <typename T, bool WIDE>
__global__ void __launch_bounds__(128, FA2__COMBINE_BLOCKS)
    fa2__combine(const fa2__args a, uint32_t qpe, uint32_t rpw, uint32_t csum_floats) {
  /* The caller's next kernel may launch now: it waits for this grid, which ends only after the
   * decode kernel has. If it too releases before its wait, the next layer's store and decode
   * kernels start theirs early, and the decode prologue overlaps this merge. */
  fattn__pdl_release();
  FATTN__STAMP(a.s.stamps, FATTN__K_COMBINE, FATTN__AT_ENTRY);
  const uint32_t qh = a.l.num_q_heads, lane = threadIdx.x & 31u, hg = (qh + rpw - 1u) / rpw;
  const uint32_t w = WIDE ? blockIdx.x : blockIdx.x * 4u + (threadIdx.x >> 5), part = WIDE ? threadIdx.x >> 5 : 0u;
  const uint32_t ei = w / (qpe * hg), slot = w / hg % qpe;
  const uint32_t hq0 = w % hg * rpw, nr = min(rpw, qh - hq0);
  const bool live = ei < __ldcg(&a.s.hdr->num_entries);
  const fattn__entry e = live ? fa2__entry(a.s.entries + ei) : fattn__entry{};
  /* Every thread waits, even one with nothing to merge: a dependent's wait is promised to
   * cover only the grid just before it, so a merge grid that ended before the decode kernel
   * could release the caller's next kernel onto an output still being written. */
  fattn__pdl_wait_alone();
  FATTN__STAMP(a.s.stamps, FATTN__K_COMBINE, FATTN__AT_WAITED);
  if (!live || e.num_splits <= 1u) return; /* the whole block alike where WIDE */
  if (e.num_splits <= FA2__FEW_SPLITS) {
    if (part == 0u)
      for (uint32_t t = slot; t < e.q_len; t += qpe) fa2__merge_few<T>(a, e, t, hq0, nr, lane);
  } else if constexpr (WIDE) {
    extern __shared__ __align__(16) float csum[]; /* csum_floats of them */
    for (uint32_t t = slot; t < e.q_len; t += qpe)
      for (uint32_t r = 0; r < nr; r++) fa2__merge_chunks<T>(a, e, t, hq0 + r, part, csum, csum_floats);
  } else {
    __shared__ float4 land[4][FA2__LAND_SPLITS * 32u]; /* [warp][split][lane]: 32 KiB */
    for (uint32_t t = slot; t < e.q_len; t += qpe)
      for (uint32_t r = 0; r < nr; r++) fa2__merge_landed<T>(a, e, t, hq0 + r, lane, land[threadIdx.x >> 5]);
  }
  FATTN__STAMP(a.s.stamps, FATTN__K_COMBINE, FATTN__AT_DONE);
}

int fa2__sm_count(void) {
  static fattn__device_facts sms;
  return fattn__device_fact(sms, [](int dev) {
    int n = 0;
    if (dev < 0 || cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || n <= 0) {
      cudaGetLastError();
      n = 108;
    }
    return n;
  });
}

static uint32_t fa2__clamp(uint32_t x, uint32_t lo, uint32_t hi) { return x < lo ? lo : x > hi ? hi : x; }

/* The combine after a split decode kernel (qpe: query tokens an entry, as the decode grid took
 * them). Four warps a row where the rows are no more than the SMs and an entry's most chunks fit
 * FA2__CSUM_BYTES, else one, and two rows a warp past one round of the combine's warps; a row's
 * result depends on neither, so a graph and its eager step may differ in them. Four warps a row
 * up to a round lost 3-6% at bs 8 and 16 (H100; docs/performance.md, decode): their rows have at
 * most 4 splits, so 3 warps of 4 idled in 4 times the blocks. */
int fa2__launch_combine(const fa2__args &a, const fattn__step_params &s, uint32_t qpe, cudaStream_t st) {
  const fattn__layer_params &l = a.l;
  const uint32_t rows = s.cap_entries * qpe * l.num_q_heads;
  const uint32_t round = FA2__COMBINE_BLOCKS * 4u * a.num_sms;
  const uint32_t csum = (s.max_splits + FA2__CHUNK - 1u) / FA2__CHUNK * l.head_dim_v * 4u;
  const uint32_t wpr = rows <= a.num_sms && csum <= FA2__CSUM_BYTES ? FA2__WIDE_WARPS : 1u;
  const uint32_t rpw = rows > round ? FA2__FEW_ROWS : 1u;
  const uint32_t warps = s.cap_entries * qpe * ((l.num_q_heads + rpw - 1u) / rpw) * wpr;
  const uint32_t smem = wpr > 1u ? csum : 0u;
  const bool bf16 = l.q_dtype == FATTN_DTYPE_BF16;
  auto combine = wpr > 1u ? (bf16 ? fa2__combine<__nv_bfloat16, true> : fa2__combine<__half, true>)
                          : (bf16 ? fa2__combine<__nv_bfloat16, false> : fa2__combine<__half, false>);
  return (int)fattn__launch(combine, dim3((warps + 3u) / 4u), dim3(128), smem, st, a, qpe, rpw, smem / 4u);
}

extern "C" int fattn__fa2_attend(fattn__layer_params l, fattn__step_params s, const void *q,
                                 void *out, float *lse, void *stream) {
  if (!fattn__fa2_supports(&l)) return (int)cudaErrorInvalidValue;
  if (s.cap_entries == 0u || s.cap_q_tokens == 0u) return (int)cudaSuccess;
  cudaStream_t st = (cudaStream_t)stream;
  const fa2__args a = fa2__args_for(l, s, q, out, lse);
  const uint32_t G = l.num_q_heads / l.num_kv_heads;
  const int decode = fattn__decode_kind(&l, &s);
  dim3 grid;
  int wide = 0, narrow = 0;
  /* query tokens an entry, rounded up: every entry's q_len in the decode modes; the longer
   * entries of extend-like steps that take the decode kind are looped over by the kernels */
  const uint32_t qpe = (s.cap_q_tokens + s.cap_entries - 1u) / s.cap_entries;
  /* twice the policy's target: graph padding may leave fewer live entries than cap_entries */
  const uint32_t want = 2u * FATTN__CTAS_PER_SM * a.num_sms;
  const uint32_t split_cap = s.max_splits < 64u ? s.max_splits : 64u; /* blocks past it would only exit */
  if (l.mla) { /* every mode but CROSS (lib/config.c): x (entry, head group) x row-tile strides, y splits */
    const uint32_t groups = fattn__decode_groups(1, l.num_q_heads, 1u), ctas = s.cap_entries * groups;
    const uint32_t tiles = fattn__ceil_div(qpe * l.num_q_heads, fattn__mla_rows(l.num_q_heads));
    const uint32_t z = fa2__clamp(fattn__ceil_div(tiles, groups), 1u, (uint32_t)(INT32_MAX / ctas));
    const uint64_t xz = (uint64_t)ctas * z;
    grid = dim3((uint32_t)xz, xz >= want ? 1u : fa2__clamp((uint32_t)((want + xz - 1u) / xz), 1u, split_cap));
    const int err = fa2__launch_mla(&a, grid, st);
    return err || !s.split_o || !fattn__mode_splits(s.mode) ? err : fa2__launch_combine(a, s, qpe, st);
  }
  if (decode) {
    uint32_t ctas = s.cap_entries * l.num_kv_heads;
    /* 32-row tiles change the column split and so the rounding; qpe is the same in a graph as
     * in its eager step for every mode that gets here (DRAFT_EXTEND does not), so replay stays exact. */
    wide = qpe * G > 16u && l.head_dim <= 128u;
    narrow = fattn__narrow_tiles(qpe * G, l.head_dim);
    const uint32_t rows_per_cta = wide ? 32u : narrow ? 8u : 16u;
    grid = dim3(ctas, fa2__clamp((want + ctas - 1u) / ctas, 1u, split_cap),
                fa2__clamp((qpe * G + rows_per_cta - 1u) / rows_per_cta, 1u, 8u));
  } else {
    if (s.cap_tiles == 0u) return (int)cudaSuccess;
    grid = dim3(s.cap_tiles, l.num_q_heads, 1u);
  }
  /* the deep kind where the whole grid fits in under a wave at 2 blocks an SM */
  const int deep = decode && !wide && grid.x * grid.y * grid.z <= 2u * a.num_sms;
  const int kind = (!decode ? FA2__KIND_PREFILL : wide ? FA2__KIND_WIDE : deep ? FA2__KIND_DEEP : FA2__KIND_DECODE) |
                   (narrow ? FA2__NARROW : 0);
  int err;
  switch (l.head_dim) {
    case 64u: err = fa2__launch_hd64(&a, kind, grid, st); break;
    case 96u: err = fa2__launch_hd96(&a, kind, grid, st); break;
    case 128u: err = fa2__launch_hd128(&a, kind, grid, st); break;
    case 192u: err = fa2__launch_hd192(&a, kind, grid, st); break;
    default: err = fa2__launch_hd256(&a, kind, grid, st); break;
  }
  if (err || !decode || !s.split_o) return err;
  return fa2__launch_combine(a, s, qpe, st);
}
