/* gpu_threads.c: contexts driven from two threads at once on one GPU (and on two, where there
 * are two) give what each gives alone; a call on the wrong current device is a state error. */
#include <cuda_runtime_api.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "tests/support.h"
#include "tests/support_gpu.h"

enum { LAYERS = 2, HQ = 8, HKV = 2, D = 128, SEQS = 4, CAP = 256, STEPS = 12 };

/* What the threads of one case share. Captures are global (cudaStreamCaptureModeGlobal): while
 * one thread captures, no thread may make a call that could synchronise (cudaMalloc, a
 * synchronous copy), so the captures take turns between two barriers. */
typedef struct together {
  pthread_mutex_t capture;
  pthread_barrier_t set_up, captured;
} together;

/* One thread's context and what it made: the decode outputs of every step, or a failure. */
typedef struct run {
  together *with; /* NULL: alone */
  int device;
  uint64_t seed;
  fattn_ctx *ctx;
  cudaStream_t stream;
  void *q, *k, *v, *out; /* [CAP, heads, D] bf16 */
  float *lse;            /* [CAP, HQ] */
  uint16_t *got;         /* host: [STEPS][SEQS, HQ, D] */
  float *got_lse;        /* host: [STEPS][SEQS, HQ] */
  char failed[320];
} run;

static char detail[256];

static void layers(void *user, void *stream) {
  run *r = user;
  for (uint32_t l = 0; l < LAYERS && !r->failed[0]; l++) {
    fattn_status st = fattn_store_kv(r->ctx, l, r->k, r->v, stream);
    if (!st) st = fattn_attend(r->ctx, l, r->q, r->out, r->lse, stream);
    if (st) snprintf(r->failed, sizeof r->failed, "layer %u: %s: %s", l, fattn_status_name(st), fattn_detail(r->ctx));
  }
}

#define TRY(r, what, ok)                                                                    \
  do {                                                                                      \
    if (!(ok)) {                                                                            \
      if (!(r)->failed[0])                                                                  \
        snprintf((r)->failed, sizeof (r)->failed, "%s: %s", what, (r)->ctx ? fattn_detail((r)->ctx) : ""); \
      goto out;                                                                             \
    }                                                                                       \
  } while (0)

/* Prefill SEQS sequences, capture a DECODE graph, then STEPS decode steps, eager and replayed
 * by turns, each step's output copied back. Checks nothing itself: Check unwinds one thread. */
