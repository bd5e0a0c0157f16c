/* support_ref.c: the reference tests' fixture: exact random data, one layer's NaN-filled
 * pools behind a shuffled page table, steps built by hand, and a dense softmax oracle. */
#include "tests/support_ref.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "lib/dtype.h"

/* ---------------------------------------------------------------- data */

uint64_t ref_seed;

double rng_unit(void) { return (double)(fattn_test_splitmix(&ref_seed) >> 11) * 0x1.0p-53; }

/* Random values exact in bf16 and fp16: magnitude in [1/64, 1], random sign, never zero. */
float *rnd(size_t n) {
  float *x = fattn_test_xmalloc(n * sizeof *x);
  for (size_t i = 0; i < n; i++) {
    float m = fattn__bf16_to_f32(fattn__f32_to_bf16((float)(1.0 / 64 + rng_unit() * 63 / 64)));
    x[i] = rng_unit() < 0.5 ? -m : m;
  }
  return x;
}

/* x as the bits of a 16-bit dtype. */
uint16_t bits16(uint32_t dtype, float x) {
  return dtype == FATTN_DTYPE_FP16 ? fattn__f32_to_f16(x) : fattn__f32_to_bf16(x);
}

/* x [n] as q_dtype bits. */
uint16_t *enc(uint32_t dtype, const float *x, size_t n) {
  uint16_t *b = fattn_test_xmalloc(n * sizeof *b);
  for (size_t i = 0; i < n; i++) b[i] = bits16(dtype, x[i]);
  return b;
}

/* A pool of n elements of dtype, all NaN: any unwritten slot read leaks into the output. */
void *nan_pool(uint32_t dtype, size_t n) {
  if (dtype == FATTN_DTYPE_FP8_E4M3) {
    uint8_t *p = fattn_test_xmalloc(n);
    memset(p, 0x7f, n);
    return p;
  }
  uint16_t *p = fattn_test_xmalloc(n * 2);
  for (size_t i = 0; i < n; i++) p[i] = dtype == FATTN_DTYPE_FP16 ? 0x7e00u : 0x7fc0u;
  return p;
}

