/* test_ref.c: the float64 reference (attn/ref) against closed forms, a dense softmax over
 * logical arrays, and itself across equivalent plans (splits, trees, branches, decode). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "attn/backend.h"
#include "lib/dtype.h"
#include "tests/support.h"

#define ck_close(got, want, tol)                                                       \
  do {                                                                                 \
    double g_ = (got), w_ = (want);                                                    \
    ck_assert_msg(fabs(g_ - w_) <= (tol) * fmax(1.0, fabs(w_)), "%s = %.17g, want %.17g", \
                  #got, g_, w_);                                                       \
  } while (0)

/* ---------------------------------------------------------------- data */

static uint64_t rng_state;

static double rng_unit(void) { /* splitmix64, [0, 1) */
  uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return (double)((z ^ (z >> 31)) >> 11) * 0x1.0p-53;
}

static void *xmalloc(size_t n) {
  void *p = malloc(n ? n : 1);
  ck_assert_ptr_nonnull(p);
  return p;
}

/* Random values exact in bf16 and fp16: magnitude in [1/64, 1], random sign, never zero. */
static float *rnd(size_t n) {
  float *x = xmalloc(n * sizeof *x);
  for (size_t i = 0; i < n; i++) {
    float m = fattn__bf16_to_f32(fattn__f32_to_bf16((float)(1.0 / 64 + rng_unit() * 63 / 64)));
    x[i] = rng_unit() < 0.5 ? -m : m;
  }
  return x;
}

/* x as the bits of a 16-bit dtype. */
static uint16_t bits16(uint32_t dtype, float x) {
  return dtype == FATTN_DTYPE_FP16 ? fattn__f32_to_f16(x) : fattn__f32_to_bf16(x);
}

/* x [n] as q_dtype bits. */
static uint16_t *enc(uint32_t dtype, const float *x, size_t n) {
  uint16_t *b = xmalloc(n * sizeof *b);
  for (size_t i = 0; i < n; i++) b[i] = bits16(dtype, x[i]);
  return b;
}

/* ------------------------------------------------------------- fixture */

enum { ROWS = 8, MAX_ENTRIES = 8 }; /* page-table rows, entries of one step */

typedef struct shape {
  uint32_t qh, kvh, d, dv, ps, len; /* dv 0: d; len: longest sequence */
  uint32_t q_dtype, kv_dtype, mla;  /* 0: bf16, bf16, no */
} shape;

/* One layer's pools and page table, and the step being built. */
typedef struct fx {
  fattn__layer_params l;
  fattn__step_hdr h;
  fattn__entry e[MAX_ENTRIES];
  uint64_t mask[64];
  fattn__step_params s;
  uint32_t *perm, next_page; /* page ids are handed out in this order */
} fx;

/* Results of one fx_run: O in q_dtype and float LSE, O and LSE in double. */
typedef struct res {
  uint16_t *out;
  float *lse;
  double *o, *lse64;
  size_t no, nl;
} res;

/* A pool of n elements of dtype, all NaN: any unwritten slot read leaks into the output. */
static void *nan_pool(uint32_t dtype, size_t n) {
  if (dtype == FATTN_DTYPE_FP8_E4M3) {
    uint8_t *p = xmalloc(n);
    memset(p, 0x7f, n);
    return p;
  }
  uint16_t *p = xmalloc(n * 2);
  for (size_t i = 0; i < n; i++) p[i] = dtype == FATTN_DTYPE_FP16 ? 0x7e00u : 0x7fc0u;
  return p;
}

static void fx_init(fx *f, shape sh) {
  memset(f, 0, sizeof *f);
  fattn__layer_params *l = &f->l;
  l->num_q_heads = sh.qh;
  l->num_kv_heads = sh.kvh;
  l->head_dim = sh.d;
  l->head_dim_v = sh.dv ? sh.dv : sh.d;
  l->mla = sh.mla;
  l->page_size = sh.ps;
  l->pages_per_seq = (sh.len + sh.ps - 1) / sh.ps;
  l->num_pages = ROWS * l->pages_per_seq + 3;
  l->q_dtype = sh.q_dtype ? sh.q_dtype : FATTN_DTYPE_BF16;
  l->kv_dtype = sh.kv_dtype ? sh.kv_dtype : FATTN_DTYPE_BF16;
  l->scale = 1.0f / sqrtf((float)sh.d);
  l->window = FATTN_NO_WINDOW;
  l->k_scale = l->v_scale = 1.0f;
  size_t rows = (size_t)l->num_pages * sh.ps * sh.kvh;
  l->k_pool = nan_pool(l->kv_dtype, rows * sh.d);
  l->v_pool = sh.mla ? NULL : nan_pool(l->kv_dtype, rows * l->head_dim_v);
  size_t pt = (size_t)ROWS * l->pages_per_seq;
  l->page_table = xmalloc(pt * sizeof *l->page_table);
  for (size_t i = 0; i < pt; i++) l->page_table[i] = (int32_t)FATTN__PAGE_NONE;
  f->perm = xmalloc(l->num_pages * sizeof *f->perm);
  for (uint32_t i = 0; i < l->num_pages; i++) f->perm[i] = i;
  for (uint32_t i = l->num_pages - 1; i > 0; i--) { /* Fisher-Yates */
    uint32_t j = (uint32_t)(rng_unit() * (i + 1)), t = f->perm[i];
    f->perm[i] = f->perm[j];
    f->perm[j] = t;
  }
  f->s.hdr = &f->h;
  f->s.entries = f->e;
  f->s.mask = f->mask;
}

static void fx_free(fx *f) {
  free(f->l.k_pool);
  free(f->l.v_pool);
  free(f->l.page_table);
  free(f->perm);
  free(f->s.split_o);
  free(f->s.split_lse);
}

static void res_free(res *r) {
  free(r->out);
  free(r->lse);
  free(r->o);
  free(r->lse64);
}

/* Maps the unmapped pages covering slots [0, len) of row seq. */
static void fx_map(fx *f, uint32_t seq, uint32_t len) {
  for (uint32_t p = 0; p * f->l.page_size < len; p++) {
    int32_t *pt = &f->l.page_table[seq * f->l.pages_per_seq + p];
    if (*pt != (int32_t)FATTN__PAGE_NONE) continue;
    ck_assert_uint_lt(f->next_page, f->l.num_pages);
    *pt = (int32_t)f->perm[f->next_page++];
  }
}

