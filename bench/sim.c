/* sim.c: `fattn-bench run`. Prints the Llama-3.1-8B memory plan, drives a simulated scheduler
 * (arrivals, growth, forks, truncations, finishes) through the allocator and planner, then serves. */
#include <stdlib.h>
#include <string.h>

#include "bench/bench.h"

#define SIM_MAX_ACTIVE 512

typedef struct sim {
  fattn_ctx *ctx;
  uint32_t active[SIM_MAX_ACTIVE];
  uint32_t remaining[SIM_MAX_ACTIVE]; /* decode tokens until it finishes */
  uint32_t n;
  uint64_t seed;
  uint64_t ops, arrivals, rejected, preempted, forks, truncations, finishes, plans;
  double op_seconds, plan_seconds;
} sim;

static uint32_t rnd(sim *s) {
  s->seed ^= s->seed << 13;
  s->seed ^= s->seed >> 7;
  s->seed ^= s->seed << 17;
  return (uint32_t)(s->seed >> 11);
}

static int timed(sim *s, fattn_status st, double t0) {
  s->op_seconds += fattn_bench_now() - t0;
  s->ops++;
  return st == FATTN_OK;
}

static void drop(sim *s, uint32_t i) {
  double t0 = fattn_bench_now();
  timed(s, fattn_seq_close(s->ctx, s->active[i]), t0);
  s->active[i] = s->active[s->n - 1];
  s->remaining[i] = s->remaining[s->n - 1];
  s->n--;
}

static void arrive(sim *s, uint32_t max_batch) {
  if (s->n >= max_batch) return;
  uint32_t id, prompt = 16 + rnd(s) % 4081;
  double t0 = fattn_bench_now();
  if (!timed(s, fattn_seq_open(s->ctx, &id), t0)) return;
  s->arrivals++;
  s->active[s->n] = id;
  s->remaining[s->n] = 1 + rnd(s) % 1024;
  s->n++;
  t0 = fattn_bench_now();
  if (!timed(s, fattn_seq_reserve(s->ctx, id, prompt), t0)) {
    s->rejected++;
    drop(s, s->n - 1);
  }
}

static void grow_and_plan(sim *s) {
  uint32_t ids[SIM_MAX_ACTIVE], k = 0;
  for (uint32_t i = 0; i < s->n;) {
    uint32_t len;
    fattn_seq_length(s->ctx, s->active[i], &len);
    double t0 = fattn_bench_now();
    if (s->remaining[i] == 0 || len >= 8192) {
      s->finishes++;
      drop(s, i);
      continue;
    }
    if (!timed(s, fattn_seq_reserve(s->ctx, s->active[i], len + 1), t0)) { /* out of pages */
      s->preempted++;
      drop(s, i);
      continue;
    }
    s->remaining[i]--;
    if (k < 256) ids[k++] = s->active[i];
    i++;
  }
  if (!k) return;
  fattn_batch b = FATTN_BATCH_INIT;
  b.mode = FATTN_MODE_DECODE;
  b.num_seqs = k;
  b.seq_ids = ids;
  double t0 = fattn_bench_now();
  fattn_status st = fattn_plan(s->ctx, &b, NULL);
  s->plan_seconds += fattn_bench_now() - t0;
  s->plans++;
  if (st) {
    fprintf(stderr, "fattn_plan: %s: %s\n", fattn_status_name(st), fattn_detail(s->ctx));
    exit(1);
  }
}

/* Parallel sampling shares a prefix; rejected draft tokens shrink a sequence. */
static void fork_or_truncate(sim *s, uint32_t max_batch) {
  uint32_t r = rnd(s) % 100;
  if (s->n == 0) return;
  uint32_t i = rnd(s) % s->n, len, id;
  fattn_seq_length(s->ctx, s->active[i], &len);
  if (r < 2 && s->n < max_batch) {
    double t0 = fattn_bench_now();
    if (timed(s, fattn_seq_fork(s->ctx, s->active[i], len, &id), t0)) {
      s->forks++;
      s->active[s->n] = id;
      s->remaining[s->n++] = 1 + rnd(s) % 256;
    }
  } else if (r < 6 && len > 8) {
    double t0 = fattn_bench_now();
    if (timed(s, fattn_seq_truncate(s->ctx, s->active[i], len - 1 - rnd(s) % 8), t0)) s->truncations++;
  }
}