static void *script(void *arg) {
  run *r = arg;
  char why[256] = "";
  int met = 0; /* the barriers passed: a failing thread still meets the other at both */
  TRY(r, "cudaSetDevice", cudaSetDevice(r->device) == cudaSuccess);
  fattn_config c;
  fattn_model m;
  fattn_test_small(&c, &m);
  m.num_layers = LAYERS, m.num_q_heads = HQ, m.num_kv_heads = HKV, m.head_dim = D;
  c.device = r->device;
  c.page_size = 16;
  c.kv_budget_pages = 256;
  c.max_batch = SEQS;
  c.max_seqs = 2 * SEQS;
  c.max_seq_len = 512;
  c.max_q_tokens = CAP;
  c.graph_modes = 1u << FATTN_MODE_DECODE;
  if (fattn_create(&c, &m, &r->ctx, why, sizeof why) != FATTN_OK) {
    snprintf(r->failed, sizeof r->failed, "fattn_create on device %d: %s", r->device, why);
    goto out;
  }
  TRY(r, "stream", cudaStreamCreate(&r->stream) == cudaSuccess);
  TRY(r, "buffers", cudaMalloc(&r->q, (size_t)CAP * HQ * D * 2) == cudaSuccess &&
                        cudaMalloc(&r->out, (size_t)CAP * HQ * D * 2) == cudaSuccess &&
                        cudaMalloc(&r->k, (size_t)CAP * HKV * D * 2) == cudaSuccess &&
                        cudaMalloc(&r->v, (size_t)CAP * HKV * D * 2) == cudaSuccess &&
                        cudaMalloc((void **)&r->lse, (size_t)CAP * HQ * 4) == cudaSuccess);
  TRY(r, "random data", fattn_test_gpu_randn(r->q, (size_t)CAP * HQ * D, FATTN_DTYPE_BF16, 1.f, r->seed) == 0 &&
                            fattn_test_gpu_randn(r->k, (size_t)CAP * HKV * D, FATTN_DTYPE_BF16, 1.f, r->seed + 1) == 0 &&
                            fattn_test_gpu_randn(r->v, (size_t)CAP * HKV * D, FATTN_DTYPE_BF16, 1.f, r->seed + 2) == 0 &&
                            cudaDeviceSynchronize() == cudaSuccess);
  uint32_t ids[SEQS], lens[SEQS];
  for (uint32_t i = 0; i < SEQS; i++) {
    lens[i] = 17 + 13 * i + (uint32_t)(r->seed % 7);
    TRY(r, "fattn_seq_open", fattn_seq_open(r->ctx, &ids[i]) == FATTN_OK);
    TRY(r, "fattn_seq_reserve", fattn_seq_reserve(r->ctx, ids[i], lens[i]) == FATTN_OK);
  }
  fattn_batch b = FATTN_BATCH_INIT;
  b.mode = FATTN_MODE_PREFILL, b.num_seqs = SEQS, b.seq_ids = ids, b.q_lens = lens;
  TRY(r, "fattn_plan (prefill)", fattn_plan(r->ctx, &b, r->stream) == FATTN_OK);
  layers(r, r->stream);
  TRY(r, "prefill", !r->failed[0] && cudaStreamSynchronize(r->stream) == cudaSuccess);
  if (r->with) pthread_barrier_wait(&r->with->set_up), pthread_mutex_lock(&r->with->capture);
  fattn_status captured = fattn_graph_capture(r->ctx, FATTN_MODE_DECODE, SEQS, layers, r);
  if (r->with) pthread_mutex_unlock(&r->with->capture), pthread_barrier_wait(&r->with->captured);
  met = 1;
  TRY(r, "capture", !r->failed[0] && captured == FATTN_OK);
  b = (fattn_batch)FATTN_BATCH_INIT;
  b.num_seqs = SEQS, b.seq_ids = ids;
  for (uint32_t s = 0; s < STEPS; s++) {
    for (uint32_t i = 0; i < SEQS; i++)
      TRY(r, "fattn_seq_reserve", fattn_seq_reserve(r->ctx, ids[i], lens[i] + 1 + s) == FATTN_OK);
    if (s % 2) {
      TRY(r, "fattn_graph_launch", fattn_graph_launch(r->ctx, &b, r->stream) == FATTN_OK);
    } else {
      TRY(r, "fattn_plan", fattn_plan(r->ctx, &b, r->stream) == FATTN_OK);
      layers(r, r->stream);
      TRY(r, "eager step", !r->failed[0]);
    }
    TRY(r, "copy back",
        cudaMemcpyAsync(r->got + (size_t)s * SEQS * HQ * D, r->out, (size_t)SEQS * HQ * D * 2, cudaMemcpyDeviceToHost,
                        r->stream) == cudaSuccess &&
            cudaMemcpyAsync(r->got_lse + (size_t)s * SEQS * HQ, r->lse, (size_t)SEQS * HQ * 4, cudaMemcpyDeviceToHost,
                            r->stream) == cudaSuccess &&
            cudaStreamSynchronize(r->stream) == cudaSuccess);
  }
  TRY(r, "fattn_check", fattn_check(r->ctx) == FATTN_OK);
out:
  if (r->with && !met) pthread_barrier_wait(&r->with->set_up), pthread_barrier_wait(&r->with->captured);
  if (r->stream) cudaStreamSynchronize(r->stream);
  void *bufs[5] = {r->q, r->k, r->v, r->out, r->lse};
  for (int i = 0; i < 5; i++) cudaFree(bufs[i]);
  if (r->stream) cudaStreamDestroy(r->stream);
  if (r->ctx && fattn_destroy(r->ctx, 1) != FATTN_OK && !r->failed[0])
    snprintf(r->failed, sizeof r->failed, "fattn_destroy: %s", fattn_detail(r->ctx));
  r->ctx = NULL;
  return NULL;
}

static void run_init(run *r, int device, uint64_t seed) {
  memset(r, 0, sizeof *r);
  r->device = device, r->seed = seed;
  r->got = fattn_test_xmalloc((size_t)STEPS * SEQS * HQ * D * 2);
  r->got_lse = fattn_test_xmalloc((size_t)STEPS * SEQS * HQ * 4);
}

static void run_free(run *r) { free(r->got), free(r->got_lse); }

/* Scripts of seeds 1 and 2 on the given devices: alone, one after the other, then from two
 * threads at once; each thread's outputs equal its script's alone, bit for bit. */
