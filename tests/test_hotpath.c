/* test_hotpath.c: the hot-path contract on the CPU backend. Sequence and page operations,
 * fattn_plan, fattn_store_kv and fattn_attend make no malloc-family, device-allocation or synchronising call. */
#include "lib/internal.h"
#include "tests/support.h"

static char detail[256];


START_TEST(sequence_ops_and_plan_make_no_forbidden_call) {
  fattn_config c;
  fattn_model m;
  fattn_test_small(&c, &m);
  c.kv_budget_pages = 256;
  c.max_seqs = 16;
  fattn_ctx *ctx;
  ck_assert_ok(fattn_create(&c, &m, &ctx, detail, sizeof detail));
  uint32_t ids[16], n = 0, fails = 0, plans = 0;
  uint64_t seed = 42;
  static uint16_t k[8 * 2 * 64], v[8 * 2 * 64], q[8 * 4 * 64], out[8 * 4 * 64];
  static float lse[8 * 4];
  for (size_t i = 0; i < sizeof k / 2; i++) k[i] = v[i] = (uint16_t)(0x3c00 + i % 97); /* bf16 ~1..2 */
  for (size_t i = 0; i < sizeof q / 2; i++) q[i] = (uint16_t)(0x3c00 + i % 89);
  fattn_calls_reset();
  for (int step = 0; step < 5000; step++) {
    uint32_t r = fattn_test_rand(&seed) % 6, i = n ? fattn_test_rand(&seed) % n : 0, len = 0;
    if (n) fattn_seq_length(ctx, ids[i], &len);
    if (r == 0 && n < 8) {
      fails += fattn_seq_open(ctx, &ids[n++]) != FATTN_OK;
    } else if (r == 1 && n && len + 9 <= c.max_seq_len) {
      fails += fattn_seq_reserve(ctx, ids[i], len + 1 + fattn_test_rand(&seed) % 9) != FATTN_OK;
    } else if (r == 2 && n && n < 8) {
      fails += fattn_seq_fork(ctx, ids[i], len / 2, &ids[n++]) != FATTN_OK;
    } else if (r == 3 && n) {
      fails += fattn_seq_truncate(ctx, ids[i], len / 2) != FATTN_OK;
    } else if (r == 4 && n) {
      fails += fattn_seq_close(ctx, ids[i]) != FATTN_OK;
      ids[i] = ids[--n];
    } else if (n) { /* one decode step over every sequence with room */
      uint32_t use[8], nb = 0;
      for (uint32_t j = 0; j < n; j++) {
        fattn_seq_length(ctx, ids[j], &len);
        if (len >= c.max_seq_len) continue;
        fails += fattn_seq_reserve(ctx, ids[j], len + 1) != FATTN_OK;
        use[nb++] = ids[j];
      }
      fattn_batch b = FATTN_BATCH_INIT;
      b.mode = FATTN_MODE_DECODE;
      b.num_seqs = nb;
      b.seq_ids = use;
      if (nb) {
        fails += fattn_plan(ctx, &b, NULL) != FATTN_OK;
        for (uint32_t l = 0; l < m.num_layers; l++) {
          fails += fattn_store_kv(ctx, l, k, v, NULL) != FATTN_OK;
          fails += fattn_attend(ctx, l, q, out, lse, NULL) != FATTN_OK;
        }
        plans++;
      }
    }
  }
  fattn_call_counts made = fattn_calls;
  ck_assert_int_eq(fails, 0);
  ck_assert_int_eq(made.malloc + made.free + made.device_alloc + made.host_alloc + made.sync, 0);
  ck_assert_int_gt(plans, 500);
  ck_assert_ok(fattn_check(ctx));
  /* after one more plan the planner's table equals the allocator's */
  uint32_t s0;
  ck_assert_ok(fattn_seq_open(ctx, &s0));
  ck_assert_ok(fattn_seq_reserve(ctx, s0, 1));
  fattn_batch b = FATTN_BATCH_INIT;
  b.num_seqs = 1;
  b.seq_ids = &s0;
  ck_assert_ok(fattn_plan(ctx, &b, NULL));
  ck_assert_int_eq(memcmp(ctx->dev + ctx->lay.dev_off[FATTN_REGION_PAGE_TABLE], ctx->pages.table,
                          (size_t)ctx->pages.max_seqs * ctx->pages.pages_per_seq * 4), 0);
  ck_assert_ok(fattn_destroy(ctx, 1));
}
END_TEST

FATTN_SUITE("hotpath", FATTN_TEST_CPU, sequence_ops_and_plan_make_no_forbidden_call)
