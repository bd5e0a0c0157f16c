/* main.c: fattn-bench, one binary with subcommands (run, ...), shared helpers.
 * `fattn-bench run` is what `make run` starts. */
#include <cuda_runtime_api.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench/bench.h"

double fattn_bench_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

double fattn_bench_median(double *v, size_t n) {
  qsort(v, n, sizeof *v, cmp_double);
  return n ? v[n / 2] : 0.0;
}

int fattn_bench_has_gpu(void) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    n = 0;
  }
  return n > 0;
}

uint64_t fattn_bench_kv_budget(uint64_t want) {
  size_t free_bytes = 0, total_bytes = 0;
  if (cudaMemGetInfo(&free_bytes, &total_bytes) != cudaSuccess) {
    cudaGetLastError();
    return want; /* fattn_create then says why it cannot allocate */
  }
  const uint64_t room = (uint64_t)free_bytes / 10u * 9u;
  return want < room ? want : room;
}

void fattn_bench_print_plan(const fattn_memory_report *r, FILE *out) {
  uint64_t total = r->device_bytes + r->pinned_bytes;
  fprintf(out, "%-16s %18s %8s\n", "region", "bytes", "share");
  for (int i = 0; i < FATTN_REGION_COUNT; i++)
    fprintf(out, "%-16s %18llu %7.3f%%\n", fattn_region_name((fattn_region)i),
            (unsigned long long)r->region_bytes[i], 100.0 * (double)r->region_bytes[i] / (double)total);
  fprintf(out, "%-16s %18llu   (one allocation)\n", "device total", (unsigned long long)r->device_bytes);
  fprintf(out, "%-16s %18llu   (one allocation)\n", "pinned total", (unsigned long long)r->pinned_bytes);
  fprintf(out, "pages %u of %llu bytes (all layers, K+V), %u per sequence at most\n", r->num_pages,
          (unsigned long long)r->page_bytes, r->pages_per_seq);
}

static void usage(void) {
  fprintf(stderr,
          "usage: fattn-bench COMMAND [options]\n"
          "  run [--steps N]   memory plan, a simulated scheduler, checked CPU steps, then serve\n"
          "  plan              host time of fattn_plan at bs 1, 64, 256\n"
          "  serve             the serving-step benchmark (prefill, decode eager/graph, speculative round)\n"
          "  decode            decode attention against a pure-read roofline (GPU)\n"
          "  prefill           prefill attention, the FA3 paper's shapes (GPU)\n"
          "  mla               MLA decode, DeepSeek-V3 shapes, against a pure-read roofline (GPU)\n"
          "measurement lab (tools/):\n"
          "  copies            copy paths of paged KV into shared memory against whole-page reads (sm_90)\n");
}

int main(int argc, char **argv) {
  if (argc < 2) {
    usage();
    return 2;
  }
  if (strcmp(argv[1], "run") == 0) return fattn_bench_run(argc - 1, argv + 1);
  if (strcmp(argv[1], "plan") == 0) return fattn_bench_plan(argc - 1, argv + 1);
  if (strcmp(argv[1], "serve") == 0) return fattn_bench_serve(argc - 1, argv + 1);
  if (strcmp(argv[1], "decode") == 0) return fattn_bench_decode(argc - 1, argv + 1);
  if (strcmp(argv[1], "prefill") == 0) return fattn_bench_prefill(argc - 1, argv + 1);
  if (strcmp(argv[1], "mla") == 0) return fattn_bench_mla(argc - 1, argv + 1);
  if (strcmp(argv[1], "copies") == 0) return fattn_bench_copies(argc - 1, argv + 1);
  usage();
  return 2;
}
