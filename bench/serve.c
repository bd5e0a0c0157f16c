/* serve.c: `fattn-bench serve`, the serving-step benchmark. A Llama-3.1-8B attention stack
 * driven like bench_one_batch: prefill, decode eager and with graphs, a speculative round. */
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "bench/serve.h"
#include "lib/dtype.h"

static void die(const serve *s, fattn_status st, const char *what) {
  if (st == FATTN_OK) return;
  fprintf(stderr, "%s: %s: %s\n", what, fattn_status_name(st), s->ctx ? fattn_detail(s->ctx) : "");
  exit(1);
}

static void *buffer(const serve *s, size_t bytes) {
  void *p = NULL;
  if (s->gpu ? cudaMalloc(&p, bytes) != cudaSuccess : (p = calloc(1, bytes)) == NULL) {
    fprintf(stderr, "serve: no memory for %zu bytes\n", bytes);
    exit(1);
  }
  if (s->gpu) cudaMemset(p, 0, bytes);
  return p;
}

/* Host version of the mix kernel, for the CPU backend. */
static void mix_host(serve *s, uint32_t salt) {
  uint16_t *out = s->out, *q = s->q, *k = s->k, *v = s->v;
  for (uint64_t i = 0; i < (uint64_t)s->tokens * s->hq * s->d; i++) {
    uint32_t c = (uint32_t)(i % s->d), h = (uint32_t)(i / s->d % s->hq);
    uint64_t t = i / ((uint64_t)s->d * s->hq);
    float x = fattn__bf16_to_f32(out[i]);
    float wave = 0.5f * sinf(0.37f * (float)(c + 3 * h + salt) + 0.011f * (float)t);
    q[i] = fattn__f32_to_bf16(0.5f * x + wave);
    if (h < s->hkv) {
      uint64_t j = (t * s->hkv + h) * s->d + c;
      k[j] = fattn__f32_to_bf16(0.25f * x - wave);
      v[j] = fattn__f32_to_bf16(x + 0.5f * wave);
    }
  }
}

/* The per-step body every mode runs, eagerly or under capture: for each layer, store the new
 * K/V, attend, and derive the next layer's q, k, v from the output. */
void fattn_bench_layer_loop(void *user, void *stream) {
  serve *s = user;
  for (uint32_t l = 0; l < s->run_layers; l++) {
    fattn_status st = fattn_store_kv(s->ctx, l, s->k, s->v, stream);
    if (!st) st = fattn_attend(s->ctx, l, s->q, s->out, NULL, stream);
    if (st) {
      s->failed = st;
      return;
    }
    if (s->gpu) s->failed = fattn_bench_mix(s->out, s->q, s->k, s->v, s->tokens, s->hq, s->hkv, s->d, l, stream)
                                ? FATTN_ERR_CUDA : s->failed;
    else mix_host(s, l);
  }
}

double fattn_bench_timer_start(serve *s) {
  if (!s->gpu) return fattn_bench_now();
  cudaEventRecord(s->ev[0], s->stream);
  return 0;
}

double fattn_bench_timer_ms(serve *s, double t0) {
  if (!s->gpu) return (fattn_bench_now() - t0) * 1e3;
  float ms = 0;
  cudaEventRecord(s->ev[1], s->stream);
  cudaEventSynchronize(s->ev[1]);
  cudaEventElapsedTime(&ms, s->ev[0], s->ev[1]);
  return ms;
}

void fattn_bench_issue(serve *s, const fattn_batch *b, int graph) {
  if (graph) {
    die(s, fattn_graph_launch(s->ctx, b, s->stream), "fattn_graph_launch");
  } else {
    die(s, fattn_plan(s->ctx, b, s->stream), "fattn_plan");
    fattn_bench_layer_loop(s, s->stream);
    die(s, s->failed, "layer loop");
  }
}

double fattn_bench_step(serve *s, const fattn_batch *b, uint32_t tokens, int graph) {
  double t0 = fattn_bench_timer_start(s);
  s->tokens = tokens;
  fattn_bench_issue(s, b, graph);
  return fattn_bench_timer_ms(s, t0);
}

