/* serve.h: what the serving benchmark's files share: the stack under test, its shape, the
 * results, and the phases (one batch, speculative round, batch sweep, report). */
#ifndef FATTN_BENCH_SERVE_H
#define FATTN_BENCH_SERVE_H

#include <cuda_runtime_api.h>

#include "bench/bench.h"

typedef struct serve_shape {
  uint32_t batch;  /* requests of the one-batch run */
  uint32_t input;  /* prompt tokens */
  uint32_t output; /* decode steps */
  uint32_t max_bs; /* largest batch of the sweep */
} serve_shape;

typedef struct serve {
  fattn_ctx *ctx;
  int gpu;
  serve_shape p;
  uint32_t layers, hq, hkv, d;
  uint32_t run_layers; /* layers the layer loop runs: all for the target, 1 for draft phases */
  uint32_t tokens;     /* query tokens the mix kernel covers */
  uint32_t cap_tokens;
  void *q, *k, *v, *out; /* [cap_tokens, heads, d] bf16 */
  cudaStream_t stream;
  cudaEvent_t ev[2];
  fattn_status failed;
  uint32_t req[256]; /* the one-batch requests */
} serve;

enum { SWEEP_MAX = 16 };

typedef struct serve_result {
  double prefill_ms;
  double decode_eager_ms, decode_graph_ms; /* median per step */
  double kernel_sum_ms;                    /* sum of one decode step's kernel times */
  double kernel_us[3], kernel_us_bs1[3];   /* a layer's store, attend, mix: one-batch run, bs 1 sweep */
  double launch_host_us_bs256;             /* host time of fattn_graph_launch at bs 256, device idle */
  double launch_busy_us_bs256;             /* the same while the step before runs */
  double launch_idle_halves_us_bs256[2];   /* its halves timed apart, device idle: plan, cudaGraphLaunch */
  double launch_busy_halves_us_bs256[2];   /* the same halves while the step before runs */
  uint64_t launch_busy_waits;              /* staging waits during those launches */
  double eager_issue_us_bs1;               /* host time to issue one eager step at bs 1, device idle */
  double spec_eager_ms[4], spec_graph_ms[4]; /* draft decode x steps, verify, draft extend, total */
  uint32_t sweep_n;
  uint32_t sweep_bs[SWEEP_MAX];
  double sweep_eager_ms[SWEEP_MAX], sweep_graph_ms[SWEEP_MAX];
  uint64_t graph_static_bytes; /* Llama-3.1-8B at max_seq_len 131072, every mode, default buckets */
} serve_result;

/* bench/serve_mix.cu: out -> the next layer's q, k, v on the device; a cudaError_t. */
int fattn_bench_mix(const void *out, void *q, void *k, void *v, uint32_t tokens, uint32_t hq, uint32_t hkv,
                    uint32_t d, uint32_t salt, void *stream);
void fattn_bench_layer_loop(void *user, void *stream);
double fattn_bench_timer_start(serve *s);
double fattn_bench_timer_ms(serve *s, double t0);
/* Issues one step of batch b (plan + layer loop eagerly, or fattn_graph_launch); no wait. */
void fattn_bench_issue(serve *s, const fattn_batch *b, int graph);
/* The same step, timed on the stream. Milliseconds. */
double fattn_bench_step(serve *s, const fattn_batch *b, uint32_t tokens, int graph);
void fattn_bench_capture(serve *s, fattn_mode mode, uint32_t bs, uint32_t tokens, uint32_t layers);

void fattn_bench_one_batch(serve *s, serve_result *r);
void fattn_bench_spec_round(serve *s, serve_result *r);
void fattn_bench_batch_sweep(serve *s, serve_result *r);
void fattn_bench_report(serve *s, const serve_result *r);
#ifdef FATTN_STAMPS
/* tools/serve_stamps.c (measurement builds): the stamp buffer, cleared before a step, and the
 * timeline of that step's last layer */
void fattn_bench_stamps_open(serve *s);
void fattn_bench_stamps_clear(void);
void fattn_bench_stamps_print(void);
#endif

#endif /* FATTN_BENCH_SERVE_H */
