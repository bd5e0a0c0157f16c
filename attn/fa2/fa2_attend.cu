/* fa2_attend.cu: the fa2 entry points fattn__fa2_supports and fattn__fa2_attend: host-side
 * dispatch from layer shape, mode and step caps, and the split-KV combine kernel. */
#include "attn/fa2/fa2.h"

extern "C" int fattn__fa2_supports(const fattn__layer_params *l) {
  uint32_t d = l->head_dim, dv = l->head_dim_v;
  int dims = (d == 64u || d == 96u || d == 128u || d == 192u || d == 256u) &&
             (dv == d || (d == 192u && dv == 128u));
  int types = (l->q_dtype == 1u || l->q_dtype == 2u) &&
              (l->kv_dtype == l->q_dtype || l->kv_dtype == 3u);
  int ps = l->page_size >= 1u && l->page_size <= 256u && (l->page_size & (l->page_size - 1u)) == 0u;
  int heads = l->num_kv_heads > 0u && l->num_q_heads % l->num_kv_heads == 0u;
  int mla = !l->mla || l->num_kv_heads == 1u;
  return dims && types && ps && heads && mla;
}

/* Splits of a row whose partial O the combine holds in registers; rows of more splits land
 * FA2__LAND_SPLITS at a time in shared memory, which, unlike registers, the kernel's other
 * rows do not pay for: 16 float4 a lane in registers (144 a thread) held 3 blocks an SM, and
 * verify's 16k rows of 3 splits took 22 us after the decode kernel (docs/perf.md, session 18). */
#define FA2__FEW_SPLITS 4u
#define FA2__LAND_SPLITS 16u

/* Merges the split partials of query t of entry e for q head hq (one warp): one pass over the
 * LSEs, then the partial O rows B splits at a time (the first batch issued with the LSE pass),
 * so that a row costs a few L2 round trips, not one a split. Past FA2__FEW_SPLITS the rows
 * land in this warp's land ([FA2__LAND_SPLITS][32] float4, one a lane a split). */
template <typename T, uint32_t B>
__device__ __forceinline__ void fa2__merge_row(const fa2__args &a, const fattn__entry &e, uint32_t t, uint32_t hq,
                                               uint32_t lane, float4 *land) {
  constexpr bool LAND = B > FA2__FEW_SPLITS;
  const uint32_t qh = a.l.num_q_heads, dv = a.l.head_dim_v, ns = e.num_splits;
  const size_t base = (size_t)e.split_row + (size_t)t * ns;
  const float *lse = a.s.split_lse + base * qh + hq; /* split s at lse[s * qh] */
  const float *po = a.s.split_o + (base * qh + hq) * dv; /* split s at po[s * qh * dv] */
  float x[LAND ? 1 : B];
  float4 v[LAND ? 1 : B];
  /* Unconditional loads (past the last split, the last split again, weighted 0): guarded ones
   * were issued one after another, each waiting on the one before. */
  auto fetch = [&](uint32_t s0, uint32_t c) {
#pragma unroll
    for (uint32_t j = 0; j < B; j++) {
      const size_t sj = s0 + j < ns ? s0 + j : ns - 1u;
      if constexpr (LAND) {
        fa2__cp16(land + j * 32u + lane, po + sj * qh * dv + c, 1);
      } else {
        x[j] = lse[sj * qh];
        v[j] = *(const float4 *)(po + sj * qh * dv + c);
      }
    }
    if constexpr (LAND) fa2__commit();
  };
  const uint32_t c0 = lane * 4u; /* this lane's first 4 dims; lanes past dv have none */
  if (c0 < dv) fetch(0u, c0); /* in flight with the LSE pass: one round trip, not two */
  float M = -INFINITY, L = 0.f; /* this lane's splits, then the warp's */
  for (uint32_t s = lane; s < ns; s += 32u) {
    const float ls = lse[(size_t)s * qh], m = fmaxf(M, ls);
    L = m == -INFINITY ? 0.f : L * expf(M - m) + expf(ls - m);
    M = m;
  }
  float Mw = M;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) Mw = fmaxf(Mw, __shfl_xor_sync(0xffffffffu, Mw, o));
  const size_t orow = (size_t)(e.q_start + t) * qh + hq;
  T *out = (T *)a.out + orow * dv;
  if (Mw == -INFINITY) {
    if constexpr (LAND) fa2__wait<0>(); /* the next row lands where this one's copies go */
    for (uint32_t c = c0; c < dv; c += 128u)
      *(uint2 *)(out + c) = make_uint2(0u, 0u);
    if (a.lse && lane == 0u) a.lse[orow] = a.l.sinks ? a.l.sinks[hq] : -INFINITY;
    return;
  }
  L = M == -INFINITY ? 0.f : L * expf(M - Mw);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) L += __shfl_xor_sync(0xffffffffu, L, o);
  if (a.l.sinks) L += expf(a.l.sinks[hq] - Mw);
  const float inv = a.o_mul / L;
  for (uint32_t c = c0; c < dv; c += 128u) {
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
    for (uint32_t s0 = 0; s0 < ns; s0 += B) {
      if (s0 != 0u || c != c0) fetch(s0, c); /* the first batch of the first dims is in flight */
      if constexpr (LAND) fa2__wait<0>(); /* a lane reads only what its own copies landed */
#pragma unroll
      for (uint32_t j = 0; j < B; j++) {
        /* landed rows' LSEs are read again here, from L1 (the LSE pass read them) */
        const float wt = s0 + j < ns ? expf((LAND ? lse[(size_t)(s0 + j) * qh] : x[LAND ? 0 : j]) - Mw) : 0.f;
        const float4 y = LAND ? land[j * 32u + lane] : v[LAND ? 0 : j];
        acc.x += wt * y.x; acc.y += wt * y.y; acc.z += wt * y.z; acc.w += wt * y.w;
      }
    }
    *(uint2 *)(out + c) = make_uint2(fa2__pack<T>(acc.x * inv, acc.y * inv), fa2__pack<T>(acc.z * inv, acc.w * inv));
  }
  if (a.lse && lane == 0u) a.lse[orow] = Mw + logf(L);
}

