/* planbench.c: `fattn-bench plan`. Host time of fattn_plan (median of many runs) at batch
 * sizes 1, 64 and 256 for DECODE and TARGET_VERIFY, on the GPU if present, else the CPU backend. */
#include <stdlib.h>
#include <string.h>

#include "bench/bench.h"

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* Median microseconds of one fattn_plan for bs requests of mode. */
static double time_plan(fattn_ctx *ctx, fattn_mode mode, uint32_t bs, uint32_t *ids, uint32_t draft) {
  enum { RUNS = 2001 };
  static double t[RUNS];
  fattn_batch b = FATTN_BATCH_INIT;
  b.mode = mode;
  b.num_seqs = bs;
  b.seq_ids = ids;
  for (int r = 0; r < RUNS; r++) {
    for (uint32_t i = 0; i < bs; i++) { /* each step grows every sequence like real decoding */
      uint32_t len;
      fattn_seq_length(ctx, ids[i], &len);
      fattn_seq_truncate(ctx, ids[i], len - (mode == FATTN_MODE_TARGET_VERIFY ? draft : 1));
      fattn_seq_reserve(ctx, ids[i], len);
    }
    double t0 = fattn_bench_now();
    fattn_status st = fattn_plan(ctx, &b, NULL);
    t[r] = fattn_bench_now() - t0;
    if (st) {
      fprintf(stderr, "fattn_plan: %s\n", fattn_detail(ctx));
      exit(1);
    }
  }
  qsort(t, RUNS, sizeof t[0], cmp_double);
  return t[RUNS / 2] * 1e6;
}

int fattn_bench_plan(int argc, char **argv) {
  (void)argc, (void)argv;
  fattn_config cfg;
  fattn_model model;
  int gpu = fattn_bench_has_gpu();
  fattn_shape_llama8b(&cfg, &model, gpu ? 0 : FATTN_DEVICE_CPU);
  cfg.kv_budget_bytes = gpu ? 80ull << 30 : 4ull << 30;
  if (!gpu) model.num_layers = 1; /* host memory; plan time does not depend on the layer count */
  cfg.max_seq_len = 8192;
  cfg.spec_topk = 4;
  cfg.spec_steps = 5;
  cfg.spec_draft_tokens = 8;
  char detail[256];
  fattn_ctx *ctx;
  if (fattn_create(&cfg, &model, &ctx, detail, sizeof detail)) {
    fprintf(stderr, "fattn_create: %s\n", detail);
    return 1;
  }
  static uint32_t ids[256];
  for (uint32_t i = 0; i < 256; i++) {
    fattn_seq_open(ctx, &ids[i]);
    fattn_seq_reserve(ctx, ids[i], 1024 + 7 * i);
  }
  printf("fattn_plan host time, Llama-3.1-8B heads, %u layers (%s backend), median of 2001\n", model.num_layers,
         gpu ? "GPU" : "CPU");
  printf("%-14s %6s %10s\n", "mode", "bs", "us");
  const fattn_mode modes[2] = {FATTN_MODE_DECODE, FATTN_MODE_TARGET_VERIFY};
  const uint32_t sizes[3] = {1, 64, 256};
  for (int m = 0; m < 2; m++)
    for (int s = 0; s < 3; s++)
      printf("%-14s %6u %10.2f\n", m ? "TARGET_VERIFY" : "DECODE", sizes[s],
             time_plan(ctx, modes[m], sizes[s], ids, cfg.spec_draft_tokens));
  fattn_destroy(ctx, 1);
  return 0;
}
