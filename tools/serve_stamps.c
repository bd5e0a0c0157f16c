/* serve_stamps.c: measurement builds only (-DFATTN_STAMPS, attn/stamps.h): the timeline of
 * the last layer of a bs 1 graph step, from the stamps its kernels' blocks leave. */
#include "bench/serve.h"

#ifdef FATTN_STAMPS
#include <stdlib.h>

#include "attn/stamps.h"
#include "lib/internal.h"

int fattn_bench_mix_stamps(unsigned long long *buf); /* bench/serve_mix.cu */

static unsigned long long *stamps; /* [FATTN__STAMP_WORDS] on the device */

void fattn_bench_stamps_open(serve *s) {
  if (!s->gpu) return;
  if (cudaMalloc((void **)&stamps, FATTN__STAMP_WORDS * sizeof *stamps) != cudaSuccess ||
      fattn_bench_mix_stamps(stamps) != 0) {
    fprintf(stderr, "stamps: no device buffer\n");
    exit(1);
  }
  s->ctx->stamps = stamps; /* before any capture: graphs keep the step parameters they saw */
}

void fattn_bench_stamps_clear(void) {
  if (cudaMemset(stamps, 0, FATTN__STAMP_WORDS * sizeof *stamps) != cudaSuccess) {
    fprintf(stderr, "stamps: cannot clear the buffer\n"); /* stale stamps would pass for this step's */
    exit(1);
  }
}

/* Reads the buffer after a synchronised step and prints, for each kernel, each point's time
 * after the store's first block entered (median and latest over the blocks that reached it)
 * and the median SM cycles from each point to the next inside a block. */
void fattn_bench_stamps_print(void) {
  static const char *kernel[FATTN__STAMP_KERNELS] = {"store", "decode", "combine", "mix"};
  static const char *point[FATTN__STAMP_POINTS] = {"entry", "waited", "looped", "done"};
  unsigned long long *h = malloc(FATTN__STAMP_WORDS * sizeof *h);
  double *v = malloc(FATTN__STAMP_BLOCKS * sizeof *v);
  if (!h || !v || cudaMemcpy(h, stamps, FATTN__STAMP_WORDS * sizeof *h, cudaMemcpyDeviceToHost) != cudaSuccess) {
    fprintf(stderr, "stamps: cannot read the buffer\n");
    exit(1);
  }
#define AT(k, b, p, w) h[((((size_t)(k) * FATTN__STAMP_BLOCKS + (b)) * FATTN__STAMP_POINTS + (p)) * 2u) + (w)]
  unsigned long long t0 = 0;
  for (uint32_t b = 0; b < FATTN__STAMP_BLOCKS; b++) {
    const unsigned long long t = AT(FATTN__K_STORE, b, FATTN__AT_ENTRY, 0);
    if (t && (!t0 || t < t0)) t0 = t;
  }
  printf("  stamps, last layer of a bs 1 graph step: us after the store's first block entered, median [latest] "
         "over the blocks; then SM cycles from each point to the next, median\n");
  printf("  %-8s %6s", "kernel", "blocks");
  for (int p = 0; p < FATTN__STAMP_POINTS; p++) printf(" %17s", point[p]);
  printf("   cycles\n");
  for (int k = 0; k < FATTN__STAMP_KERNELS; k++) {
    uint32_t blocks = 0;
    for (uint32_t b = 0; b < FATTN__STAMP_BLOCKS; b++) blocks += AT(k, b, FATTN__AT_ENTRY, 0) != 0;
    printf("  %-8s %6u", kernel[k], blocks);
    for (int p = 0; p < FATTN__STAMP_POINTS; p++) {
      uint32_t n = 0;
      for (uint32_t b = 0; b < FATTN__STAMP_BLOCKS; b++)
        if (AT(k, b, p, 0) >= t0 && AT(k, b, p, 0)) v[n++] = (double)(AT(k, b, p, 0) - t0) / 1e3;
      if (n) {
        const double med = fattn_bench_median(v, n); /* sorts v */
        printf(" %7.2f [%7.2f]", med, v[n - 1]);
      } else {
        printf(" %17s", "-");
      }
    }
    int at[FATTN__STAMP_POINTS], np = 0; /* the points this kernel stamps, in order */
    for (int p = 0; p < FATTN__STAMP_POINTS; p++) {
      int any = 0;
      for (uint32_t b = 0; b < FATTN__STAMP_BLOCKS && !any; b++) any = AT(k, b, p, 0) != 0;
      if (any) at[np++] = p;
    }
    for (int i = 0; i + 1 < np; i++) {
      uint32_t n = 0;
      for (uint32_t b = 0; b < FATTN__STAMP_BLOCKS; b++)
        if (AT(k, b, at[i], 1) && AT(k, b, at[i + 1], 1) >= AT(k, b, at[i], 1))
          v[n++] = (double)(AT(k, b, at[i + 1], 1) - AT(k, b, at[i], 1));
      if (n) printf(" %s-%s %.0f", point[at[i]], point[at[i + 1]], fattn_bench_median(v, n));
    }
    printf("\n");
  }
#undef AT
  free(h);
  free(v);
}
#endif
