/* ref.c: the float64 reference attention on the host, the oracle of every GPU kernel.
 * Owns paged KV stores and reads, masks, softcap, sinks, rounded P, split-KV and its merge. */
#include <assert.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "attn/backend.h"
#include "fattn.h"
#include "lib/dtype.h"

/* Largest head_dim / head_dim_v held on the stack (MLA's 576 fits). The reference allocates
 * nothing, so the CPU backend keeps the hot path free of malloc. */
#define FATTN__REF_MAX_DIM 1024u

/* Element i of an array of dtype; fp8 is dequantised with scale (exact in double). An
 * unknown dtype reads as NaN so that it cannot pass a comparison. */
static double fattn__ref_get(uint32_t dtype, const void *base, size_t i, float scale) {
  switch (dtype) {
  case FATTN_DTYPE_BF16: return fattn__bf16_to_f32(((const uint16_t *)base)[i]);
  case FATTN_DTYPE_FP16: return fattn__f16_to_f32(((const uint16_t *)base)[i]);
  case FATTN_DTYPE_FP8_E4M3: return (double)fattn__e4m3_to_f32(((const uint8_t *)base)[i]) * scale;
  }
  return NAN;
}

/* Stores x as element i of an array of dtype, round to nearest even; fp8 stores x / scale. */
static void fattn__ref_put(uint32_t dtype, void *base, size_t i, float x, float scale) {
  switch (dtype) {
  case FATTN_DTYPE_BF16: ((uint16_t *)base)[i] = fattn__f32_to_bf16(x); break;
  case FATTN_DTYPE_FP16: ((uint16_t *)base)[i] = fattn__f32_to_f16(x); break;
  case FATTN_DTYPE_FP8_E4M3: ((uint8_t *)base)[i] = fattn__f32_to_e4m3(x / scale); break;
  }
}

/* x rounded to dtype, as a kernel holding P in registers of that type sees it. */
static double fattn__ref_round(uint32_t dtype, double x) {
  uint16_t b = 0;
  fattn__ref_put(dtype, &b, 0, (float)x, 1.0f);
  return fattn__ref_get(dtype, &b, 0, 1.0f);
}

/* Pool row of slot p of page-table row seq; pools are [num_pages * page_size] rows. An
 * unmapped page below kv_len is a planning bug: stop rather than read stray memory. */
static size_t fattn__ref_slot(const fattn__layer_params *l, uint32_t seq, uint32_t p) {
  uint32_t pg = (uint32_t)l->page_table[(size_t)seq * l->pages_per_seq + p / l->page_size];
  assert(pg < l->num_pages);
  return (size_t)pg * l->page_size + p % l->page_size;
}

/* One token's rows [kv_heads, d]: new K/V (q_dtype) row src_row into pool row pool_row. */
static void fattn__ref_store_row(const fattn__layer_params *l, const void *src, size_t src_row,
                                 void *pool, size_t pool_row, uint32_t d, float scale) {
  size_t n = (size_t)l->num_kv_heads * d;
  for (size_t i = 0; i < n; i++) {
    float x = (float)fattn__ref_get(l->q_dtype, src, src_row * n + i, 1.0f);
    fattn__ref_put(l->kv_dtype, pool, pool_row * n + i, x, scale);
  }
}

void fattn__ref_store_kv(fattn__layer_params l, fattn__step_params s, const void *k,
                         const void *v) {
  for (uint32_t i = 0; i < s.hdr->num_entries; i++) {
    const fattn__entry *e = &s.entries[i];
    for (uint32_t r = 0; r < e->new_len; r++) {
      size_t row = fattn__ref_slot(&l, e->seq, e->kv_len - e->new_len + r);
      fattn__ref_store_row(&l, k, e->new_start + r, l.k_pool, row, l.head_dim, l.k_scale);
      if (!l.mla)
        fattn__ref_store_row(&l, v, e->new_start + r, l.v_pool, row, l.head_dim_v, l.v_scale);
    }
  }
}