static void alone_then_together(int dev0, int dev1) {
  run alone[2], both[2];
  run_init(&alone[0], dev0, 1), run_init(&alone[1], dev1, 2);
  run_init(&both[0], dev0, 1), run_init(&both[1], dev1, 2);
  for (int i = 0; i < 2; i++) {
    script(&alone[i]);
    ck_assert_msg(!alone[i].failed[0], "alone %d: %s", i, alone[i].failed);
  }
  together with;
  pthread_mutex_init(&with.capture, NULL);
  pthread_barrier_init(&with.set_up, NULL, 2);
  pthread_barrier_init(&with.captured, NULL, 2);
  pthread_t t[2];
  for (int i = 0; i < 2; i++) {
    both[i].with = &with;
    ck_assert_int_eq(pthread_create(&t[i], NULL, script, &both[i]), 0);
  }
  for (int i = 0; i < 2; i++) ck_assert_int_eq(pthread_join(t[i], NULL), 0);
  pthread_barrier_destroy(&with.set_up), pthread_barrier_destroy(&with.captured);
  pthread_mutex_destroy(&with.capture);
  for (int i = 0; i < 2; i++) {
    ck_assert_msg(!both[i].failed[0], "thread %d: %s", i, both[i].failed);
    ck_assert_msg(memcmp(both[i].got, alone[i].got, (size_t)STEPS * SEQS * HQ * D * 2) == 0,
                  "thread %d's outputs differ from its script's alone", i);
    ck_assert_msg(memcmp(both[i].got_lse, alone[i].got_lse, (size_t)STEPS * SEQS * HQ * 4) == 0,
                  "thread %d's LSE differs from its script's alone", i);
    run_free(&alone[i]), run_free(&both[i]);
  }
}

START_TEST(two_contexts_two_threads_one_gpu) { alone_then_together(0, 0); }
END_TEST

/* One context per device, from one thread per device (skipped on one GPU). */
START_TEST(two_contexts_two_threads_two_gpus) {
  if (fattn_test_cuda_devices() < 2) FATTN_TEST_SKIP("needs 2 CUDA devices, found %d", fattn_test_cuda_devices());
  alone_then_together(0, 1);
}
END_TEST

/* fattn_create and fattn_destroy leave the context's device current; a step on a device other
 * than the context's fails with FATTN_ERR_STATE, the detail naming both (needs 2 devices). */
START_TEST(calls_check_the_current_device) {
  const int n = fattn_test_cuda_devices(), other = n > 1 ? 1 : 0;
  ck_assert_int_eq(cudaSetDevice(0), cudaSuccess);
  fattn_config c;
  fattn_model m;
  fattn_test_small(&c, &m);
  m.head_dim = D;
  c.device = other;
  fattn_ctx *ctx = NULL;
  ck_assert_msg(fattn_create(&c, &m, &ctx, detail, sizeof detail) == FATTN_OK, "%s", detail);
  int now = -1;
  ck_assert_int_eq(cudaGetDevice(&now), cudaSuccess);
  ck_assert_int_eq(now, other);
  ck_assert_int_eq(cudaSetDevice(0), cudaSuccess);
  uint32_t s;
  ck_assert_ok(fattn_seq_open(ctx, &s)); /* host-side calls take any current device */
  ck_assert_ok(fattn_seq_reserve(ctx, s, 5));
  fattn_batch b = FATTN_BATCH_INIT;
  b.num_seqs = 1, b.seq_ids = &s;
  if (other != 0) {
    ck_assert_status(fattn_plan(ctx, &b, NULL), FATTN_ERR_STATE);
    ck_assert_msg(strstr(fattn_detail(ctx), "current CUDA device is 0") && strstr(fattn_detail(ctx), "device 1"),
                  "detail: %s", fattn_detail(ctx));
    ck_assert_int_eq(cudaSetDevice(other), cudaSuccess);
  }
  ck_assert_ok(fattn_plan(ctx, &b, NULL));
  ck_assert_int_eq(cudaSetDevice(0), cudaSuccess);
  if (other != 0) /* the device is checked before the arguments */
    ck_assert_status(fattn_store_kv(ctx, 0, NULL, NULL, NULL), FATTN_ERR_STATE);
  ck_assert_ok(fattn_destroy(ctx, 1)); /* from device 0 too */
  ck_assert_int_eq(cudaGetDevice(&now), cudaSuccess);
  ck_assert_int_eq(now, other);
}
END_TEST

FATTN_SUITE("gpu_threads", FATTN_TEST_GPU, two_contexts_two_threads_one_gpu, two_contexts_two_threads_two_gpus,
            calls_check_the_current_device)
