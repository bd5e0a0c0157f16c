/* scheduler.c: a continuous-batching serving loop over fattn's public API alone: arrivals,
 * chunked prefill, prefix sharing by fork, decode (CUDA graphs on a GPU), speculative rounds.
 * Runs on the CPU backend; scheduler --device N runs it on CUDA device N. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fattn.h"

/* The CUDA runtime calls the GPU path makes, as cuda_runtime_api.h declares them (cudaError_t
 * is an int-sized enum, 0 success; streams are pointers), so that this file includes fattn.h
 * alone. fattn's static link brings cudart in; the CPU path calls none of them. */
int cudaMalloc(void **ptr, size_t bytes);
int cudaMemcpy(void *dst, const void *src, size_t bytes, int kind); /* 1: host to device */
int cudaFree(void *ptr);
int cudaStreamCreate(void **stream);
int cudaStreamSynchronize(void *stream);
int cudaStreamDestroy(void *stream);

enum { LAYERS = 2, HQ = 4, HKV = 2, D = 64 };                 /* the model */
enum { MAX_BATCH = 8, TOPK = 2, DRAFT = 4, MAX_Q = 64 };        /* the config */
enum { REQUESTS = 16, PREFIX = 32, CHUNK = 24, SPEC_EVERY = 3 }; /* the workload */

typedef struct request {
  uint32_t seq, prompt, done, gen, made; /* prompt tokens prefilled (done), tokens generated (made) */
  int state;                             /* 0 waiting, 1 prefill, 2 decode, 3 finished */
} request;

typedef struct server {
  fattn_ctx *ctx;
  void *stream;                      /* NULL on the CPU backend */
  void *q, *k, *v, *out;             /* MAX_Q tokens each, bf16 (device memory on a GPU) */
  int graphs;                        /* decode steps replay captured graphs */
  unsigned long long tokens, steps;
} server;

static void check(const fattn_ctx *ctx, fattn_status st, const char *call) {
  if (st == FATTN_OK) return;
  fprintf(stderr, "scheduler: %s: %s: %s\n", call, fattn_status_name(st), fattn_detail(ctx));
  exit(1);
}
#define CHECK(call) check(S->ctx, (call), #call)

/* Every layer of the planned step: its new K/V into the cache, then attention. It is also the
 * body fattn_graph_capture records, on the stream it is given. */
static void layers(void *user, void *stream) {
  server *S = user;
  for (uint32_t l = 0; l < LAYERS; l++) {
    CHECK(fattn_store_kv(S->ctx, l, S->k, S->v, stream));
    CHECK(fattn_attend(S->ctx, l, S->q, S->out, NULL, stream));
  }
}

/* One step of mode over n entries (DRAFT_DECODE: n requests of TOPK branch ids each). */
static void step(server *S, fattn_mode mode, uint32_t n, const uint32_t *ids, const uint32_t *q_lens,
                 const uint64_t *tree, uint32_t q_tokens) {
  fattn_batch b = FATTN_BATCH_INIT;
  b.mode = mode;
  b.num_seqs = n;
  b.seq_ids = ids;
  b.q_lens = q_lens; /* NULL: the mode's default (1; DRAFT for TARGET_VERIFY) */
  b.tree_mask = tree;
  if (S->graphs && mode == FATTN_MODE_DECODE) { /* plans into the bucket and replays its graph */
    CHECK(fattn_graph_launch(S->ctx, &b, S->stream));
  } else {
    CHECK(fattn_plan(S->ctx, &b, S->stream));
    layers(S, S->stream);
  }
  S->tokens += q_tokens;
  S->steps++;
}

static uint32_t length(server *S, uint32_t seq) {
  uint32_t n;
  CHECK(fattn_seq_length(S->ctx, seq, &n));
  return n;
}

/* Draft TOPK branches a request and one token each, verify DRAFT tokens with a tree, accept
 * some, cut the rest off, extend the draft over the accepted. One context plays the draft model
 * here to stay short; a runtime gives the draft model a context of its own. */
