/* test_ref.c: the float64 reference (attn/ref) against closed forms, a dense softmax over
 * logical arrays, and itself across equivalent plans (splits, trees, branches, decode). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "lib/dtype.h"
#include "tests/support_ref.h"

START_TEST(single_key_gives_v) {
  ref_seed = 1;
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
  ref_seed = 2;
  fx f;
  fx_init(&f, (shape){.qh = 2, .kvh = 1, .d = 64, .dv = 32, .ps = 4, .len = 8});
  float *k1 = rnd(64), *k = fattn_test_xmalloc(5 * 64 * sizeof *k), *v = rnd(5 * 32), *q = rnd(2 * 64);
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
  ref_seed = 3;
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
  ref_seed = 4;
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
  ref_seed = 5;
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

/* A sink far above the scores: one head, d 64, one slot whose score is exactly -90 (Q 2.5, K
 * -4.5, scale 1/8), so that exp(score - sink) is below float's range. The LSE is log(e^-90 +
 * e^sink) and O is V times the slot's share, each within 1e-6 of the long double value (of
 * its magnitude where above 1); the sinks far below and absent leave the lone slot's softmax. */
START_TEST(sinks_far_from_lone_score) {
  ref_seed = 12;
  fx f;
  fx_init(&f, (shape){.qh = 1, .kvh = 1, .d = 64, .ps = 16, .len = 16});
  float q[64], k[64], *v = rnd(64);
  for (int c = 0; c < 64; c++) q[c] = 2.5f, k[c] = -4.5f;
  fx_fill(&f, 0, 0, 1, k, v);
  fx_add(&f, 0, 1, 1, 0);
  fx_plan(&f, FATTN_MODE_DECODE);
  ck_assert_double_eq(qk(&f, q, k), -90.0);
  const float sinks[4] = {0.0f, 10.0f, -190.0f, -INFINITY};
  for (int i = 0; i < 4; i++) {
    f.l.sinks = &sinks[i];
    res r = fx_run(&f, q, 0, 0);
    const long double s = sinks[i], lse = logl(expl(-90.0L) + expl(s)), share = expl(-90.0L - lse);
    ck_close(r.lse64[0], (double)lse, 1e-6);
    ck_assert(isfinite(r.lse[0]));
    for (uint32_t c = 0; c < 64; c++) ck_close(r.o[c], (double)(share * v[c]), 1e-6);
    res_free(&r);
  }
  f.l.sinks = NULL;
  free(v);
  fx_free(&f);
}
END_TEST

START_TEST(fp8_store_round_trip) {
  ref_seed = 6;
  fx f;
  fx_init(&f, (shape){.qh = 2, .kvh = 2, .d = 64, .ps = 16, .len = 48,
                      .kv_dtype = FATTN_DTYPE_FP8_E4M3});
  f.l.k_scale = 0.05f;
  f.l.v_scale = 0.02f;
  float *k = rnd(40 * 2 * 64), *v = rnd(40 * 2 * 64), *q = rnd(2 * 64);
  float *kd = fattn_test_xmalloc(40 * 2 * 64 * sizeof *kd), *vd = fattn_test_xmalloc(40 * 2 * 64 * sizeof *vd);
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
  ref_seed = 7;
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
  ref_seed = 8;
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
  ref_seed = 9;
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
  uint8_t *mask = fattn_test_xmalloc(e->kv_len);
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
  ref_seed = 10;
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

/* The step's one call (with no room, too little, and enough for the longest range) writes the
 * bytes of two calls, and its rounded O differs from the exact O in q_dtype somewhere. */
static void expect_both_in_one(fx *f, const float *q, uint32_t longest) {
  const fattn__layer_params *l = &f->l;
  uint16_t *qb = enc(l->q_dtype, q, (size_t)f->h.num_q_tokens * l->num_q_heads * l->head_dim);
  double *scores = fattn_test_xmalloc(longest * sizeof *scores);
  both two = both_run(f, qb, 0, NULL, 0);
  const uint32_t caps[3] = {0, longest / 2, longest};
  for (int i = 0; i < 3; i++) {
    both one = both_run(f, qb, 1, caps[i] ? scores : NULL, caps[i]);
    ck_assert_mem_eq(one.o, two.o, two.no * sizeof *two.o);
    ck_assert_mem_eq(one.lse, two.lse, two.nl * sizeof *two.lse);
    ck_assert_mem_eq(one.rounded, two.rounded, two.no * sizeof *two.rounded);
    ck_assert_mem_eq(one.split_o, two.split_o, two.nw * l->head_dim_v * sizeof *two.split_o);
    ck_assert_mem_eq(one.split_lse, two.split_lse, two.nw * sizeof *two.split_lse);
    both_free(&one);
  }
  size_t differ = 0;
  for (size_t i = 0; i < two.no; i++) differ += two.rounded[i] != bits16(l->q_dtype, (float)two.o[i]);
  ck_assert_uint_gt(differ, 0);
  both_free(&two);
  free(scores), free(qb);
}

START_TEST(rounded_run_rides_along) {
  ref_seed = 11;
  fx f;
  fx_init(&f, (shape){.qh = 4, .kvh = 2, .d = 128, .ps = 16, .len = 3072, .q_dtype = FATTN_DTYPE_FP16});
  f.h.max_splits = 8;
  f.h.split_rows_cap = 64;
  f.h.target_ctas = 64;
  float *k = rnd(3000 * 256), *v = rnd(3000 * 256), *q = rnd(6 * 4 * 128);
  float sinks[4] = {-2, 0, 1, 4};
  fx_fill(&f, 0, 0, 3000, k, v);
  fx_fill(&f, 1, 0, 1100, k, v);
  f.l.sinks = sinks;
  f.l.softcap = 30.0f;
  fx_add(&f, 0, 3, 3000, 0); /* rows over more slots than the stack keeps */
  fx_plan(&f, FATTN_MODE_PREFILL);
  expect_both_in_one(&f, q, 3000);
  f.h.num_entries = 0;
  fx_add(&f, 0, 1, 3000, 0);
  fx_add(&f, 1, 1, 1100, 0);
  fx_plan(&f, FATTN_MODE_DECODE);
  ck_assert_uint_gt(f.e[0].num_splits, 1);
  expect_both_in_one(&f, q, 3000);
  ck_assert_uint_eq(fx_tree_verify(&f, 1, 1100)->num_splits, 1); /* a tree row in one pass */
  expect_both_in_one(&f, q, 1100);
  free(k), free(v), free(q);
  fx_free(&f);
}
END_TEST

FATTN_SUITE("ref", FATTN_TEST_CPU, single_key_gives_v, equal_scores_give_mean,
            window_zero_sees_itself, softcap_bounds_scores, sinks_join_denominator, sinks_far_from_lone_score,
            fp8_store_round_trip, tree_mask_chain_equals_causal, draft_decode_shares_prefix,
            decode_equals_prefill_last_row, split_merge_equals_one_pass, rounded_run_rides_along)