/* One query row: token t of entry e, q head hq, its query widened to double. */
typedef struct fattn__ref_row {
  const fattn__layer_params *l;
  const fattn__step_params *s;
  const fattn__entry *e;
  uint32_t t, hq, kvh, p_dtype;
  double *scores; /* the caller's room for scores past the stack's (opts->scores) */
  uint32_t scores_cap;
  double q[FATTN__REF_MAX_DIM];
} fattn__ref_row;

/* Visibility of slot j. A tree-mask row replaces causality over the draft slots (a bit may
 * point either way); window and chunk still apply to the distance between the slots. */
static int fattn__ref_sees(const fattn__ref_row *r, uint32_t j) {
  const fattn__entry *e = r->e;
  int causal = (int)r->s->hdr->causal;
  uint32_t prefix = e->kv_len - e->q_len, qpos = prefix + r->t;
  if (r->s->hdr->mode != FATTN_MODE_TARGET_VERIFY || e->mask_row == UINT32_MAX || j < prefix)
    return fattn__visible(r->l, causal, qpos, j);
  if (!((r->s->mask[e->mask_row + r->t] >> (j - prefix)) & 1u)) return 0;
  return j <= qpos ? fattn__visible(r->l, causal, qpos, j) : fattn__visible(r->l, causal, j, qpos);
}

/* scale * q.k_j, then the softcap. */
static double fattn__ref_score(const fattn__ref_row *r, uint32_t j) {
  const fattn__layer_params *l = r->l;
  // K pool: [pages, page_size, kv_heads, head_dim]
  size_t base = (fattn__ref_slot(l, r->e->seq, j) * l->num_kv_heads + r->kvh) * l->head_dim;
  double x = 0.0;
  for (uint32_t c = 0; c < l->head_dim; c++)
    x += r->q[c] * fattn__ref_get(l->kv_dtype, l->k_pool, base + c, l->k_scale);
  x *= (double)l->scale;
  if (l->softcap > 0.0f) x = (double)l->softcap * tanh(x / (double)l->softcap);
  return x;
}

/* acc [head_dim_v] += w * V_j, and acc2 += w2 * V_j where acc2 is non-NULL. MLA has no V
 * pool: V is the first head_dim_v dims of the K row, stored (and so dequantised) with k_scale. */
static void fattn__ref_add_v(const fattn__ref_row *r, uint32_t j, double w, double *acc, double w2,
                             double *acc2) {
  const fattn__layer_params *l = r->l;
  const void *pool = l->mla ? l->k_pool : l->v_pool;
  uint32_t stride = l->mla ? l->head_dim : l->head_dim_v;
  float scale = l->mla ? l->k_scale : l->v_scale;
  // V pool: [pages, page_size, kv_heads, head_dim_v]
  size_t base = (fattn__ref_slot(l, r->e->seq, j) * l->num_kv_heads + r->kvh) * stride;
  for (uint32_t c = 0; c < l->head_dim_v; c++) {
    const double v = fattn__ref_get(l->kv_dtype, pool, base + c, scale);
    acc[c] += w * v;
    if (acc2) acc2[c] += w2 * v;
  }
}

/* Softmax over the visible slots of [lo, hi) alone: o [head_dim_v] normalised; returns the
 * LSE, or -INFINITY with o = 0 when no slot is visible. P is taken against this pass's max
 * so that a rounded P (p_dtype) holds the values a kernel's P does; the sum stays exact, so
 * o_rounded (NULL: none), with P rounded to q_dtype, shares the pass. The max pass keeps up
 * to FATTN__REF_KEPT scores on the stack, or the caller's room, for the sum pass, which
 * otherwise computes them again (the same doubles either way). */
