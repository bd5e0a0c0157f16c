/* serve_phases.c: the phases of `fattn-bench serve`: one batch (prefill, decode eager and
 * graph), a speculative round (draft decode, verify, draft extend), a batch sweep, the report. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "bench/serve.h"

static void check(fattn_status st, const serve *s, const char *what) {
  if (st == FATTN_OK) return;
  fprintf(stderr, "%s: %s: %s\n", what, fattn_status_name(st), fattn_detail(s->ctx));
  exit(1);
}

static void grow(serve *s, const uint32_t *ids, uint32_t n, uint32_t by) {
  for (uint32_t i = 0; i < n; i++) {
    uint32_t len;
    fattn_seq_length(s->ctx, ids[i], &len);
    check(fattn_seq_reserve(s->ctx, ids[i], len + by), s, "fattn_seq_reserve");
  }
}

/* A DECODE step of the n sequences ids. */
static fattn_batch decode_batch(const uint32_t *ids, uint32_t n) {
  fattn_batch b = FATTN_BATCH_INIT;
  b.mode = FATTN_MODE_DECODE;
  b.num_seqs = n;
  b.seq_ids = ids;
  return b;
}

static void open_seqs(serve *s, uint32_t *ids, uint32_t n) {
  for (uint32_t i = 0; i < n; i++) check(fattn_seq_open(s->ctx, &ids[i]), s, "fattn_seq_open");
}

/* Prefill n sequences of len tokens in chunks that fit one step. */
static double prefill(serve *s, const uint32_t *ids, uint32_t n, uint32_t len) {
  uint32_t per = s->cap_tokens / len, q[256];
  double ms = 0;
  for (uint32_t i = 0; i < n; i++) q[i] = len;
  grow(s, ids, n, len);
  s->run_layers = s->layers;
  for (uint32_t at = 0; at < n; at += per) {
    fattn_batch b = FATTN_BATCH_INIT;
    b.mode = FATTN_MODE_PREFILL;
    b.num_seqs = n - at < per ? n - at : per;
    b.seq_ids = ids + at;
    b.q_lens = q;
    ms += fattn_bench_step(s, &b, b.num_seqs * len, 0);
  }
  return ms;
}

static double decode_steps(serve *s, const uint32_t *ids, uint32_t n, uint32_t steps, int graph) {
  double *t = malloc(steps * sizeof *t);
  const fattn_batch b = decode_batch(ids, n);
  for (uint32_t i = 0; i < steps; i++) {
    grow(s, ids, n, 1);
    t[i] = fattn_bench_step(s, &b, n, graph);
  }
  double m = fattn_bench_median(t, steps);
  free(t);
  return m;
}

/* One decode step's kernels, each timed as 20 back-to-back launches in a graph: us[] gets a
 * layer's store, attend and mix; the sum over the layers is what a perfect replay of the step
 * would cost. Uses the last eager plan. */
static double kernel_sum_ms(serve *s, double us[3]) {
  double total = 0;
  for (int which = 0; which < 3; which++) {
    cudaGraph_t g;
    cudaGraphExec_t x;
    cudaStreamBeginCapture(s->stream, cudaStreamCaptureModeGlobal);
    for (int i = 0; i < 20; i++) {
      if (which == 0) fattn_store_kv(s->ctx, 0, s->k, s->v, s->stream);
      if (which == 1) fattn_attend(s->ctx, 0, s->q, s->out, NULL, s->stream);
      if (which == 2) fattn_bench_mix(s->out, s->q, s->k, s->v, s->tokens, s->hq, s->hkv, s->d, 0, s->stream);
    }
    cudaStreamEndCapture(s->stream, &g);
    cudaGraphInstantiate(&x, g, 0);
    double t[9];
    for (int r = 0; r < 9; r++) {
      double t0 = fattn_bench_timer_start(s);
      cudaGraphLaunch(x, s->stream);
      t[r] = fattn_bench_timer_ms(s, t0) / 20;
    }
    const double ms = fattn_bench_median(t, 9);
    us[which] = ms * 1e3;
    total += ms * s->layers;
    cudaGraphExecDestroy(x);
    cudaGraphDestroy(g);
  }
  return total;
}