/* Stores logical rows k [new_tokens, kvh, d], v [new_tokens, kvh, dv] for step s. */
static void fx_store_step(fx *f, fattn__step_params s, const float *k, const float *v) {
  size_t n = s.hdr->num_new_tokens * f->l.num_kv_heads;
  uint16_t *kb = enc(f->l.q_dtype, k, n * f->l.head_dim);
  uint16_t *vb = f->l.mla ? NULL : enc(f->l.q_dtype, v, n * f->l.head_dim_v);
  fattn__ref_store_kv(f->l, s, kb, vb);
  free(kb);
  free(vb);
}

/* Writes n logical rows into slots [lo, lo + n) of row seq, through a step of its own. */
static void fx_fill(fx *f, uint32_t seq, uint32_t lo, uint32_t n, const float *k,
                    const float *v) {
  fattn__step_hdr h = {.mode = FATTN_MODE_PREFILL, .num_entries = 1,
                       .num_kv_heads = f->l.num_kv_heads, .causal = 1};
  fattn__entry e = {.seq = seq, .q_len = n, .kv_len = lo + n, .new_len = n,
                    .mask_row = UINT32_MAX};
  fattn__prep(&h, &e);
  fx_map(f, seq, lo + n);
  fx_store_step(f, (fattn__step_params){.hdr = &h, .entries = &e}, k, v);
}

static fattn__entry *fx_add(fx *f, uint32_t seq, uint32_t q_len, uint32_t kv_len,
                            uint32_t new_len) {
  ck_assert_uint_lt(f->h.num_entries, MAX_ENTRIES);
  fattn__entry *e = &f->e[f->h.num_entries++];
  *e = (fattn__entry){.seq = seq, .q_len = q_len, .kv_len = kv_len, .new_len = new_len,
                      .mask_row = UINT32_MAX};
  fx_map(f, seq, kv_len);
  return e;
}

/* Derives the step; split_rows_cap, max_splits and target_ctas are the caller's. */
static void fx_plan(fx *f, uint32_t mode) {
  f->h.mode = mode;
  f->h.num_kv_heads = f->l.num_kv_heads;
  f->h.causal = mode != FATTN_MODE_CROSS;
  fattn__prep(&f->h, f->e);
  if (f->h.split_rows_cap && !f->s.split_o) {
    size_t rows = (size_t)f->h.split_rows_cap * f->l.num_q_heads;
    f->s.split_o = xmalloc(rows * f->l.head_dim_v * sizeof(float));
    f->s.split_lse = xmalloc(rows * sizeof(float));
  }
  if (f->s.split_o) { /* NaN: a merge reading a row no split wrote fails */
    size_t rows = (size_t)f->h.split_rows_cap * f->l.num_q_heads;
    for (size_t i = 0; i < rows * f->l.head_dim_v; i++) f->s.split_o[i] = NAN;
    for (size_t i = 0; i < rows; i++) f->s.split_lse[i] = NAN;
  }
}

static void fx_store(fx *f, const float *k, const float *v) { fx_store_step(f, f->s, k, v); }

/* Attends q [q_tokens, qh, d] twice: to q_dtype O and float LSE (opts NULL where it can be),
 * and to double; the first must be the second rounded. */
static res fx_run(fx *f, const float *q, uint32_t p_dtype, uint32_t ignore_splits) {
  const fattn__layer_params *l = &f->l;
  res r = {0};
  r.nl = (size_t)f->h.num_q_tokens * l->num_q_heads;
  r.no = r.nl * l->head_dim_v;
  r.out = xmalloc(r.no * sizeof *r.out);
  r.lse = xmalloc(r.nl * sizeof *r.lse);
  r.o = xmalloc(r.no * sizeof *r.o);
  r.lse64 = xmalloc(r.nl * sizeof *r.lse64);
  uint16_t *qb = enc(l->q_dtype, q, r.nl * l->head_dim);
  fattn__ref_opts a = {p_dtype, ignore_splits, NULL, NULL};
  fattn__ref_opts b = {p_dtype, ignore_splits, r.o, r.lse64};
  fattn__ref_attend(f->l, f->s, qb, r.out, r.lse, p_dtype || ignore_splits ? &a : NULL);
  fattn__ref_attend(f->l, f->s, qb, NULL, NULL, &b);
  free(qb);
  for (size_t i = 0; i < r.no; i++)
    ck_assert_uint_eq(r.out[i], bits16(l->q_dtype, (float)r.o[i]));
  for (size_t i = 0; i < r.nl; i++) ck_assert_float_eq(r.lse[i], (float)r.lse64[i]);
  return r;
}

/* ----------------------------------------------------------- dense oracle */

typedef int (*vis_fn)(const fx *f, const fattn__entry *e, uint32_t t, uint32_t j);

static int vis_all(const fx *f, const fattn__entry *e, uint32_t t, uint32_t j) {
  (void)f, (void)e, (void)t, (void)j;
  return 1;
}

static int vis_causal(const fx *f, const fattn__entry *e, uint32_t t, uint32_t j) {
  (void)f;
  return j <= e->kv_len - e->q_len + t;
}

static int vis_tree(const fx *f, const fattn__entry *e, uint32_t t, uint32_t j) {
  uint32_t prefix = e->kv_len - e->q_len;
  return j < prefix || ((f->mask[e->mask_row + t] >> (j - prefix)) & 1u);
}

/* Plain softmax for query qr [d] of head hq over logical rows k [n, kvh, d], v [n, kvh, dv]
 * (MLA: the first dv dims of k) with the layer's scale, softcap and sink; returns the LSE. */
static double dense(const fx *f, const float *qr, uint32_t hq, const float *k, const float *v,
                    const uint8_t *vis, uint32_t n, double *o) {
  const fattn__layer_params *l = &f->l;
  uint32_t h = hq / (l->num_q_heads / l->num_kv_heads), dv = l->head_dim_v;
  double *x = xmalloc(n * sizeof *x), sink = l->sinks ? l->sinks[hq] : -INFINITY;
  double m = sink, sum = 0;
  for (uint32_t j = 0; j < n; j++) {
    double dot = 0;
    for (uint32_t c = 0; c < l->head_dim; c++)
      dot += (double)qr[c] * k[((size_t)j * l->num_kv_heads + h) * l->head_dim + c];
    x[j] = dot * l->scale;
    if (l->softcap > 0) x[j] = l->softcap * tanh(x[j] / l->softcap);
    if (vis[j]) m = fmax(m, x[j]);
  }
  memset(o, 0, dv * sizeof *o);
  if (m == -INFINITY) { free(x); return -INFINITY; }
  for (uint32_t j = 0; j < n; j++) {
    if (!vis[j]) continue;
    double p = exp(x[j] - m);
    sum += p;
    for (uint32_t c = 0; c < dv; c++)
      o[c] += p * (l->mla ? k[(size_t)j * l->head_dim + c]
                          : v[((size_t)j * l->num_kv_heads + h) * dv + c]);
  }
  sum += exp(sink - m);
  for (uint32_t c = 0; c < dv; c++) o[c] /= sum;
  free(x);
  return m + log(sum);
}

