/* test_ref_shapes.c: the float64 reference across shapes and layouts: split counts, chunked
 * and cross attention, GQA groups, MLA, P's dtype, head dims, page sizes and the KV store. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "attn/fa3/fa3_trios.h"
#include "lib/dtype.h"
#include "tests/support_ref.h"

/* Splits of one entry of a step of `entries` equal entries, Llama-3.1-8B's 8 kv heads, on 132
 * SMs at the default target (the shapes of docs/performance.md's split-count figures). */
static uint32_t splits_kv(uint32_t mode, int kv_fp8, uint32_t entries, uint32_t q_len, uint32_t kv_len) {
  fattn__step_hdr h = {.mode = mode, .num_entries = entries, .max_splits = 32,
                       .target_ctas = FATTN__CTAS_PER_SM * 132u, .decode_groups = 8,
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

/* The three-consumer kernels' work over the pairs prep counts: every query row of an entry in
 * exactly one trio, the trios in row order on the entry's last pairs, the pairs before them
 * empty (fa3__trio_of). */
START_TEST(trios_cover_every_row_once) {
  for (uint32_t q = 1; q <= 5000; q++) {
    const uint32_t pairs = (q + FATTN__Q_PAIR - 1u) / FATTN__Q_PAIR;
    const uint32_t trios = (q + FATTN__Q_TRIO - 1u) / FATTN__Q_TRIO;
    uint32_t next = 0, empty = 0;
    for (uint32_t p = 0; p < pairs; p++) {
      const uint32_t t = fa3__trio_of(q, p);
      if (t == UINT32_MAX) {
        ck_assert_msg(next == 0, "q %u: pair %u empty after a trio", q, p);
        empty++;
        continue;
      }
      ck_assert_msg(t * FATTN__Q_TRIO == next, "q %u: pair %u carries rows %u.., not %u..", q, p,
                    t * FATTN__Q_TRIO, next);
      next += FATTN__Q_TRIO;
    }
    ck_assert_msg(next >= q && next - q < FATTN__Q_TRIO, "q %u: trios cover %u rows", q, next);
    ck_assert_uint_eq(pairs - empty, trios);
  }
}
END_TEST

START_TEST(chunked_local_closed_form) {
  ref_seed = 11;
  fx f;
  fx_init(&f, (shape){.qh = 1, .kvh = 1, .d = 64, .ps = 4, .len = 12});
  f.l.chunk = 4;
  float *k1 = rnd(64), *k = fattn_test_xmalloc(10 * 64 * sizeof *k), *v = rnd(10 * 64), *q = rnd(10 * 64);
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
  ref_seed = 12;
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
    ref_seed = 13 + (uint64_t)i;
    uint32_t kvh = kvhs[i], g = 8 / kvh;
    fx f;
    fx_init(&f, (shape){.qh = 8, .kvh = kvh, .d = 64, .ps = 16, .len = 16});
    float *k = rnd(12 * kvh * 64), *v = rnd(12 * kvh * 64), *q1 = rnd(5 * 64);
    float *q = fattn_test_xmalloc(5 * 8 * 64 * sizeof *q); /* every head of a token asks the same */
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
    ref_seed = 16;
    fx f;
    fx_init(&f, (shape){.qh = 4, .kvh = 1, .d = 576, .dv = 512, .ps = 16, .len = 48,
                        .kv_dtype = kinds[i], .mla = 1});
    f.l.k_scale = i ? 0.05f : 1.0f;
    f.l.v_scale = 7.0f; /* unused: MLA's V is K's bytes, under k_scale */
    float *k = rnd(40 * 576), *q = rnd(2 * 4 * 576), *kd = fattn_test_xmalloc(40 * 576 * sizeof *kd);
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
  ref_seed = 17;
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
  float *kn = fattn_test_xmalloc(13 * kr * sizeof *kn), *vn = fattn_test_xmalloc(13 * vr * sizeof *vn);
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
        ref_seed = 100 + n;
        shape_case(dims[i], half ? dims[i] / 2 : dims[i], pss[p], dt[n % 4][0], dt[n % 4][1]);
      }
}
END_TEST

START_TEST(empty_row_is_zero) {
  ref_seed = 18;
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
  ref_seed = 19;
  fx f;
  fx_init(&f, (shape){.qh = 2, .kvh = 2, .d = 64, .dv = 32, .ps = 16, .len = 32,
                      .kv_dtype = FATTN_DTYPE_FP16});
  float *k0 = rnd(23 * 128), *v0 = rnd(23 * 64), *k1 = rnd(5 * 128), *v1 = rnd(5 * 64);
  k0[0] = fattn__bf16_to_f32(fattn__f32_to_bf16(1e-6f)); /* rounds as an fp16 subnormal */
  k0[1] = fattn__bf16_to_f32(fattn__f32_to_bf16(7e4f));  /* past fp16's range */
  fx_fill(&f, 2, 0, 20, k0, v0);
  float *kn = fattn_test_xmalloc(8 * 128 * sizeof *kn), *vn = fattn_test_xmalloc(8 * 64 * sizeof *vn);
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

FATTN_SUITE("ref_shapes", FATTN_TEST_CPU, split_count_follows_waves, trios_cover_every_row_once,
            chunked_local_closed_form, cross_is_not_causal, gqa_maps_heads_to_groups, mla_reads_v_from_k, p_dtype_rounds_p,
            head_dims_and_page_sizes, empty_row_is_zero, store_converts_into_pages)
