/* tp.c: Llama-3.1-70B's attention layer under tensor parallelism: N ranks, each a thread with a
 * fattn context over 64/N q and 8/N kv heads, a cuBLAS output projection and an all-reduce.
 *
 *   tp [N] [--check]      N in 1, 2, 4, 8 (default 2)
 *
 * Each rank runs a prefill of BATCH prompts, DECODE_STEPS decode steps eagerly and as many
 * replayed from its own CUDA graph, and a speculative round (TARGET_VERIFY of DRAFT tokens),
 * each step followed by y = O W_o[rank's rows] and the sum of y over the ranks. With a device
 * per rank the sum is NCCL's all-reduce (NCCL_NVLS_ENABLE=0: no NVLink multicast); with fewer
 * devices than ranks the ranks share them (several contexts on one device) and rank 0 adds the
 * others' y on its device, since NCCL takes one rank a device. It prints each phase's time and
 * tokens/s; --check runs one rank first and requires the N-rank y of the prefill and of the
 * speculative round to match it within bf16 tolerance, and every rank's fattn_check clean. */
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <math.h>
#include <nccl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fattn.h"

enum { HQ = 64, HKV = 8, D = 128, HIDDEN = HQ * D };                /* the model's attention */
enum { BATCH = 8, PROMPT = 512, DECODE_STEPS = 32, DRAFT = 4 };     /* the workload */
enum { MAX_Q = BATCH * PROMPT, PHASES = 4 };
static const char *const PHASE[PHASES] = {"prefill", "decode (eager)", "decode (graph)", "verify"};
static const uint32_t PHASE_TOKENS[PHASES] = {BATCH * PROMPT, BATCH * DECODE_STEPS, BATCH * DECODE_STEPS,
                                              BATCH * DRAFT};

#define DIE(...) (fprintf(stderr, "tp: " __VA_ARGS__), fputc('\n', stderr), exit(1))
#define CUDA(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) DIE("%s: %s", #x, cudaGetErrorString(e_)); } while (0)
#define BLAS(x) do { cublasStatus_t e_ = (x); if (e_ != CUBLAS_STATUS_SUCCESS) DIE("%s: cuBLAS status %d", #x, (int)e_); } while (0)
#define NCCL(x) do { ncclResult_t e_ = (x); if (e_ != ncclSuccess) DIE("%s: %s", #x, ncclGetErrorString(e_)); } while (0)
#define FATTN(r, x) do { fattn_status e_ = (x); if (e_ != FATTN_OK) DIE("rank %d: %s: %s", (r)->id, #x, fattn_detail((r)->ctx)); } while (0)

/* The layer's inputs, made once on the host from a seed, so that every N reads the same model:
 * q [MAX_Q, HQ, D], k and v [MAX_Q, HKV, D], W_o [HIDDEN, HIDDEN] (row-major, in x out). */
typedef struct inputs {
  uint16_t *q, *k, *v, *w;
} inputs;

typedef struct rank {
  int id, n, dev, nccl;
  uint32_t hq, hkv;
  const inputs *in;
  ncclComm_t comm;
  fattn_ctx *ctx;
  cublasHandle_t blas;
  cudaStream_t stream;
  void *q, *k, *v, *o, *w, *y; /* device: q/k/v/o [MAX_Q, heads, D], w [hq D, HIDDEN], y [MAX_Q, HIDDEN] */
  uint32_t ids[BATCH];         /* the batch's sequences */
  struct rank *all;            /* every rank, for the shared-device sum */
  pthread_barrier_t *bar;
  double ms[PHASES];
  uint16_t *y_prefill, *y_verify; /* rank 0: the summed y of those phases, on the host */
} rank;