/* One warp per (entry, query slot, q head), qpe query slots an entry: merges the split
 * partials of queries t = slot, slot + qpe, ... of split entries. The entry is indexed, not
 * searched, and read before the wait (attn/pdl.h), so that no chain of loads follows it.
 * Registers for 7 blocks an SM (72, no spill); the landing area (32 KiB and the block's 1 KiB
 * reserve, of 228 KiB) fits 6, against 3 that 144 registers allowed before. */
template <typename T>
__global__ void __launch_bounds__(128, 7) fa2__combine(const fa2__args a, uint32_t qpe) {
  /* The caller's next kernel may launch now: it waits for this grid, which ends only after the
   * decode kernel has. If it too releases before its wait, the next layer's store and decode
   * kernels start theirs early, and the decode prologue overlaps this merge. */
  fattn__pdl_release();
  const uint32_t qh = a.l.num_q_heads, lane = threadIdx.x & 31u;
  const uint32_t w = blockIdx.x * 4u + (threadIdx.x >> 5), ei = w / (qpe * qh), slot = w / qh % qpe, hq = w % qh;
  const bool live = ei < __ldcg(&a.s.hdr->num_entries);
  const fattn__entry e = live ? fa2__entry(a.s.entries + ei) : fattn__entry{};
  /* Every thread waits, even one with nothing to merge: a dependent's wait is promised to
   * cover only the grid just before it, so a merge grid that ended before the decode kernel
   * could release the caller's next kernel onto an output still being written. */
  fattn__pdl_wait_alone();
  if (!live || e.num_splits <= 1u) return;
  __shared__ float4 land[4][FA2__LAND_SPLITS * 32u]; /* [warp][split][lane]: 32 KiB */
  for (uint32_t t = slot; t < e.q_len; t += qpe) {
    if (e.num_splits <= FA2__FEW_SPLITS) fa2__merge_row<T, FA2__FEW_SPLITS>(a, e, t, hq, lane, nullptr);
    else fa2__merge_row<T, FA2__LAND_SPLITS>(a, e, t, hq, lane, land[threadIdx.x >> 5]);
  }
}

int fa2__sm_count(void) {
  static int sms; /* host attribute, read once */
  if (!sms) {
    int dev = 0, n = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || n <= 0)
      n = 108;
    sms = n;
  }
  return sms;
}

static uint32_t fa2__clamp(uint32_t x, uint32_t lo, uint32_t hi) { return x < lo ? lo : x > hi ? hi : x; }

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
  if (decode) {
    uint32_t ctas = s.cap_entries * l.num_kv_heads;
    /* 32-row tiles change the column split and so the rounding; qpe is the same in a graph as
     * in its eager step for every mode that gets here (DRAFT_EXTEND does not), so replay stays exact. */
    wide = qpe * G > 16u && l.head_dim <= 128u;
    narrow = fattn__narrow_tiles(qpe * G, l.head_dim);
    const uint32_t rows_per_cta = wide ? 32u : narrow ? 8u : 16u;
    /* twice the policy's target: graph padding may leave fewer live entries than cap_entries */
    const uint32_t want = 2u * FATTN__CTAS_PER_SM * (uint32_t)fa2__sm_count();
    /* no entry gets more than max_splits (>= 1) splits: blocks past it would only exit */
    grid = dim3(ctas, fa2__clamp((want + ctas - 1u) / ctas, 1u, s.max_splits < 64u ? s.max_splits : 64u),
                fa2__clamp((qpe * G + rows_per_cta - 1u) / rows_per_cta, 1u, 8u));
  } else {
    if (s.cap_tiles == 0u) return (int)cudaSuccess;
    grid = dim3(s.cap_tiles, l.num_q_heads, 1u);
  }
  /* the deep kind where the whole grid fits in under a wave at 2 blocks an SM */
  const int deep = decode && !wide && grid.x * grid.y * grid.z <= 2u * (uint32_t)fa2__sm_count();
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
  const uint32_t warps = s.cap_entries * qpe * l.num_q_heads;
  return (int)fattn__launch(l.q_dtype == 1u ? fa2__combine<__nv_bfloat16> : fa2__combine<__half>,
                            dim3((warps + 3u) / 4u), dim3(128), 0, st, a, qpe);
}