void fattn_bench_capture(serve *s, fattn_mode mode, uint32_t bs, uint32_t tokens, uint32_t layers) {
  s->tokens = tokens;
  s->run_layers = layers;
  die(s, fattn_graph_capture(s->ctx, mode, bs, fattn_bench_layer_loop, s), "fattn_graph_capture");
  die(s, s->failed, "captured layer loop");
}

static void open_serve(serve *s, int gpu) {
  memset(s, 0, sizeof *s);
  s->gpu = gpu;
  fattn_config cfg;
  fattn_model m;
  fattn_shape_llama8b(&cfg, &m, gpu ? 0 : FATTN_DEVICE_CPU);
  s->p = gpu ? (serve_shape){16, 1024, 512, 256} : (serve_shape){4, 64, 16, 8};
  if (!gpu) { /* the same flow, scaled to a host */
    m.num_layers = 2, m.num_q_heads = 4, m.num_kv_heads = 2, m.head_dim = 64;
  }
  cfg.kv_budget_bytes = gpu ? 32ull << 30 : 256ull << 20;
  cfg.max_batch = s->p.max_bs;
  cfg.max_seq_len = 4096;
  cfg.max_q_tokens = s->p.batch * s->p.input;
  cfg.spec_topk = 4;
  cfg.spec_steps = 5;
  cfg.spec_draft_tokens = 8;
  cfg.graph_modes = gpu ? (1u << FATTN_MODE_DECODE) | (1u << FATTN_MODE_DRAFT_DECODE) |
                              (1u << FATTN_MODE_TARGET_VERIFY) | (1u << FATTN_MODE_DRAFT_EXTEND)
                        : 0;
  char detail[256];
  fattn_status st = fattn_create(&cfg, &m, &s->ctx, detail, sizeof detail);
  if (st) {
    fprintf(stderr, "fattn_create: %s\n", detail);
    exit(1);
  }
#ifdef FATTN_STAMPS
  fattn_bench_stamps_open(s);
#endif
  s->layers = m.num_layers, s->hq = m.num_q_heads, s->hkv = m.num_kv_heads, s->d = m.head_dim;
  s->cap_tokens = cfg.max_q_tokens > s->p.max_bs * 9 ? cfg.max_q_tokens : s->p.max_bs * 9;
  s->q = buffer(s, (size_t)s->cap_tokens * s->hq * s->d * 2);
  s->out = buffer(s, (size_t)s->cap_tokens * s->hq * s->d * 2);
  s->k = buffer(s, (size_t)s->cap_tokens * s->hkv * s->d * 2);
  s->v = buffer(s, (size_t)s->cap_tokens * s->hkv * s->d * 2);
  if (gpu) {
    cudaStreamCreateWithFlags(&s->stream, cudaStreamNonBlocking);
    cudaEventCreate(&s->ev[0]);
    cudaEventCreate(&s->ev[1]);
  }
}

static void close_serve(serve *s) {
  fattn_destroy(s->ctx, 1);
  void *bufs[4] = {s->q, s->out, s->k, s->v};
  for (int i = 0; i < 4; i++) s->gpu ? (void)cudaFree(bufs[i]) : free(bufs[i]);
  if (s->gpu) {
    cudaEventDestroy(s->ev[0]);
    cudaEventDestroy(s->ev[1]);
    cudaStreamDestroy(s->stream);
  }
}

int fattn_bench_serve(int argc, char **argv) {
  (void)argc, (void)argv;
  serve s;
  int gpu = fattn_bench_has_gpu();
  open_serve(&s, gpu);
  printf("fattn-bench serve: %s, %u layers, %u q / %u kv heads, d %u, bf16 KV, page 16\n",
         gpu ? "GPU" : "CPU backend (no CUDA device: a small shape, eager only)", s.layers, s.hq, s.hkv, s.d);
  serve_result r;
  memset(&r, 0, sizeof r);
  fattn_bench_one_batch(&s, &r);
  fattn_bench_spec_round(&s, &r);
  if (gpu) fattn_bench_batch_sweep(&s, &r);
  fattn_bench_report(&s, &r);
  close_serve(&s);
  return 0;
}
