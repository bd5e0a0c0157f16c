/* refbench.c: the reference's time, two calls (exact P, then P rounded to q_dtype) against one
 * call with out_rounded and room for the scores, on one causal prefill entry (docs/perf.md,
 * session 32). Not built by the Makefile; after `make all`, from the repository root:
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
  size_t nl = (size_t)ql * 32, no = nl * 128;
  uint16_t *qb = enc(f.l.q_dtype, q, nl * 128);
  double *o1 = fattn_test_xmalloc(no * 8), *l1 = fattn_test_xmalloc(nl * 8), *o2 = fattn_test_xmalloc(no * 8),
         *l2 = fattn_test_xmalloc(nl * 8), *sc = fattn_test_xmalloc(kv * 8);
  uint16_t *r1 = fattn_test_xmalloc(no * 2), *r2 = fattn_test_xmalloc(no * 2);
  double t0 = now();
  fattn__ref_opts ex = {.out_f64 = o1, .lse_f64 = l1}, lp = {.p_dtype = f.l.q_dtype};
  fattn__ref_attend(f.l, f.s, qb, NULL, NULL, &ex);
  fattn__ref_attend(f.l, f.s, qb, r1, NULL, &lp);
  double t1 = now();
  fattn__ref_opts both = {.out_f64 = o2, .lse_f64 = l2, .out_rounded = r2, .scores = sc, .scores_cap = kv};
  fattn__ref_attend(f.l, f.s, qb, NULL, NULL, &both);
  double t2 = now();
  same = !memcmp(o1, o2, no * 8) && !memcmp(l1, l2, nl * 8) && !memcmp(r1, r2, no * 2);
  printf("kv %u, %u queries x 32 heads: two calls %.2f s, one call %.2f s (%.2fx), bytes %s\n", kv, ql, t1 - t0, t2 - t1,
         (t2 - t1) / (t1 - t0), same ? "equal" : "DIFFER");
  free(o1), free(l1), free(o2), free(l2), free(sc), free(r1), free(r2), free(qb), free(k), free(v), free(q);
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