int fattn_bench_run(int argc, char **argv) {
  uint32_t steps = 100000;
  for (int i = 1; i + 1 < argc; i++)
    if (strcmp(argv[i], "--steps") == 0) steps = (uint32_t)strtoul(argv[++i], NULL, 10);
  fattn_config cfg;
  fattn_model model;
  int gpu = fattn_bench_has_gpu();
  fattn_shape_llama8b(&cfg, &model, gpu ? 0 : FATTN_DEVICE_CPU);
  cfg.max_seqs = 512;
  char detail[256];
  fattn_memory_report plan = FATTN_MEMORY_REPORT_INIT;
  if (fattn_memory_plan(&cfg, &model, &plan, detail, sizeof detail)) {
    fprintf(stderr, "memory plan: %s\n", detail);
    return 1;
  }
  printf("Memory plan, Llama-3.1-8B (32 layers, 32 q / 8 kv heads, d 128, bf16 KV, page 16, 80 GiB KV)\n");
  fattn_bench_print_plan(&plan, stdout);
  if (!gpu) {
    cfg.kv_budget_bytes = 8ull << 30; /* host memory of a small machine; the plan above is the GPU's */
    cfg.max_seq_len = 32768;
    printf("\nNo CUDA device: running on the CPU backend with an 8 GiB KV budget, max_seq_len 32768.\n");
  } else {
    const uint64_t planned = cfg.kv_budget_bytes;
    cfg.kv_budget_bytes = fattn_bench_kv_budget(planned);
    if (cfg.kv_budget_bytes < planned)
      printf("\nThe device has less free memory than the plan: the scheduler runs with %.1f GiB of KV.\n",
             (double)cfg.kv_budget_bytes / (1ull << 30));
  }
  sim s;
  memset(&s, 0, sizeof s);
  s.seed = 0x9e3779b97f4a7c15ull;
  if (fattn_create(&cfg, &model, &s.ctx, detail, sizeof detail)) {
    fprintf(stderr, "fattn_create: %s\n", detail);
    return 1;
  }
  fattn_stats st = FATTN_STATS_INIT;
  fattn_get_stats(s.ctx, &st);
  printf("\nSimulated scheduler: %u steps, max_batch %u, %u pages (%s backend)\n", steps, cfg.max_batch,
         st.pages_total, gpu ? "GPU" : "CPU");
  double t_start = fattn_bench_now();
  for (uint32_t step = 1; step <= steps; step++) {
    if (rnd(&s) % 4 == 0) arrive(&s, cfg.max_batch);
    fork_or_truncate(&s, cfg.max_batch);
    grow_and_plan(&s);
    if (step % 1000 == 0 && fattn_check(s.ctx) != FATTN_OK) {
      fprintf(stderr, "step %u: fattn_check: %s\n", step, fattn_detail(s.ctx));
      return 1;
    }
    if (step % 10000 == 0) {
      fattn_get_stats(s.ctx, &st);
      printf("step %6u  active %3u  pages used %6u / %u  ops %9llu  %.1f s\n", step, s.n,
             st.pages_total - st.pages_free, st.pages_total, (unsigned long long)s.ops, fattn_bench_now() - t_start);
      fflush(stdout);
    }
  }
  while (s.n) drop(&s, 0);
  fattn_status chk = fattn_check(s.ctx);
  fattn_get_stats(s.ctx, &st);
  printf("\narrivals %llu (rejected %llu), finishes %llu, preempted %llu, forks %llu, truncations %llu\n",
         (unsigned long long)s.arrivals, (unsigned long long)s.rejected, (unsigned long long)s.finishes,
         (unsigned long long)s.preempted, (unsigned long long)s.forks, (unsigned long long)s.truncations);
  printf("page operations: %llu in %.3f s = %.2f M ops/s; copy-on-write copies %llu\n", (unsigned long long)s.ops,
         s.op_seconds, (double)s.ops / s.op_seconds / 1e6, (unsigned long long)st.cow_copies);
  printf("fattn_plan: %llu plans, %.2f us each (host), staging waits %llu\n", (unsigned long long)s.plans,
         1e6 * s.plan_seconds / (double)s.plans, (unsigned long long)st.staging_waits);
  printf("final check: %s, pages free %u / %u\n", fattn_status_name(chk), st.pages_free, st.pages_total);
  fattn_destroy(s.ctx, 0);
  if (chk != FATTN_OK || st.pages_free != st.pages_total) return 1;
  if (fattn_bench_steps()) return 1;
  printf("\n");
  return fattn_bench_serve(0, NULL);
}
