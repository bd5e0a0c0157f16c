/* planbench.c: `fattn-bench plan`. Host time of fattn_plan (median of many runs) at batch
 * sizes 1, 64 and 256 for DECODE and TARGET_VERIFY, on the GPU if present, else the CPU backend;
 * on the GPU also plan and graph launch with the device idle, split into its two halves. */
#include <cuda_runtime_api.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench.h"
#include "graph/graph.h"
#include "lib/internal.h"

typedef enum how { BACK_TO_BACK, PLAN_IDLE, GRAPH_IDLE } how;

/* What the captured decode graphs run: every layer's store and attention. */
typedef struct graph_io {
  fattn_ctx *ctx;
  uint32_t layers;
  void *q, *k, *v, *out;
} graph_io;

static void layer_loop(void *user, void *stream) {
  graph_io *g = user;
  for (uint32_t l = 0; l < g->layers; l++) {
    fattn_store_kv(g->ctx, l, g->k, g->v, stream);
    fattn_attend(g->ctx, l, g->q, g->out, NULL, stream);
  }
}

/* Median microseconds of one call for bs requests of mode: fattn_plan back to back (the GPU
 * may fall a ring behind: the staging waits are counted into *waits), or fattn_plan /
 * fattn_graph_launch with the stream drained before each call (outside the timing). Where
 * reserve_us is given, the median of the step's fattn_seq_reserve calls too (one a sequence, as
 * an engine grows each sequence before its step). */
static double time_plan(fattn_ctx *ctx, fattn_mode mode, uint32_t bs, uint32_t *ids, uint32_t draft, how w,
                        void *stream, uint64_t *waits, double *reserve_us) {
  enum { RUNS = 2001, IDLE_RUNS = 201 };
  static double t[RUNS], tr[RUNS];
  static uint32_t lens[256];
  const int runs = w == BACK_TO_BACK ? RUNS : IDLE_RUNS;
  fattn_batch b = FATTN_BATCH_INIT;
  b.mode = mode;
  b.num_seqs = bs;
  b.seq_ids = ids;
  fattn_stats st0 = FATTN_STATS_INIT, st1 = FATTN_STATS_INIT;
  fattn_get_stats(ctx, &st0);
  for (int r = 0; r < runs; r++) {
    for (uint32_t i = 0; i < bs; i++) { /* each step grows every sequence like real decoding */
      fattn_seq_length(ctx, ids[i], &lens[i]);
      fattn_seq_truncate(ctx, ids[i], lens[i] - (mode == FATTN_MODE_TARGET_VERIFY ? draft : 1));
    }
    double r0 = fattn_bench_now();
    for (uint32_t i = 0; i < bs; i++) fattn_seq_reserve(ctx, ids[i], lens[i]);
    tr[r] = fattn_bench_now() - r0;
    if (w != BACK_TO_BACK) cudaStreamSynchronize((cudaStream_t)stream);
    double t0 = fattn_bench_now();
    fattn_status st = w == GRAPH_IDLE ? fattn_graph_launch(ctx, &b, stream) : fattn_plan(ctx, &b, stream);
    t[r] = fattn_bench_now() - t0;
    if (st) {
      fprintf(stderr, "%s: %s\n", w == GRAPH_IDLE ? "fattn_graph_launch" : "fattn_plan", fattn_detail(ctx));
      exit(1);
    }
  }
  if (w != BACK_TO_BACK) cudaStreamSynchronize((cudaStream_t)stream);
  fattn_get_stats(ctx, &st1);
  *waits = st1.staging_waits - st0.staging_waits;
  if (reserve_us) *reserve_us = fattn_bench_median(tr, (size_t)runs) * 1e6;
  return fattn_bench_median(t, (size_t)runs) * 1e6;
}

void fattn_bench_graph_halves(fattn_ctx *ctx, const fattn_batch *b, void *stream, double *plan_us,
                              double *launch_us) {
  void *exec;
  fattn__plan_target t;
  if (fattn__graph_for(ctx, b, &exec, &t)) {
    fprintf(stderr, "graph: %s\n", fattn_detail(ctx));
    exit(1);
  }
  const double t0 = fattn_bench_now();
  if (fattn__plan_into(ctx, b, stream, &t)) {
    fprintf(stderr, "graph plan: %s\n", fattn_detail(ctx));
    exit(1);
  }
  const double t1 = fattn_bench_now();
  const cudaError_t e = cudaGraphLaunch((cudaGraphExec_t)exec, (cudaStream_t)stream);
  const double t2 = fattn_bench_now();
  if (e != cudaSuccess) {
    fprintf(stderr, "cudaGraphLaunch: %s\n", cudaGetErrorString(e));
    exit(1);
  }
  *plan_us = (t1 - t0) * 1e6, *launch_us = (t2 - t1) * 1e6;
}