/* Each decode step runs eagerly and then, over the same slot, as a graph: both see the same
 * context length, so their medians compare. */
void fattn_bench_one_batch(serve *s, serve_result *r) {
  uint32_t n = s->p.batch, *ids = s->req, steps = s->p.output;
  open_seqs(s, ids, n);
  printf("\none batch: %u requests, input %u, output %u\n", n, s->p.input, steps);
  r->prefill_ms = prefill(s, ids, n, s->p.input);
  printf("  prefill: %.3f ms\n", r->prefill_ms);
  if (s->gpu) fattn_bench_capture(s, FATTN_MODE_DECODE, n, n, s->layers);
  double *te = malloc(steps * sizeof *te), *tg = malloc(steps * sizeof *tg);
  const fattn_batch b = decode_batch(ids, n);
  for (uint32_t i = 0; i < steps; i++) {
    grow(s, ids, n, 1);
    te[i] = fattn_bench_step(s, &b, n, 0);
    tg[i] = 0;
    if (s->gpu) {
      for (uint32_t j = 0; j < n; j++) {
        uint32_t len;
        fattn_seq_length(s->ctx, ids[j], &len);
        check(fattn_seq_truncate(s->ctx, ids[j], len - 1), s, "fattn_seq_truncate");
      }
      grow(s, ids, n, 1);
      tg[i] = fattn_bench_step(s, &b, n, 1);
    }
    if ((i + 1) % 128 == 0) {
      printf("  decode step %u/%u: eager %.3f ms, graph %.3f ms\n", i + 1, steps, te[i], tg[i]);
      fflush(stdout);
    }
  }
  r->decode_eager_ms = fattn_bench_median(te, steps);
  r->decode_graph_ms = s->gpu ? fattn_bench_median(tg, steps) : 0;
  free(te), free(tg);
  if (s->gpu) {
    check(fattn_plan(s->ctx, &b, s->stream), s, "fattn_plan");
    s->tokens = n;
    r->kernel_sum_ms = kernel_sum_ms(s, r->kernel_us);
  }
}

/* A random draft tree of nd tokens: each draft sees itself and its parent's row. */
static void random_tree(uint64_t *mask, uint32_t nd, uint64_t *seed) {
  for (uint32_t i = 0; i < nd; i++) {
    *seed = *seed * 6364136223846793005ull + 1442695040888963407ull;
    mask[i] = (1ull << i) | (i ? mask[(*seed >> 33) % i] : 0);
  }
}

