/* gpu_graph.c: CUDA graphs for DECODE, DRAFT_DECODE, TARGET_VERIFY and DRAFT_EXTEND, GQA and
 * MLA, captured by fattn or by the caller around fattn_graph_begin / end. Replay equals eager
 * execution bit for bit; plan + launch make no forbidden call; bad captures and arguments fail. */
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdlib.h>

#include "lib/dtype.h"
#include "attn/backend.h" /* fattn__fa3_available */
#include "lib/internal.h" /* FATTN__MAILBOX_POSTS */
#include "tests/support.h"
#include "tests/support_gpu.h"

enum { LAYERS = 2, HQ = 8, HKV = 2, D = 128, MAXB = 16, TOPK = 2, DRAFT = 4, CAP = 128 };

/* A rig's model: GQA at d 128 (every test), or DeepSeek-V3's absorbed MLA over 16 heads (a
 * tensor-parallel shard: one latent head, K the 576-wide latent row, O 512 wide, no V), on
 * AUTO's backend (FA2 for MLA) or on FA3's (the Hopper MLA kernel). */
typedef struct shape {
  uint32_t hq, hkv, d, dv;
  int mla;
  fattn_backend backend;
} shape;
static const shape GQA_SHAPE = {HQ, HKV, D, D, 0, FATTN_BACKEND_AUTO},
                   MLA_SHAPE = {16, 1, 576, 512, 1, FATTN_BACKEND_AUTO},
                   MLA90_SHAPE = {16, 1, 576, 512, 1, FATTN_BACKEND_FA3};

typedef struct rig {
  const shape *sh;
  fattn_ctx *ctx;
  cudaStream_t stream;
  void *q, *k, *v, *out; /* [cap, heads, D] bf16 */
  float *lse;            /* [cap, HQ] */
  void *stage[3];        /* q, k, v as layers_late's caller kernel writes them */
  int sync_inside, malloc_inside;
} rig;

static char detail[256];

static void layers(void *user, void *stream) {
  rig *r = user;
  for (uint32_t l = 0; l < LAYERS; l++) {
    fattn_store_kv(r->ctx, l, r->k, r->sh->mla ? NULL : r->v, stream);
    fattn_attend(r->ctx, l, r->q, r->out, r->lse, stream);
  }
  if (r->sync_inside) cudaStreamSynchronize((cudaStream_t)stream);
  if (r->malloc_inside) {
    void *p = NULL;
    if (cudaMalloc(&p, 1 << 20) == cudaSuccess) cudaFree(p);
  }
}

/* layers behind a caller kernel that writes q, k and v late, having released the kernels
 * after it at its first instruction: fattn's kernels must read none of them before their wait. */
static void layers_late(void *user, void *stream) {
  rig *r = user;
  for (uint32_t l = 0; l < LAYERS; l++) {
    void *to[3] = {r->q, r->k, r->v};
    for (int i = 0; i < 3; i++)
      fattn_test_gpu_copy_late(stream, to[i], r->stage[i], (size_t)CAP * (i ? HKV : HQ) * D * 2, 20);
    fattn_store_kv(r->ctx, l, r->k, r->v, stream);
    fattn_attend(r->ctx, l, r->q, r->out, r->lse, stream);
  }
}

/* Every graph mode for batches up to maxb and cap query tokens; sinks [LAYERS][HQ] or NULL. */
static void rig_config(const shape *sh, fattn_config *cp, fattn_model *mp, uint32_t maxb, uint32_t cap,
                       const float *sinks) {
  fattn_config c;
  fattn_model m;
  fattn_test_small(&c, &m);
  m.num_layers = LAYERS, m.num_q_heads = sh->hq, m.num_kv_heads = sh->hkv, m.head_dim = sh->d, m.head_dim_v = sh->dv;
  if (sh->mla) m.mla_latent_dim = sh->dv, m.mla_rope_dim = sh->d - sh->dv;
  m.sinks = sinks;
  c.prefill_backend = c.decode_backend = sh->backend;
  c.device = 0;
  c.page_size = 16;
  c.kv_budget_pages = 4096;
  c.max_batch = maxb;
  c.max_seqs = maxb * (1 + TOPK);
  c.max_seq_len = 2048;
  c.max_q_tokens = cap;
  c.spec_topk = TOPK, c.spec_steps = 2, c.spec_draft_tokens = DRAFT;
  c.graph_modes = (1u << FATTN_MODE_DECODE) | (1u << FATTN_MODE_DRAFT_DECODE) | (1u << FATTN_MODE_TARGET_VERIFY) |
                  (1u << FATTN_MODE_DRAFT_EXTEND);
  *cp = c, *mp = m;
}

/* A context of rig_config and buffers of cap query tokens. */
static void open_rig_shape(rig *r, const shape *sh, uint32_t maxb, uint32_t cap, const float *sinks) {
  memset(r, 0, sizeof *r);
  r->sh = sh;
  fattn_config c;
  fattn_model m;
  rig_config(sh, &c, &m, maxb, cap, sinks);
  ck_assert_msg(fattn_create(&c, &m, &r->ctx, detail, sizeof detail) == FATTN_OK, "%s", detail);
  ck_assert_int_eq(cudaStreamCreateWithFlags(&r->stream, cudaStreamNonBlocking), cudaSuccess);
  ck_assert_int_eq(cudaMalloc(&r->q, (size_t)cap * sh->hq * sh->d * 2), cudaSuccess);
  ck_assert_int_eq(cudaMalloc(&r->out, (size_t)cap * sh->hq * sh->dv * 2), cudaSuccess);
  ck_assert_int_eq(cudaMalloc(&r->k, (size_t)cap * sh->hkv * sh->d * 2), cudaSuccess);
  ck_assert_int_eq(cudaMalloc(&r->v, (size_t)cap * sh->hkv * sh->dv * 2), cudaSuccess);
  ck_assert_int_eq(cudaMalloc((void **)&r->lse, (size_t)cap * sh->hq * 4), cudaSuccess);
}
static void open_rig(rig *r, uint32_t maxb, uint32_t cap, const float *sinks) {
  open_rig_shape(r, &GQA_SHAPE, maxb, cap, sinks);
}