#define FATTN__REF_KEPT 2048u
static double fattn__ref_pass(const fattn__ref_row *r, uint32_t lo, uint32_t hi, double *o, double *o_rounded) {
  double m = -INFINITY, sum = 0.0, stack[FATTN__REF_KEPT];
  double *kept = hi - lo <= FATTN__REF_KEPT ? stack : hi - lo <= r->scores_cap ? r->scores : NULL;
  const uint32_t q_dtype = r->l->q_dtype;
  uint32_t seen = 0;
  for (uint32_t c = 0; c < r->l->head_dim_v; c++) {
    o[c] = 0.0;
    if (o_rounded) o_rounded[c] = 0.0;
  }
  for (uint32_t j = lo; j < hi; j++)
    if (fattn__ref_sees(r, j)) {
      const double x = fattn__ref_score(r, j);
      if (kept) kept[j - lo] = x;
      m = fmax(m, x);
      seen++;
    }
  if (seen == 0) return -INFINITY;
  for (uint32_t j = lo; j < hi; j++) {
    if (!fattn__ref_sees(r, j)) continue;
    double p = exp((kept ? kept[j - lo] : fattn__ref_score(r, j)) - m);
    sum += p;
    fattn__ref_add_v(r, j, r->p_dtype ? fattn__ref_round(r->p_dtype, p) : p, o,
                     o_rounded ? fattn__ref_round(q_dtype, p) : 0.0, o_rounded);
  }
  for (uint32_t c = 0; c < r->l->head_dim_v; c++) {
    o[c] /= sum;
    if (o_rounded) o_rounded[c] /= sum;
  }
  return m + log(sum);
}

/* log(exp(a) + exp(b)); -INFINITY on either side is exact. */
static double fattn__ref_logaddexp(double a, double b) {
  double m = fmax(a, b);
  if (m == -INFINITY) return -INFINITY;
  return m + log(exp(a - m) + exp(b - m));
}

/* Share of the full softmax held by a part of LSE part; an empty part holds none. */
static double fattn__ref_weight(double part, double total) {
  return part == -INFINITY ? 0.0 : exp(part - total);
}

/* Workspace row of (token t, split sp) for head hq: split_lse [rows, q_heads],
 * split_o [rows, q_heads, head_dim_v]. */
static size_t fattn__ref_split_at(const fattn__ref_row *r, uint32_t sp) {
  const fattn__entry *e = r->e;
  size_t row = (size_t)e->split_row + (size_t)r->t * e->num_splits + sp;
  return row * r->l->num_q_heads + r->hq;
}

/* Each split's normalised partial O and its LSE, in float, as the split kernels write them. */
static void fattn__ref_split(const fattn__ref_row *r) {
  const fattn__entry *e = r->e;
  double o[FATTN__REF_MAX_DIM];
  for (uint32_t sp = 0; sp < e->num_splits; sp++) {
    uint32_t lo = sp * e->split_len;
    uint32_t hi = e->kv_len - lo < e->split_len ? e->kv_len : lo + e->split_len;
    double lse = fattn__ref_pass(r, lo, hi, o, NULL);
    size_t at = fattn__ref_split_at(r, sp);
    r->s->split_lse[at] = (float)lse;
    for (uint32_t c = 0; c < r->l->head_dim_v; c++)
      r->s->split_o[at * r->l->head_dim_v + c] = (float)o[c];
  }
}

/* The merge kernel's work from the float partials: lse = logsumexp(splits, sink),
 * O = sum exp(lse_s - lse) O_s. The sink joins here once, not in every split. */
static double fattn__ref_merge(const fattn__ref_row *r, double sink, double *o) {
  const float *lse_s = r->s->split_lse, *o_s = r->s->split_o;
  uint32_t dv = r->l->head_dim_v;
  double lse = sink;
  for (uint32_t sp = 0; sp < r->e->num_splits; sp++)
    lse = fattn__ref_logaddexp(lse, lse_s[fattn__ref_split_at(r, sp)]);
  for (uint32_t c = 0; c < dv; c++) o[c] = 0.0;
  for (uint32_t sp = 0; sp < r->e->num_splits; sp++) {
    size_t at = fattn__ref_split_at(r, sp);
    double w = fattn__ref_weight(lse_s[at], lse);
    for (uint32_t c = 0; c < dv; c++) o[c] += w * o_s[at * dv + c];
  }
  return lse;
}