/* Every row of entry i of r equals the dense softmax over the entry's logical sequence. */
static void expect_dense(const fx *f, const res *r, uint32_t i, const float *q, const float *k,
                         const float *v, vis_fn vis, double tol) {
  const fattn__layer_params *l = &f->l;
  const fattn__entry *e = &f->e[i];
  uint8_t *mask = xmalloc(e->kv_len);
  double *o = xmalloc(l->head_dim_v * sizeof *o);
  for (uint32_t t = 0; t < e->q_len; t++) {
    for (uint32_t j = 0; j < e->kv_len; j++) mask[j] = (uint8_t)vis(f, e, t, j);
    for (uint32_t hq = 0; hq < l->num_q_heads; hq++) {
      size_t row = (size_t)(e->q_start + t) * l->num_q_heads + hq;
      double lse = dense(f, q + row * l->head_dim, hq, k, v, mask, e->kv_len, o);
      ck_close(r->lse64[row], lse, tol);
      for (uint32_t c = 0; c < l->head_dim_v; c++)
        ck_close(r->o[row * l->head_dim_v + c], o[c], tol);
    }
  }
  free(mask);
  free(o);
}

static void expect_same(const res *a, const res *b) {
  ck_assert_uint_eq(a->no, b->no);
  ck_assert_mem_eq(a->out, b->out, a->no * sizeof *a->out);
  ck_assert_mem_eq(a->o, b->o, a->no * sizeof *a->o);
  ck_assert_mem_eq(a->lse, b->lse, a->nl * sizeof *a->lse);
  ck_assert_mem_eq(a->lse64, b->lse64, a->nl * sizeof *a->lse64);
}

/* Index of K element (h, c) of slot j of row seq, computed here from the layout. */
static size_t k_at(const fx *f, uint32_t seq, uint32_t j, uint32_t h, uint32_t c, uint32_t d) {
  uint32_t pg = (uint32_t)f->l.page_table[seq * f->l.pages_per_seq + j / f->l.page_size];
  return (((size_t)pg * f->l.page_size + j % f->l.page_size) * f->l.num_kv_heads + h) * d + c;
}

static double qk(const fx *f, const float *qr, const float *kr) {
  double dot = 0;
  for (uint32_t c = 0; c < f->l.head_dim; c++) dot += (double)qr[c] * kr[c];
  return dot * f->l.scale;
}

/* --------------------------------------------------------------- cases */

START_TEST(single_key_gives_v) {
  rng_state = 1;
  fx f;
  fx_init(&f, (shape){.qh = 4, .kvh = 2, .d = 128, .ps = 16, .len = 16});
  float *k = rnd(2 * 128), *v = rnd(2 * 128), *q = rnd(4 * 128);
  fx_fill(&f, 5, 0, 1, k, v);
  fx_add(&f, 5, 1, 1, 0);
  fx_plan(&f, FATTN_MODE_DECODE);
  res r = fx_run(&f, q, 0, 0);
  for (uint32_t hq = 0; hq < 4; hq++) {
    const float *kv = k + (hq / 2) * 128, *vv = v + (hq / 2) * 128;
    for (uint32_t c = 0; c < 128; c++) ck_assert_double_eq(r.o[hq * 128 + c], vv[c]);
    ck_close(r.lse64[hq], qk(&f, q + hq * 128, kv), 1e-12);
  }
  res_free(&r);
  free(k), free(v), free(q);
  fx_free(&f);
}
END_TEST

START_TEST(equal_scores_give_mean) {
  rng_state = 2;
  fx f;
  fx_init(&f, (shape){.qh = 2, .kvh = 1, .d = 64, .dv = 32, .ps = 4, .len = 8});
  float *k1 = rnd(64), *k = xmalloc(5 * 64 * sizeof *k), *v = rnd(5 * 32), *q = rnd(2 * 64);
  for (int j = 0; j < 5; j++) memcpy(k + j * 64, k1, 64 * sizeof *k);
  fx_fill(&f, 2, 0, 5, k, v);
  fx_add(&f, 2, 1, 5, 0);
  fx_plan(&f, FATTN_MODE_DECODE);
  res r = fx_run(&f, q, 0, 0);
  for (uint32_t hq = 0; hq < 2; hq++) {
    for (uint32_t c = 0; c < 32; c++) {
      double mean = 0;
      for (int j = 0; j < 5; j++) mean += v[j * 32 + c] / 5.0;
      ck_close(r.o[hq * 32 + c], mean, 1e-12);
    }
    ck_close(r.lse64[hq], qk(&f, q + hq * 64, k1) + log(5.0), 1e-12);
  }
  res_free(&r);
  free(k1), free(k), free(v), free(q);
  fx_free(&f);
}
END_TEST

START_TEST(window_zero_sees_itself) {
  rng_state = 3;
  fx f;
  fx_init(&f, (shape){.qh = 2, .kvh = 2, .d = 64, .ps = 4, .len = 8});
  float *k = rnd(8 * 2 * 64), *v = rnd(8 * 2 * 64), *q = rnd(8 * 2 * 64);
  f.l.window = 0;
  fx_add(&f, 1, 8, 8, 8);
  fx_plan(&f, FATTN_MODE_PREFILL);
  fx_store(&f, k, v);
  res r = fx_run(&f, q, 0, 0);
  f.l.window = 1;
  res r1 = fx_run(&f, q, 0, 0);
  for (uint32_t i = 0; i < 16; i++) { /* row i: token i / 2, head i % 2 sees only its slot */
    for (uint32_t c = 0; c < 64; c++) ck_assert_double_eq(r.o[i * 64 + c], v[i * 64 + c]);
    ck_close(r.lse64[i], qk(&f, q + i * 64, k + i * 64), 1e-12);
    if (i >= 2) ck_assert_double_ne(r1.o[i * 64], v[i * 64]); /* window 1 mixes two */
  }
  res_free(&r), res_free(&r1);
  free(k), free(v), free(q);
  fx_free(&f);
}
END_TEST

