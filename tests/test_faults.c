/* test_faults.c: fail the Nth host allocation create makes, for every N up to the last one:
 * FATTN_ERR_NOMEM with a detail, nothing leaked (LSan in make asan), and a later create works. */
#include "tests/support.h"

static char detail[256];

START_TEST(every_host_allocation_of_create_fails_cleanly) {
  fattn_config c;
  fattn_model m;
  fattn_test_small(&c, &m);
  long n = 1;
  for (;; n++) {
    fattn_ctx *ctx = NULL;
    fattn_fault_arm(FATTN_FAULT_HOST, n);
    fattn_status st = fattn_create(&c, &m, &ctx, detail, sizeof detail);
    long seen = fattn_fault_seen(FATTN_FAULT_HOST);
    fattn_fault_arm(FATTN_FAULT_HOST, 0);
    if (seen < n) { /* the fault was never reached: create made n - 1 allocations */
      ck_assert_ok(st);
      ck_assert_ok(fattn_destroy(ctx, 0));
      break;
    }
    ck_assert_status(st, FATTN_ERR_NOMEM);
    ck_assert_ptr_null(ctx);
    ck_assert_msg(detail[0] != '\0', "no detail for failed allocation %ld", n);
    ck_assert_ok(fattn_create(&c, &m, &ctx, detail, sizeof detail)); /* nothing stuck */
    ck_assert_ok(fattn_check(ctx));
    ck_assert_ok(fattn_destroy(ctx, 0));
  }
  ck_assert_int_eq(n, 3); /* the CPU backend makes two: the "device" region and the slab */
}
END_TEST

START_TEST(create_makes_exactly_two_host_allocations_on_cpu) {
  fattn_config c;
  fattn_model m;
  fattn_test_small(&c, &m);
  fattn_ctx *ctx = NULL;
  /* No assertion inside a counting window: Check's own bookkeeping allocates. */
  fattn_calls_reset();
  fattn_status st = fattn_create(&c, &m, &ctx, detail, sizeof detail);
  fattn_call_counts made = fattn_calls;
  ck_assert_ok(st);
  ck_assert_int_eq(made.malloc, 2);
  ck_assert_int_eq(made.device_alloc, 0);
  ck_assert_int_eq(made.host_alloc, 0);
  fattn_calls_reset();
  st = fattn_destroy(ctx, 0);
  made = fattn_calls;
  ck_assert_ok(st);
  ck_assert_int_eq(made.free, 2);
}
END_TEST

FATTN_SUITE("faults", FATTN_TEST_CPU, every_host_allocation_of_create_fails_cleanly,
            create_makes_exactly_two_host_allocations_on_cpu)