/* O [head_dim_v] and LSE of one row, sink included, and o_rounded (NULL: none) with P rounded
 * to q_dtype (r->p_dtype is then 0). Split rows run their splits once for each, the rounded
 * first, so that the workspace ends holding o's partials. */
static double fattn__ref_solve(fattn__ref_row *r, int split, double *o, double *o_rounded) {
  double sink = r->l->sinks ? (double)r->l->sinks[r->hq] : -INFINITY;
  if (split) {
    if (o_rounded) {
      r->p_dtype = r->l->q_dtype;
      fattn__ref_split(r);
      fattn__ref_merge(r, sink, o_rounded);
      r->p_dtype = 0;
    }
    fattn__ref_split(r);
    return fattn__ref_merge(r, sink, o);
  }
  double part = fattn__ref_pass(r, 0, r->e->kv_len, o, o_rounded);
  double lse = fattn__ref_logaddexp(part, sink);
  double w = fattn__ref_weight(part, lse);
  for (uint32_t c = 0; c < r->l->head_dim_v; c++) {
    o[c] *= w;
    if (o_rounded) o_rounded[c] *= w;
  }
  return lse;
}

/* Writes row `row` (token * q_heads + hq) of O, the rounded O and LSE where opts asks for them. */
static void fattn__ref_emit(const fattn__layer_params *l, size_t row, const double *o, const double *o_rounded,
                            double lse_v, void *out, float *lse, const fattn__ref_opts *opts) {
  for (uint32_t c = 0; c < l->head_dim_v; c++) {
    size_t i = row * l->head_dim_v + c;
    if (opts->out_f64) opts->out_f64[i] = o[c];
    else fattn__ref_put(l->q_dtype, out, i, (float)o[c], 1.0f);
    if (o_rounded) fattn__ref_put(l->q_dtype, opts->out_rounded, i, (float)o_rounded[c], 1.0f);
  }
  if (lse) lse[row] = (float)lse_v;
  if (opts->lse_f64) opts->lse_f64[row] = lse_v;
}

void fattn__ref_attend(fattn__layer_params l, fattn__step_params s, const void *q, void *out,
                       float *lse, const fattn__ref_opts *opts) {
  static const fattn__ref_opts exact = {0};
  if (!opts) opts = &exact;
  assert(l.head_dim <= FATTN__REF_MAX_DIM && l.head_dim_v <= FATTN__REF_MAX_DIM);
  assert(!opts->out_rounded || opts->p_dtype == 0u);
  const uint32_t group = l.num_q_heads / l.num_kv_heads, head_hi = opts->head_hi ? opts->head_hi : l.num_q_heads;
  assert(opts->head_lo <= head_hi && head_hi <= l.num_q_heads);
  for (uint32_t i = 0; i < s.hdr->num_entries; i++) {
    const fattn__entry *e = &s.entries[i];
    int split = e->num_splits > 1u && !opts->ignore_splits;
    for (uint32_t t = 0; t < e->q_len; t++) {
      for (uint32_t hq = opts->head_lo; hq < head_hi; hq++) {
        fattn__ref_row r = {&l, &s, e, t, hq, hq / group, opts->p_dtype, opts->scores, opts->scores_cap, {0}};
        size_t row = (size_t)(e->q_start + t) * l.num_q_heads + hq;
        // Q: [q_tokens, q_heads, head_dim]
        for (uint32_t c = 0; c < l.head_dim; c++)
          r.q[c] = fattn__ref_get(l.q_dtype, q, row * l.head_dim + c, 1.0f);
        double o[FATTN__REF_MAX_DIM], o_rounded[FATTN__REF_MAX_DIM];
        double *rounded = opts->out_rounded ? o_rounded : NULL;
        double lse_v = fattn__ref_solve(&r, split, o, rounded);
        fattn__ref_emit(&l, row, o, rounded, lse_v, out, lse, opts);
      }
    }
  }
}