static uint16_t bf16(float x) { /* round to nearest even */
  uint32_t u;
  memcpy(&u, &x, 4);
  return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
static float from_bf16(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float x;
  memcpy(&x, &u, 4);
  return x;
}
static void fill(uint16_t *p, size_t n, uint64_t seed, float scale) {
  for (size_t i = 0; i < n; i++) {
    uint64_t z = (seed + i) * 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    p[i] = bf16(scale * ((float)(z >> 40) / (float)(1u << 23) - 1.0f));
  }
}

/* This rank's heads of rows [tokens, heads_all, D] (heads_all = heads * n) into dev. */
static void copy_heads(void *dev, const uint16_t *host, uint32_t tokens, uint32_t heads, int id, cudaStream_t s,
                       uint32_t n) {
  const size_t width = (size_t)heads * D * 2, pitch = width * n;
  CUDA(cudaMemcpy2DAsync(dev, width, (const char *)host + (size_t)id * width, pitch, width, tokens,
                         cudaMemcpyHostToDevice, s));
}

/* The captured body and the eager step alike: the new K/V into the pages, then attention. */
static void attention(void *user, void *stream) {
  rank *r = user;
  FATTN(r, fattn_store_kv(r->ctx, 0, r->k, r->v, stream));
  FATTN(r, fattn_attend(r->ctx, 0, r->q, r->o, NULL, stream));
}

/* y = O W_o[this rank's rows], then y summed over the ranks (NCCL, or rank 0 on a shared
 * device; every rank's stream is drained there first). */
static void project_and_sum(rank *r, uint32_t tokens) {
  const float one = 1.0f, zero = 0.0f;
  const int k = (int)(r->hq * D);
  BLAS(cublasGemmEx(r->blas, CUBLAS_OP_N, CUBLAS_OP_N, HIDDEN, (int)tokens, k, &one, r->w, CUDA_R_16BF, HIDDEN, r->o,
                    CUDA_R_16BF, k, &zero, r->y, CUDA_R_16BF, HIDDEN, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  if (r->n == 1) return;
  if (r->nccl) {
    NCCL(ncclAllReduce(r->y, r->y, (size_t)tokens * HIDDEN, ncclBfloat16, ncclSum, r->comm, r->stream));
    return;
  }
  CUDA(cudaStreamSynchronize(r->stream));
  pthread_barrier_wait(r->bar);
  if (r->id == 0)
    for (int i = 1; i < r->n; i++)
      BLAS(cublasAxpyEx(r->blas, (int)tokens * HIDDEN, &one, CUDA_R_32F, r->all[i].y, CUDA_R_16BF, 1, r->y, CUDA_R_16BF,
                        1, CUDA_R_32F));
  CUDA(cudaStreamSynchronize(r->stream));
  pthread_barrier_wait(r->bar); /* the others' y stay as they are until rank 0 has read them */
}

/* One step of mode over the batch: plan and attention (eager, or the bucket's graph), then the
 * projection and the sum. */
static void step(rank *r, fattn_mode mode, uint32_t q_len, int graph) {
  uint32_t q_lens[BATCH];
  for (uint32_t i = 0; i < BATCH; i++) {
    uint32_t len;
    FATTN(r, fattn_seq_length(r->ctx, r->ids[i], &len));
    FATTN(r, fattn_seq_reserve(r->ctx, r->ids[i], len + q_len));
    q_lens[i] = q_len;
  }
  fattn_batch b = FATTN_BATCH_INIT;
  b.mode = mode, b.num_seqs = BATCH, b.seq_ids = r->ids, b.q_lens = q_lens;
  if (graph) {
    FATTN(r, fattn_graph_launch(r->ctx, &b, r->stream));
  } else {
    FATTN(r, fattn_plan(r->ctx, &b, r->stream));
    attention(r, r->stream);
  }
  project_and_sum(r, BATCH * q_len);
}

/* Times one phase: every rank starts together, and the phase's span is rank 0's. */
static void phase(rank *r, int p, void (*body)(rank *)) {
  cudaEvent_t a, b;
  CUDA(cudaEventCreate(&a));
  CUDA(cudaEventCreate(&b));
  CUDA(cudaStreamSynchronize(r->stream));
  pthread_barrier_wait(r->bar);
  CUDA(cudaEventRecord(a, r->stream));
  body(r);
  CUDA(cudaEventRecord(b, r->stream));
  CUDA(cudaEventSynchronize(b));
  float ms;
  CUDA(cudaEventElapsedTime(&ms, a, b));
  r->ms[p] = ms;
  CUDA(cudaEventDestroy(a));
  CUDA(cudaEventDestroy(b));
}

static void read_y(rank *r, uint16_t **dst, uint32_t tokens) {
  if (r->id != 0) return;
  *dst = malloc((size_t)tokens * HIDDEN * 2);
  if (!*dst) DIE("out of host memory");
  CUDA(cudaStreamSynchronize(r->stream));
  CUDA(cudaMemcpy(*dst, r->y, (size_t)tokens * HIDDEN * 2, cudaMemcpyDeviceToHost));
}

static void prefill(rank *r) { step(r, FATTN_MODE_PREFILL, PROMPT, 0); }
static void decode_eager(rank *r) {
  for (int i = 0; i < DECODE_STEPS; i++) step(r, FATTN_MODE_DECODE, 1, 0);
}
static void decode_graph(rank *r) {
  for (int i = 0; i < DECODE_STEPS; i++) step(r, FATTN_MODE_DECODE, 1, 1);
}
static void verify(rank *r) { step(r, FATTN_MODE_TARGET_VERIFY, DRAFT, 0); }

static void *run_rank(void *arg) {
  rank *r = arg;
  CUDA(cudaSetDevice(r->dev));
  CUDA(cudaStreamCreateWithFlags(&r->stream, cudaStreamNonBlocking));
  BLAS(cublasCreate(&r->blas));
  BLAS(cublasSetStream(r->blas, r->stream));
  fattn_model m = FATTN_MODEL_INIT;
  m.num_layers = 1, m.num_q_heads = r->hq, m.num_kv_heads = r->hkv, m.head_dim = D;
  fattn_config c = FATTN_CONFIG_INIT;
  c.device = r->dev;
  c.page_size = 16;
  c.max_batch = BATCH;
  c.max_seq_len = PROMPT + 2 * DECODE_STEPS + DRAFT;
  c.kv_budget_pages = BATCH * ((c.max_seq_len + 15u) / 16u);
  c.max_q_tokens = MAX_Q;
  c.spec_topk = 1, c.spec_steps = 1, c.spec_draft_tokens = DRAFT;
  c.graph_modes = 1u << FATTN_MODE_DECODE;
  char why[256];
  if (fattn_create(&c, &m, &r->ctx, why, sizeof why) != FATTN_OK) DIE("rank %d: fattn_create: %s", r->id, why);
  const size_t qb = (size_t)MAX_Q * r->hq * D * 2, kvb = (size_t)MAX_Q * r->hkv * D * 2;
  CUDA(cudaMalloc(&r->q, qb));
  CUDA(cudaMalloc(&r->o, qb));
  CUDA(cudaMalloc(&r->k, kvb));
  CUDA(cudaMalloc(&r->v, kvb));
  CUDA(cudaMalloc(&r->w, (size_t)r->hq * D * HIDDEN * 2));
  CUDA(cudaMalloc(&r->y, (size_t)MAX_Q * HIDDEN * 2));
  /* Inputs: this rank's heads of q, k, v and its rows of W_o (whole rows: contiguous). */
  copy_heads(r->q, r->in->q, MAX_Q, r->hq, r->id, r->stream, (uint32_t)r->n);
  copy_heads(r->k, r->in->k, MAX_Q, r->hkv, r->id, r->stream, (uint32_t)r->n);
  copy_heads(r->v, r->in->v, MAX_Q, r->hkv, r->id, r->stream, (uint32_t)r->n);
  CUDA(cudaMemcpyAsync(r->w, r->in->w + (size_t)r->id * r->hq * D * HIDDEN, (size_t)r->hq * D * HIDDEN * 2,
                       cudaMemcpyHostToDevice, r->stream));
  for (uint32_t i = 0; i < BATCH; i++) FATTN(r, fattn_seq_open(r->ctx, &r->ids[i]));
  FATTN(r, fattn_graph_capture(r->ctx, FATTN_MODE_DECODE, BATCH, attention, r));
  /* Untimed: cuBLAS's first GEMM and NCCL's first all-reduce set themselves up here (the
   * projection of whatever r->o holds; y is written again by the prefill). */
  project_and_sum(r, MAX_Q);
  phase(r, 0, prefill);
  read_y(r, &r->y_prefill, BATCH * PROMPT); /* the copies back stay out of the phases' times */
  phase(r, 1, decode_eager);
  phase(r, 2, decode_graph);
  phase(r, 3, verify);
  read_y(r, &r->y_verify, BATCH * DRAFT);
  FATTN(r, fattn_check(r->ctx));
  for (uint32_t i = 0; i < BATCH; i++) FATTN(r, fattn_seq_close(r->ctx, r->ids[i]));
  CUDA(cudaStreamSynchronize(r->stream));
  pthread_barrier_wait(r->bar); /* no rank frees its y while rank 0 may still read it */
  FATTN(r, fattn_destroy(r->ctx, 1));
  cudaFree(r->q), cudaFree(r->o), cudaFree(r->k), cudaFree(r->v), cudaFree(r->w), cudaFree(r->y);
  cublasDestroy(r->blas);
  cudaStreamDestroy(r->stream);
  return NULL;
}

/* Runs the layer over n ranks; rank 0's summed y of the prefill and the verify round come back. */
static void run_tp(int n, const inputs *in, uint16_t **y_prefill, uint16_t **y_verify) {
  int devices = 0;
  CUDA(cudaGetDeviceCount(&devices));
  rank *r = calloc((size_t)n, sizeof *r);
  ncclComm_t *comms = calloc((size_t)n, sizeof *comms);
  int *devs = calloc((size_t)n, sizeof *devs);
  pthread_t *th = calloc((size_t)n, sizeof *th);
  if (!r || !comms || !devs || !th) DIE("out of host memory");
  const int nccl = n > 1 && devices >= n;
  for (int i = 0; i < n; i++) devs[i] = i % devices;
  if (nccl) NCCL(ncclCommInitAll(comms, n, devs));
  pthread_barrier_t bar;
  pthread_barrier_init(&bar, NULL, (unsigned)n);
  for (int i = 0; i < n; i++) {
    r[i].id = i, r[i].n = n, r[i].dev = devs[i], r[i].nccl = nccl, r[i].comm = comms[i];
    r[i].hq = HQ / (uint32_t)n, r[i].hkv = HKV / (uint32_t)n, r[i].in = in, r[i].all = r, r[i].bar = &bar;
    if (pthread_create(&th[i], NULL, run_rank, &r[i])) DIE("pthread_create");
  }
  for (int i = 0; i < n; i++) pthread_join(th[i], NULL);
  printf("N %d: %s, %d device%s\n", n, n == 1 ? "one rank" : nccl ? "NCCL all-reduce, a device a rank"
                                                              : "ranks sharing devices, summed on rank 0's",
         n < devices ? n : devices, (n < devices ? n : devices) > 1 ? "s" : "");
  for (int p = 0; p < PHASES; p++) {
    const double steps = p == 1 || p == 2 ? DECODE_STEPS : 1;
    printf("  %-15s %9.3f ms  %9.3f ms a step  %10.0f tokens/s\n", PHASE[p], r[0].ms[p], r[0].ms[p] / steps,
           PHASE_TOKENS[p] / (r[0].ms[p] * 1e-3));
  }
  *y_prefill = r[0].y_prefill, *y_verify = r[0].y_verify;
  if (nccl)
    for (int i = 0; i < n; i++) ncclCommDestroy(comms[i]);
  pthread_barrier_destroy(&bar);
  free(r), free(comms), free(devs), free(th);
}

/* The largest |a - b| over the largest |a|. */
static double rel_diff(const uint16_t *a, const uint16_t *b, size_t n) {
  double diff = 0, scale = 0;
  for (size_t i = 0; i < n; i++) {
    const double x = from_bf16(a[i]), y = from_bf16(b[i]);
    diff = fmax(diff, fabs(x - y));
    scale = fmax(scale, fabs(x));
  }
  return scale > 0 ? diff / scale : diff;
}

int main(int argc, char **argv) {
  int n = 2, check_it = 0;
  /* Every kernel loads with the CUDA context, not at its first launch inside a timed phase
   * (unless the caller chose otherwise). */
  setenv("CUDA_MODULE_LOADING", "EAGER", 0);
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--check") == 0) check_it = 1;
    else n = atoi(argv[i]);
  }
  if (n != 1 && n != 2 && n != 4 && n != 8) DIE("N %d: must be 1, 2, 4 or 8 (it divides the 8 kv heads)", n);
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    printf("tp: needs a CUDA device; skipped\n");
    return 0;
  }
  setenv("NCCL_NVLS_ENABLE", "0", 1); /* no NVLink multicast (a shared host's GPUs) */
  inputs in;
  const size_t nq = (size_t)MAX_Q * HQ * D, nkv = (size_t)MAX_Q * HKV * D, nw = (size_t)HIDDEN * HIDDEN;
  in.q = malloc(nq * 2), in.k = malloc(nkv * 2), in.v = malloc(nkv * 2), in.w = malloc(nw * 2);
  if (!in.q || !in.k || !in.v || !in.w) DIE("out of host memory");
  fill(in.q, nq, 1, 1.0f), fill(in.k, nkv, 2, 1.0f), fill(in.v, nkv, 3, 1.0f);
  fill(in.w, nw, 4, 1.0f / sqrtf((float)HIDDEN));
  printf("tp: Llama-3.1-70B attention (64 q / 8 kv heads, d 128), bs %d: prefill %d, %d decode steps eager and "
         "%d from graphs, a verify round of %d; one layer, y = O W_o summed over the ranks\n",
         BATCH, PROMPT, DECODE_STEPS, DECODE_STEPS, DRAFT);
  uint16_t *ref_p = NULL, *ref_v = NULL, *y_p, *y_v;
  if (check_it && n > 1) run_tp(1, &in, &ref_p, &ref_v);
  run_tp(n, &in, &y_p, &y_v);
  int rc = 0;
  if (ref_p) {
    const double dp = rel_diff(ref_p, y_p, (size_t)BATCH * PROMPT * HIDDEN);
    const double dv = rel_diff(ref_v, y_v, (size_t)BATCH * DRAFT * HIDDEN);
    const double tol = 2e-2; /* bf16 y summed in another order: a few ulps of the largest */
    rc = !(dp <= tol && dv <= tol);
    printf("check N %d against N 1: prefill %.2e, verify %.2e of the largest |y| (tolerance %.0e): %s\n", n, dp, dv,
           tol, rc ? "FAILED" : "ok");
  }
  free(in.q), free(in.k), free(in.v), free(in.w), free(ref_p), free(ref_v), free(y_p), free(y_v);
  return rc;
}