static void speculate(server *S, request **R, uint32_t n, uint32_t *rng) {
  uint32_t seqs[MAX_BATCH], br[MAX_BATCH * TOPK], len[MAX_BATCH], acc[MAX_BATCH];
  uint64_t tree[MAX_BATCH * DRAFT];
  const uint64_t rows[DRAFT] = {0x1, 0x3, 0x5, 0xb}; /* draft 0 the root; 1, 2 its children; 3 under 1 */
  for (uint32_t i = 0; i < n; i++) {
    seqs[i] = R[i]->seq, len[i] = length(S, seqs[i]);
    for (uint32_t j = 0; j < TOPK; j++) { /* branches share the pages; the first write copies one */
      CHECK(fattn_seq_fork(S->ctx, seqs[i], len[i], &br[i * TOPK + j]));
      CHECK(fattn_seq_reserve(S->ctx, br[i * TOPK + j], len[i] + 1));
    }
    memcpy(&tree[i * DRAFT], rows, sizeof rows);
  }
  step(S, FATTN_MODE_DRAFT_DECODE, n, br, NULL, NULL, n * TOPK);
  for (uint32_t j = 0; j < n * TOPK; j++) CHECK(fattn_seq_close(S->ctx, br[j]));
  for (uint32_t i = 0; i < n; i++) CHECK(fattn_seq_reserve(S->ctx, seqs[i], len[i] + DRAFT));
  step(S, FATTN_MODE_TARGET_VERIFY, n, seqs, NULL, tree, n * DRAFT);
  for (uint32_t i = 0; i < n; i++) {
    *rng = *rng * 1664525u + 1013904223u;
    acc[i] = 1 + (*rng >> 16) % DRAFT; /* what the target's sampling would accept */
    CHECK(fattn_seq_truncate(S->ctx, seqs[i], len[i] + acc[i]));
    R[i]->made += acc[i];
  }
  uint32_t accepted = 0;
  for (uint32_t i = 0; i < n; i++) accepted += acc[i];
  step(S, FATTN_MODE_DRAFT_EXTEND, n, seqs, acc, NULL, accepted);
}

static void *buffer(server *S, const void *host, size_t bytes) {
  void *p = NULL;
  if (!S->stream) {
    if (!(p = malloc(bytes))) exit(1);
    memcpy(p, host, bytes);
  } else if (cudaMalloc(&p, bytes) != 0 || cudaMemcpy(p, host, bytes, 1) != 0) {
    fprintf(stderr, "scheduler: cudaMalloc of %zu bytes failed\n", bytes);
    exit(1);
  }
  return p;
}