/* What the graph path does each call, each half timed on its own: the plan into the bucket's
 * area and cudaGraphLaunch, with the staging slots taken and the waits for one. */
typedef struct graph_times {
  double plan_us, launch_us, slots, waits;
} graph_times;

typedef enum graph_how { GRAPH_FULL, GRAPH_SHORT_KV } graph_how;

/* Medians over idle calls (stream drained outside the timing): GRAPH_FULL as fattn_graph_launch
 * does it; GRAPH_SHORT_KV attends 64 slots a sequence, so that the replay before each call is
 * short. A replay always follows its plan: the graph's prep node reads the slot plan posted. */
static graph_times time_graph(fattn_ctx *ctx, uint32_t bs, uint32_t *ids, graph_how w, void *stream) {
  enum { RUNS = 201 };
  static double tp[RUNS], tl[RUNS];
  static uint32_t short_kv[256];
  fattn_batch b = FATTN_BATCH_INIT;
  b.mode = FATTN_MODE_DECODE;
  b.num_seqs = bs;
  b.seq_ids = ids;
  for (uint32_t i = 0; i < bs; i++) short_kv[i] = 64;
  if (w == GRAPH_SHORT_KV) b.kv_lens = short_kv;
  const uint64_t taken0 = ctx->ring_taken, waits0 = ctx->staging_waits;
  for (int r = 0; r < RUNS; r++) {
    if (w != GRAPH_SHORT_KV)
      for (uint32_t i = 0; i < bs; i++) {
        uint32_t len;
        fattn_seq_length(ctx, ids[i], &len);
        fattn_seq_truncate(ctx, ids[i], len - 1);
        fattn_seq_reserve(ctx, ids[i], len);
      }
    cudaStreamSynchronize((cudaStream_t)stream);
    fattn_bench_graph_halves(ctx, &b, stream, &tp[r], &tl[r]);
  }
  cudaStreamSynchronize((cudaStream_t)stream);
  return (graph_times){fattn_bench_median(tp, RUNS), fattn_bench_median(tl, RUNS), (double)(ctx->ring_taken - taken0) / RUNS,
                       (double)(ctx->staging_waits - waits0) / RUNS};
}

/* GPU milliseconds of one replay of bs's decode graph (events around it). */
static float replay_ms(fattn_ctx *ctx, uint32_t bs, uint32_t *ids, void *stream) {
  fattn_batch b = FATTN_BATCH_INIT;
  b.mode = FATTN_MODE_DECODE;
  b.num_seqs = bs;
  b.seq_ids = ids;
  cudaEvent_t e0, e1;
  float ms = -1.f;
  cudaEventCreate(&e0), cudaEventCreate(&e1);
  cudaEventRecord(e0, (cudaStream_t)stream);
  if (fattn_graph_launch(ctx, &b, stream) == FATTN_OK) {
    cudaEventRecord(e1, (cudaStream_t)stream);
    cudaEventSynchronize(e1);
    cudaEventElapsedTime(&ms, e0, e1);
  }
  cudaEventDestroy(e0), cudaEventDestroy(e1);
  return ms;
}

/* A speculative round's page work at long context: bs requests of len tokens each fork topk
 * branches at full length, every branch grows by a token, one DRAFT_DECODE step is planned, the
 * branches close. Medians over rounds of each part's host time, the mean slots the plan took,
 * and on the GPU the device time from just before the plan to just after (its prep kernels). */