START_TEST(softcap_bounds_scores) {
  rng_state = 4;
  fx f;
  fx_init(&f, (shape){.qh = 4, .kvh = 1, .d = 64, .ps = 16, .len = 16});
  float *k = rnd(16 * 64), *v = rnd(16 * 64), *q = rnd(2 * 4 * 64);
  fx_fill(&f, 0, 0, 16, k, v);
  fx_fill(&f, 1, 0, 1, k, v);
  fx_add(&f, 0, 1, 16, 0);
  fx_add(&f, 1, 1, 1, 0);
  fx_plan(&f, FATTN_MODE_DECODE);
  f.l.scale = 4.0f;
  res raw = fx_run(&f, q, 0, 0);
  f.l.softcap = 2.0f;
  res cap = fx_run(&f, q, 0, 0);
  int outside = 0, capped = 0;
  for (uint32_t hq = 0; hq < 4; hq++) {
    ck_assert(cap.lse64[hq] > log(16.0) - 2.0 && cap.lse64[hq] < log(16.0) + 2.0);
    outside += fabs(raw.lse64[hq] - log(16.0)) > 2.0;
    double x = qk(&f, q + (4 + hq) * 64, k); /* entry 1: one key, LSE is its capped score */
    ck_close(cap.lse64[4 + hq], 2.0 * tanh(x / 2.0), 1e-12);
    capped += fabs(x) > 2.0;
  }
  ck_assert_int_gt(outside, 0); /* the bound would fail without the cap */
  ck_assert_int_gt(capped, 0);  /* and the closed form would without tanh */
  res_free(&raw), res_free(&cap);
  free(k), free(v), free(q);
  fx_free(&f);
}
END_TEST

START_TEST(sinks_join_denominator) {
  rng_state = 5;
  fx f;
  fx_init(&f, (shape){.qh = 4, .kvh = 2, .d = 64, .ps = 16, .len = 32});
  float *k = rnd(20 * 2 * 64), *v = rnd(20 * 2 * 64), *q = rnd(4 * 4 * 64);
  fx_fill(&f, 3, 0, 20, k, v);
  fx_add(&f, 3, 4, 20, 0);
  fx_plan(&f, FATTN_MODE_PREFILL);
  res base = fx_run(&f, q, 0, 0);
  float none[4] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY}, sinks[4] = {-1, 0, 0.5f, 3};
  f.l.sinks = none;
  res r0 = fx_run(&f, q, 0, 0);
  expect_same(&base, &r0);
  f.l.sinks = sinks;
  res r1 = fx_run(&f, q, 0, 0);
  for (uint32_t i = 0; i < 16; i++) {
    double lse = log(exp(base.lse64[i]) + exp((double)sinks[i % 4]));
    ck_close(r1.lse64[i], lse, 1e-12);
    for (uint32_t c = 0; c < 64; c++)
      ck_close(r1.o[i * 64 + c], base.o[i * 64 + c] * exp(base.lse64[i] - lse), 1e-12);
  }
  expect_dense(&f, &r1, 0, q, k, v, vis_causal, 1e-12);
  res_free(&base), res_free(&r0), res_free(&r1);
  free(k), free(v), free(q);
  fx_free(&f);
}
END_TEST

/* Half an e4m3 ulp at |a|: subnormals step by 2^-9, normals keep 3 mantissa bits. */
static double e4m3_half_ulp(double a) {
  if (a < 0x1p-6) return 0x1p-10;
  return ldexp(1.0, (int)floor(log2(a)) - 4);
}

START_TEST(fp8_store_round_trip) {
  rng_state = 6;
  fx f;
  fx_init(&f, (shape){.qh = 2, .kvh = 2, .d = 64, .ps = 16, .len = 48,
                      .kv_dtype = FATTN_DTYPE_FP8_E4M3});
  f.l.k_scale = 0.05f;
  f.l.v_scale = 0.02f;
  float *k = rnd(40 * 2 * 64), *v = rnd(40 * 2 * 64), *q = rnd(2 * 64);
  float *kd = xmalloc(40 * 2 * 64 * sizeof *kd), *vd = xmalloc(40 * 2 * 64 * sizeof *vd);
  fx_fill(&f, 3, 0, 40, k, v);
  const uint8_t *kp = f.l.k_pool, *vp = f.l.v_pool;
  double worst = 0;
  for (uint32_t j = 0; j < 40; j++)
    for (uint32_t h = 0; h < 2; h++)
      for (uint32_t c = 0; c < 64; c++) {
        size_t li = (j * 2 + h) * 64 + c, at = k_at(&f, 3, j, h, c, 64);
        double a = k[li] / (double)f.l.k_scale, b = v[li] / (double)f.l.v_scale;
        double ka = fattn__e4m3_to_f32(kp[at]), va = fattn__e4m3_to_f32(vp[at]);
        ck_assert(fabs(ka - a) <= e4m3_half_ulp(fabs(a)) * (1 + 1e-6));
        ck_assert(fabs(va - b) <= e4m3_half_ulp(fabs(b)) * (1 + 1e-6));
        worst = fmax(worst, fabs(ka - a));
        kd[li] = (float)(ka * f.l.k_scale); /* dequantised, as attend must read it */
        vd[li] = (float)(va * f.l.v_scale);
      }
  ck_assert(worst > 0); /* values were quantised, not copied */
  fx_add(&f, 3, 1, 40, 0);
  fx_plan(&f, FATTN_MODE_DECODE);
  res r = fx_run(&f, q, 0, 0);
  expect_dense(&f, &r, 0, q, kd, vd, vis_all, 1e-6);
  res_free(&r);
  free(k), free(v), free(q), free(kd), free(vd);
  fx_free(&f);
}
END_TEST

START_TEST(tree_mask_chain_equals_causal) {
  rng_state = 7;
  fx f;
  fx_init(&f, (shape){.qh = 4, .kvh = 2, .d = 64, .ps = 16, .len = 32});
  float *k = rnd(30 * 2 * 64), *v = rnd(30 * 2 * 64), *q = rnd(6 * 4 * 64);
  fx_fill(&f, 2, 0, 30, k, v);
  fattn__entry *e = fx_add(&f, 2, 6, 30, 0);
  fx_plan(&f, FATTN_MODE_TARGET_VERIFY);
  res causal = fx_run(&f, q, 0, 0);
  e->mask_row = 0;
  for (int t = 0; t < 6; t++) f.mask[t] = (2ull << t) - 1;
  res chain = fx_run(&f, q, 0, 0);
  expect_same(&causal, &chain);
  /* parents - 0 0 1 2 -: two roots; row 1 also sees draft 3, past itself: the mask decides */
  const uint64_t tree[6] = {0x1, 0xb, 0x5, 0xb, 0x15, 0x20};
  memcpy(f.mask, tree, sizeof tree);
  res r = fx_run(&f, q, 0, 0);
  expect_dense(&f, &r, 0, q, k, v, vis_tree, 1e-12);
  ck_assert_double_ne(r.o[2 * 4 * 64], causal.o[2 * 4 * 64]); /* draft 2 skips draft 1 */
  res_free(&causal), res_free(&chain), res_free(&r);
  free(k), free(v), free(q);
  fx_free(&f);
}
END_TEST

