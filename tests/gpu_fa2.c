/* gpu_fa2.c: the fa2 kernels (attn/fa2) against the float64 reference (attn/ref) on random
 * paged steps: store_kv bytes, every mode, options, head dims, dtypes, page sizes, GQA.
 * tests/gpu_fa3.c builds the same sweep with FATTN_TEST_FA3: attend through the fa3 backend
 * (the query-tiled groups; decode and store_kv stay here); tests/gpu_mla.c runs its case
 * machinery with cases of its own (FATTN_TEST_MLA). */
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "attn/backend.h"
#include "attn/fa3/fa3_trios.h"
#include "lib/dtype.h"
#include "lib/internal.h"
#include "tests/support.h"
#include "tests/support_gpu.h"
#include "tests/support_oracle.h"

#define CK(x)                                                                            \
  do {                                                                                   \
    int e_ = (int)(x);                                                                   \
    ck_assert_msg(e_ == 0, "%s: %s", #x, cudaGetErrorString((cudaError_t)e_));           \
  } while (0)

enum { BF = FATTN_DTYPE_BF16, FP = FATTN_DTYPE_FP16, F8 = FATTN_DTYPE_FP8_E4M3 };
enum { MAX_SPLITS = 32, TARGET_CTAS = 264 };
/* fp8 compute's bounds (gpu_fa3's fp8_compute), against the float64 reference over the same fp8
 * cache. `python3 tools/fp8_accuracy.py --gpu-test --seeds 4` emulates the policy (include/fattn.h,
 * compute_dtype) on these cases' data: Q from N(0, 1.5^2) in bf16 / fp16, K and V e4m3(N(0, 1))
 * read at 0.75 / 1.25, every head dim, mode and option, entries of 1 to 4224 slots. Its worst
 * single entry (a case may hold just one): RMSE of O 3.5e-2, max abs error 0.225, LSE error
 * / (1 + |LSE|) 6.7e-2. They come from Q's e4m3 rounding (3 mantissa bits: a score moves by
 * about 0.03 at these scores' spread, whatever d) and P's, largest in rows of few slots, where
 * one rounded P moves O by a share of the slots' V difference. The bounds are 2.2-2.7x those:
 * room for the kernel's own fp32 sums and running max, while a path that lost a scale or read
 * the wrong bytes (errors of order 1) fails. */
#define FP8_RMSE_TOL 8e-2
#define FP8_MAX_TOL 0.6
#define FP8_LSE_TOL 0.15

static uint64_t rng_state = 0x1234567ull;
/* fp8 compute cases whose output differed from the same step's 16-bit path (cases of ct F8) */
static int fp8_unlike_16bit;
/* split decode-like steps run again under caps past a round of the combine's warps, and those
 * whose exact caps gave the combine four warps a row (rows no more than the SMs) with a row of
 * more than 4 splits (FA2__FEW_SPLITS, attn/fa2/fa2_attend.cu): the merge a block's warps share */
static int wide_runs, wide_shared;
static uint64_t rng_next(void) { return fattn_test_splitmix(&rng_state); }
static uint32_t rnd(uint32_t n) { return n ? (uint32_t)(rng_next() % n) : 0u; }
static double rnd_unit(void) { return (double)(rng_next() >> 11) * 0x1.0p-53; }

static void *dalloc(size_t n) {
  void *p = NULL;
  CK(cudaMalloc(&p, n ? n : 16));
  return p;
}
static size_t esize(uint32_t dt) { return dt == F8 ? 1u : dt == 0u ? 4u : 2u; }
static double to_f(uint32_t dt, const void *p, size_t i) {
  uint16_t b = ((const uint16_t *)p)[i];
  return dt == FP ? fattn__f16_to_f32(b) : fattn__bf16_to_f32(b);
}
static const char *dname(uint32_t dt) { return dt == BF ? "bf16" : dt == FP ? "fp16" : "fp8"; }
/* n elements of a 16-bit dtype, all x. */
static void fill16(void *dev, size_t n, uint32_t dt, float x) {
  ck_assert_uint_ne(dt, F8);
  uint16_t *h = fattn_test_xmalloc(n * 2 + 2), b = dt == FP ? fattn__f32_to_f16(x) : fattn__f32_to_bf16(x);
  for (size_t i = 0; i < n; i++) h[i] = b;
  CK(cudaMemcpy(dev, h, n * 2, cudaMemcpyHostToDevice));
  free(h);
}

#ifdef FATTN_TEST_FA3
#define BACKEND "fa3"
/* fa3 with its TMA maps wherever the page size allows them (else it gathers, or falls back to
 * fa2 for shapes it does not cover). */
static int attend_under_test(fattn__layer_params l, fattn__step_params s, const void *q, void *out, float *lse) {
  static _Alignas(64) uint8_t maps[FATTN__TMAP_BYTES];
  l.tmaps = fattn__fa3_encode_maps(&l, maps) == 0 ? maps : NULL;
  return fattn__fa3_attend(l, s, q, out, lse, NULL);
}
#elif defined(FATTN_TEST_MLA90)
#define BACKEND "mla90"
/* The Hopper MLA kernel (tests/gpu_mla90.c): where pages allow the latent pool's tensor map,
 * calls alternate between TMA and the gather, so that a split step's rerun (whose bytes must
 * equal the first run's) also compares the two loads. */
static int attend_under_test(fattn__layer_params l, fattn__step_params s, const void *q, void *out, float *lse) {
  static _Alignas(64) uint8_t map[FATTN__TMAP_BYTES];
  static unsigned calls;
  if (!l.mla) return fattn__fa2_attend(l, s, q, out, lse, NULL);
  l.tmaps = calls++ % 2u == 0u && fattn__mla90_encode_map(&l, map) == 0 ? map : NULL;
  return fattn__mla90_attend(l, s, q, out, lse, NULL);
}
#else
#define BACKEND "fa2"
static int attend_under_test(fattn__layer_params l, fattn__step_params s, const void *q, void *out, float *lse) {
  return fattn__fa2_attend(l, s, q, out, lse, NULL);
}
#endif

/* Where a group's sinks lie (cfg.sinks): none; random near the scores (head 1 without one); 100
 * above every score a head's rows see, where the sink's term against a row's max is past float's
 * range; 100 below every one (head 1 without one), where it is under it; 0 (cfg.lone). */
enum { SINKS_NONE, SINKS_NEAR, SINKS_ABOVE, SINKS_BELOW, SINKS_ZERO };

/* One group of random cases sharing a shape and options. lone: every entry one query over one
 * slot, Q all 2.5 and K all -4.5 (exact in bf16 and fp16), so that at d 64 the one score is -90. */
typedef struct cfg {
  uint32_t mode, qh, kvh, d, dv, qt, kt, ps;
  float softcap;
  int32_t window;
  uint32_t chunk;
  int sinks, tree, lse, mla, lone;
  uint32_t ct;       /* compute_dtype: 0 for qt (16-bit MMAs), F8 for e4m3 GEMMs (gpu_fa3's fp8_compute) */
  uint32_t max_bs;   /* entries drawn in 1..max_bs */
  uint32_t long_len; /* longest KV (decode) or query (prefill) length drawn */
  uint64_t budget;   /* reference work per case: sum over entries of q_len * kv_len * q_heads */
} cfg;

/* ------------------------------------------------------------------- one case */

typedef struct stats {
  int ok, n;
  double worst;
} stats;

static int is_decode(uint32_t m) { return m == FATTN_MODE_DECODE || m == FATTN_MODE_DRAFT_DECODE; }

static uint32_t draw_len(const cfg *c, int longer) {
  uint32_t ps = c->ps;
  uint32_t base[5] = {1, ps > 1 ? ps - 1 : 1, ps, ps + 1, 1 + rnd(3 * ps + 40)};
  if (longer) return rnd(2) ? c->long_len : 1 + rnd(c->long_len);
  return base[rnd(5)];
}

/* Each head's sink 100 past every score its rows see, from the reference without sinks over
 * the host step (hl, hs): a row's LSE is at least its largest score and, with Q negated (every
 * score negated, softcap's tanh being odd), at least minus its smallest. SINKS_ABOVE: the head's
 * largest LSE + 100; SINKS_BELOW: minus its largest LSE of -Q, - 100, and head 1 without a sink.
 * A head none of whose rows sees a slot keeps sink 0. o and lse: room for the reference's O and
 * LSE; q [qn] (16-bit) comes back as it was. */
static void far_sinks(int where, fattn__layer_params hl, fattn__step_params hs, uint16_t *q, size_t qn, double *o,
                      double *lse, size_t ln, float *sinks) {
  hl.sinks = NULL;
  for (size_t i = 0; where == SINKS_BELOW && i < qn; i++) q[i] ^= 0x8000u; /* the sign bit of bf16 and fp16 */
  fattn_test_oracle(hl, hs, q, o, lse, NULL, 0);
  for (size_t i = 0; where == SINKS_BELOW && i < qn; i++) q[i] ^= 0x8000u;
  for (uint32_t hq = 0; hq < hl.num_q_heads; hq++) {
    double top = -INFINITY;
    for (size_t i = hq; i < ln; i += hl.num_q_heads) top = fmax(top, lse[i]);
    sinks[hq] = top == -INFINITY ? 0.0f : where == SINKS_ABOVE ? (float)(top + 100.0) : (float)(-top - 100.0);
    if (where == SINKS_BELOW && hq == 1) sinks[hq] = -INFINITY;
  }
}

/* Builds a random step for c, runs fa2 and the reference, compares; returns err / tol. */
static double run_case(const cfg *c, int route, int *ok) {
  fattn__layer_params l;
  memset(&l, 0, sizeof l);
  l.num_q_heads = c->qh;
  l.num_kv_heads = c->kvh;
  l.head_dim = c->d;
  l.head_dim_v = c->dv;
  l.mla = (uint32_t)c->mla;
  l.page_size = c->ps;
  l.q_dtype = c->qt;
  l.kv_dtype = c->kt;
  l.compute_dtype = c->ct ? c->ct : c->qt;
  l.scale = 1.0f / sqrtf((float)c->d);
  l.softcap = c->softcap;
  l.window = c->window;
  l.chunk = c->chunk;
  l.k_scale = c->kt == F8 ? 0.75f : 1.0f;
  l.v_scale = c->kt == F8 ? 1.25f : 1.0f;
  const uint32_t G = c->qh / c->kvh;

  /* Entries. */
  uint32_t bs = 1 + rnd(c->max_bs);
  fattn__entry *e = fattn_test_xmalloc(bs * sizeof *e);
  uint64_t *mask = fattn_test_xmalloc(64 * 64 * (size_t)bs * sizeof *mask);
  uint32_t nmask = 0, maxkv = 1;
  uint64_t work = 0;
  for (uint32_t i = 0; i < bs; i++) {
    fattn__entry *x = &e[i];
    memset(x, 0, sizeof *x);
    x->mask_row = UINT32_MAX;
    int longer = c->max_bs == 1 || (work < c->budget / 2 && rnd(3) == 0);
    uint32_t ql, kl;
    if (c->lone) {
      ql = kl = 1;
    } else if (is_decode(c->mode)) {
      ql = 1;
      kl = draw_len(c, longer);
    } else if (c->mode == FATTN_MODE_TARGET_VERIFY) {
      ql = rnd(6) == 0 ? 1 + rnd(64) : 1 + rnd(8);
      kl = ql + draw_len(c, longer) - 1 + rnd(2);
    } else if (c->mode == FATTN_MODE_CROSS) {
      ql = 1 + rnd(longer ? 300 : 40);
      kl = rnd(8) == 0 ? 0 : draw_len(c, longer);
    } else {
      ql = draw_len(c, longer);
      if (c->mode == FATTN_MODE_DRAFT_EXTEND) ql = 1 + rnd(8);
      uint32_t pre = rnd(3) == 0 ? 0 : rnd(2) ? rnd(c->ps + 2) : rnd(600);
      kl = ql + pre;
    }
    uint64_t w = (uint64_t)ql * kl * c->qh;
    if (work + w > c->budget && i > 0) { /* keep the reference affordable */
      ql = is_decode(c->mode) || c->mode == FATTN_MODE_TARGET_VERIFY ? ql : 1 + rnd(4);
      kl = c->mode == FATTN_MODE_CROSS ? 1 + rnd(c->ps + 2) : ql + rnd(c->ps + 2);
      if (c->mode == FATTN_MODE_TARGET_VERIFY) { ql = 1 + rnd(4); kl = ql + rnd(c->ps + 2); }
      w = (uint64_t)ql * kl * c->qh;
    }
    work += w;
    x->q_len = ql;
    x->kv_len = kl;
    x->new_len = c->mode == FATTN_MODE_CROSS ? 0 : ql;
    if (c->tree && c->mode == FATTN_MODE_TARGET_VERIFY && rnd(4) != 0) {
      x->mask_row = nmask;
      for (uint32_t t = 0; t < ql; t++) {
        uint64_t m = rnd(10) ? (1ull << t) : 0; /* a row may even see nothing */
        for (uint32_t b = 0; b < ql; b++)
          if (b != t && rnd(b < t ? 2 : 8) == 0) m |= 1ull << b;
        mask[nmask++] = m;
      }
    }
    if (kl > maxkv) maxkv = kl;
  }

  /* Header and prep. */
  fattn__step_hdr h;
  memset(&h, 0, sizeof h);
  h.mode = c->mode;
  h.num_entries = bs;
  h.max_splits = MAX_SPLITS;
  h.split_rows_cap = MAX_SPLITS * FATTN__SPLIT_ROWS_PER_SPLIT;
  h.target_ctas = TARGET_CTAS;
  h.decode_groups = fattn__decode_groups(c->mla, c->qh, c->kvh);
  h.decode_resident = c->mla ? FATTN__DECODE_RESIDENT_MLA : fattn__decode_resident(c->kt == F8, c->d, c->qh / c->kvh);
  h.causal = c->mode != FATTN_MODE_CROSS;
  h.num_mask_rows = nmask;
  fattn__prep(&h, e);

  /* Paged layout: rows are shuffled sequences, pages a shuffled pool with spare pages. */
  l.pages_per_seq = (maxkv + c->ps - 1) / c->ps + 1;
  uint32_t need = 0;
  for (uint32_t i = 0; i < bs; i++) need += (e[i].kv_len + c->ps - 1) / c->ps;
  l.num_pages = need + 3;
  uint32_t *perm = fattn_test_xmalloc(l.num_pages * sizeof *perm);
  for (uint32_t i = 0; i < l.num_pages; i++) perm[i] = i;
  for (uint32_t i = l.num_pages - 1; i > 0; i--) {
    uint32_t k = rnd(i + 1), t = perm[i];
    perm[i] = perm[k];
    perm[k] = t;
  }
  uint32_t *rows = fattn_test_xmalloc(bs * sizeof *rows);
  for (uint32_t i = 0; i < bs; i++) rows[i] = i;
  for (uint32_t i = bs - 1; i > 0; i--) {
    uint32_t k = rnd(i + 1), t = rows[i];
    rows[i] = rows[k];
    rows[k] = t;
  }
  size_t pt_n = (size_t)bs * l.pages_per_seq, slots = (size_t)l.num_pages * c->ps;
  int32_t *pt = fattn_test_xmalloc(pt_n * sizeof *pt);
  for (size_t i = 0; i < pt_n; i++) pt[i] = (int32_t)FATTN__PAGE_NONE;
  uint8_t *used = calloc(slots, 1);
  uint32_t next = 0;
  for (uint32_t i = 0; i < bs; i++) {
    e[i].seq = rows[i];
    for (uint32_t p = 0; p < (e[i].kv_len + c->ps - 1) / c->ps; p++)
      pt[(size_t)rows[i] * l.pages_per_seq + p] = (int32_t)perm[next++];
    for (uint32_t j = 0; j < e[i].kv_len; j++)
      used[(size_t)(uint32_t)pt[(size_t)rows[i] * l.pages_per_seq + j / c->ps] * c->ps + j % c->ps] = 1;
  }

  /* Caps: exact, inflated (blocks past the work exit), or steered to the other kernel. */
  fattn__step_params s;
  memset(&s, 0, sizeof s);
  s.mode = c->mode; /* as attn/step.c: the kernel choice follows it */
  s.cap_entries = bs;
  s.cap_q_tokens = h.num_q_tokens;
  s.cap_new_tokens = h.num_new_tokens;
  s.cap_tiles = h.num_tiles;
  s.max_splits = h.max_splits; /* as attn/step.c: the decode grid and kind follow it */
  if (route == 1) { s.cap_entries += 3; s.cap_q_tokens += 5; s.cap_tiles += 2; }
#ifdef FATTN_TEST_FA3 /* caps of long sequences: three-consumer rows */
  if (route == 1 && (c->mode == FATTN_MODE_PREFILL || c->mode == FATTN_MODE_CROSS) &&
      s.cap_q_tokens < FATTN__TRIO_MIN_Q * s.cap_entries)
    s.cap_q_tokens = FATTN__TRIO_MIN_Q * s.cap_entries;
#endif
  if (route == 2) {
    if ((uint64_t)s.cap_q_tokens * G <= 16ull * s.cap_entries) s.cap_q_tokens = 16 * s.cap_entries + 1;
    else s.cap_entries = s.cap_q_tokens * G;
    if (s.cap_tiles < s.cap_q_tokens / FATTN__Q_TILE + bs) s.cap_tiles = s.cap_q_tokens / FATTN__Q_TILE + bs;
  }

  /* Split decode-like steps run again under wide caps, whose grids are past one round of the
   * combine's warps (one warp a row, or two rows a warp, where exact caps give a row four
   * warps), the query tokens an entry kept: a graph's bucket must give its eager step's bytes. */
  fattn__step_params w = s;
  const int wide = route == 0 && h.num_split_rows && (is_decode(c->mode) || c->mode == FATTN_MODE_TARGET_VERIFY);
  int shared_rows = 0;
  if (wide) {
    int sms = 0;
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    const uint32_t qpe = (s.cap_q_tokens + s.cap_entries - 1) / s.cap_entries;
    for (uint32_t i = 0; i < bs; i++) shared_rows |= e[i].num_splits > 4u;
    shared_rows &= (uint64_t)s.cap_entries * qpe * c->qh <= (uint64_t)sms;
    w.cap_entries = 20u * (uint32_t)sms / (qpe * c->qh) + 1;
    if (w.cap_entries < s.cap_entries) w.cap_entries = s.cap_entries;
    w.cap_q_tokens = w.cap_entries * qpe;
    w.cap_tiles = s.cap_tiles + (w.cap_entries - s.cap_entries);
  }

  /* Device buffers. */
  size_t kn = slots * c->kvh * c->d, vn = c->mla ? 0 : slots * c->kvh * c->dv;
  size_t qn = (size_t)h.num_q_tokens * c->qh * c->d, on = (size_t)h.num_q_tokens * c->qh * c->dv;
  size_t ln = (size_t)h.num_q_tokens * c->qh;
  size_t so_n = (size_t)h.split_rows_cap * c->qh * c->dv, sl_n = (size_t)h.split_rows_cap * c->qh;
  float *sinks = NULL;
  if (c->sinks) {
    sinks = fattn_test_xmalloc(c->qh * sizeof *sinks);
    for (uint32_t i = 0; i < c->qh; i++) sinks[i] = c->sinks != SINKS_NEAR ? 0.0f : i == 1 ? -INFINITY : (float)(4.0 * rnd_unit() - 1.0);
  }
  void *dk = dalloc(kn * esize(c->kt)), *dv = c->mla ? NULL : dalloc(vn * esize(c->kt));
  void *dq = dalloc(qn * 2), *dout = dalloc(on * 2 + 16);
  float *dlse = c->lse ? dalloc(ln * 4 + 16) : NULL, *dso = dalloc(so_n * 4), *dsl = dalloc(sl_n * 4);
  float *dsinks = c->sinks ? dalloc(c->qh * 4) : NULL;
  uint32_t *dctr = dalloc(8); /* fa3's tile scheduler words, zero between launches */
  int32_t *dpt = dalloc(pt_n * 4);
  uint8_t *dused = dalloc(slots);
  fattn__step_hdr *dh = dalloc(sizeof h);
  /* cap_entries slots, as the step area has: early decode blocks read their slot before they
   * know whether it is live; the slots past the batch hold garbage, as stale entries would */
  const uint32_t slots_e = w.cap_entries > bs ? w.cap_entries : bs;
  fattn__entry *de = dalloc(slots_e * sizeof *e);
  uint64_t *dmask = dalloc((nmask + 1) * 8);
  uint64_t seed = rng_next();
  CK(fattn_test_gpu_randn(dk, kn, c->kt, 1.0f, seed));
  if (!c->mla) CK(fattn_test_gpu_randn(dv, vn, c->kt, 1.0f, seed + 1));
  CK(fattn_test_gpu_randn(dq, qn, c->qt, 1.5f, seed + 2));
  if (c->lone) {
    fill16(dq, qn, c->qt, 2.5f);
    fill16(dk, kn, c->kt, -4.5f);
  }
  CK(cudaMemcpy(dused, used, slots, cudaMemcpyHostToDevice));
  CK(fattn_test_gpu_nan_rows(dk, dused, slots, (size_t)c->kvh * c->d, c->kt));
  if (!c->mla) CK(fattn_test_gpu_nan_rows(dv, dused, slots, (size_t)c->kvh * c->dv, c->kt));
  CK(fattn_test_gpu_nan(dout, on, c->qt));
  if (c->lse) CK(fattn_test_gpu_nan(dlse, ln, 0));
  CK(fattn_test_gpu_nan(dso, so_n, 0));
  CK(fattn_test_gpu_nan(dsl, sl_n, 0));
  CK(cudaMemset(dctr, 0, 8));
  CK(cudaMemcpy(dpt, pt, pt_n * 4, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dh, &h, sizeof h, cudaMemcpyHostToDevice));
  CK(cudaMemset(de, 0xff, slots_e * sizeof *e));
  CK(cudaMemcpy(de, e, bs * sizeof *e, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dmask, mask, (nmask + 1) * 8, cudaMemcpyHostToDevice));

  /* The reference's step over host copies of the pools and Q (the kernels only read them), and
   * the sinks placed against its scores. */
  void *hk = fattn_test_xmalloc(kn * esize(c->kt)), *hv = c->mla ? NULL : fattn_test_xmalloc(vn * esize(c->kt));
  uint16_t *hq = fattn_test_xmalloc(qn * 2);
  CK(cudaMemcpy(hk, dk, kn * esize(c->kt), cudaMemcpyDeviceToHost));
  if (!c->mla) CK(cudaMemcpy(hv, dv, vn * esize(c->kt), cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(hq, dq, qn * 2, cudaMemcpyDeviceToHost));
  double *o64 = fattn_test_xmalloc(on * 8 + 8), *l64 = fattn_test_xmalloc(ln * 8 + 8);
  float *hso = fattn_test_xmalloc(so_n * 4), *hsl = fattn_test_xmalloc(sl_n * 4);
  fattn__layer_params hl = l;
  hl.k_pool = hk;
  hl.v_pool = hv;
  hl.page_table = pt;
  hl.sinks = sinks;
  fattn__step_params hs = s;
  hs.hdr = &h;
  hs.entries = e;
  hs.mask = mask;
  hs.split_o = hso;
  hs.split_lse = hsl;
  if (c->sinks == SINKS_ABOVE || c->sinks == SINKS_BELOW) far_sinks(c->sinks, hl, hs, hq, qn, o64, l64, ln, sinks);
  if (c->sinks) CK(cudaMemcpy(dsinks, sinks, c->qh * 4, cudaMemcpyHostToDevice));

  fattn__layer_params dl = l;
  dl.k_pool = dk;
  dl.v_pool = dv;
  dl.page_table = dpt;
  dl.sinks = dsinks;
  fattn__step_params ds = s;
  ds.hdr = dh;
  ds.entries = de;
  ds.mask = dmask;
  ds.split_o = dso;
  ds.split_lse = dsl;
  ds.tile_counter = dctr;
  CK(attend_under_test(dl, ds, dq, dout, dlse));
  CK(cudaDeviceSynchronize());
  uint32_t ctr[2];
  CK(cudaMemcpy(ctr, dctr, 8, cudaMemcpyDeviceToHost)); /* the next launch expects them back at 0 */

  int wide_same = 1;
  if (wide) { /* the first run's bytes, then the same step under wide caps into poisoned outputs */
    const size_t nb = on * 2 + (c->lse ? ln * 4 : 0);
    uint8_t *first = fattn_test_xmalloc(nb + 1), *again = fattn_test_xmalloc(nb + 1);
    CK(cudaMemcpy(first, dout, on * 2, cudaMemcpyDeviceToHost));
    if (c->lse) CK(cudaMemcpy(first + on * 2, dlse, ln * 4, cudaMemcpyDeviceToHost));
    CK(fattn_test_gpu_nan(dout, on, c->qt));
    if (c->lse) CK(fattn_test_gpu_nan(dlse, ln, 0));
    CK(fattn_test_gpu_nan(dso, so_n, 0)); /* a split the rerun skipped must not pass on the first's */
    CK(fattn_test_gpu_nan(dsl, sl_n, 0));
    fattn__step_params dw = ds;
    dw.cap_entries = w.cap_entries, dw.cap_q_tokens = w.cap_q_tokens, dw.cap_tiles = w.cap_tiles;
    CK(attend_under_test(dl, dw, dq, dout, dlse));
    CK(cudaDeviceSynchronize());
    uint32_t wctr[2];
    CK(cudaMemcpy(wctr, dctr, 8, cudaMemcpyDeviceToHost));
    ctr[0] |= wctr[0], ctr[1] |= wctr[1];
    CK(cudaMemcpy(again, dout, on * 2, cudaMemcpyDeviceToHost));
    if (c->lse) CK(cudaMemcpy(again + on * 2, dlse, ln * 4, cudaMemcpyDeviceToHost));
    wide_same = memcmp(first, again, nb) == 0;
    free(first);
    free(again);
    wide_runs++;
    wide_shared += shared_rows;
  }

  /* The outputs and the reference. */
  void *hout = fattn_test_xmalloc(on * 2 + 2), *hlp = fattn_test_xmalloc(on * 2 + 2);
  float *hlse = fattn_test_xmalloc(ln * 4 + 4);
  CK(cudaMemcpy(hout, dout, on * 2, cudaMemcpyDeviceToHost));
  if (c->lse) CK(cudaMemcpy(hlse, dlse, ln * 4, cudaMemcpyDeviceToHost));
  fattn_test_oracle(hl, hs, hq, o64, l64, hlp, 0);

  double err = 0, lerr = 0, lse_err = 0, sq = 0;
  size_t nans = fattn_test_count_nan(hout, on, c->qt) + (c->lse ? fattn_test_count_nan(hlse, ln, 0) : 0);
  /* An LSE is finite unless the reference's is -inf (a row that sees nothing, without a sink):
   * whatever merges by LSE turns an infinite one into NaN. */
  size_t infinite = 0;
  for (size_t i = 0; c->lse && i < ln; i++) infinite += isinf(hlse[i]) && hlse[i] != l64[i];
  for (size_t i = 0; i < on; i++) {
    double g = to_f(c->qt, hout, i), lp = to_f(c->qt, hlp, i);
    if (fabs(g - o64[i]) > err) err = fabs(g - o64[i]);
    if (fabs(lp - o64[i]) > lerr) lerr = fabs(lp - o64[i]);
    sq += (g - o64[i]) * (g - o64[i]);
  }
  const double rmse = on ? sqrt(sq / (double)on) : 0.0;
  if (c->lse)
    for (size_t i = 0; i < ln; i++) {
      double d = (isinf(l64[i]) && hlse[i] == l64[i]) ? 0.0 : fabs(hlse[i] - l64[i]) / (1.0 + fabs(l64[i]));
      if (!(d <= lse_err)) lse_err = isnan(d) ? INFINITY : d;
    }
  double tol = (c->kt == F8 ? 4.0 : 2.0) * lerr + 1e-5, lse_tol = 2e-3;
  double ratio = err / tol;
  if (c->ct == F8) { /* the policy's error, not the 16-bit path's: see FP8_RMSE_TOL */
    tol = FP8_MAX_TOL;
    lse_tol = FP8_LSE_TOL;
    ratio = fmax(err / FP8_MAX_TOL, rmse / FP8_RMSE_TOL);
  }
  *ok = nans == 0 && infinite == 0 && err <= tol && lse_err <= lse_tol && ctr[0] == 0 && ctr[1] == 0 && wide_same &&
        (c->ct != F8 || rmse <= FP8_RMSE_TOL);
  if (!*ok)
    printf("  FAIL mode %u bs %u route %d: err %.3g tol %.3g rmse %.3g lse_err %.3g nans %zu infinite LSEs %zu "
           "scheduler %u/%u%s (q_tokens %u, kv of e0 %u)\n",
           c->mode, bs, route, err, tol, rmse, lse_err, nans, infinite, ctr[0], ctr[1],
           wide_same ? "" : ", bytes unlike under wide caps", h.num_q_tokens, e[0].kv_len);
  if (c->ct == F8) { /* the same step through the 16-bit path: its bytes must differ somewhere in the sweep */
    uint8_t *again = fattn_test_xmalloc(on * 2 + 1);
    fattn__layer_params d16 = dl;
    d16.compute_dtype = c->qt;
    CK(attend_under_test(d16, ds, dq, dout, dlse));
    CK(cudaMemcpy(again, dout, on * 2, cudaMemcpyDeviceToHost));
    fp8_unlike_16bit += memcmp(again, hout, on * 2) != 0;
    free(again);
  }

  cudaFree(dk); cudaFree(dv); cudaFree(dq); cudaFree(dout); cudaFree(dlse); cudaFree(dso);
  cudaFree(dsl); cudaFree(dsinks); cudaFree(dpt); cudaFree(dused); cudaFree(dh); cudaFree(de);
  cudaFree(dmask); cudaFree(dctr);
  free(hk); free(hv); free(hq); free(hout); free(hlp); free(hlse); free(o64); free(l64);
  free(hso); free(hsl); free(sinks); free(pt); free(used); free(rows); free(perm); free(e);
  free(mask);
  return ratio;
}

static const char *mname(uint32_t m) {
  static const char *n[] = {"?", "prefill", "decode", "verify", "draft_decode", "draft_extend", "cross"};
  return m <= 6 ? n[m] : "?";
}

/* Runs n cases of c (routes cycle), prints one line; returns the failures. */
static double seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int run_group(const cfg *c, int n, const char *tag) {
  stats st = {0, 0, 0.0};
  const double t0 = seconds(); /* the suite must fit one GPU call: the line says where time goes */
  for (int i = 0; i < n; i++) {
    int ok = 0;
    double r = run_case(c, i % 3 == 2 ? 2 : (i % 3), &ok);
    st.n++;
    st.ok += ok;
    if (r > st.worst || isnan(r)) st.worst = r;
  }
  printf("%s d%u/%u %s/%s page%u gqa%u%s: %d/%d ok, worst err/tol %.2f (%.1f s)\n", mname(c->mode), c->d, c->dv,
         dname(c->qt), dname(c->kt), c->ps, c->qh / c->kvh, tag, st.ok, st.n, st.worst, seconds() - t0);
  fflush(stdout);
  return st.n - st.ok;
}

static cfg base_cfg(uint32_t mode, uint32_t d, uint32_t dv, uint32_t qt, uint32_t kt, uint32_t ps,
                    uint32_t qh, uint32_t kvh) {
  cfg c;
  memset(&c, 0, sizeof c);
  c.mode = mode;
  c.d = d;
  c.dv = dv;
  c.qt = qt;
  c.kt = kt;
  c.ps = ps;
  c.qh = qh;
  c.kvh = kvh;
  c.window = FATTN_NO_WINDOW;
  c.lse = 1;
  c.max_bs = 16;
  c.long_len = 4224;
  c.budget = 400000;
  return c;
}

static int total_fail, total_groups;
static void group(const cfg *c, int n, const char *tag) {
  total_fail += run_group(c, n, tag);
  total_groups++;
}

#if !defined(FATTN_TEST_FA3) && !defined(FATTN_TEST_MLA90) /* store_kv runs fa2's kernel alone */
/* One random store_kv step on layer shape l (its pools and page table made here): up to 40
 * entries of up to 700 slots, each with new rows (DECODE: one) or none, on permuted pages; the
 * kernel's pool bytes against the reference's. MLA layers have no V pool (v is NULL). Returns
 * whether they are equal, having printed the case. */
static int store_case(fattn__layer_params l, uint32_t mode) {
  const uint32_t qt = l.q_dtype, kt = l.kv_dtype, ps = l.page_size, d = l.head_dim, kvh = l.num_kv_heads;
  const uint32_t dvv = l.mla ? 0u : l.head_dim_v; /* V row elements, none for MLA */
  uint32_t bs = 1 + rnd(40);
  fattn__entry *e = fattn_test_xmalloc(bs * sizeof *e);
  uint32_t maxkv = 1;
  for (uint32_t i = 0; i < bs; i++) {
    memset(&e[i], 0, sizeof e[i]);
    e[i].kv_len = 1 + rnd(700);
    e[i].new_len = rnd(4) ? (mode == FATTN_MODE_DECODE ? 1 : 1 + rnd(e[i].kv_len)) : 0;
    e[i].q_len = e[i].new_len;
    e[i].mask_row = UINT32_MAX;
    e[i].seq = i;
    if (e[i].kv_len > maxkv) maxkv = e[i].kv_len;
  }
  fattn__step_hdr h;
  memset(&h, 0, sizeof h);
  h.mode = mode; h.num_entries = bs; h.decode_groups = fattn__decode_groups(l.mla, l.num_q_heads, kvh); h.causal = 1;
  h.max_splits = 1; h.target_ctas = 1;
  fattn__prep(&h, e);
  l.pages_per_seq = (maxkv + ps - 1) / ps;
  l.num_pages = bs * l.pages_per_seq;
  size_t pt_n = (size_t)bs * l.pages_per_seq;
  int32_t *pt = fattn_test_xmalloc(pt_n * 4);
  for (size_t i = 0; i < pt_n; i++) pt[i] = (int32_t)((i * 7919u) % pt_n); /* a permutation */
  if (pt_n % 7919u == 0) for (size_t i = 0; i < pt_n; i++) pt[i] = (int32_t)(pt_n - 1 - i);
  size_t slots = (size_t)l.num_pages * ps, kn = slots * kvh * d, vn = slots * kvh * dvv;
  size_t nk = (size_t)h.num_new_tokens * kvh * d, nv = (size_t)h.num_new_tokens * kvh * dvv;
  void *dk = dalloc(kn * esize(kt)), *dvp = dalloc(vn * esize(kt)), *dnk = dalloc(nk * 2), *dnv = dalloc(nv * 2);
  int32_t *dpt = dalloc(pt_n * 4);
  fattn__step_hdr *dh = dalloc(sizeof h);
  fattn__entry *de = dalloc(bs * sizeof *e);
  uint64_t seed = rng_next();
  CK(fattn_test_gpu_randn(dk, kn, kt, 1.f, seed));
  CK(fattn_test_gpu_randn(dvp, vn, kt, 1.f, seed + 1));
  CK(fattn_test_gpu_randn(dnk, nk, qt, 2.f, seed + 2));
  CK(fattn_test_gpu_randn(dnv, nv, qt, 2.f, seed + 3));
  CK(cudaMemcpy(dpt, pt, pt_n * 4, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dh, &h, sizeof h, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(de, e, bs * sizeof *e, cudaMemcpyHostToDevice));
  void *hk = fattn_test_xmalloc(kn * esize(kt)), *hv = fattn_test_xmalloc(vn * esize(kt) + 1);
  void *hnk = fattn_test_xmalloc(nk * 2 + 1), *hnv = fattn_test_xmalloc(nv * 2 + 1);
  void *gk = fattn_test_xmalloc(kn * esize(kt)), *gv = fattn_test_xmalloc(vn * esize(kt) + 1);
  CK(cudaMemcpy(hk, dk, kn * esize(kt), cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(hv, dvp, vn * esize(kt), cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(hnk, dnk, nk * 2, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(hnv, dnv, nv * 2, cudaMemcpyDeviceToHost));
  fattn__layer_params dl = l;
  dl.k_pool = dk; dl.v_pool = dvv ? dvp : NULL; dl.page_table = dpt;
  fattn__step_params ds;
  memset(&ds, 0, sizeof ds);
  ds.mode = mode; ds.hdr = dh; ds.entries = de; ds.cap_entries = bs;
  ds.cap_new_tokens = h.num_new_tokens + 9; /* blocks past the rows exit */
  CK(fattn__fa2_store_kv(dl, ds, dnk, dvv ? dnv : NULL, NULL));
  CK(cudaMemcpy(gk, dk, kn * esize(kt), cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(gv, dvp, vn * esize(kt), cudaMemcpyDeviceToHost));
  fattn__layer_params hl = l;
  hl.k_pool = hk; hl.v_pool = dvv ? hv : NULL; hl.page_table = pt;
  fattn__step_params hs = ds;
  hs.hdr = &h; hs.entries = e;
  fattn__ref_store_kv(hl, hs, hnk, dvv ? hnv : NULL);
  int ok = memcmp(gk, hk, kn * esize(kt)) == 0 && memcmp(gv, hv, vn * esize(kt)) == 0;
  printf("store_kv %sd%u/%u %s/%s page%u: %u entries, %u rows, bytes %s\n", l.mla ? "mla " : "", d, l.head_dim_v,
         dname(qt), dname(kt), ps, bs, h.num_new_tokens, ok ? "equal" : "DIFFER");
  cudaFree(dk); cudaFree(dvp); cudaFree(dnk); cudaFree(dnv); cudaFree(dpt); cudaFree(dh); cudaFree(de);
  free(hk); free(hv); free(hnk); free(hnv); free(gk); free(gv); free(pt); free(e);
  return ok;
}

#endif

/* ------------------------------------------------------------------- cases */

#ifndef FATTN_TEST_MLA /* tests/gpu_mla.c brings its own cases */

static const uint32_t PAGES[5] = {1, 16, 64, 128, 256};
static const uint32_t DIMS[6][2] = {{64, 64}, {96, 96}, {128, 128}, {192, 128}, {192, 192}, {256, 256}};
static const uint32_t GQA[4][2] = {{4, 4}, {8, 2}, {8, 1}, {32, 1}};

#ifndef FATTN_TEST_FA3 /* backend-independent, or fa2's own decode kernels */
START_TEST(store_kv) {
  int fails = 0;
  for (int k = 0; k < 6; k++) {
    uint32_t qt = k & 1 ? FP : BF, kt = k >= 4 ? F8 : qt;
    fattn__layer_params l;
    memset(&l, 0, sizeof l);
    l.num_q_heads = 8; l.num_kv_heads = 2; l.head_dim = DIMS[k][0]; l.head_dim_v = DIMS[k][1]; l.page_size = PAGES[rnd(5)];
    l.q_dtype = qt; l.kv_dtype = kt; l.compute_dtype = qt; l.k_scale = kt == F8 ? 0.37f : 1.f; l.v_scale = kt == F8 ? 2.5f : 1.f;
    fails += !store_case(l, FATTN_MODE_PREFILL);
  }
  ck_assert_int_eq(fails, 0);
}
END_TEST

START_TEST(decode) {
  int f0 = total_fail;
  static const uint32_t TYPES[4][2] = {{BF, BF}, {FP, FP}, {BF, F8}, {FP, F8}};
  for (int t = 0; t < 4; t++)
    for (int p = 0; p < 5; p++) {
      cfg c = base_cfg(FATTN_MODE_DECODE, 128, 128, TYPES[t][0], TYPES[t][1], PAGES[p], 8, 2);
      c.max_bs = 48;
      c.long_len = p == 1 && t < 2 ? 16384 : 4224;
      group(&c, 2, "");
    }
  for (int k = 0; k < 6; k++)
    for (int g = 0; g < 4; g++) {
      cfg c = base_cfg(k % 2 ? FATTN_MODE_DRAFT_DECODE : FATTN_MODE_DECODE, DIMS[k][0], DIMS[k][1],
                       (k + g) % 2 ? FP : BF, g == 3 ? F8 : (k + g) % 2 ? FP : BF, PAGES[(k + g) % 5],
                       GQA[g][0], GQA[g][1]);
      c.max_bs = g == 0 ? 256 : 32;
      group(&c, 1, "");
    }
  /* bs 1 long sequences through split-KV. */
  cfg c = base_cfg(FATTN_MODE_DECODE, 128, 128, BF, BF, 16, 4, 1);
  c.max_bs = 1; c.long_len = 16384;
  group(&c, 3, " long");
  ck_assert_int_eq(total_fail - f0, 0);
}
END_TEST

/* Narrow heads (d 64, 96) at bs <= 4 through split-KV and the combine, whose lanes past the
 * row's dims must not read: small enough for compute-sanitizer (tests/sanitize.cases). */
START_TEST(decode_narrow) {
  int f0 = total_fail;
  for (int k = 0; k < 2; k++) {
    cfg c = base_cfg(FATTN_MODE_DECODE, DIMS[k][0], DIMS[k][1], k ? FP : BF, k ? FP : BF, PAGES[1 + k], 8, 2);
    c.max_bs = 4;
    c.long_len = 4224;
    group(&c, 2, " narrow");
  }
  ck_assert_int_eq(total_fail - f0, 0);
}
END_TEST

#endif

START_TEST(options) {
  int f0 = total_fail;
  uint32_t modes[4] = {FATTN_MODE_DECODE, FATTN_MODE_PREFILL, FATTN_MODE_TARGET_VERIFY, FATTN_MODE_DRAFT_EXTEND};
  for (int m = 0; m < 4; m++)
    for (int o = 0; o < 5; o++) {
      cfg c = base_cfg(modes[m], 128, 128, o % 2 ? FP : BF, o == 4 ? F8 : o % 2 ? FP : BF, PAGES[(m + o) % 5], 8, 2);
      c.max_bs = modes[m] == FATTN_MODE_PREFILL ? 4 : 16;
      c.long_len = modes[m] == FATTN_MODE_PREFILL ? 700 : 4224;
      const char *tag = "";
      if (o == 0) { c.softcap = 3.0f; tag = " softcap"; }
      if (o == 1) { c.window = 37 + (int)rnd(200); tag = " window"; }
      if (o == 2) { c.chunk = 64u << rnd(3); tag = " chunk"; }
      if (o == 3) { c.sinks = SINKS_NEAR; c.lse = 1; tag = " sinks"; }
      if (o == 4) { c.sinks = SINKS_NEAR; c.window = 100; c.softcap = 5.0f; c.lse = 0; tag = " sinks+window+softcap nolse"; }
      group(&c, 2, tag);
    }
  ck_assert_int_eq(total_fail - f0, 0);
}
END_TEST

START_TEST(verify) {
  int f0 = total_fail;
  for (int k = 0; k < 6; k++) {
    cfg c = base_cfg(FATTN_MODE_TARGET_VERIFY, DIMS[k][0], DIMS[k][1], k % 2 ? FP : BF, k == 2 ? F8 : k % 2 ? FP : BF,
                     PAGES[k % 5], GQA[k % 4][0], GQA[k % 4][1]);
    c.tree = k != 1;
    c.max_bs = 8;
    c.budget = 500000;
    group(&c, 2, c.tree ? " tree" : " chain");
  }
  ck_assert_int_eq(total_fail - f0, 0);
}
END_TEST

/* Sinks 100 above every score of their head and 100 below, on every path: prefill, decode and
 * draft decode (their split-KV steps and the merge; bs 1 over 16384 slots for rows of more than
 * 4 splits), verify's trees (the wide kind), draft extend and cross with softcap; then the lone
 * score of -90 beside a sink of 0 (d 64, one head, one slot), whose LSE is about 0. */
START_TEST(sinks_far) {
  int f0 = total_fail;
  static const struct { uint32_t mode; int dim, gqa; uint32_t qt, kt, ps; float softcap; } X[6] = {
      {FATTN_MODE_PREFILL, 2, 1, BF, BF, 16, 0.f},       {FATTN_MODE_DECODE, 2, 2, FP, F8, 64, 0.f},
      {FATTN_MODE_DRAFT_DECODE, 0, 0, BF, BF, 1, 0.f},   {FATTN_MODE_TARGET_VERIFY, 2, 3, BF, BF, 16, 0.f},
      {FATTN_MODE_DRAFT_EXTEND, 5, 1, FP, FP, 128, 0.f}, {FATTN_MODE_CROSS, 3, 1, BF, F8, 256, 4.f}};
  for (int where = SINKS_ABOVE; where <= SINKS_BELOW; where++) {
    const char *tag = where == SINKS_ABOVE ? " sinks 100 above" : " sinks 100 below";
    for (int k = 0; k < 6; k++) {
      cfg c = base_cfg(X[k].mode, DIMS[X[k].dim][0], DIMS[X[k].dim][1], X[k].qt, X[k].kt, X[k].ps, GQA[X[k].gqa][0],
                       GQA[X[k].gqa][1]);
      c.sinks = where;
      c.softcap = X[k].softcap;
      c.tree = X[k].mode == FATTN_MODE_TARGET_VERIFY;
      c.max_bs = X[k].mode == FATTN_MODE_PREFILL ? 4 : 16;
      c.long_len = X[k].mode == FATTN_MODE_PREFILL ? 700 : 4224;
      group(&c, 3, tag);
    }
    cfg c = base_cfg(FATTN_MODE_DECODE, 128, 128, BF, BF, 16, 4, 1);
    c.sinks = where;
    c.max_bs = 1;
    c.long_len = 16384;
    group(&c, 3, where == SINKS_ABOVE ? " long sinks 100 above" : " long sinks 100 below");
  }
  static const uint32_t LONE[4] = {FATTN_MODE_PREFILL, FATTN_MODE_DECODE, FATTN_MODE_TARGET_VERIFY, FATTN_MODE_CROSS};
  for (int m = 0; m < 4; m++) {
    cfg c = base_cfg(LONE[m], 64, 64, m % 2 ? FP : BF, m % 2 ? FP : BF, PAGES[m + 1], 1, 1);
    c.lone = 1;
    c.sinks = SINKS_ZERO;
    c.max_bs = 8;
    group(&c, 3, " lone score -90, sink 0");
  }
  ck_assert_int_eq(total_fail - f0, 0);
}
END_TEST

START_TEST(prefill) {
  int f0 = total_fail;
  const int quick = getenv("FATTN_TEST_QUICK") != NULL; /* under compute-sanitizer: 6 of 18 groups, no long one */
  for (int k = 0; k < 6; k++)
    for (int p = quick ? k % 3 : 0; p < 5; p += quick ? 6 : 2) {
      int t = (k + p) % 3;
      cfg c = base_cfg(FATTN_MODE_PREFILL, DIMS[k][0], DIMS[k][1], t == 1 ? FP : BF, t == 2 ? F8 : t == 1 ? FP : BF,
                       PAGES[(k + p) % 5], GQA[(k + p) % 4][0], GQA[(k + p) % 4][1]);
      c.max_bs = 6;
      c.long_len = 1000;
      c.budget = 600000;
      group(&c, 1, "");
    }
  cfg c = base_cfg(FATTN_MODE_PREFILL, 128, 128, BF, BF, 64, 2, 1);
  c.max_bs = 1;
  if (!quick) group(&c, 1, " long");
  for (int k = 0; k < 3; k++) {
    cfg x = base_cfg(FATTN_MODE_DRAFT_EXTEND, DIMS[2 * k][0], DIMS[2 * k][1], BF, k == 1 ? F8 : BF, PAGES[k + 1], 8, 2);
    x.max_bs = 40;
    group(&x, 2, "");
    cfg y = base_cfg(FATTN_MODE_CROSS, DIMS[2 * k + 1][0], DIMS[2 * k + 1][1], FP, k == 2 ? F8 : FP, PAGES[k + 2], 8, 1);
    y.max_bs = 8;
    group(&y, 2, "");
  }
  ck_assert_int_eq(total_fail - f0, 0);
}
END_TEST

START_TEST(totals) {
  printf(BACKEND " totals: %d groups, %d failed cases, %d split steps run again under wide caps (%d with four-warp "
         "rows)\n", total_groups, total_fail, wide_runs, wide_shared);
  ck_assert_int_eq(total_fail, 0);
#ifndef FATTN_TEST_FA3 /* gpu_fa3 runs no decode group, and its verify steps seldom have so few rows */
  if (total_groups) /* the groups ran in this process */
    ck_assert_msg(wide_shared > 0, "%d split steps ran under wide caps, none with four-warp rows of more than 4 splits",
                  wide_runs);
#endif
}
END_TEST

#ifdef FATTN_TEST_FA3
/* Long prefill and extend on the fa3 kernel itself: every head dim it covers, TMA pages (128,
 * 256) and gathered ones, fp8 KV, causal, cross, window, softcap and sinks. */
START_TEST(fa3_long) {
  ck_assert_msg(fattn__fa3_available(), "the fa3 kernels need a compute capability 9.0 device");
  int f0 = total_fail;
  static const uint32_t D3[3] = {64, 128, 256}, P3[4] = {16, 64, 128, 256};
  for (int k = 0; k < 3; k++)
    for (int p = 0; p < 4; p++) {
      uint32_t mode = p == 3 ? FATTN_MODE_CROSS : FATTN_MODE_PREFILL;
      cfg c = base_cfg(mode, D3[k], D3[k], (k + p) % 2 ? FP : BF, (k + p) % 2 ? FP : BF, P3[p], GQA[p][0], GQA[p][1]);
      c.max_bs = 3;
      c.long_len = 1500;
      c.budget = 3000000;
      const char *tag = "";
      if (p == 1) { c.window = 300; tag = " window"; }
      if (p == 2 && k == 1) { c.softcap = 4.0f; tag = " softcap"; }
      group(&c, 2, tag);
    }
  /* Tiles padded past d (96), d_v below d (192 / 128), and fp8 KV widened by the producer. */
  static const struct { int dim; uint32_t qt, kt, ps; int gqa, window, sinks; float softcap; const char *tag; } X[7] = {
      {1, BF, BF, 128, 1, 0, 0, 0.f, " tma"},      {1, FP, FP, 16, 2, 300, 0, 0.f, " window"},
      {3, BF, BF, 64, 0, 0, 0, 0.f, " tma"},       {4, FP, FP, 16, 1, 0, 0, 4.f, " softcap"},
      {2, BF, F8, 128, 1, 0, SINKS_NEAR, 0.f, " sinks"},    {5, FP, F8, 64, 2, 300, 0, 0.f, " window"},
      {3, BF, F8, 16, 1, 0, 0, 0.f, ""}};
  for (int k = 0; k < 7; k++) {
    cfg x = base_cfg(FATTN_MODE_PREFILL, DIMS[X[k].dim][0], DIMS[X[k].dim][1], X[k].qt, X[k].kt, X[k].ps,
                     GQA[X[k].gqa][0], GQA[X[k].gqa][1]);
    x.max_bs = 3;
    x.long_len = 1500;
    x.budget = 3000000;
    if (X[k].window) x.window = X[k].window;
    x.sinks = X[k].sinks;
    x.softcap = X[k].softcap;
    group(&x, 2, X[k].tag);
  }
  cfg c = base_cfg(FATTN_MODE_PREFILL, 128, 128, BF, BF, 128, 2, 1);
  c.max_bs = 1;
  c.long_len = 8192;
  c.budget = 2ull * 8192 * 8192;
  group(&c, 1, " 8192");
  ck_assert_int_eq(total_fail - f0, 0);
}
END_TEST

/* fp8 compute (compute_dtype FP8_E4M3) against the float64 reference over the same fp8 cache: every
 * head dim, the four prefill-side modes (prefill over a cached prefix, verify's trees, draft extend,
 * cross), each with every option in turn (none, window, chunk, softcap, sinks; LSE on), pages 1, 16
 * and 128, bf16 and fp16 Q; then long prefills. Under FATTN_TEST_QUICK (compute-sanitizer): 5 of the
 * 24 groups, one of each mode, no long one. The output cannot show which GEMMs ran, so the
 * same steps also run through the 16-bit path, whose bytes some case must not match. */
START_TEST(fp8_compute) {
  ck_assert_msg(fattn__fa3_available(), "the fa3 kernels need a compute capability 9.0 device");
  int f0 = total_fail, unlike0 = fp8_unlike_16bit;
  const int quick = getenv("FATTN_TEST_QUICK") != NULL;
  static const uint32_t MODES[4] = {FATTN_MODE_PREFILL, FATTN_MODE_TARGET_VERIFY, FATTN_MODE_DRAFT_EXTEND,
                                    FATTN_MODE_CROSS};
  static const uint32_t P3[3] = {1, 16, 128};
  for (int k = 0; k < 6; k++)
    for (int m = 0; m < 4; m++) {
      const int i = 4 * k + m; /* i % 5 gives each mode every option over the six dims */
      if (quick && i % 5 != 0) continue;
      cfg c = base_cfg(MODES[m], DIMS[k][0], DIMS[k][1], (k + m) % 2 ? FP : BF, F8, P3[i % 3], GQA[i % 4][0],
                       GQA[i % 4][1]);
      c.ct = F8;
      c.tree = MODES[m] == FATTN_MODE_TARGET_VERIFY;
      c.max_bs = MODES[m] == FATTN_MODE_PREFILL ? 6 : MODES[m] == FATTN_MODE_DRAFT_EXTEND ? 40 : 8;
      if (MODES[m] == FATTN_MODE_PREFILL) c.long_len = 1000;
      c.budget = MODES[m] == FATTN_MODE_PREFILL ? 600000 : 500000;
      const char *tag = " fp8 compute";
      switch (i % 5) {
        case 1: c.window = 37 + (int)rnd(200); tag = " fp8 compute window"; break;
        case 2: c.chunk = 64u << rnd(3); tag = " fp8 compute chunk"; break;
        case 3: c.softcap = 3.0f; tag = " fp8 compute softcap"; break;
        case 4: c.sinks = SINKS_NEAR; tag = " fp8 compute sinks"; break;
        default: break;
      }
      group(&c, 2, tag);
    }
  static const struct { int dim; uint32_t mode, qt, ps; int gqa, window; } L[3] = {
      {2, FATTN_MODE_PREFILL, BF, 128, 1, 0}, {5, FATTN_MODE_PREFILL, FP, 16, 2, 300}, {3, FATTN_MODE_CROSS, BF, 128, 0, 0}};
  for (int k = 0; k < 3 && !quick; k++) {
    cfg c = base_cfg(L[k].mode, DIMS[L[k].dim][0], DIMS[L[k].dim][1], L[k].qt, F8, L[k].ps, GQA[L[k].gqa][0],
                     GQA[L[k].gqa][1]);
    c.ct = F8;
    c.max_bs = 3;
    c.long_len = 1500;
    c.budget = 3000000;
    if (L[k].window) c.window = L[k].window;
    group(&c, 2, L[k].window ? " fp8 compute long window" : " fp8 compute long");
  }
  ck_assert_msg(fp8_unlike_16bit > unlike0, "no fp8 compute case differed from its 16-bit path: compute_dtype ignored");
  ck_assert_int_eq(total_fail - f0, 0);
}
END_TEST

/* store_kv and the decode groups are left to gpu_fa2: fa3 hands those steps to the same fa2
 * kernels, so they would only repeat it. */
FATTN_SUITE("gpu_fa3", FATTN_TEST_GPU, options, verify, sinks_far, prefill, fa3_long, fp8_compute, totals)
#else
FATTN_SUITE("gpu_fa2", FATTN_TEST_GPU, store_kv, decode, decode_narrow, options, verify, sinks_far, prefill, totals)
#endif
#endif /* FATTN_TEST_MLA */
