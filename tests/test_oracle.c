/* test_oracle.c: the GPU suites' oracle (tests/support_oracle.c), rows shared over threads by q
 * heads and entry pieces, against one single-threaded reference call, byte for byte. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tests/support_oracle.h"
#include "tests/support_ref.h"

/* Over 1 to 64 threads, the oracle writes the bytes of one call with both outputs. */
static void expect_oracle(fx *f, const float *q) {
  const fattn__layer_params *l = &f->l;
  uint16_t *qb = enc(l->q_dtype, q, (size_t)f->h.num_q_tokens * l->num_q_heads * l->head_dim);
  both one = both_run(f, qb, 1, NULL, 0);
  static const unsigned threads[5] = {1, 3, 7, 16, 64};
  for (int i = 0; i < 5; i++) {
    double *o = fattn_test_xmalloc(one.no * sizeof *o), *lse = fattn_test_xmalloc(one.nl * sizeof *lse);
    uint16_t *rounded = fattn_test_xmalloc(one.no * sizeof *rounded);
    memset(o, 0xff, one.no * sizeof *o), memset(lse, 0xff, one.nl * sizeof *lse);
    memset(rounded, 0xff, one.no * sizeof *rounded);
    fattn_test_oracle(f->l, f->s, qb, o, lse, rounded, threads[i]);
    ck_assert_mem_eq(o, one.o, one.no * sizeof *o);
    ck_assert_mem_eq(lse, one.lse, one.nl * sizeof *lse);
    ck_assert_mem_eq(rounded, one.rounded, one.no * sizeof *rounded);
    free(o), free(lse), free(rounded);
  }
  both_free(&one);
  free(qb);
}

/* Causal entries cut into 16-query pieces (one over more slots than the stack keeps), and
 * entries of one query or a few, with sinks and a window. */
START_TEST(prefill_in_pieces) {
  ref_seed = 21;
  fx f;
  fx_init(&f, (shape){.qh = 8, .kvh = 2, .d = 64, .ps = 16, .len = 2200, .q_dtype = FATTN_DTYPE_FP16});
  float *k = rnd(2200 * 2 * 64), *v = rnd(2200 * 2 * 64), *q = rnd(64 * 8 * 64);
  float sinks[8] = {-1, 0, 2, -3, 1, 0.5f, -0.5f, 3};
  const uint32_t q_len[4] = {40, 17, 5, 1}, kv_len[4] = {40, 300, 2100, 9};
  for (uint32_t i = 0; i < 4; i++) {
    fx_fill(&f, i, 0, kv_len[i], k, v);
    fx_add(&f, i, q_len[i], kv_len[i], 0);
  }
  f.l.sinks = sinks;
  fx_plan(&f, FATTN_MODE_PREFILL);
  expect_oracle(&f, q);
  f.l.window = 25;
  expect_oracle(&f, q);
  free(k), free(v), free(q);
  fx_free(&f);
}
END_TEST

/* Cross attention: pieces keep every slot. */
START_TEST(cross_in_pieces) {
  ref_seed = 22;
  fx f;
  fx_init(&f, (shape){.qh = 4, .kvh = 4, .d = 96, .ps = 64, .len = 400});
  float *k = rnd(400 * 4 * 96), *v = rnd(400 * 4 * 96), *q = rnd(60 * 4 * 96);
  fx_fill(&f, 0, 0, 400, k, v);
  fx_fill(&f, 1, 0, 33, k, v);
  fx_add(&f, 0, 37, 400, 0);
  fx_add(&f, 1, 23, 33, 0);
  fx_plan(&f, FATTN_MODE_CROSS);
  expect_oracle(&f, q);
  free(k), free(v), free(q);
  fx_free(&f);
}
END_TEST

/* Entries that are not cut: split decode rows (through the workspace) and tree rows. */
START_TEST(splits_and_trees_whole) {
  ref_seed = 23;
  fx f;
  fx_init(&f, (shape){.qh = 32, .kvh = 1, .d = 128, .ps = 16, .len = 3072});
  f.h.max_splits = 8;
  f.h.split_rows_cap = 64;
  f.h.target_ctas = 64;
  float *k = rnd(3000 * 128), *v = rnd(3000 * 128), *q = rnd(8 * 32 * 128);
  fx_fill(&f, 0, 0, 3000, k, v);
  fx_fill(&f, 1, 0, 1100, k, v);
  fx_add(&f, 0, 1, 3000, 0);
  fx_add(&f, 1, 1, 1100, 0);
  fx_plan(&f, FATTN_MODE_DECODE);
  ck_assert_uint_gt(f.e[0].num_splits, 1);
  expect_oracle(&f, q);
  fx_tree_verify(&f, 1, 1100);
  expect_oracle(&f, q);
  free(k), free(v), free(q);
  fx_free(&f);
}
END_TEST

FATTN_SUITE("oracle", FATTN_TEST_CPU, prefill_in_pieces, cross_in_pieces, splits_and_trees_whole)