START_TEST(draft_decode_shares_prefix) {
  rng_state = 8;
  fx f;
  fx_init(&f, (shape){.qh = 4, .kvh = 2, .d = 64, .ps = 16, .len = 48});
  float *kp = rnd(32 * 2 * 64), *vp = rnd(32 * 2 * 64);
  float *kb = rnd(3 * 2 * 64), *vb = rnd(3 * 2 * 64), *q = rnd(3 * 4 * 64);
  fx_fill(&f, 0, 0, 32, kp, vp);
  for (uint32_t b = 1; b < 3; b++) /* rows 1, 2 share row 0's two prefix pages */
    memcpy(&f.l.page_table[b * f.l.pages_per_seq], f.l.page_table, 2 * sizeof(int32_t));
  for (uint32_t b = 0; b < 3; b++) fx_add(&f, b, 1, 33, 1);
  fx_plan(&f, FATTN_MODE_DRAFT_DECODE);
  fx_store(&f, kb, vb);
  res shared = fx_run(&f, q, 0, 0);
  f.h.num_entries = 0;
  for (uint32_t b = 0; b < 3; b++) {
    fx_fill(&f, 3 + b, 0, 32, kp, vp);
    fx_add(&f, 3 + b, 1, 33, 1);
  }
  fx_plan(&f, FATTN_MODE_DECODE);
  fx_store(&f, kb, vb);
  res sep = fx_run(&f, q, 0, 0);
  expect_same(&shared, &sep);
  ck_assert_double_ne(shared.o[0], shared.o[4 * 64]); /* the branches differ */
  res_free(&shared), res_free(&sep);
  free(kp), free(vp), free(kb), free(vb), free(q);
  fx_free(&f);
}
END_TEST

START_TEST(decode_equals_prefill_last_row) {
  rng_state = 9;
  fx f;
  fx_init(&f, (shape){.qh = 4, .kvh = 2, .d = 128, .ps = 16, .len = 48});
  size_t kr = 2 * 128, qr = 4 * 128;
  float *k = rnd(37 * kr), *v = rnd(37 * kr), *q = rnd(37 * qr);
  fx_add(&f, 0, 37, 37, 37);
  fx_plan(&f, FATTN_MODE_PREFILL);
  fx_store(&f, k, v);
  res pre = fx_run(&f, q, 0, 0);
  f.h.num_entries = 0;
  fx_fill(&f, 1, 0, 36, k, v);
  fx_add(&f, 1, 1, 37, 1);
  fx_plan(&f, FATTN_MODE_DECODE);
  fx_store(&f, k + 36 * kr, v + 36 * kr);
  res dec = fx_run(&f, q + 36 * qr, 0, 0);
  ck_assert_mem_eq(dec.o, pre.o + 36 * qr, qr * sizeof *dec.o);
  ck_assert_mem_eq(dec.out, pre.out + 36 * qr, qr * sizeof *dec.out);
  ck_assert_mem_eq(dec.lse64, pre.lse64 + 36 * 4, 4 * sizeof *dec.lse64);
  res_free(&pre), res_free(&dec);
  free(k), free(v), free(q);
  fx_free(&f);
}
END_TEST

/* Each workspace row (entry i, token t, split sp) holds the sink-less softmax over the
 * split's own slots, at split_row + t * num_splits + sp. */
static void expect_partials(fx *f, uint32_t i, const float *q, const float *k, const float *v) {
  const fattn__entry *e = &f->e[i];
  const float *sinks = f->l.sinks;
  uint8_t *mask = xmalloc(e->kv_len);
  double o[128];
  f->l.sinks = NULL;
  for (uint32_t t = 0; t < e->q_len; t++)
    for (uint32_t sp = 0; sp < e->num_splits; sp++) {
      for (uint32_t j = 0; j < e->kv_len; j++)
        mask[j] = j / e->split_len == sp && fattn__visible(&f->l, 1, e->kv_len - e->q_len + t, j);
      for (uint32_t hq = 0; hq < 4; hq++) {
        size_t at = ((size_t)e->split_row + t * e->num_splits + sp) * 4 + hq;
        double lse = dense(f, q + ((e->q_start + t) * 4 + hq) * 128, hq, k, v, mask, e->kv_len, o);
        if (lse == -INFINITY) ck_assert_float_eq(f->s.split_lse[at], -INFINITY);
        else ck_close(f->s.split_lse[at], lse, 1e-6);
        for (uint32_t c = 0; c < 128; c++) ck_close(f->s.split_o[at * 128 + c], o[c], 1e-6);
      }
    }
  f->l.sinks = sinks;
  free(mask);
}

/* One split configuration (mode, q_len; window and sinks as set) over the sequences kv:
 * k, v of 3000 slots, then of 1100. Merged equals one pass. */
static void split_case(fx *f, uint32_t mode, uint32_t q_len, const float *q,
                       const float *const kv[4]) {
  f->h.num_entries = 0;
  fx_add(f, 0, q_len, 3000, 0);
  fx_add(f, 1, q_len, 1100, 0);
  fx_plan(f, mode);
  ck_assert_uint_gt(f->e[0].num_splits, 1);
  ck_assert_uint_gt(f->e[1].num_splits, 1);
  res one = fx_run(f, q, 0, 1);
  ck_assert(isnan(f->s.split_lse[0])); /* ignore_splits leaves the workspace alone */
  res sp = fx_run(f, q, 0, 0);
  expect_partials(f, 0, q, kv[0], kv[1]);
  expect_partials(f, 1, q, kv[2], kv[3]);
  double big = 0;
  for (size_t i = 0; i < one.no; i++) big = fmax(big, fabs(one.o[i]));
  for (size_t i = 0; i < one.no; i++) ck_assert(fabs(sp.o[i] - one.o[i]) <= 1e-6 * big);
  for (size_t i = 0; i < one.nl; i++) ck_close(sp.lse64[i], one.lse64[i], 1e-6);
  res_free(&one), res_free(&sp);
}

