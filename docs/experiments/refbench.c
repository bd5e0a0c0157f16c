/* refbench.c: the reference's time, two calls (P rounded to q_dtype, then exact P) against one
 * call with out_rounded and room for the scores (tests/support_ref.c's both_run), on one
 * causal prefill entry (docs/perf.md, session 32). Not built by the Makefile; after `make all`,
 * from the repository root:
 *   gcc -std=c11 -O2 -I. -Ilib -I/usr/local/cuda/include -o /tmp/refbench docs/experiments/refbench.c \
 *     build/obj/tests/support_ref.o build/obj/tests/support.o build/libfattn.a \
 *     $(for f in malloc calloc realloc free posix_memalign aligned_alloc cudaMalloc cudaFree cudaHostAlloc \
 *       cudaMallocHost cudaFreeHost cudaMallocManaged cudaMallocAsync cudaFreeAsync cudaDeviceSynchronize \
 *       cudaStreamSynchronize cudaEventSynchronize cudaMemcpy cudaMemset; do printf -- '-Wl,--wrap=%s ' $f; done) \
 *     -Wl,-Bstatic -ljemalloc -lcheck -lsubunit -Wl,-Bdynamic /usr/local/cuda/lib64/libcudart_static.a \
 *     -L/usr/local/cuda/lib64 -lcurand -lstdc++ -lm -lpthread -ldl -lrt
 *   /tmp/refbench 2048 64; /tmp/refbench 8192 16     (KV slots, queries) */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <check.h>
#include "tests/support_ref.h"
static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}
static uint32_t kv, ql;
static int same;
START_TEST(bench) {
  ref_seed = 3;
  fx f;
  fx_init(&f, (shape){.qh = 32, .kvh = 8, .d = 128, .ps = 16, .len = kv});
  float *k = rnd((size_t)kv * 8 * 128), *v = rnd((size_t)kv * 8 * 128), *q = rnd((size_t)ql * 32 * 128);
  fx_fill(&f, 0, 0, kv, k, v);
  fx_add(&f, 0, ql, kv, 0);
  fx_plan(&f, FATTN_MODE_PREFILL);
  uint16_t *qb = enc(f.l.q_dtype, q, (size_t)ql * 32 * 128);
  double *sc = fattn_test_xmalloc(kv * sizeof *sc);
  double t0 = now();
  both two = both_run(&f, qb, 0, NULL, 0);
  double t1 = now();
  both one = both_run(&f, qb, 1, sc, kv);
  double t2 = now();
  same = !memcmp(one.o, two.o, two.no * sizeof *two.o) && !memcmp(one.lse, two.lse, two.nl * sizeof *two.lse) &&
         !memcmp(one.rounded, two.rounded, two.no * sizeof *two.rounded);
  printf("kv %u, %u queries x 32 heads: two calls %.2f s, one call %.2f s (%.2fx), bytes %s\n", kv, ql, t1 - t0, t2 - t1,
         (t2 - t1) / (t1 - t0), same ? "equal" : "DIFFER");
  both_free(&one), both_free(&two);
  free(sc), free(qb), free(k), free(v), free(q);
  fx_free(&f);
}
END_TEST
/* The fixture's helpers assert through Check, so the timing runs as a case of its own. */
int main(int argc, char **argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: refbench KV_SLOTS QUERIES\n");
    return 2;
  }
  kv = (uint32_t)atoi(argv[1]), ql = (uint32_t)atoi(argv[2]);
  Suite *su = suite_create("refbench");
  TCase *tc = tcase_create("refbench");
  tcase_set_timeout(tc, 0);
  tcase_add_test(tc, bench);
  suite_add_tcase(su, tc);
  SRunner *sr = srunner_create(su);
  srunner_set_fork_status(sr, CK_NOFORK);
  srunner_run_all(sr, CK_SILENT);
  srunner_free(sr);
  return !same;
}
