/* glaunch.cu: host time of cudaGraphLaunch with nothing pending, with the stream busy, with the
 * same exec's previous launch still queued, and with another exec's queued (docs/perf.md,
 * session 36). Not built by the Makefile; from the repository root:
 *   nvcc -O2 -gencode=arch=compute_90,code=sm_90 -cudart static -o /tmp/glaunch docs/experiments/glaunch.cu
 *   /tmp/glaunch 130; /tmp/glaunch 1     (kernel nodes in the graph) */
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

enum { RUNS = 101, CASES = 4, HOLD_NS = 300000 };

__global__ void nop(int *p, int i) {
  if (p && threadIdx.x == 0) p[0] = i;
}

/* Keeps the stream busy far longer than the launches timed behind it. */
__global__ void hold(long long ns) {
  long long t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  while (t - t0 < ns);
}

static double now_us(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e6 + t.tv_nsec * 1e-3;
}

static void check(cudaError_t e, const char *what) {
  if (e == cudaSuccess) return;
  fprintf(stderr, "glaunch: %s: %s\n", what, cudaGetErrorString(e));
  exit(1);
}

static int by_value(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

int main(int argc, char **argv) {
  const int nodes = argc > 1 ? atoi(argv[1]) : 130;
  if (nodes < 1) return fprintf(stderr, "usage: glaunch [NODES >= 1]\n"), 2;
  cudaStream_t s;
  cudaGraph_t g;
  cudaGraphExec_t a, b;
  check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "stream");
  check(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), "capture");
  for (int i = 0; i < nodes; i++) nop<<<132, 256, 0, s>>>(NULL, i);
  check(cudaStreamEndCapture(s, &g), "end capture");
  check(cudaGraphInstantiate(&a, g, 0), "instantiate a");
  check(cudaGraphInstantiate(&b, g, 0), "instantiate b");
  check(cudaGraphLaunch(a, s), "upload a");
  check(cudaGraphLaunch(b, s), "upload b");
  check(cudaStreamSynchronize(s), "sync");
  static const char *name[CASES] = {"idle, none pending", "busy, none pending", "same exec queued",
                                    "other exec queued"};
  static double t[CASES][RUNS];
  for (int r = 0; r < RUNS; r++) /* cases interleaved, so the host's drift falls on all alike */
    for (int c = 0; c < CASES; c++) {
      check(cudaStreamSynchronize(s), "sync");
      if (c >= 1) hold<<<1, 1, 0, s>>>(HOLD_NS);
      if (c >= 2) check(cudaGraphLaunch(a, s), "queued launch");
      const double t0 = now_us();
      check(cudaGraphLaunch(c == 3 ? b : a, s), "timed launch");
      t[c][r] = now_us() - t0;
    }
  check(cudaStreamSynchronize(s), "sync");
  printf("cudaGraphLaunch of a %d-node graph, median [p10, p90] of %d, us\n", nodes, RUNS);
  for (int c = 0; c < CASES; c++) {
    qsort(t[c], RUNS, sizeof t[c][0], by_value);
    printf("  %-20s %7.2f [%7.2f, %7.2f]\n", name[c], t[c][RUNS / 2], t[c][RUNS / 10], t[c][RUNS * 9 / 10]);
  }
  return 0;
}