static void fork_round(uint32_t bs, uint32_t len, uint32_t topk, int gpu, void *stream) {
  enum { ROUNDS = 21 };
  fattn_config cfg;
  fattn_model model;
  fattn_shape_llama8b(&cfg, &model, gpu ? 0 : FATTN_DEVICE_CPU);
  model.num_layers = 1; /* page-table work does not depend on the layer count */
  cfg.max_seq_len = len + 64;
  cfg.max_batch = bs;
  cfg.spec_topk = topk;
  cfg.spec_steps = 5;
  cfg.spec_draft_tokens = 8;
  cfg.kv_budget_bytes = ((uint64_t)bs * (len + 64) + (uint64_t)bs * topk * 32) * 8 * 128 * 2 * 2;
  char detail[256];
  fattn_ctx *ctx;
  if (fattn_create(&cfg, &model, &ctx, detail, sizeof detail)) {
    fprintf(stderr, "fattn_create: %s\n", detail);
    exit(1);
  }
  static uint32_t ids[256], br[1024];
  static double t[5][ROUNDS];
  for (uint32_t i = 0; i < bs; i++)
    if (fattn_seq_open(ctx, &ids[i]) || fattn_seq_reserve(ctx, ids[i], len - i % 16)) {
      fprintf(stderr, "fork round: %s\n", fattn_detail(ctx));
      exit(1);
    }
  fattn_batch b = FATTN_BATCH_INIT;
  b.mode = FATTN_MODE_DRAFT_DECODE, b.num_seqs = bs, b.seq_ids = br;
  cudaEvent_t ev[2];
  if (gpu) cudaEventCreate(&ev[0]), cudaEventCreate(&ev[1]);
  uint64_t taken = 0;
  for (int r = -1; r < ROUNDS; r++) { /* round -1 ships the requests' own rows: not timed */
    if (gpu) cudaStreamSynchronize((cudaStream_t)stream);
    fattn_status st = FATTN_OK;
    double t0 = fattn_bench_now();
    for (uint32_t i = 0; i < bs && !st; i++)
      for (uint32_t k = 0; k < topk && !st; k++) st = fattn_seq_fork(ctx, ids[i], len - i % 16, &br[i * topk + k]);
    double t1 = fattn_bench_now();
    for (uint32_t i = 0; i < bs * topk && !st; i++) st = fattn_seq_reserve(ctx, br[i], len - i / topk % 16 + 1);
    double t2 = fattn_bench_now();
    const uint64_t taken0 = ctx->ring_taken;
    if (gpu) cudaEventRecord(ev[0], (cudaStream_t)stream);
    if (!st) st = fattn_plan(ctx, &b, stream);
    double t3 = fattn_bench_now();
    if (gpu) cudaEventRecord(ev[1], (cudaStream_t)stream);
    if (r >= 0) taken += ctx->ring_taken - taken0;
    for (uint32_t i = 0; i < bs * topk && !st; i++) st = fattn_seq_close(ctx, br[i]);
    double t4 = fattn_bench_now();
    if (st) {
      fprintf(stderr, "fork round: %s\n", fattn_detail(ctx));
      exit(1);
    }
    float ms = 0.f;
    if (gpu) cudaEventSynchronize(ev[1]), cudaEventElapsedTime(&ms, ev[0], ev[1]);
    if (r >= 0) t[0][r] = t1 - t0, t[1][r] = t2 - t1, t[2][r] = t3 - t2, t[3][r] = t4 - t3, t[4][r] = ms * 1e-3;
  }
  printf("%6u %7u %5u %9.1f %11.1f %9.1f %9.1f %6.2f %10.1f\n", bs, len, topk, fattn_bench_median(t[0], ROUNDS) * 1e6,
         fattn_bench_median(t[1], ROUNDS) * 1e6, fattn_bench_median(t[2], ROUNDS) * 1e6,
         fattn_bench_median(t[3], ROUNDS) * 1e6, (double)taken / ROUNDS, fattn_bench_median(t[4], ROUNDS) * 1e6);
  if (gpu) cudaEventDestroy(ev[0]), cudaEventDestroy(ev[1]);
  fattn_destroy(ctx, 1);
}