static void close_rig(rig *r) {
  ck_assert_ok(fattn_destroy(r->ctx, 1));
  cudaFree(r->q), cudaFree(r->out), cudaFree(r->k), cudaFree(r->v), cudaFree(r->lse);
  cudaStreamDestroy(r->stream);
}

static uint32_t rnd(uint64_t *s, uint32_t n) { return fattn_test_rand(s) % n; }

/* The default bucket (1, 2, 4, 8, 12, 16, ..) of n requests. */
static uint32_t default_bucket(uint32_t n) {
  uint32_t bucket = 0;
  while (bucket < n) bucket = bucket < 2 ? bucket + 1 : bucket < 8 ? bucket * 2 : bucket + 4;
  return bucket;
}

/* Who captures and replays a test's graphs: fattn (fattn_graph_capture, fattn_graph_launch), or
 * the caller, on its own stream around fattn_graph_begin / fattn_graph_end, replayed by
 * fattn_graph_plan and cudaGraphLaunch. */
typedef enum graphs_by { BY_FATTN, BY_CALLER } graphs_by;

/* The caller's graph of layers for (mode, bucket of bs), captured in global mode on the rig's
 * stream. */
static cudaGraphExec_t caller_capture(rig *r, fattn_mode mode, uint32_t bs) {
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  ck_assert_int_eq(cudaStreamBeginCapture(r->stream, cudaStreamCaptureModeGlobal), cudaSuccess);
  fattn_status st = fattn_graph_begin(r->ctx, mode, bs, r->stream);
  if (st == FATTN_OK) {
    layers(r, r->stream);
    st = fattn_graph_end(r->ctx);
  }
  ck_assert_int_eq(cudaStreamEndCapture(r->stream, &graph), cudaSuccess);
  ck_assert_msg(st == FATTN_OK, "mode %d bs %u: %s", mode, bs, fattn_detail(r->ctx));
  ck_assert_int_eq(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  cudaGraphDestroy(graph);
  return exec;
}

/* A random batch of mode with its sequences; returns the query tokens. */
static uint32_t make_batch(rig *r, fattn_mode mode, uint64_t *seed, fattn_batch *b, uint32_t *ids, uint32_t *q,
                           uint64_t *mask, uint32_t *opened) {
  uint32_t reqs = 1 + rnd(seed, MAXB), n = 0, tokens = 0;
  *opened = 0;
  for (uint32_t i = 0; i < reqs; i++) {
    uint32_t parent, len = 1 + rnd(seed, 1500);
    ck_assert_ok(fattn_seq_open(r->ctx, &parent));
    ck_assert_ok(fattn_seq_reserve(r->ctx, parent, len));
    ids[(*opened)++ + 64] = parent; /* remembered for closing, past the batch's ids */
    if (mode == FATTN_MODE_DRAFT_DECODE) {
      for (uint32_t k = 0; k < TOPK; k++, n++) {
        ck_assert_ok(fattn_seq_fork(r->ctx, parent, len, &ids[n]));
        ck_assert_ok(fattn_seq_reserve(r->ctx, ids[n], len + 1));
        ids[(*opened)++ + 64] = ids[n];
        q[n] = 1;
      }
      continue;
    }
    q[n] = mode == FATTN_MODE_DECODE ? 1 : mode == FATTN_MODE_TARGET_VERIFY ? DRAFT : 1 + rnd(seed, DRAFT + 1);
    ck_assert_ok(fattn_seq_reserve(r->ctx, parent, len + q[n]));
    ids[n++] = parent;
  }
  for (uint32_t i = 0; i < n; i++) tokens += q[i];
  for (uint32_t i = 0; i < reqs * DRAFT; i++) /* a random tree: a row sees itself and its parent's row */
    mask[i] = (1ull << (i % DRAFT)) | (i % DRAFT ? mask[i - i % DRAFT + rnd(seed, i % DRAFT)] : 0);
  fattn_batch x = FATTN_BATCH_INIT;
  x.mode = mode;
  x.num_seqs = reqs;
  x.seq_ids = ids;
  x.q_lens = q;
  x.tree_mask = mode == FATTN_MODE_TARGET_VERIFY ? mask : NULL;
  *b = x;
  return tokens;
}

static void read_out(rig *r, uint16_t *out, float *lse, uint32_t tokens) {
  ck_assert_int_eq(cudaStreamSynchronize(r->stream), cudaSuccess);
  ck_assert_int_eq(cudaMemcpy(out, r->out, (size_t)tokens * r->sh->hq * r->sh->dv * 2, cudaMemcpyDeviceToHost),
                   cudaSuccess);
  ck_assert_int_eq(cudaMemcpy(lse, r->lse, (size_t)tokens * r->sh->hq * 4, cudaMemcpyDeviceToHost), cudaSuccess);
}

/* reps replays a mode with random batch sizes and lengths from seed, on a rig of shape sh whose
 * heads take the sinks sink4[h % 4] (NULL: none): graph output and LSE equal eager bit for bit,
 * padding rows come out as zeros, plan + launch make no forbidden call, every LSE is finite
 * (every row sees its own slot), and a head whose sink is 150 above every score (N(0, 1) data at
 * d 128: scores within a few units of 0) has LSE 150 and O 0: its sink's term would overflow
 * float against the row's max. */
static void replay_every_mode(const shape *sh, const float *sink4, uint64_t seed, int reps, graphs_by by) {
  float sinks[LAYERS * HQ];
  for (uint32_t i = 0; sink4 && i < LAYERS * HQ; i++) sinks[i] = sink4[i % 4];
  ck_assert(!sink4 || sh->hq == HQ);
  rig r;
  open_rig_shape(&r, sh, MAXB, CAP, sink4 ? sinks : NULL);
  const fattn_mode modes[4] = {FATTN_MODE_DECODE, FATTN_MODE_DRAFT_DECODE, FATTN_MODE_TARGET_VERIFY,
                               FATTN_MODE_DRAFT_EXTEND};
  const size_t rows = (size_t)CAP * sh->hq, on = rows * sh->dv; /* O rows and elements of the buffers */
  uint16_t *eager = fattn_test_xmalloc(on * 2), *graph = fattn_test_xmalloc(on * 2);
  float *eager_lse = fattn_test_xmalloc(rows * 4), *graph_lse = fattn_test_xmalloc(rows * 4);
  long forbidden = 0;
  for (int m = 0; m < 4; m++) {
    cudaGraphExec_t caller[MAXB + 1] = {0}; /* BY_CALLER: the graph of each bucket */
    for (uint32_t b = 1; b <= MAXB; b++) {
      if (by == BY_FATTN) {
        ck_assert_msg(fattn_graph_capture(r.ctx, modes[m], b, layers, &r) == FATTN_OK, "%s", fattn_detail(r.ctx));
        continue;
      }
      if (caller[default_bucket(b)]) cudaGraphExecDestroy(caller[default_bucket(b)]);
      caller[default_bucket(b)] = caller_capture(&r, modes[m], b);
    }
    for (int rep = 0; rep < reps; rep++) {
      uint32_t ids[128], q[64], opened;
      uint64_t mask[MAXB * DRAFT];
      fattn_batch b;
      const uint32_t tokens = make_batch(&r, modes[m], &seed, &b, ids, q, mask, &opened);
      const size_t live = (size_t)tokens * sh->hq;
      ck_assert_int_eq(fattn_test_gpu_randn(r.q, rows * sh->d, FATTN_DTYPE_BF16, 1.0f, seed), 0);
      ck_assert_int_eq(fattn_test_gpu_randn(r.k, (size_t)CAP * sh->hkv * sh->d, FATTN_DTYPE_BF16, 1.0f, seed + 1), 0);
      ck_assert_int_eq(fattn_test_gpu_randn(r.v, (size_t)CAP * sh->hkv * sh->dv, FATTN_DTYPE_BF16, 1.0f, seed + 2), 0);
      ck_assert_int_eq(fattn_test_gpu_nan(r.out, on, FATTN_DTYPE_BF16), 0);
      ck_assert_int_eq(cudaDeviceSynchronize(), cudaSuccess);
      ck_assert_msg(fattn_plan(r.ctx, &b, r.stream) == FATTN_OK, "%s", fattn_detail(r.ctx));
      layers(&r, r.stream);
      read_out(&r, eager, eager_lse, tokens);
      ck_assert_int_eq(fattn_test_gpu_nan(r.out, on, FATTN_DTYPE_BF16), 0);
      ck_assert_int_eq(fattn_test_gpu_nan(r.lse, rows, 0), 0);
      ck_assert_int_eq(cudaDeviceSynchronize(), cudaSuccess);
      const uint32_t bucket = default_bucket(b.num_seqs); /* padding: its query tokens past the batch's */
      fattn_calls_reset();
      fattn_status st = by == BY_FATTN ? fattn_graph_launch(r.ctx, &b, r.stream) : fattn_graph_plan(r.ctx, &b, r.stream);
      forbidden += fattn_calls_forbidden();
      ck_assert_msg(st == FATTN_OK, "%s", fattn_detail(r.ctx));
      if (by == BY_CALLER) ck_assert_int_eq(cudaGraphLaunch(caller[bucket], r.stream), cudaSuccess);
      uint32_t per = modes[m] == FATTN_MODE_DRAFT_DECODE ? TOPK : modes[m] == FATTN_MODE_TARGET_VERIFY ? DRAFT
                     : modes[m] == FATTN_MODE_DRAFT_EXTEND ? DRAFT + 1 : 1;
      uint32_t bucket_tokens = bucket * per;
      if (modes[m] == FATTN_MODE_DRAFT_EXTEND) bucket_tokens = tokens + (bucket - b.num_seqs) * per;
      read_out(&r, graph, graph_lse, bucket_tokens);
      ck_assert_msg(memcmp(eager, graph, live * sh->dv * 2) == 0, "mode %d rep %d: O differs", modes[m], rep);
      ck_assert_msg(memcmp(eager_lse, graph_lse, live * 4) == 0, "mode %d rep %d: LSE differs", modes[m], rep);
      ck_assert_uint_eq(fattn_test_count_nan(eager, live * sh->dv, FATTN_DTYPE_BF16), 0);
      for (size_t i = live * sh->dv; i < (size_t)bucket_tokens * sh->hq * sh->dv; i++)
        ck_assert_msg(graph[i] == 0, "mode %d: padding row element %zu is 0x%04x, not 0", modes[m], i, graph[i]);
      for (uint32_t i = 0; i < live; i++) {
        const float sink = sink4 ? sink4[i % 4] : -INFINITY;
        ck_assert_msg(isfinite(eager_lse[i]), "mode %d rep %d: row %u (sink %g) has LSE %g", modes[m], rep, i,
                      (double)sink, (double)eager_lse[i]);
        if (sink != 150.0f) continue;
        ck_assert_msg(fabsf(eager_lse[i] - 150.0f) <= 1e-3f, "mode %d rep %d: row %u has LSE %g under a sink of 150",
                      modes[m], rep, i, (double)eager_lse[i]);
        for (uint32_t c = 0; c < sh->dv; c++)
          ck_assert_msg(fabsf(fattn__bf16_to_f32(eager[(size_t)i * sh->dv + c])) <= 1e-6f,
                        "mode %d rep %d: row %u under a sink of 150 has O[%u] = %g", modes[m], rep, i, c,
                        (double)fattn__bf16_to_f32(eager[(size_t)i * sh->dv + c]));
      }
      for (uint32_t i = 0; i < opened; i++) ck_assert_ok(fattn_seq_close(r.ctx, ids[64 + i]));
    }
    for (uint32_t b = 0; b <= MAXB; b++)
      if (caller[b]) cudaGraphExecDestroy(caller[b]);
  }
  ck_assert_int_eq(forbidden, 0);
  ck_assert_ok(fattn_check(r.ctx));
  close_rig(&r);
  free(eager), free(graph), free(eager_lse), free(graph_lse);
}

/* 200 replays a mode (4 under FATTN_TEST_QUICK), no sinks. */
START_TEST(replay_equals_eager_every_mode) {
  replay_every_mode(&GQA_SHAPE, NULL, 7, getenv("FATTN_TEST_QUICK") ? 4 : 200, BY_FATTN);
}
END_TEST

/* The same from graphs the caller captures around fattn_graph_begin / end (each bucket captured
 * again from every batch size it holds) and replays after fattn_graph_plan, 48 replays a mode. */
START_TEST(caller_graph_replay_equals_eager_every_mode) {
  replay_every_mode(&GQA_SHAPE, NULL, 37, getenv("FATTN_TEST_QUICK") ? 4 : 48, BY_CALLER);
}
END_TEST

/* The same for MLA (attn/fa2/fa2_mla.cu: packed rows of one or two queries, split-KV and the
 * combine in DECODE, DRAFT_DECODE and TARGET_VERIFY, tree masks), 24 replays a mode. */
START_TEST(mla_replay_equals_eager_every_mode) {
  replay_every_mode(&MLA_SHAPE, NULL, 29, getenv("FATTN_TEST_QUICK") ? 2 : 24, BY_FATTN);
}
END_TEST

/* And on the Hopper MLA kernel (attn/mla/mla90.cu), which FA3 runs MLA layers on; pages of 16
 * slots, so its producer gathers. FATTN_TEST_NO_MLA90 skips it, for a run where the kernel's own
 * suite failed (a hang here would take the rest of the run with it). */
START_TEST(mla90_replay_equals_eager_every_mode) {
#ifdef FATTN_HAVE_SM90A
  if (!fattn__fa3_available()) FATTN_TEST_SKIP("mla90 needs a compute capability 9.0 device");
  else if (getenv("FATTN_TEST_NO_MLA90")) FATTN_TEST_SKIP("FATTN_TEST_NO_MLA90 is set (gpu_mla90 failed first)");
  else replay_every_mode(&MLA90_SHAPE, NULL, 31, getenv("FATTN_TEST_QUICK") ? 2 : 24, BY_FATTN);
#else
  FATTN_TEST_SKIP("mla90 not built: CUDA_ARCHS lacks 90a");
#endif
}
END_TEST

/* Sinks 150 above every score, 150 below, none and 0, heads 0-3 and again 4-7 of both layers,
 * 16 replays a mode (2 under FATTN_TEST_QUICK). */
START_TEST(sinks_far_from_scores_replay) {
  static const float SINK[4] = {150.0f, -150.0f, -INFINITY, 0.0f};
  replay_every_mode(&GQA_SHAPE, SINK, 19, getenv("FATTN_TEST_QUICK") ? 2 : 16, BY_FATTN);
}
END_TEST

/* A captured body that synchronises or allocates fails the capture with a clear error. */
START_TEST(capture_that_syncs_or_allocates_fails) {
  rig r;
  open_rig(&r, MAXB, CAP, NULL);
  r.sync_inside = 1;
  ck_assert_status(fattn_graph_capture(r.ctx, FATTN_MODE_DECODE, 4, layers, &r), FATTN_ERR_CUDA);
  ck_assert_msg(strstr(fattn_detail(r.ctx), "must not allocate or synchronise"), "%s", fattn_detail(r.ctx));
  r.sync_inside = 0, r.malloc_inside = 1;
  fattn_status st = fattn_graph_capture(r.ctx, FATTN_MODE_DECODE, 4, layers, &r);
  ck_assert_msg(st == FATTN_ERR_CUDA, "capture with cudaMalloc inside returned %s", fattn_status_name(st));
  r.malloc_inside = 0;
  ck_assert_ok(fattn_graph_capture(r.ctx, FATTN_MODE_DECODE, 4, layers, &r));
  uint32_t s;
  ck_assert_ok(fattn_seq_open(r.ctx, &s));
  ck_assert_ok(fattn_seq_reserve(r.ctx, s, 10));
  fattn_batch b = FATTN_BATCH_INIT;
  b.num_seqs = 8, b.seq_ids = &s;
  ck_assert_status(fattn_graph_launch(r.ctx, &b, r.stream), FATTN_ERR_STATE); /* bucket 8 not captured */
  b.mode = FATTN_MODE_PREFILL, b.num_seqs = 1;
  ck_assert_status(fattn_graph_launch(r.ctx, &b, r.stream), FATTN_ERR_INVALID);
  close_rig(&r);
}
END_TEST

/* Replays of one bucket launched back to back behind a held device, nothing waited for between
 * them: each replay's prep node must read the post its own launch made in the bucket's mailbox,
 * so the last replay equals an eager step of the same batch made after it (same lengths, the
 * same K and V stored into the same slots). The mailbox holds FATTN__MAILBOX_POSTS posts: the
 * launches before the hold ends wait only from the one that would overwrite an unread post. */
START_TEST(back_to_back_replays_share_a_mailbox) {
  enum { BS = 4 };
  const int reps = getenv("FATTN_TEST_QUICK") ? 8 : 64; /* under compute-sanitizer: racecheck was killed at 64 */
  rig r;
  open_rig(&r, MAXB, CAP, NULL);
  ck_assert_ok(fattn_graph_capture(r.ctx, FATTN_MODE_DECODE, BS, layers, &r));
  uint32_t ids[BS];
  for (uint32_t i = 0; i < BS; i++) {
    ck_assert_ok(fattn_seq_open(r.ctx, &ids[i]));
    ck_assert_ok(fattn_seq_reserve(r.ctx, ids[i], 200 + 37 * i));
  }
  ck_assert_int_eq(fattn_test_gpu_randn(r.q, (size_t)CAP * HQ * D, FATTN_DTYPE_BF16, 1.0f, 41), 0);
  ck_assert_int_eq(fattn_test_gpu_randn(r.k, (size_t)CAP * HKV * D, FATTN_DTYPE_BF16, 1.0f, 42), 0);
  ck_assert_int_eq(fattn_test_gpu_randn(r.v, (size_t)CAP * HKV * D, FATTN_DTYPE_BF16, 1.0f, 43), 0);
  ck_assert_int_eq(fattn_test_gpu_nan(r.out, (size_t)CAP * HQ * D, FATTN_DTYPE_BF16), 0);
  ck_assert_int_eq(cudaDeviceSynchronize(), cudaSuccess);
  fattn_batch b = FATTN_BATCH_INIT;
  b.num_seqs = BS, b.seq_ids = ids;
  fattn_stats st0 = FATTN_STATS_INIT, st1 = FATTN_STATS_INIT;
  ck_assert_ok(fattn_get_stats(r.ctx, &st0));
  ck_assert_int_eq(fattn_test_gpu_hold(r.stream, 200000), 0); /* far longer than the launches below */
  for (int rep = 0; rep < reps; rep++) {
    for (uint32_t i = 0; i < BS; i++) {
      uint32_t len;
      ck_assert_ok(fattn_seq_length(r.ctx, ids[i], &len));
      ck_assert_ok(fattn_seq_reserve(r.ctx, ids[i], len + 1));
    }
    ck_assert_msg(fattn_graph_launch(r.ctx, &b, r.stream) == FATTN_OK, "%s", fattn_detail(r.ctx));
    if (rep <= FATTN__MAILBOX_POSTS) { /* the ring (4 slots) is not full yet: waits are the mailbox's */
      fattn_stats now = FATTN_STATS_INIT;
      ck_assert_ok(fattn_get_stats(r.ctx, &now));
      ck_assert_msg(now.staging_waits - st0.staging_waits == (rep == FATTN__MAILBOX_POSTS),
                    "launch %d behind the held device: %llu staging waits", rep + 1,
                    (unsigned long long)(now.staging_waits - st0.staging_waits));
    }
  }
  ck_assert_ok(fattn_get_stats(r.ctx, &st1));
  ck_assert_uint_eq(st1.steps_planned - st0.steps_planned, (uint64_t)reps);
  static uint16_t graph[BS * HQ * D], eager[BS * HQ * D];
  static float graph_lse[BS * HQ], eager_lse[BS * HQ];
  read_out(&r, graph, graph_lse, BS);
  ck_assert_ok(fattn_plan(r.ctx, &b, r.stream));
  layers(&r, r.stream);
  read_out(&r, eager, eager_lse, BS);
  ck_assert_uint_eq(fattn_test_count_nan(graph, (size_t)BS * HQ * D, FATTN_DTYPE_BF16), 0);
  ck_assert_msg(memcmp(eager, graph, sizeof graph) == 0, "the last of %d back-to-back replays differs from eager", reps);
  ck_assert_msg(memcmp(eager_lse, graph_lse, sizeof graph_lse) == 0, "LSE of the last replay differs from eager");
  for (uint32_t i = 0; i < BS; i++) ck_assert_ok(fattn_seq_close(r.ctx, ids[i]));
  ck_assert_ok(fattn_check(r.ctx));
  close_rig(&r);
}
END_TEST

/* A kernel of the caller's launched right after the last fattn_attend, chained by programmatic
 * dependent launch and waiting only on the grid before it, sees the whole output: every fattn
 * kernel, the split merge included when it has nothing to merge, ends only after the kernel
 * before it. Odd rounds: 256 short sequences, no entry split, so the merge grid has no work
 * and the decode kernel runs waves; even rounds: a few long ones, split. */
START_TEST(next_kernel_sees_the_whole_output) {
  enum { BS = 256 };
  rig r;
  open_rig(&r, BS, BS, NULL);
  void *copy;
  const size_t bytes = (size_t)BS * HQ * D * 2;
  ck_assert_int_eq(cudaMalloc(&copy, bytes), cudaSuccess);
  static uint16_t out[BS * HQ * D], seen[BS * HQ * D];
  uint64_t seed = 11;
  const int rounds = getenv("FATTN_TEST_QUICK") ? 2 : 24;
  for (int round = 0; round < rounds; round++) {
    const uint32_t bs = round & 1 ? BS : 1 + rnd(&seed, 4);
    uint32_t ids[BS];
    for (uint32_t i = 0; i < bs; i++) {
      const uint32_t len = round & 1 ? 64 + rnd(&seed, 160) : 1024 + rnd(&seed, 1000);
      ck_assert_ok(fattn_seq_open(r.ctx, &ids[i]));
      ck_assert_ok(fattn_seq_reserve(r.ctx, ids[i], len));
    }
    ck_assert_int_eq(fattn_test_gpu_randn(r.q, (size_t)BS * HQ * D, FATTN_DTYPE_BF16, 1.0f, seed), 0);
    ck_assert_int_eq(fattn_test_gpu_randn(r.k, (size_t)BS * HKV * D, FATTN_DTYPE_BF16, 1.0f, seed + 1), 0);
    ck_assert_int_eq(fattn_test_gpu_randn(r.v, (size_t)BS * HKV * D, FATTN_DTYPE_BF16, 1.0f, seed + 2), 0);
    ck_assert_int_eq(fattn_test_gpu_nan(r.out, (size_t)BS * HQ * D, FATTN_DTYPE_BF16), 0);
    ck_assert_int_eq(fattn_test_gpu_nan(copy, (size_t)BS * HQ * D, FATTN_DTYPE_BF16), 0);
    ck_assert_int_eq(cudaDeviceSynchronize(), cudaSuccess);
    fattn_batch b = FATTN_BATCH_INIT;
    b.num_seqs = bs, b.seq_ids = ids;
    ck_assert_msg(fattn_plan(r.ctx, &b, r.stream) == FATTN_OK, "%s", fattn_detail(r.ctx));
    layers(&r, r.stream);
    ck_assert_int_eq(fattn_test_gpu_copy_after(r.stream, copy, r.out, bytes), 0);
    ck_assert_int_eq(cudaStreamSynchronize(r.stream), cudaSuccess);
    ck_assert_int_eq(cudaMemcpy(out, r.out, (size_t)bs * HQ * D * 2, cudaMemcpyDeviceToHost), cudaSuccess);
    ck_assert_int_eq(cudaMemcpy(seen, copy, (size_t)bs * HQ * D * 2, cudaMemcpyDeviceToHost), cudaSuccess);
    ck_assert_uint_eq(fattn_test_count_nan(out, (size_t)bs * HQ * D, FATTN_DTYPE_BF16), 0);
    size_t differ = 0;
    for (size_t i = 0; i < (size_t)bs * HQ * D; i++) differ += out[i] != seen[i];
    ck_assert_msg(differ == 0, "round %d (bs %u): the next kernel read %zu of %zu output elements before they were final",
                  round, bs, differ, (size_t)bs * HQ * D);
    for (uint32_t i = 0; i < bs; i++) ck_assert_ok(fattn_seq_close(r.ctx, ids[i]));
  }
  cudaFree(copy);
  ck_assert_ok(fattn_check(r.ctx));
  close_rig(&r);
}
END_TEST

/* The caller's kernel before fattn_store_kv releases its dependents at its first instruction
 * and writes q, k and v 20 us after its wait (layers_late): the store and the decode kernel
 * launch at once and do their early work (metadata, earlier steps' rows) but read the new
 * tokens only after their waits. Eager and graph steps at bs 1 and 4 over long, split contexts
 * (the deep decode kind) equal a step whose inputs were copied before it, bit for bit. */
START_TEST(inputs_written_late_by_a_released_kernel) {
  rig r;
  open_rig(&r, MAXB, CAP, NULL);
  for (int i = 0; i < 3; i++) ck_assert_int_eq(cudaMalloc(&r.stage[i], (size_t)CAP * (i ? HKV : HQ) * D * 2), cudaSuccess);
  static uint16_t want[CAP * HQ * D], eager[CAP * HQ * D], graph[CAP * HQ * D];
  static float want_lse[CAP * HQ], eager_lse[CAP * HQ], graph_lse[CAP * HQ];
  const uint32_t sizes[2] = {1, 4};
  uint64_t seed = 11;
  const int rounds = getenv("FATTN_TEST_QUICK") ? 1 : 6;
  for (int z = 0; z < 2; z++) {
    const uint32_t bs = sizes[z];
    ck_assert_msg(fattn_graph_capture(r.ctx, FATTN_MODE_DECODE, bs, layers_late, &r) == FATTN_OK, "%s",
                  fattn_detail(r.ctx));
    for (int round = 0; round < rounds; round++) {
      uint32_t ids[4];
      for (uint32_t i = 0; i < bs; i++) {
        ck_assert_ok(fattn_seq_open(r.ctx, &ids[i]));
        ck_assert_ok(fattn_seq_reserve(r.ctx, ids[i], 600 + rnd(&seed, 1400)));
      }
      fattn_batch b = FATTN_BATCH_INIT;
      b.num_seqs = bs, b.seq_ids = ids;
      const size_t nq = (size_t)CAP * HQ * D, nkv = (size_t)CAP * HKV * D;
      ck_assert_int_eq(fattn_test_gpu_randn(r.stage[0], nq, FATTN_DTYPE_BF16, 1.0f, seed), 0);
      ck_assert_int_eq(fattn_test_gpu_randn(r.stage[1], nkv, FATTN_DTYPE_BF16, 1.0f, seed + 1), 0);
      ck_assert_int_eq(fattn_test_gpu_randn(r.stage[2], nkv, FATTN_DTYPE_BF16, 1.0f, seed + 2), 0);
      ck_assert_int_eq(cudaMemcpy(r.q, r.stage[0], nq * 2, cudaMemcpyDeviceToDevice), cudaSuccess);
      ck_assert_int_eq(cudaMemcpy(r.k, r.stage[1], nkv * 2, cudaMemcpyDeviceToDevice), cudaSuccess);
      ck_assert_int_eq(cudaMemcpy(r.v, r.stage[2], nkv * 2, cudaMemcpyDeviceToDevice), cudaSuccess);
      ck_assert_int_eq(cudaDeviceSynchronize(), cudaSuccess);
      ck_assert_msg(fattn_plan(r.ctx, &b, r.stream) == FATTN_OK, "%s", fattn_detail(r.ctx));
      layers(&r, r.stream);
      read_out(&r, want, want_lse, bs);
      for (int g = 0; g < 2; g++) {
        uint16_t *got = g ? graph : eager;
        float *got_lse = g ? graph_lse : eager_lse;
        ck_assert_int_eq(fattn_test_gpu_nan(r.q, nq, FATTN_DTYPE_BF16), 0);
        ck_assert_int_eq(fattn_test_gpu_nan(r.k, nkv, FATTN_DTYPE_BF16), 0);
        ck_assert_int_eq(fattn_test_gpu_nan(r.v, nkv, FATTN_DTYPE_BF16), 0);
        ck_assert_int_eq(fattn_test_gpu_nan(r.out, nq, FATTN_DTYPE_BF16), 0);
        ck_assert_int_eq(cudaDeviceSynchronize(), cudaSuccess);
        if (g) {
          ck_assert_msg(fattn_graph_launch(r.ctx, &b, r.stream) == FATTN_OK, "%s", fattn_detail(r.ctx));
        } else {
          ck_assert_msg(fattn_plan(r.ctx, &b, r.stream) == FATTN_OK, "%s", fattn_detail(r.ctx));
          layers_late(&r, r.stream);
        }
        read_out(&r, got, got_lse, bs);
        ck_assert_msg(memcmp(want, got, (size_t)bs * HQ * D * 2) == 0 && memcmp(want_lse, got_lse, (size_t)bs * HQ * 4) == 0,
                      "bs %u round %d: the %s step behind a late writer differs (%zu NaN)", bs, round,
                      g ? "graph" : "eager", fattn_test_count_nan(got, (size_t)bs * HQ * D, FATTN_DTYPE_BF16));
      }
      ck_assert_uint_eq(fattn_test_count_nan(want, (size_t)bs * HQ * D, FATTN_DTYPE_BF16), 0);
      for (uint32_t i = 0; i < bs; i++) ck_assert_ok(fattn_seq_close(r.ctx, ids[i]));
    }
  }
  for (int i = 0; i < 3; i++) cudaFree(r.stage[i]);
  ck_assert_ok(fattn_check(r.ctx));
  close_rig(&r);
}
END_TEST

/* Decode steps of one batch of 3 sequences (bucket 4: one padding entry), each run eagerly and
 * then from the caller's graph: fattn_graph_plan + cudaGraphLaunch equal fattn_plan + the layers
 * bit for bit at every step (the replay stores the step's K and V again into the same slots),
 * the padding rows come out as zeros, and the plan makes no forbidden call. */
START_TEST(caller_graph_steps_equal_eager_steps) {
  enum { BS = 3, BUCKET = 4 };
  rig r;
  open_rig(&r, MAXB, CAP, NULL);
  cudaGraphExec_t exec = caller_capture(&r, FATTN_MODE_DECODE, BS);
  uint32_t ids[BS];
  for (uint32_t i = 0; i < BS; i++) {
    ck_assert_ok(fattn_seq_open(r.ctx, &ids[i]));
    ck_assert_ok(fattn_seq_reserve(r.ctx, ids[i], 100 + 211 * i));
  }
  fattn_batch b = FATTN_BATCH_INIT;
  b.num_seqs = BS, b.seq_ids = ids;
  static uint16_t eager[BUCKET * HQ * D], graph[BUCKET * HQ * D];
  static float eager_lse[BUCKET * HQ], graph_lse[BUCKET * HQ];
  const int steps = getenv("FATTN_TEST_QUICK") ? 4 : 32;
  long forbidden = 0;
  for (int step = 0; step < steps; step++) {
    for (uint32_t i = 0; i < BS; i++) {
      uint32_t len;
      ck_assert_ok(fattn_seq_length(r.ctx, ids[i], &len));
      ck_assert_ok(fattn_seq_reserve(r.ctx, ids[i], len + 1));
    }
    ck_assert_int_eq(fattn_test_gpu_randn(r.q, (size_t)CAP * HQ * D, FATTN_DTYPE_BF16, 1.0f, 100 + step), 0);
    ck_assert_int_eq(fattn_test_gpu_randn(r.k, (size_t)CAP * HKV * D, FATTN_DTYPE_BF16, 1.0f, 200 + step), 0);
    ck_assert_int_eq(fattn_test_gpu_randn(r.v, (size_t)CAP * HKV * D, FATTN_DTYPE_BF16, 1.0f, 300 + step), 0);
    ck_assert_int_eq(fattn_test_gpu_nan(r.out, (size_t)CAP * HQ * D, FATTN_DTYPE_BF16), 0);
    ck_assert_int_eq(cudaDeviceSynchronize(), cudaSuccess);
    ck_assert_msg(fattn_plan(r.ctx, &b, r.stream) == FATTN_OK, "%s", fattn_detail(r.ctx));
    layers(&r, r.stream);
    read_out(&r, eager, eager_lse, BS);
    ck_assert_int_eq(fattn_test_gpu_nan(r.out, (size_t)CAP * HQ * D, FATTN_DTYPE_BF16), 0);
    ck_assert_int_eq(cudaDeviceSynchronize(), cudaSuccess);
    fattn_calls_reset();
    fattn_status st = fattn_graph_plan(r.ctx, &b, r.stream);
    forbidden += fattn_calls_forbidden();
    ck_assert_msg(st == FATTN_OK, "%s", fattn_detail(r.ctx));
    ck_assert_int_eq(cudaGraphLaunch(exec, r.stream), cudaSuccess);
    read_out(&r, graph, graph_lse, BUCKET);
    ck_assert_uint_eq(fattn_test_count_nan(eager, (size_t)BS * HQ * D, FATTN_DTYPE_BF16), 0);
    ck_assert_msg(memcmp(eager, graph, (size_t)BS * HQ * D * 2) == 0, "step %d: O differs", step);
    ck_assert_msg(memcmp(eager_lse, graph_lse, (size_t)BS * HQ * 4) == 0, "step %d: LSE differs", step);
    for (size_t i = (size_t)BS * HQ * D; i < (size_t)BUCKET * HQ * D; i++)
      ck_assert_msg(graph[i] == 0, "step %d: padding row element %zu is 0x%04x, not 0", step, i, graph[i]);
  }
  ck_assert_int_eq(forbidden, 0);
  for (uint32_t i = 0; i < BS; i++) ck_assert_ok(fattn_seq_close(r.ctx, ids[i]));
  ck_assert_ok(fattn_check(r.ctx));
  cudaGraphExecDestroy(exec);
  close_rig(&r);
}
END_TEST

/* fattn_graph_begin / end / plan refuse bad input with a status and a detail naming it, and
 * leave the step binding as it was: a stream that is not capturing, end and plan without a
 * capture, a mode without graph buffers, a batch size out of range, a second begin and any
 * plan, launch or capture while one is open; a capture that a synchronising call ended fails at
 * end and leaves its bucket unready. A good capture gives the step binding back at end. */
START_TEST(caller_graph_arguments_are_checked) {
  rig r;
  open_rig(&r, MAXB, CAP, NULL);
  uint32_t ids[2];
  for (uint32_t i = 0; i < 2; i++) {
    ck_assert_ok(fattn_seq_open(r.ctx, &ids[i]));
    ck_assert_ok(fattn_seq_reserve(r.ctx, ids[i], 10));
  }
  fattn_batch one = FATTN_BATCH_INIT, two = FATTN_BATCH_INIT;
  one.num_seqs = 1, one.seq_ids = ids;
  two.num_seqs = 2, two.seq_ids = ids;
  ck_assert_ok(fattn_plan(r.ctx, &two, r.stream)); /* an eager step: the binding the refusals keep */
  fattn__step step = r.ctx->step;
#define REFUSED(call, status, text)                                                                       \
  do {                                                                                                    \
    ck_assert_status((call), (status));                                                                   \
    ck_assert_msg(strstr(fattn_detail(r.ctx), text), "%s: detail '%s' lacks '%s'", #call,                \
                  fattn_detail(r.ctx), text);                                                             \
    ck_assert_msg(memcmp(&step, &r.ctx->step, sizeof step) == 0, "%s changed the step binding", #call);  \
  } while (0)
  REFUSED(fattn_graph_begin(r.ctx, FATTN_MODE_DECODE, 1, r.stream), FATTN_ERR_INVALID, "is not capturing");
  REFUSED(fattn_graph_end(r.ctx), FATTN_ERR_STATE, "fattn_graph_end: no capture is open");
  REFUSED(fattn_graph_plan(r.ctx, &one, r.stream), FATTN_ERR_STATE, "bucket 1 was never captured");
  ck_assert_int_eq(cudaStreamBeginCapture(r.stream, cudaStreamCaptureModeGlobal), cudaSuccess);
  REFUSED(fattn_graph_begin(r.ctx, FATTN_MODE_PREFILL, 1, r.stream), FATTN_ERR_INVALID, "mode 1 has no graph buffers");
  REFUSED(fattn_graph_begin(r.ctx, FATTN_MODE_DECODE, 0, r.stream), FATTN_ERR_INVALID, "batch_size 0");
  REFUSED(fattn_graph_begin(r.ctx, FATTN_MODE_DECODE, MAXB + 1, r.stream), FATTN_ERR_INVALID, "batch_size 17");
  ck_assert_ok(fattn_graph_begin(r.ctx, FATTN_MODE_DECODE, 1, r.stream));
  const fattn__step bound = r.ctx->step;
  ck_assert_msg(memcmp(&step, &bound, sizeof step) != 0, "fattn_graph_begin left the eager binding");
  step = bound;
  REFUSED(fattn_graph_begin(r.ctx, FATTN_MODE_DECODE, 2, r.stream), FATTN_ERR_STATE, "a capture is open");
  REFUSED(fattn_graph_plan(r.ctx, &one, r.stream), FATTN_ERR_STATE, "fattn_graph_plan: a capture is open");
  REFUSED(fattn_graph_launch(r.ctx, &one, r.stream), FATTN_ERR_STATE, "fattn_graph_launch: a capture is open");
  REFUSED(fattn_graph_capture(r.ctx, FATTN_MODE_DECODE, 1, layers, &r), FATTN_ERR_STATE, "a capture is open");
  layers(&r, r.stream);
  ck_assert_ok(fattn_graph_end(r.ctx));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  ck_assert_int_eq(cudaStreamEndCapture(r.stream, &graph), cudaSuccess);
  ck_assert_int_eq(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  cudaGraphDestroy(graph);
  step = r.ctx->step;
  ck_assert_msg(memcmp(&step, &bound, sizeof step) != 0, "fattn_graph_end kept the bucket's binding");
  REFUSED(fattn_graph_plan(r.ctx, &two, r.stream), FATTN_ERR_STATE, "bucket 2 was never captured");
  ck_assert_int_eq(cudaStreamBeginCapture(r.stream, cudaStreamCaptureModeGlobal), cudaSuccess);
  ck_assert_ok(fattn_graph_begin(r.ctx, FATTN_MODE_DECODE, 2, r.stream));
  ck_assert_int_ne(cudaStreamSynchronize(r.stream), cudaSuccess); /* ends the capture */
  REFUSED(fattn_graph_end(r.ctx), FATTN_ERR_CUDA, "must not allocate or synchronise");
  ck_assert_int_ne(cudaStreamEndCapture(r.stream, &graph), cudaSuccess);
  cudaGetLastError();
  REFUSED(fattn_graph_plan(r.ctx, &two, r.stream), FATTN_ERR_STATE, "bucket 2 was never captured");
#undef REFUSED
  ck_assert_ok(fattn_graph_plan(r.ctx, &one, r.stream)); /* bucket 1, from the good capture */
  ck_assert_int_eq(cudaGraphLaunch(exec, r.stream), cudaSuccess);
  ck_assert_int_eq(cudaStreamSynchronize(r.stream), cudaSuccess);
  for (uint32_t i = 0; i < 2; i++) ck_assert_ok(fattn_seq_close(r.ctx, ids[i]));
  ck_assert_ok(fattn_check(r.ctx));
  cudaGraphExecDestroy(exec);
  close_rig(&r);
}
END_TEST

/* Every default bucket (1, 2, 4, 8, 12, 16, 24, 32, then every 8 up to 256: 36) of every graph
 * mode captures in global mode at max_batch 256; a size past max_batch is refused; the memory
 * plan reports each mode's graph memory. */
START_TEST(capture_every_default_bucket) {
  rig r;
  open_rig(&r, 256, 256 * (DRAFT + 1), NULL);
  const fattn_mode modes[4] = {FATTN_MODE_DECODE, FATTN_MODE_DRAFT_DECODE, FATTN_MODE_TARGET_VERIFY,
                               FATTN_MODE_DRAFT_EXTEND};
  int captured = 0;
  for (int m = 0; m < 4; m++) {
    for (uint32_t b = 1; b <= 256; b = b < 8 ? b * 2 : b < 16 ? b + 4 : b + 8) {
      fattn_status st = fattn_graph_capture(r.ctx, modes[m], b, layers, &r);
      ck_assert_msg(st == FATTN_OK, "mode %d bucket %u: %s", modes[m], b, fattn_detail(r.ctx));
      captured++;
    }
    ck_assert_status(fattn_graph_capture(r.ctx, modes[m], 257, layers, &r), FATTN_ERR_INVALID);
  }
  ck_assert_int_eq(captured, 4 * 36);
  fattn_config c;
  fattn_model mo;
  rig_config(&GQA_SHAPE, &c, &mo, 256, 256 * (DRAFT + 1), NULL);
  fattn_memory_report rep = FATTN_MEMORY_REPORT_INIT;
  ck_assert_msg(fattn_memory_plan(&c, &mo, &rep, detail, sizeof detail) == FATTN_OK, "%s", detail);
  for (int m = 0; m < 4; m++) ck_assert_msg(rep.graph_bytes_per_mode[modes[m]] > 0, "mode %d: no graph bytes", modes[m]);
  ck_assert_ok(fattn_check(r.ctx));
  close_rig(&r);
}
END_TEST

FATTN_SUITE("gpu_graph", FATTN_TEST_GPU, replay_equals_eager_every_mode, mla_replay_equals_eager_every_mode,
            mla90_replay_equals_eager_every_mode, caller_graph_replay_equals_eager_every_mode,
            caller_graph_steps_equal_eager_steps, caller_graph_arguments_are_checked,
            capture_that_syncs_or_allocates_fails,
            back_to_back_replays_share_a_mailbox, next_kernel_sees_the_whole_output,
            inputs_written_late_by_a_released_kernel, capture_every_default_bucket, sinks_far_from_scores_replay)