/* The speculative round on the one-batch requests: eager, then the same phases as graphs. */
void fattn_bench_spec_round(serve *s, serve_result *r) {
  const uint32_t n = s->p.batch, topk = 4, steps = 5, nd = 8;
  uint32_t *ids = s->req, br[1024], acc[256];
  static uint64_t mask[256 * 8];
  uint64_t seed = 99;
  for (uint32_t i = 0; i < n * nd; i += nd) random_tree(mask + i, nd, &seed);
  printf("\nspeculative round: topk %u, %u draft steps, %u draft tokens\n", topk, steps, nd);
  for (int graph = 0; graph <= s->gpu; graph++) {
    if (graph) {
      fattn_bench_capture(s, FATTN_MODE_DRAFT_DECODE, n, n * topk, 1);
      fattn_bench_capture(s, FATTN_MODE_TARGET_VERIFY, n, n * nd, s->layers);
      fattn_bench_capture(s, FATTN_MODE_DRAFT_EXTEND, n, n * (nd + 1), 1);
    }
    uint32_t base[256];
    for (uint32_t i = 0; i < n; i++) {
      fattn_seq_length(s->ctx, ids[i], &base[i]);
      for (uint32_t k = 0; k < topk; k++)
        check(fattn_seq_fork(s->ctx, ids[i], base[i], &br[i * topk + k]), s, "fattn_seq_fork");
    }
    fattn_batch b = FATTN_BATCH_INIT;
    double *ms = graph ? r->spec_graph_ms : r->spec_eager_ms;
    s->run_layers = 1;
    b.mode = FATTN_MODE_DRAFT_DECODE, b.num_seqs = n, b.seq_ids = br;
    for (uint32_t st = 0; st < steps; st++) {
      grow(s, br, n * topk, 1);
      ms[0] += fattn_bench_step(s, &b, n * topk, graph);
    }
    s->run_layers = s->layers;
    grow(s, ids, n, nd);
    b = (fattn_batch)FATTN_BATCH_INIT;
    b.mode = FATTN_MODE_TARGET_VERIFY, b.num_seqs = n, b.seq_ids = ids, b.tree_mask = mask;
    ms[1] = fattn_bench_step(s, &b, n * nd, graph);
    for (uint32_t i = 0; i < n; i++) {
      seed = seed * 6364136223846793005ull + 1442695040888963407ull;
      acc[i] = 1 + (uint32_t)(seed >> 33) % nd;
      check(fattn_seq_truncate(s->ctx, ids[i], base[i] + acc[i]), s, "fattn_seq_truncate");
    }
    s->run_layers = 1;
    b = (fattn_batch)FATTN_BATCH_INIT;
    b.mode = FATTN_MODE_DRAFT_EXTEND, b.num_seqs = n, b.seq_ids = ids, b.q_lens = acc;
    uint32_t tokens = 0;
    for (uint32_t i = 0; i < n; i++) tokens += acc[i];
    ms[2] = fattn_bench_step(s, &b, graph ? n * (nd + 1) : tokens, graph);
    ms[3] = ms[0] + ms[1] + ms[2];
    for (uint32_t i = 0; i < n * topk; i++) check(fattn_seq_close(s->ctx, br[i]), s, "fattn_seq_close");
    printf("  %s: draft decode %.3f ms (%u steps), verify %.3f ms, draft extend %.3f ms, round %.3f ms\n",
           graph ? "graph" : "eager", ms[0], steps, ms[1], ms[2], ms[3]);
  }
  s->run_layers = s->layers;
}

/* Calls a host-time median is taken over: the host's slow phases move a median
 * of 21 by several us; each call grows the bs 256 sequences by a token, 4 loops of them. */
enum { HOST_RUNS = 61 };

/* Host time of fattn_graph_launch as a serving loop sees it: the step before is still on the
 * device and the host spins (as a busy scheduler would) until the one before that is done, so
 * one step runs while the next is planned. Staging waits are counted: they must stay 0. With
 * `halves`, the same calls timed as their two halves apart (fattn_bench_graph_halves): the
 * plan into halves[0], cudaGraphLaunch into halves[1]; the return is then their sum. */
static double launch_while_busy(serve *s, const uint32_t *ids, uint32_t bs, uint64_t *waits, double halves[2]) {
  const fattn_batch batch = decode_batch(ids, bs), *b = &batch;
  double t[HOST_RUNS], tp[HOST_RUNS], tl[HOST_RUNS];
  cudaEvent_t ev[2];
  for (int i = 0; i < 2; i++) cudaEventCreateWithFlags(&ev[i], cudaEventDisableTiming);
  fattn_stats st0 = FATTN_STATS_INIT, st1 = FATTN_STATS_INIT;
  grow(s, b->seq_ids, b->num_seqs, 1);
  check(fattn_graph_launch(s->ctx, b, s->stream), s, "fattn_graph_launch");
  cudaEventRecord(ev[0], s->stream);
  fattn_get_stats(s->ctx, &st0);
  for (int i = 0; i < HOST_RUNS; i++) {
    grow(s, b->seq_ids, b->num_seqs, 1);
    if (halves) {
      fattn_bench_graph_halves(s->ctx, b, s->stream, &tp[i], &tl[i]);
      t[i] = tp[i] + tl[i];
    } else {
      double t0 = fattn_bench_now();
      check(fattn_graph_launch(s->ctx, b, s->stream), s, "fattn_graph_launch");
      t[i] = (fattn_bench_now() - t0) * 1e6;
    }
    cudaEventRecord(ev[(i + 1) % 2], s->stream);
    while (cudaEventQuery(ev[i % 2]) == cudaErrorNotReady) {
    }
  }
  fattn_get_stats(s->ctx, &st1);
  cudaStreamSynchronize(s->stream);
  for (int i = 0; i < 2; i++) cudaEventDestroy(ev[i]);
  *waits = st1.staging_waits - st0.staging_waits;
  if (halves) halves[0] = fattn_bench_median(tp, HOST_RUNS), halves[1] = fattn_bench_median(tl, HOST_RUNS);
  return fattn_bench_median(t, HOST_RUNS);
}

