/* harness.h: one Check suite per test binary, declared with FATTN_SUITE at the end of a file.
 * GPU suites skip every case with one line when no CUDA device is present; never forks. */
#ifndef FATTN_TESTS_HARNESS_H
#define FATTN_TESTS_HARNESS_H

#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fattn.h"

enum { FATTN_TEST_CPU = 0, FATTN_TEST_GPU = 1 };

/* Number of CUDA devices, 0 when none (or no driver); defined in tests/support.c. */
int fattn_test_cuda_devices(void);

/* ck_assert that a call returned the expected status, naming both on failure. */
#define ck_assert_status(call, expected)                                              \
  do {                                                                                \
    fattn_status st_ = (call);                                                        \
    ck_assert_msg(st_ == (expected), "%s returned %s, expected %s", #call,            \
                  fattn_status_name(st_), fattn_status_name(expected));               \
  } while (0)

#define ck_assert_ok(call) ck_assert_status((call), FATTN_OK)

/* A case that cannot run here (a two-device case on one GPU) says so and returns: it counts
 * as skipped, with its reason, never as passed. */
static int fattn_test_skips_;
static char fattn_test_skip_why_[160];
#define FATTN_TEST_SKIP(...)                                                             \
  do {                                                                                   \
    snprintf(fattn_test_skip_why_, sizeof fattn_test_skip_why_, __VA_ARGS__);            \
    fattn_test_skips_++;                                                                 \
    return;                                                                              \
  } while (0)

/* Runs the cases named in a variadic list. Prints Check's summary; a GPU suite on a machine
 * without a device prints "<suite>: N cases skipped (no CUDA device)" and exits 0; cases
 * that skipped themselves get such a line after the summary. The runner script tests/run.sh
 * sums the lines of every binary. */
static inline int fattn_test_main(const char *name, int kind, const TTest *const *cases,
                                  int ncases, int argc, char **argv) {
  const char *only = argc > 1 ? argv[1] : NULL; /* optional: run one case by name */
  if (kind == FATTN_TEST_GPU && fattn_test_cuda_devices() == 0) {
    printf("%s: %d cases skipped (no CUDA device)\n", name, ncases);
    return 0;
  }
  Suite *s = suite_create(name);
  TCase *tc = tcase_create("all");
  tcase_set_timeout(tc, 600);
  int added = 0;
  for (int i = 0; i < ncases; i++) {
    if (only && strcmp(only, cases[i]->name) != 0) continue;
    tcase_add_test(tc, cases[i]);
    added++;
  }
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_set_fork_status(sr, CK_NOFORK); /* CUDA and fork do not mix */
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  int run = srunner_ntests_run(sr);
  srunner_free(sr);
  printf("%s: %d passed, %d failed\n", name, run - failed - fattn_test_skips_, failed);
  if (fattn_test_skips_) printf("%s: %d cases skipped (%s)\n", name, fattn_test_skips_, fattn_test_skip_why_);
  return (failed == 0 && added > 0) ? 0 : 1;
}

#define FATTN_SUITE(name, kind, ...)                                                  \
  int main(int argc, char **argv) {                                                   \
    const TTest *const cases_[] = {__VA_ARGS__};                                      \
    return fattn_test_main(name, kind, cases_, (int)(sizeof cases_ / sizeof cases_[0]), \
                           argc, argv);                                               \
  }

#endif /* FATTN_TESTS_HARNESS_H */