void fx_init(fx *f, shape sh) {
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
  l->compute_dtype = l->q_dtype; /* the reference computes in float64 whatever the kernels' GEMMs */
  l->scale = 1.0f / sqrtf((float)sh.d);
  l->window = FATTN_NO_WINDOW;
  l->k_scale = l->v_scale = 1.0f;
  size_t rows = (size_t)l->num_pages * sh.ps * sh.kvh;
  l->k_pool = nan_pool(l->kv_dtype, rows * sh.d);
  l->v_pool = sh.mla ? NULL : nan_pool(l->kv_dtype, rows * l->head_dim_v);
  size_t pt = (size_t)ROWS * l->pages_per_seq;
  l->page_table = fattn_test_xmalloc(pt * sizeof *l->page_table);
  for (size_t i = 0; i < pt; i++) l->page_table[i] = (int32_t)FATTN__PAGE_NONE;
  f->perm = fattn_test_xmalloc(l->num_pages * sizeof *f->perm);
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

void fx_free(fx *f) {
  free(f->l.k_pool);
  free(f->l.v_pool);
  free(f->l.page_table);
  free(f->perm);
  free(f->s.split_o);
  free(f->s.split_lse);
}

void res_free(res *r) {
  free(r->out);
  free(r->lse);
  free(r->o);
  free(r->lse64);
}

/* Maps the unmapped pages covering slots [0, len) of row seq. */
void fx_map(fx *f, uint32_t seq, uint32_t len) {
  for (uint32_t p = 0; p * f->l.page_size < len; p++) {
    int32_t *pt = &f->l.page_table[seq * f->l.pages_per_seq + p];
    if (*pt != (int32_t)FATTN__PAGE_NONE) continue;
    ck_assert_uint_lt(f->next_page, f->l.num_pages);
    *pt = (int32_t)f->perm[f->next_page++];
  }
}

/* Stores logical rows k [new_tokens, kvh, d], v [new_tokens, kvh, dv] for step s. */
void fx_store_step(fx *f, fattn__step_params s, const float *k, const float *v) {
  size_t n = s.hdr->num_new_tokens * f->l.num_kv_heads;
  uint16_t *kb = enc(f->l.q_dtype, k, n * f->l.head_dim);
  uint16_t *vb = f->l.mla ? NULL : enc(f->l.q_dtype, v, n * f->l.head_dim_v);
  fattn__ref_store_kv(f->l, s, kb, vb);
  free(kb);
  free(vb);
}

/* Writes n logical rows into slots [lo, lo + n) of row seq, through a step of its own. */
void fx_fill(fx *f, uint32_t seq, uint32_t lo, uint32_t n, const float *k,
                    const float *v) {
  fattn__step_hdr h = {.mode = FATTN_MODE_PREFILL, .num_entries = 1,
                       .decode_groups = fattn__decode_groups(f->l.mla, f->l.num_q_heads, f->l.num_kv_heads),
                       .causal = 1};
  fattn__entry e = {.seq = seq, .q_len = n, .kv_len = lo + n, .new_len = n,
                    .mask_row = UINT32_MAX};
  fattn__prep(&h, &e);
  fx_map(f, seq, lo + n);
  fx_store_step(f, (fattn__step_params){.hdr = &h, .entries = &e}, k, v);
}

fattn__entry *fx_add(fx *f, uint32_t seq, uint32_t q_len, uint32_t kv_len,
                            uint32_t new_len) {
  ck_assert_uint_lt(f->h.num_entries, MAX_ENTRIES);
  fattn__entry *e = &f->e[f->h.num_entries++];
  *e = (fattn__entry){.seq = seq, .q_len = q_len, .kv_len = kv_len, .new_len = new_len,
                      .mask_row = UINT32_MAX};
  fx_map(f, seq, kv_len);
  return e;
}

/* Derives the step; split_rows_cap, max_splits and target_ctas are the caller's. */
void fx_plan(fx *f, uint32_t mode) {
  f->h.mode = mode;
  f->h.decode_groups = fattn__decode_groups(f->l.mla, f->l.num_q_heads, f->l.num_kv_heads);
  f->h.causal = mode != FATTN_MODE_CROSS;
  fattn__prep(&f->h, f->e);
  if (f->h.split_rows_cap && !f->s.split_o) {
    size_t rows = (size_t)f->h.split_rows_cap * f->l.num_q_heads;
    f->s.split_o = fattn_test_xmalloc(rows * f->l.head_dim_v * sizeof(float));
    f->s.split_lse = fattn_test_xmalloc(rows * sizeof(float));
  }
  if (f->s.split_o) { /* NaN: a merge reading a row no split wrote fails */
    size_t rows = (size_t)f->h.split_rows_cap * f->l.num_q_heads;
    for (size_t i = 0; i < rows * f->l.head_dim_v; i++) f->s.split_o[i] = NAN;
    for (size_t i = 0; i < rows; i++) f->s.split_lse[i] = NAN;
  }
}

fattn__entry *fx_tree_verify(fx *f, uint32_t seq, uint32_t kv_len) {
  static const uint64_t tree[6] = {0x1, 0x3, 0x5, 0xb, 0x15, 0x20};
  f->h.num_entries = 0;
  f->h.max_splits = 1;
  fattn__entry *e = fx_add(f, seq, 6, kv_len, 0);
  fx_plan(f, FATTN_MODE_TARGET_VERIFY);
  e->mask_row = 0;
  memcpy(f->mask, tree, sizeof tree);
  return e;
}

void fx_store(fx *f, const float *k, const float *v) { fx_store_step(f, f->s, k, v); }

/* Attends q [q_tokens, qh, d] twice: to q_dtype O and float LSE (opts NULL where it can be),
 * and to double; the first must be the second rounded. */
res fx_run(fx *f, const float *q, uint32_t p_dtype, uint32_t ignore_splits) {
  const fattn__layer_params *l = &f->l;
  res r = {0};
  r.nl = (size_t)f->h.num_q_tokens * l->num_q_heads;
  r.no = r.nl * l->head_dim_v;
  r.out = fattn_test_xmalloc(r.no * sizeof *r.out);
  r.lse = fattn_test_xmalloc(r.nl * sizeof *r.lse);
  r.o = fattn_test_xmalloc(r.no * sizeof *r.o);
  r.lse64 = fattn_test_xmalloc(r.nl * sizeof *r.lse64);
  uint16_t *qb = enc(l->q_dtype, q, r.nl * l->head_dim);
  fattn__ref_opts a = {.p_dtype = p_dtype, .ignore_splits = ignore_splits};
  fattn__ref_opts b = {.p_dtype = p_dtype, .ignore_splits = ignore_splits, .out_f64 = r.o, .lse_f64 = r.lse64};
  fattn__ref_attend(f->l, f->s, qb, r.out, r.lse, p_dtype || ignore_splits ? &a : NULL);
  fattn__ref_attend(f->l, f->s, qb, NULL, NULL, &b);
  free(qb);
  for (size_t i = 0; i < r.no; i++)
    ck_assert_uint_eq(r.out[i], bits16(l->q_dtype, (float)r.o[i]));
  for (size_t i = 0; i < r.nl; i++) ck_assert_float_eq(r.lse[i], (float)r.lse64[i]);
  return r;
}

/* one_call: one call with out_rounded (and room for cap scores); else a call with P rounded,
 * then an exact one, so that the workspace ends with the exact partials either way. */
both both_run(fx *f, const uint16_t *qb, int one_call, double *scores, uint32_t cap) {
  const fattn__layer_params *l = &f->l;
  both b = {0};
  b.nl = (size_t)f->h.num_q_tokens * l->num_q_heads;
  b.no = b.nl * l->head_dim_v;
  b.nw = f->s.split_o ? (size_t)f->h.split_rows_cap * l->num_q_heads : 0;
  b.o = fattn_test_xmalloc(b.no * sizeof *b.o);
  b.lse = fattn_test_xmalloc(b.nl * sizeof *b.lse);
  b.rounded = fattn_test_xmalloc(b.no * sizeof *b.rounded);
  b.split_o = fattn_test_xmalloc(b.nw * l->head_dim_v * sizeof *b.split_o);
  b.split_lse = fattn_test_xmalloc(b.nw * sizeof *b.split_lse);
  fattn__ref_opts ex = {.out_f64 = b.o, .lse_f64 = b.lse, .scores = scores, .scores_cap = cap};
  if (one_call) {
    ex.out_rounded = b.rounded;
  } else {
    fattn__ref_opts rounded = {.p_dtype = l->q_dtype};
    fattn__ref_attend(f->l, f->s, qb, b.rounded, NULL, &rounded);
  }
  fattn__ref_attend(f->l, f->s, qb, NULL, NULL, &ex);
  if (b.nw) {
    memcpy(b.split_o, f->s.split_o, b.nw * l->head_dim_v * sizeof *b.split_o);
    memcpy(b.split_lse, f->s.split_lse, b.nw * sizeof *b.split_lse);
  }
  return b;
}

void both_free(both *b) {
  free(b->o), free(b->lse), free(b->rounded), free(b->split_o), free(b->split_lse);
}

/* ----------------------------------------------------------- dense oracle */

int vis_all(const fx *f, const fattn__entry *e, uint32_t t, uint32_t j) {
  (void)f, (void)e, (void)t, (void)j;
  return 1;
}

int vis_causal(const fx *f, const fattn__entry *e, uint32_t t, uint32_t j) {
  (void)f;
  return j <= e->kv_len - e->q_len + t;
}

int vis_tree(const fx *f, const fattn__entry *e, uint32_t t, uint32_t j) {
  uint32_t prefix = e->kv_len - e->q_len;
  return j < prefix || ((f->mask[e->mask_row + t] >> (j - prefix)) & 1u);
}

/* Plain softmax for query qr [d] of head hq over logical rows k [n, kvh, d], v [n, kvh, dv]
 * (MLA: the first dv dims of k) with the layer's scale, softcap and sink; returns the LSE. */
double dense(const fx *f, const float *qr, uint32_t hq, const float *k, const float *v,
                    const uint8_t *vis, uint32_t n, double *o) {
  const fattn__layer_params *l = &f->l;
  uint32_t h = hq / (l->num_q_heads / l->num_kv_heads), dv = l->head_dim_v;
  double *x = fattn_test_xmalloc(n * sizeof *x), sink = l->sinks ? l->sinks[hq] : -INFINITY;
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
void expect_dense(const fx *f, const res *r, uint32_t i, const float *q, const float *k,
                         const float *v, vis_fn vis, double tol) {
  const fattn__layer_params *l = &f->l;
  const fattn__entry *e = &f->e[i];
  uint8_t *mask = fattn_test_xmalloc(e->kv_len);
  double *o = fattn_test_xmalloc(l->head_dim_v * sizeof *o);
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

void expect_same(const res *a, const res *b) {
  ck_assert_uint_eq(a->no, b->no);
  ck_assert_mem_eq(a->out, b->out, a->no * sizeof *a->out);
  ck_assert_mem_eq(a->o, b->o, a->no * sizeof *a->o);
  ck_assert_mem_eq(a->lse, b->lse, a->nl * sizeof *a->lse);
  ck_assert_mem_eq(a->lse64, b->lse64, a->nl * sizeof *a->lse64);
}

/* Index of K element (h, c) of slot j of row seq, computed here from the layout. */
size_t k_at(const fx *f, uint32_t seq, uint32_t j, uint32_t h, uint32_t c, uint32_t d) {
  uint32_t pg = (uint32_t)f->l.page_table[seq * f->l.pages_per_seq + j / f->l.page_size];
  return (((size_t)pg * f->l.page_size + j % f->l.page_size) * f->l.num_kv_heads + h) * d + c;
}

double qk(const fx *f, const float *qr, const float *kr) {
  double dot = 0;
  for (uint32_t c = 0; c < f->l.head_dim; c++) dot += (double)qr[c] * kr[c];
  return dot * f->l.scale;
}