int fattn_bench_plan(int argc, char **argv) {
  (void)argc, (void)argv;
  fattn_config cfg;
  fattn_model model;
  int gpu = fattn_bench_has_gpu();
  fattn_shape_llama8b(&cfg, &model, gpu ? 0 : FATTN_DEVICE_CPU);
  cfg.kv_budget_bytes = gpu ? fattn_bench_kv_budget(80ull << 30) : 4ull << 30;
  if (!gpu) model.num_layers = 1; /* host memory; plan time does not depend on the layer count */
  cfg.max_seq_len = 8192;
  cfg.spec_topk = 4;
  cfg.spec_steps = 5;
  cfg.spec_draft_tokens = 8;
  if (gpu) cfg.graph_modes = 1u << FATTN_MODE_DECODE;
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
  printf("%-14s %6s %10s %8s %11s\n", "mode", "bs", "us", "waits", "reserve_us");
  const fattn_mode modes[2] = {FATTN_MODE_DECODE, FATTN_MODE_TARGET_VERIFY};
  const uint32_t sizes[3] = {1, 64, 256};
  uint64_t waits;
  for (int m = 0; m < 2; m++)
    for (int s = 0; s < 3; s++) {
      double reserve_us;
      double us =
          time_plan(ctx, modes[m], sizes[s], ids, cfg.spec_draft_tokens, BACK_TO_BACK, NULL, &waits, &reserve_us);
      printf("%-14s %6u %10.2f %8llu %11.2f\n", m ? "TARGET_VERIFY" : "DECODE", sizes[s], us,
             (unsigned long long)waits, reserve_us);
    }
  if (gpu) {
    graph_io g = {ctx, model.num_layers, NULL, NULL, NULL, NULL};
    const size_t q_bytes = 256ull * model.num_q_heads * model.head_dim * 2,
                 kv_bytes = 256ull * model.num_kv_heads * model.head_dim * 2;
    cudaStream_t stream;
    if (cudaMalloc(&g.q, q_bytes) || cudaMalloc(&g.out, q_bytes) || cudaMalloc(&g.k, kv_bytes) ||
        cudaMalloc(&g.v, kv_bytes) || cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking)) {
      fprintf(stderr, "graph buffers: %s\n", cudaGetErrorString(cudaGetLastError()));
      return 1;
    }
    cudaMemset(g.q, 0, q_bytes), cudaMemset(g.k, 0, kv_bytes), cudaMemset(g.v, 0, kv_bytes);
    printf("\nDECODE, device idle before each call (stream drained outside the timing), median of 201\n");
    printf("graph = plan_into + cudaGraphLaunch timed apart; short-kv: kv_len 64\n");
    printf("%6s %9s %12s %10s %9s %6s %6s %13s %10s\n", "bs", "plan_us", "plan+launch", "g_plan_us",
           "launch_us", "slots", "waits", "short_kv_l_us", "replay_ms");
    for (int s = 0; s < 3; s++) {
      if (fattn_graph_capture(ctx, FATTN_MODE_DECODE, sizes[s], layer_loop, &g)) {
        fprintf(stderr, "fattn_graph_capture: %s\n", fattn_detail(ctx));
        return 1;
      }
      double plan = time_plan(ctx, FATTN_MODE_DECODE, sizes[s], ids, 0, PLAN_IDLE, stream, &waits, NULL);
      double both = time_plan(ctx, FATTN_MODE_DECODE, sizes[s], ids, 0, GRAPH_IDLE, stream, &waits, NULL);
      graph_times full = time_graph(ctx, sizes[s], ids, GRAPH_FULL, stream);
      graph_times shrt = time_graph(ctx, sizes[s], ids, GRAPH_SHORT_KV, stream);
      float ms = replay_ms(ctx, sizes[s], ids, stream);
      printf("%6u %9.2f %12.2f %10.2f %9.2f %6.2f %6.2f %13.2f %10.3f\n", sizes[s], plan, both, full.plan_us,
             full.launch_us, full.slots, full.waits, shrt.launch_us, (double)ms);
    }
    cudaStreamDestroy(stream);
    cudaFree(g.q), cudaFree(g.out), cudaFree(g.k), cudaFree(g.v);
  }
  fattn_destroy(ctx, 1);
  printf("\nspeculative round's page work: bs requests fork topk branches at full length, each branch\n"
         "grows a token, one DRAFT_DECODE plan, the branches close; medians of 21 rounds (us)\n");
  printf("%6s %7s %5s %9s %11s %9s %9s %6s %10s\n", "bs", "len", "topk", "fork_us", "reserve_us", "plan_us",
         "close_us", "slots", "gpu_us");
  void *stream = NULL;
  if (gpu) cudaStreamCreateWithFlags((cudaStream_t *)&stream, cudaStreamNonBlocking);
  fork_round(64, 4096, 4, gpu, stream);
  fork_round(64, 8192, 4, gpu, stream);
  fork_round(16, 32768, 4, gpu, stream);
  if (gpu) cudaStreamDestroy((cudaStream_t)stream);
  return 0;
}