START_TEST(split_merge_equals_one_pass) {
  rng_state = 10;
  fx f;
  fx_init(&f, (shape){.qh = 4, .kvh = 2, .d = 128, .ps = 16, .len = 3072});
  f.h.max_splits = 8;
  f.h.split_rows_cap = 64;
  f.h.target_ctas = 64;
  float *k0 = rnd(3000 * 256), *v0 = rnd(3000 * 256), *k1 = rnd(1100 * 256),
        *v1 = rnd(1100 * 256), *q = rnd(6 * 4 * 128);
  fx_fill(&f, 0, 0, 3000, k0, v0);
  fx_fill(&f, 1, 0, 1100, k1, v1);
  const float *const kv[4] = {k0, v0, k1, v1};
  split_case(&f, FATTN_MODE_DECODE, 1, q, kv);
  float sinks[4] = {-2, 0, 1, 4};
  f.l.sinks = sinks;
  split_case(&f, FATTN_MODE_TARGET_VERIFY, 3, q, kv);
  f.l.window = 300;
  split_case(&f, FATTN_MODE_DECODE, 1, q, kv);
  ck_assert_float_eq(f.s.split_lse[f.e[0].split_row * 4], -INFINITY); /* empty split */
  ck_assert(isfinite(f.s.split_lse[(f.e[0].split_row + f.e[0].num_splits - 1) * 4]));
  free(k0), free(v0), free(k1), free(v1), free(q);
  fx_free(&f);
}
END_TEST

/* Splits of one entry of a step of `entries` equal entries, Llama-3.1-8B's 8 kv heads, on 132
 * SMs at the default target (the shapes docs/perf.md's session 17 measured). */
static uint32_t splits_kv(uint32_t mode, int kv_fp8, uint32_t entries, uint32_t q_len, uint32_t kv_len) {
  fattn__step_hdr h = {.mode = mode, .num_entries = entries, .max_splits = 32,
                       .target_ctas = FATTN__CTAS_PER_SM * 132u, .num_kv_heads = 8,
                       .decode_resident = fattn__decode_resident(kv_fp8, 128, 4)};
  fattn__entry x = {.q_len = q_len, .kv_len = kv_len};
  fattn__split_of(&h, &x);
  return x.num_splits;
}
static uint32_t splits_of(uint32_t mode, uint32_t entries, uint32_t q_len, uint32_t kv_len) {
  return splits_kv(mode, 0, entries, q_len, kv_len);
}

/* One-query decode steps that fill a wave of the decode kind take the split count whose
 * blocks run in the fewest rounds, more than the target's only while splits stay long. */
START_TEST(split_count_follows_waves) {
  ck_assert_uint_eq(fattn__wave_splits(512, 396, 5), 3);  /* 3.9 rounds of 3 splits */
  ck_assert_uint_eq(fattn__wave_splits(1024, 396, 3), 3); /* 7.8 rounds: 2.6 a split */
  ck_assert_uint_eq(fattn__wave_splits(128, 396, 8), 3);  /* a tie with 6 goes to fewer */
  ck_assert_uint_eq(fattn__wave_splits(100, 396, 1), 1);
  const uint32_t D = FATTN_MODE_DECODE;
  ck_assert_uint_eq(splits_of(D, 64, 1, 4096), 3);
  ck_assert_uint_eq(splits_of(D, 128, 1, 8192), 3);  /* the target alone gives 2 */
  ck_assert_uint_eq(splits_of(D, 16, 1, 1024), 3);   /* the target alone gives 8 */
  ck_assert_uint_eq(splits_of(D, 128, 1, 528), 2);   /* 3 would leave splits of 256, 256, 16 */
  ck_assert_uint_eq(splits_of(D, 256, 1, 528), 1);
  ck_assert_uint_eq(splits_of(D, 1, 1, 32768), 32);  /* under a wave: the target's, at max_splits */
  ck_assert_uint_eq(splits_of(FATTN_MODE_TARGET_VERIFY, 128, 8, 8192), 2); /* 8 queries: the target's */
  ck_assert_uint_eq(splits_of(FATTN_MODE_PREFILL, 128, 1, 8192), 1);
  /* fp8 KV's 8-row kind holds 4 blocks an SM: bs 64's 512 blocks are one wave of 528 */
  ck_assert_uint_eq(fattn__decode_resident(1, 128, 4), 4);
  ck_assert_uint_eq(fattn__decode_resident(1, 128, 32), 3); /* 16-row tiles */
  ck_assert_uint_eq(splits_kv(D, 1, 64, 1, 4096), 1);
  ck_assert_uint_eq(splits_kv(D, 1, 128, 1, 8192), 1);  /* 2 rounds whole ties 4 of halves: fewer */
  ck_assert_uint_eq(splits_kv(D, 1, 16, 1, 1024), 4);
}
END_TEST

START_TEST(chunked_local_closed_form) {
  rng_state = 11;
  fx f;
  fx_init(&f, (shape){.qh = 1, .kvh = 1, .d = 64, .ps = 4, .len = 12});
  f.l.chunk = 4;
  float *k1 = rnd(64), *k = xmalloc(10 * 64 * sizeof *k), *v = rnd(10 * 64), *q = rnd(10 * 64);
  for (int j = 0; j < 10; j++) memcpy(k + j * 64, k1, 64 * sizeof *k);
  fx_add(&f, 0, 10, 10, 10);
  fx_plan(&f, FATTN_MODE_PREFILL);
  fx_store(&f, k, v);
  res r = fx_run(&f, q, 0, 0);
  for (uint32_t t = 0; t < 10; t++) {
    uint32_t lo = t / 4 * 4, n = t - lo + 1;
    for (uint32_t c = 0; c < 64; c++) {
      double mean = 0;
      for (uint32_t j = lo; j <= t; j++) mean += v[j * 64 + c];
      ck_close(r.o[t * 64 + c], mean / n, 1e-12);
    }
    ck_close(r.lse64[t], qk(&f, q + t * 64, k1) + log((double)n), 1e-12);
  }
  res_free(&r);
  free(k1), free(k), free(v), free(q);
  fx_free(&f);
}
END_TEST

START_TEST(cross_is_not_causal) {
  rng_state = 12;
  fx f;
  fx_init(&f, (shape){.qh = 4, .kvh = 2, .d = 96, .ps = 4, .len = 8});
  f.l.window = 0; /* neither applies to CROSS */
  f.l.chunk = 2;
  float *ka = rnd(7 * 2 * 96), *va = rnd(7 * 2 * 96), *kb = rnd(5 * 2 * 96),
        *vb = rnd(5 * 2 * 96), *q = rnd(5 * 4 * 96);
  fx_fill(&f, 5, 0, 5, kb, vb); /* encoder KV cached earlier */
  fx_add(&f, 4, 3, 7, 7);
  fx_add(&f, 5, 2, 5, 0);
  fx_plan(&f, FATTN_MODE_CROSS);
  ck_assert_uint_eq(f.h.causal, 0);
  fx_store(&f, ka, va);
  res r = fx_run(&f, q, 0, 0);
  expect_dense(&f, &r, 0, q, ka, va, vis_all, 1e-12);
  expect_dense(&f, &r, 1, q, kb, vb, vis_all, 1e-12);
  res_free(&r);
  free(ka), free(va), free(kb), free(vb), free(q);
  fx_free(&f);
}
END_TEST