int main(int argc, char **argv) {
  int device = FATTN_DEVICE_CPU;
  if (argc == 3 && strcmp(argv[1], "--device") == 0) device = atoi(argv[2]);
  else if (argc != 1) return fprintf(stderr, "usage: scheduler [--device N]\n"), 2;
  fattn_model model = FATTN_MODEL_INIT;
  model.num_layers = LAYERS, model.num_q_heads = HQ, model.num_kv_heads = HKV, model.head_dim = D;
  fattn_config cfg = FATTN_CONFIG_INIT;
  cfg.device = device;
  cfg.page_size = 16;
  cfg.kv_budget_pages = 192;
  cfg.max_seqs = 1 + MAX_BATCH * (1 + TOPK); /* the shared prefix, requests, draft branches */
  cfg.max_batch = MAX_BATCH;
  cfg.max_seq_len = 256;
  cfg.max_q_tokens = MAX_Q;
  cfg.spec_topk = TOPK, cfg.spec_steps = 1, cfg.spec_draft_tokens = DRAFT;
  cfg.graph_modes = device >= 0 ? 1u << FATTN_MODE_DECODE : 0u;
  server s = {0}, *S = &s;
  char detail[256];
  fattn_status st = fattn_create(&cfg, &model, &S->ctx, detail, sizeof detail);
  if (st) return fprintf(stderr, "scheduler: fattn_create: %s: %s\n", fattn_status_name(st), detail), 1;
  if (device >= 0 && cudaStreamCreate(&S->stream) != 0) return fprintf(stderr, "scheduler: no stream\n"), 1;
  static uint16_t host[MAX_Q * HQ * D];
  uint32_t rng = 7;
  for (size_t i = 0; i < sizeof host / 2; i++) host[i] = (uint16_t)(0x3c00u + (i * 2654435761u >> 24) % 256u);
  S->q = buffer(S, host, (size_t)MAX_Q * HQ * D * 2), S->out = buffer(S, host, (size_t)MAX_Q * HQ * D * 2);
  S->k = buffer(S, host, (size_t)MAX_Q * HKV * D * 2), S->v = buffer(S, host, (size_t)MAX_Q * HKV * D * 2);
  if (device >= 0) { /* one graph per decode bucket (1, 2, 4, 8), captured before serving */
    for (uint32_t bs = 1; bs <= MAX_BATCH; bs *= 2) CHECK(fattn_graph_capture(S->ctx, FATTN_MODE_DECODE, bs, layers, S));
    S->graphs = 1;
  }

  /* The shared system prompt, prefilled once; half the requests fork it instead of recomputing. */
  uint32_t prefix, plen = PREFIX;
  CHECK(fattn_seq_open(S->ctx, &prefix));
  CHECK(fattn_seq_reserve(S->ctx, prefix, PREFIX));
  step(S, FATTN_MODE_PREFILL, 1, &prefix, &plen, NULL, PREFIX);

  request req[REQUESTS];
  for (uint32_t r = 0; r < REQUESTS; r++) {
    rng = rng * 1664525u + 1013904223u;
    req[r] = (request){0, PREFIX + 8 + (rng >> 16) % 64, 0, 6 + (rng >> 8) % 12, 0, 0};
  }
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  uint32_t finished = 0, active = 0, arrived = 0;
  for (uint32_t it = 0; finished < REQUESTS; it++) {
    /* Arrivals: one a step while the batch has room. */
    if (arrived < REQUESTS && active < MAX_BATCH && arrived <= it) {
      request *q = &req[arrived];
      if (arrived % 2 == 0) { /* shares the system prompt: pages by reference */
        CHECK(fattn_seq_fork(S->ctx, prefix, PREFIX, &q->seq));
        q->done = PREFIX;
      } else {
        CHECK(fattn_seq_open(S->ctx, &q->seq));
      }
      q->state = 1, arrived++, active++;
    }
    /* Chunked prefill: each prefilling request's next chunk attends over all its KV so far. */
    uint32_t ids[MAX_BATCH], ql[MAX_BATCH], n = 0, budget = MAX_Q;
    request *R[MAX_BATCH];
    for (uint32_t r = 0; r < arrived && budget; r++) {
      request *q = &req[r];
      if (q->state != 1) continue;
      uint32_t c = q->prompt - q->done < CHUNK ? q->prompt - q->done : CHUNK;
      c = c < budget ? c : budget;
      CHECK(fattn_seq_reserve(S->ctx, q->seq, q->done + c));
      R[n] = q, ids[n] = q->seq, ql[n++] = c, budget -= c;
    }
    if (n) step(S, FATTN_MODE_PREFILL, n, ids, ql, NULL, MAX_Q - budget);
    for (uint32_t i = 0; i < n; i++)
      if ((R[i]->done += ql[i]) == R[i]->prompt) R[i]->state = 2;
    /* Decode every request past its prompt: a plain step, or every SPEC_EVERY-th a round. */
    n = 0;
    for (uint32_t r = 0; r < arrived; r++)
      if (req[r].state == 2) R[n] = &req[r], ids[n++] = req[r].seq;
    if (!n) continue;
    if (it % SPEC_EVERY == SPEC_EVERY - 1) {
      speculate(S, R, n, &rng);
    } else {
      for (uint32_t i = 0; i < n; i++) {
        CHECK(fattn_seq_reserve(S->ctx, ids[i], length(S, ids[i]) + 1));
        R[i]->made++;
      }
      step(S, FATTN_MODE_DECODE, n, ids, NULL, NULL, n);
    }
    for (uint32_t i = 0; i < n; i++)
      if (R[i]->made >= R[i]->gen) { /* finished: its pages go back (the shared ones lose a reference) */
        CHECK(fattn_seq_close(S->ctx, R[i]->seq));
        R[i]->state = 3, finished++, active--;
      }
  }
  if (S->stream) cudaStreamSynchronize(S->stream);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  const double secs = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
  CHECK(fattn_seq_close(S->ctx, prefix));
  fattn_stats stats = FATTN_STATS_INIT;
  CHECK(fattn_get_stats(S->ctx, &stats));
  CHECK(fattn_check(S->ctx));
  printf("scheduler: %u requests, %llu steps, %llu tokens in %.3f s: %.0f tokens/s on %s; "
         "%llu copy-on-write pages; fattn_check OK, %u of %u pages free\n",
         REQUESTS, S->steps, S->tokens, secs, (double)S->tokens / secs, device >= 0 ? "the GPU" : "the CPU backend",
         (unsigned long long)stats.cow_copies, stats.pages_free, stats.pages_total);
  void *bufs[4] = {S->q, S->k, S->v, S->out};
  for (int i = 0; i < 4; i++) S->stream ? (void)cudaFree(bufs[i]) : free(bufs[i]);
  if (S->stream) cudaStreamDestroy(S->stream);
  CHECK(fattn_destroy(S->ctx, 0));
  return 0;
}