/* Host microseconds to issue one decode step of bs requests (eager: plan and every layer's
 * calls; graph: fattn_graph_launch), the device idle before each: median of HOST_RUNS. With
 * `halves` (graph only), fattn_graph_launch's two halves timed apart as in launch_while_busy. */
static double host_issue_us(serve *s, const uint32_t *ids, uint32_t bs, int graph, double halves[2]) {
  double t[HOST_RUNS], tp[HOST_RUNS], tl[HOST_RUNS];
  const fattn_batch b = decode_batch(ids, bs);
  s->tokens = bs;
  for (int i = 0; i < HOST_RUNS; i++) {
    grow(s, ids, bs, 1);
    cudaStreamSynchronize(s->stream);
    if (halves) {
      fattn_bench_graph_halves(s->ctx, &b, s->stream, &tp[i], &tl[i]);
      t[i] = tp[i] + tl[i];
    } else {
      double t0 = fattn_bench_now();
      fattn_bench_issue(s, &b, graph);
      t[i] = (fattn_bench_now() - t0) * 1e6;
    }
  }
  cudaStreamSynchronize(s->stream);
  if (halves) halves[0] = fattn_bench_median(tp, HOST_RUNS), halves[1] = fattn_bench_median(tl, HOST_RUNS);
  return fattn_bench_median(t, HOST_RUNS);
}

void fattn_bench_batch_sweep(serve *s, serve_result *r) {
  static const uint32_t sizes[] = {1, 2, 4, 8, 16, 32, 64, 128, 256};
  uint32_t ids[256];
  for (uint32_t i = 0; i < s->p.batch; i++) check(fattn_seq_close(s->ctx, s->req[i]), s, "fattn_seq_close");
  printf("\ndecode step latency against batch size (context 512, %u layers)\n", s->layers);
  for (uint32_t k = 0; k < sizeof sizes / sizeof sizes[0] && sizes[k] <= s->p.max_bs; k++) {
    uint32_t bs = sizes[k];
    open_seqs(s, ids, bs);
    prefill(s, ids, bs, 512);
    r->sweep_bs[k] = bs;
    r->sweep_eager_ms[k] = decode_steps(s, ids, bs, 16, 0);
    fattn_bench_capture(s, FATTN_MODE_DECODE, bs, bs, s->layers);
    r->sweep_graph_ms[k] = decode_steps(s, ids, bs, 16, 1);
    if (bs == 1) {
      r->eager_issue_us_bs1 = host_issue_us(s, ids, bs, 0, NULL);
      kernel_sum_ms(s, r->kernel_us_bs1); /* over host_issue_us's last eager plan */
#ifdef FATTN_STAMPS
      fattn_bench_stamps_clear();
      decode_steps(s, ids, bs, 1, 1); /* one graph step: its last layer's stamps */
      fattn_bench_stamps_print();
#endif
    }
    if (bs == 256) { /* host side of plan + launch */
      r->launch_host_us_bs256 = host_issue_us(s, ids, bs, 1, NULL);
      r->launch_busy_us_bs256 = launch_while_busy(s, ids, bs, &r->launch_busy_waits, NULL);
      uint64_t more_waits;
      launch_while_busy(s, ids, bs, &more_waits, r->launch_busy_halves_us_bs256);
      r->launch_busy_waits += more_waits;
      host_issue_us(s, ids, bs, 1, r->launch_idle_halves_us_bs256);
    }
    printf("  bs %3u: eager %.3f ms, graph %.3f ms (%.2fx)\n", bs, r->sweep_eager_ms[k], r->sweep_graph_ms[k],
           r->sweep_eager_ms[k] / r->sweep_graph_ms[k]);
    fflush(stdout);
    for (uint32_t i = 0; i < bs; i++) check(fattn_seq_close(s->ctx, ids[i]), s, "fattn_seq_close");
    r->sweep_n = k + 1;
  }
}