START_TEST(gqa_maps_heads_to_groups) {
  const uint32_t kvhs[3] = {1, 2, 8}; /* MQA, GQA, MHA */
  for (int i = 0; i < 3; i++) {
    rng_state = 13 + (uint64_t)i;
    uint32_t kvh = kvhs[i], g = 8 / kvh;
    fx f;
    fx_init(&f, (shape){.qh = 8, .kvh = kvh, .d = 64, .ps = 16, .len = 16});
    float *k = rnd(12 * kvh * 64), *v = rnd(12 * kvh * 64), *q1 = rnd(5 * 64);
    float *q = xmalloc(5 * 8 * 64 * sizeof *q); /* every head of a token asks the same */
    for (int t = 0; t < 5; t++)
      for (int h = 0; h < 8; h++) memcpy(q + (t * 8 + h) * 64, q1 + t * 64, 64 * sizeof *q);
    fx_fill(&f, 1, 0, 7, k, v);
    fx_add(&f, 1, 5, 12, 5);
    fx_plan(&f, FATTN_MODE_PREFILL);
    fx_store(&f, k + 7 * kvh * 64, v + 7 * kvh * 64);
    res r = fx_run(&f, q, 0, 0);
    expect_dense(&f, &r, 0, q, k, v, vis_causal, 1e-12);
    for (uint32_t h = 1; h < 8; h++) {
      if (h % g) ck_assert_mem_eq(r.o + h * 64, r.o + (h - 1) * 64, 64 * sizeof *r.o);
      else ck_assert_double_ne(r.o[h * 64], r.o[(h - 1) * 64]);
    }
    res_free(&r);
    free(k), free(v), free(q1), free(q);
    fx_free(&f);
  }
}
END_TEST

START_TEST(mla_reads_v_from_k) {
  const uint32_t kinds[2] = {FATTN_DTYPE_BF16, FATTN_DTYPE_FP8_E4M3};
  for (int i = 0; i < 2; i++) {
    rng_state = 16;
    fx f;
    fx_init(&f, (shape){.qh = 4, .kvh = 1, .d = 576, .dv = 512, .ps = 16, .len = 48,
                        .kv_dtype = kinds[i], .mla = 1});
    f.l.k_scale = i ? 0.05f : 1.0f;
    f.l.v_scale = 7.0f; /* unused: MLA's V is K's bytes, under k_scale */
    float *k = rnd(40 * 576), *q = rnd(2 * 4 * 576), *kd = xmalloc(40 * 576 * sizeof *kd);
    ck_assert_ptr_null(f.l.v_pool);
    fx_fill(&f, 2, 0, 39, k, NULL);
    fx_add(&f, 2, 2, 40, 1);
    fx_plan(&f, FATTN_MODE_PREFILL);
    fx_store(&f, k + 39 * 576, NULL);
    const uint8_t *kp = f.l.k_pool;
    for (uint32_t j = 0; j < 40; j++) /* fp8: what the pool holds, dequantised */
      for (uint32_t c = 0; c < 576; c++)
        kd[j * 576 + c] = i ? fattn__e4m3_to_f32(kp[k_at(&f, 2, j, 0, c, 576)]) * f.l.k_scale
                            : k[j * 576 + c];
    res r = fx_run(&f, q, 0, 0);
    expect_dense(&f, &r, 0, q, kd, NULL, vis_causal, i ? 1e-6 : 1e-12);
    res_free(&r);
    free(k), free(q), free(kd);
    fx_free(&f);
  }
}
END_TEST

static double max_diff(const res *a, const res *b) {
  double d = 0;
  for (size_t i = 0; i < a->no; i++) d = fmax(d, fabs(a->o[i] - b->o[i]));
  return d;
}

START_TEST(p_dtype_rounds_p) {
  rng_state = 17;
  fx f;
  fx_init(&f, (shape){.qh = 4, .kvh = 2, .d = 128, .ps = 16, .len = 64});
  float *k = rnd(50 * 256), *v = rnd(50 * 256), *q = rnd(4 * 128);
  fx_fill(&f, 0, 0, 50, k, v);
  fx_add(&f, 0, 1, 50, 0);
  fx_plan(&f, FATTN_MODE_DECODE);
  res exact = fx_run(&f, q, 0, 0);
  res bf = fx_run(&f, q, FATTN_DTYPE_BF16, 0);
  res hf = fx_run(&f, q, FATTN_DTYPE_FP16, 0);
  double db = max_diff(&bf, &exact), dh = max_diff(&hf, &exact);
  ck_assert(db > 0 && db < 1e-2);
  ck_assert(dh > 0 && dh < db);
  ck_assert_mem_eq(bf.lse64, exact.lse64, exact.nl * sizeof *exact.lse64); /* sum unrounded */
  res_free(&exact), res_free(&bf), res_free(&hf);
  free(k), free(v), free(q);
  fx_free(&f);
}
END_TEST

/* One shape: two entries extending cached prefixes, checked against the dense softmax. */
static void shape_case(uint32_t d, uint32_t dv, uint32_t ps, uint32_t qt, uint32_t kt) {
  fx f;
  fx_init(&f, (shape){.qh = 4, .kvh = 2, .d = d, .dv = dv, .ps = ps, .len = 40,
                      .q_dtype = qt, .kv_dtype = kt});
  size_t kr = 2 * d, vr = 2 * dv;
  float *k0 = rnd(40 * kr), *v0 = rnd(40 * vr), *k1 = rnd(8 * kr), *v1 = rnd(8 * vr);
  float *q = rnd(13 * 4 * d);
  float *kn = xmalloc(13 * kr * sizeof *kn), *vn = xmalloc(13 * vr * sizeof *vn);
  memcpy(kn, k0 + 30 * kr, 10 * kr * sizeof *kn); /* new rows, entry after entry */
  memcpy(kn + 10 * kr, k1 + 5 * kr, 3 * kr * sizeof *kn);
  memcpy(vn, v0 + 30 * vr, 10 * vr * sizeof *vn);
  memcpy(vn + 10 * vr, v1 + 5 * vr, 3 * vr * sizeof *vn);
  fx_fill(&f, 0, 0, 30, k0, v0);
  fx_fill(&f, 3, 0, 5, k1, v1);
  fx_add(&f, 0, 10, 40, 10);
  fx_add(&f, 3, 3, 8, 3);
  fx_plan(&f, FATTN_MODE_PREFILL);
  fx_store(&f, kn, vn);
  res r = fx_run(&f, q, 0, 0);
  expect_dense(&f, &r, 0, q, k0, v0, vis_causal, 1e-12);
  expect_dense(&f, &r, 1, q, k1, v1, vis_causal, 1e-12);
  res_free(&r);
  free(k0), free(v0), free(k1), free(v1), free(q), free(kn), free(vn);
  fx_free(&f);
}

START_TEST(head_dims_and_page_sizes) {
  const uint32_t dims[5] = {64, 96, 128, 192, 256}, pss[3] = {1, 16, 256};
  enum { B = FATTN_DTYPE_BF16, H = FATTN_DTYPE_FP16 };
  const uint32_t dt[4][2] = {{B, B}, {H, H}, {H, B}, {B, H}}; /* q_dtype, kv_dtype */
  uint32_t n = 0;
  for (int i = 0; i < 5; i++)
    for (int p = 0; p < 3; p++)
      for (uint32_t half = 0; half < 2; half++, n++) {
        rng_state = 100 + n;
        shape_case(dims[i], half ? dims[i] / 2 : dims[i], pss[p], dt[n % 4][0], dt[n % 4][1]);
      }
}
END_TEST

START_TEST(empty_row_is_zero) {
  rng_state = 18;
  fx f;
  fx_init(&f, (shape){.qh = 2, .kvh = 1, .d = 64, .ps = 16, .len = 16});
  float *q = rnd(2 * 2 * 64);
  fx_add(&f, 0, 2, 0, 0); /* row 0 stays unmapped: nothing may be read */
  fx_plan(&f, FATTN_MODE_CROSS);
  res r = fx_run(&f, q, 0, 0);
  float sinks[2] = {0.5f, -3};
  f.l.sinks = sinks;
  res rs = fx_run(&f, q, 0, 0);
  for (uint32_t i = 0; i < 4; i++) {
    ck_assert(r.lse64[i] == -INFINITY && r.lse[i] == -INFINITY);
    ck_assert_double_eq(rs.lse64[i], sinks[i % 2]);
    for (uint32_t c = 0; c < 64; c++) {
      ck_assert(r.o[i * 64 + c] == 0.0 && rs.o[i * 64 + c] == 0.0);
      ck_assert_uint_eq(r.out[i * 64 + c], 0);
    }
  }
  res_free(&r), res_free(&rs);
  free(q);
  fx_free(&f);
}
END_TEST

/* Count of pool elements that are no longer the NaN fill. */
static size_t written(const uint16_t *p, size_t n) {
  size_t w = 0;
  for (size_t i = 0; i < n; i++) w += p[i] != 0x7e00u;
  return w;
}

/* Slots [0, n) of row seq hold logical k [n, 2, 64], v [n, 2, 32] as fp16 (RNE). */
static void expect_f16_rows(const fx *f, uint32_t seq, uint32_t n, const float *k,
                            const float *v) {
  const uint16_t *kp = f->l.k_pool, *vp = f->l.v_pool;
  for (uint32_t j = 0; j < n; j++)
    for (uint32_t h = 0; h < 2; h++)
      for (uint32_t c = 0; c < 64; c++) {
        size_t ki = (j * 2 + h) * 64 + c, vi = (j * 2 + h) * 32 + c;
        ck_assert_uint_eq(kp[k_at(f, seq, j, h, c, 64)], fattn__f32_to_f16(k[ki]));
        if (c < 32) ck_assert_uint_eq(vp[k_at(f, seq, j, h, c, 32)], fattn__f32_to_f16(v[vi]));
      }
}

START_TEST(store_converts_into_pages) {
  rng_state = 19;
  fx f;
  fx_init(&f, (shape){.qh = 2, .kvh = 2, .d = 64, .dv = 32, .ps = 16, .len = 32,
                      .kv_dtype = FATTN_DTYPE_FP16});
  float *k0 = rnd(23 * 128), *v0 = rnd(23 * 64), *k1 = rnd(5 * 128), *v1 = rnd(5 * 64);
  k0[0] = fattn__bf16_to_f32(fattn__f32_to_bf16(1e-6f)); /* rounds as an fp16 subnormal */
  k0[1] = fattn__bf16_to_f32(fattn__f32_to_bf16(7e4f));  /* past fp16's range */
  fx_fill(&f, 2, 0, 20, k0, v0);
  float *kn = xmalloc(8 * 128 * sizeof *kn), *vn = xmalloc(8 * 64 * sizeof *vn);
  memcpy(kn, k0 + 20 * 128, 3 * 128 * sizeof *kn);
  memcpy(kn + 3 * 128, k1, 5 * 128 * sizeof *kn);
  memcpy(vn, v0 + 20 * 64, 3 * 64 * sizeof *vn);
  memcpy(vn + 3 * 64, v1, 5 * 64 * sizeof *vn);
  fx_add(&f, 2, 3, 23, 3);
  fx_add(&f, 6, 5, 5, 5);
  fx_plan(&f, FATTN_MODE_PREFILL);
  fx_store(&f, kn, vn);
  expect_f16_rows(&f, 2, 23, k0, v0);
  expect_f16_rows(&f, 6, 5, k1, v1);
  const uint16_t *kp = f.l.k_pool, *vp = f.l.v_pool;
  ck_assert_uint_eq(kp[k_at(&f, 2, 0, 0, 1, 64)], 0x7c00u); /* +inf */
  ck_assert_uint_eq(written(kp, (size_t)f.l.num_pages * 16 * 128), 28 * 128);
  ck_assert_uint_eq(written(vp, (size_t)f.l.num_pages * 16 * 64), 28 * 64);
  free(k0), free(v0), free(k1), free(v1), free(kn), free(vn);
  fx_free(&f);
}
END_TEST

FATTN_SUITE("ref", FATTN_TEST_CPU, single_key_gives_v, equal_scores_give_mean,
            window_zero_sees_itself, softcap_bounds_scores, sinks_join_denominator,
            fp8_store_round_trip, tree_mask_chain_equals_causal, draft_decode_shares_prefix,
            decode_equals_prefill_last_row, split_merge_equals_one_pass, split_count_follows_waves,
            chunked_local_closed_form, cross_is_not_causal, gqa_maps_heads_to_groups,
            mla_reads_v_from_k, p_dtype_rounds_p, head_dims_and_page_sizes, empty_row_is_zero,
            store_converts_into_pages)
