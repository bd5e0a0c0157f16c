/* graph.c: CUDA graph pools per (mode, batch-size bucket). Capture binds a bucket's static
 * metadata area and records the caller's layer loop (or opens it in the caller's own capture:
 * begin / end); launch plans into that area and replays (plan alone, for the caller's graph). */
#include <cuda_runtime_api.h>
#include <string.h>

#include "attn/plan.h"
#include "graph/graph.h"

/* Requests of a bucket become this many entries and query tokens each. */
static uint32_t entries_per_request(const fattn_ctx *ctx, fattn_mode mode) {
  return mode == FATTN_MODE_DRAFT_DECODE ? ctx->n.cfg.spec_topk : 1u;
}

static uint32_t q_per_entry(const fattn_ctx *ctx, fattn_mode mode) {
  switch (mode) {
    case FATTN_MODE_TARGET_VERIFY: return ctx->n.cfg.spec_draft_tokens;
    case FATTN_MODE_DRAFT_EXTEND: return ctx->n.cfg.spec_draft_tokens + 1;
    default: return 1;
  }
}

static fattn__graph_slot *slot_of(fattn_ctx *ctx, fattn_mode mode, uint32_t b) {
  return &ctx->graphs[(size_t)mode * ctx->n.num_buckets + b];
}

/* Areas in the graph region follow mode order, then bucket order (arena/layout.c). */
fattn_status fattn__graphs_init(fattn_ctx *ctx) {
  size_t n = (size_t)(FATTN_MODE_COUNT + 1) * ctx->n.num_buckets;
  ctx->graphs = fattn__heap_alloc(ctx->heap, n * sizeof *ctx->graphs);
  fattn__mailbox *boxes = fattn__heap_alloc(ctx->heap, n * sizeof *boxes);
  if (!ctx->graphs || !boxes) return fattn__fail(ctx, FATTN_ERR_NOMEM, "graph table in the pinned slab");
  memset(boxes, 0, n * sizeof *boxes);
  uint8_t *area = ctx->dev + ctx->lay.dev_off[FATTN_REGION_GRAPH_STATIC];
  for (uint32_t mode = 1; mode <= FATTN_MODE_COUNT; mode++) {
    if (!(ctx->n.cfg.graph_modes & (1u << mode))) continue;
    for (uint32_t b = 0; b < ctx->n.num_buckets; b++) {
      fattn__graph_slot *g = slot_of(ctx, (fattn_mode)mode, b);
      g->box = &boxes[(size_t)mode * ctx->n.num_buckets + b];
      g->area = area;
      g->requests = ctx->n.buckets[b];
      area += fattn__graph_area_bytes(&ctx->n, (fattn_mode)mode, g->requests);
    }
  }
  return FATTN_OK;
}

void fattn__graphs_close(fattn_ctx *ctx) {
  if (!ctx->graphs) return;
  for (size_t i = 0; i < (size_t)(FATTN_MODE_COUNT + 1) * ctx->n.num_buckets; i++)
    if (ctx->graphs[i].exec) cudaGraphExecDestroy((cudaGraphExec_t)ctx->graphs[i].exec);
}

/* The smallest bucket holding requests, or -1. */
static int bucket_for(const fattn_ctx *ctx, uint32_t requests) {
  for (uint32_t b = 0; b < ctx->n.num_buckets; b++)
    if (ctx->n.buckets[b] >= requests) return (int)b;
  return -1;
}

/* Every graph call: a context on a CUDA device, that device current. */
static fattn_status check_device(fattn_ctx *ctx, const char *call) {
  if (!ctx) return FATTN_ERR_INVALID;
  if (ctx->n.on_cpu) return fattn__fail(ctx, FATTN_ERR_UNSUPPORTED, "%s: graphs need a CUDA device", call);
  return fattn__on_device(ctx, call);
}

static fattn_status check_mode(fattn_ctx *ctx, fattn_mode mode, const char *call) {
  fattn_status st = check_device(ctx, call);
  if (st) return st;
  if (mode < FATTN_MODE_PREFILL || mode > FATTN_MODE_COUNT || !(ctx->n.cfg.graph_modes & (1u << mode)))
    return fattn__fail(ctx, FATTN_ERR_INVALID, "%s: mode %d has no graph buffers (config graph_modes 0x%x)", call,
                       mode, ctx->n.cfg.graph_modes);
  /* A plan or another capture would re-point the step that the open capture records against. */
  if (ctx->capture.slot)
    return fattn__fail(ctx, FATTN_ERR_STATE, "%s: a capture is open (fattn_graph_begin without fattn_graph_end)",
                       call);
  return FATTN_OK;
}

/* Opens a capture of bucket g on stream (capturing): points the step at the bucket's area with
 * its bounds (entries, query tokens, new tokens, query tiles) and records the prep node that
 * reads its mailbox, the first node of the graph. On failure the step is as it was. */
static cudaError_t capture_open(fattn_ctx *ctx, fattn_mode mode, fattn__graph_slot *g, void *stream) {
  const uint32_t entries = g->requests * entries_per_request(ctx, mode), q = q_per_entry(ctx, mode);
  const fattn__step saved = ctx->step;
  fattn__step_bind(ctx, mode, g->area, entries, entries, entries * q, entries * q,
                   entries * fattn__ceil_div(q, FATTN__Q_TILE));
  const fattn__plan_target t = {g->area, entries, q, g->box};
  ctx->detail[0] = '\0'; /* a captured call's detail is appended to a failed capture's */
  cudaError_t e = (cudaError_t)fattn__prep_launch_boxed(ctx, &t, stream);
  if (e != cudaSuccess) {
    ctx->step = saved;
    return e;
  }
  ctx->capture = (fattn__capture){g, mode, stream, saved};
  return cudaSuccess;
}

/* Closes the open capture, the step binding before it back; whether its stream still captures
 * (a captured call that synchronised or allocated ended the capture). */
static cudaError_t capture_close(fattn_ctx *ctx) {
  const fattn__capture c = ctx->capture;
  ctx->step = c.saved;
  ctx->capture.slot = NULL;
  enum cudaStreamCaptureStatus status;
  cudaError_t e = cudaStreamIsCapturing((cudaStream_t)c.stream, &status);
  if (e == cudaSuccess && status != cudaStreamCaptureStatusActive) e = cudaErrorStreamCaptureInvalidated;
  return e;
}

/* A capture that failed with e: the status, and the detail a captured fattn call left, if
 * any (copied first: the new detail is written over it). */
static fattn_status capture_failed(fattn_ctx *ctx, const char *call, fattn_mode mode, const fattn__graph_slot *g,
                                   cudaError_t e) {
  char inner[FATTN__DETAIL_LEN];
  memcpy(inner, ctx->detail, sizeof inner);
  cudaGetLastError();
  return fattn__fail(ctx, FATTN_ERR_CUDA,
                     "%s: mode %d bucket %u: %s (the captured calls must not allocate or synchronise)%s%s", call,
                     mode, g->requests, cudaGetErrorString(e), inner[0] ? "; " : "", inner);
}

/* The bucket of `size` requests for call, or FATTN_ERR_INVALID naming the argument (arg) that
 * gave the size. */
static fattn_status bucket_of_size(fattn_ctx *ctx, fattn_mode mode, uint32_t size, const char *call,
                                   const char *arg, fattn__graph_slot **g) {
  int b = bucket_for(ctx, size);
  if (size == 0 || b < 0)
    return fattn__fail(ctx, FATTN_ERR_INVALID, "%s: %s %u: must be in 1..max_batch %u", call, arg, size,
                       ctx->n.cfg.max_batch);
  *g = slot_of(ctx, mode, (uint32_t)b);
  return FATTN_OK;
}

fattn_status fattn_graph_capture(fattn_ctx *ctx, fattn_mode mode, uint32_t batch_size, fattn_graph_fn fn,
                                 void *user) {
  fattn_status st = check_mode(ctx, mode, "fattn_graph_capture");
  if (st) return st;
  if (!fn) return fattn__fail(ctx, FATTN_ERR_INVALID, "fattn_graph_capture: fn is required");
  fattn__graph_slot *g;
  if ((st = bucket_of_size(ctx, mode, batch_size, "fattn_graph_capture", "batch_size", &g))) return st;
  cudaStream_t s;
  cudaGraph_t graph = NULL;
  cudaGraphExec_t exec = NULL;
  cudaError_t e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  if (e == cudaSuccess) {
    e = cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal);
    if (e == cudaSuccess) {
      cudaError_t body = capture_open(ctx, mode, g, s);
      if (body == cudaSuccess) {
        fn(user, s);
        body = capture_close(ctx);
      }
      e = cudaStreamEndCapture(s, &graph);
      if (e == cudaSuccess && body != cudaSuccess) e = body;
    }
    if (e == cudaSuccess) e = cudaGraphInstantiate(&exec, graph, 0);
    if (graph) cudaGraphDestroy(graph);
    cudaStreamDestroy(s);
  }
  if (e != cudaSuccess) return capture_failed(ctx, "fattn_graph_capture", mode, g, e);
  if (g->exec) cudaGraphExecDestroy((cudaGraphExec_t)g->exec);
  g->exec = exec;
  return FATTN_OK;
}

fattn_status fattn_graph_begin(fattn_ctx *ctx, fattn_mode mode, uint32_t batch_size, void *stream) {
  fattn_status st = check_mode(ctx, mode, "fattn_graph_begin");
  if (st) return st;
  fattn__graph_slot *g;
  if ((st = bucket_of_size(ctx, mode, batch_size, "fattn_graph_begin", "batch_size", &g))) return st;
  enum cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  cudaError_t e = cudaStreamIsCapturing((cudaStream_t)stream, &status);
  if (e != cudaSuccess || status != cudaStreamCaptureStatusActive) {
    cudaGetLastError();
    return fattn__fail(ctx, FATTN_ERR_INVALID,
                       "fattn_graph_begin: stream %p is not capturing (%s): begin your capture on it first",
                       stream, e != cudaSuccess ? cudaGetErrorString(e)
                               : status == cudaStreamCaptureStatusNone ? "no capture"
                                                                       : "its capture was invalidated");
  }
  if ((e = capture_open(ctx, mode, g, stream)) != cudaSuccess) {
    cudaGetLastError();
    return fattn__fail(ctx, FATTN_ERR_CUDA, "fattn_graph_begin: mode %d bucket %u: the prep node: %s", mode,
                       g->requests, cudaGetErrorString(e));
  }
  return FATTN_OK;
}

fattn_status fattn_graph_end(fattn_ctx *ctx) {
  fattn_status st = check_device(ctx, "fattn_graph_end");
  if (st) return st;
  fattn__graph_slot *g = ctx->capture.slot;
  if (!g) return fattn__fail(ctx, FATTN_ERR_STATE, "fattn_graph_end: no capture is open (fattn_graph_begin first)");
  const fattn_mode mode = ctx->capture.mode;
  cudaError_t e = capture_close(ctx);
  if (e != cudaSuccess) return capture_failed(ctx, "fattn_graph_end", mode, g, e);
  g->caller_graph = 1;
  return FATTN_OK;
}

/* The bucket of a batch for call, validated as fattn_plan does first, its mode and plan target. */
static fattn_status bucket_of_batch(fattn_ctx *ctx, const fattn_batch *batch, const char *call,
                                    fattn__graph_slot **g, fattn_mode *mode, fattn__plan_target *target) {
  if (!ctx) return FATTN_ERR_INVALID;
  fattn_batch local;
  fattn_status st = fattn__batch_in(ctx, batch, &local, &batch);
  if (st || (st = check_mode(ctx, batch->mode, call)) ||
      (st = bucket_of_size(ctx, batch->mode, batch->num_seqs, call, "num_seqs", g)))
    return st;
  *mode = batch->mode;
  *target = (fattn__plan_target){(*g)->area, (*g)->requests * entries_per_request(ctx, batch->mode),
                                 q_per_entry(ctx, batch->mode), (*g)->box};
  return FATTN_OK;
}

fattn_status fattn__graph_for(fattn_ctx *ctx, const fattn_batch *batch, void **exec, fattn__plan_target *target) {
  fattn__graph_slot *g;
  fattn_mode mode;
  fattn_status st = bucket_of_batch(ctx, batch, "fattn_graph_launch", &g, &mode, target);
  if (st) return st;
  if (!g->exec)
    return fattn__fail(ctx, FATTN_ERR_STATE, "fattn_graph_launch: no graph captured for mode %d bucket %u", mode,
                       g->requests);
  *exec = g->exec;
  return FATTN_OK;
}

fattn_status fattn_graph_launch(fattn_ctx *ctx, const fattn_batch *batch, void *stream) {
  void *exec;
  fattn__plan_target t;
  fattn_status st = fattn__graph_for(ctx, batch, &exec, &t);
  if (st || (st = fattn__plan_into(ctx, batch, stream, &t))) return st;
  cudaError_t e = cudaGraphLaunch((cudaGraphExec_t)exec, (cudaStream_t)stream);
  if (e != cudaSuccess) { /* no prep node will read the post: free its slot and take it back */
    const fattn__post *p = &t.box->post[--t.box->posted % FATTN__MAILBOX_POSTS];
    fattn__slot_release(ctx, p->index, p->seq);
    return fattn__fail(ctx, FATTN_ERR_CUDA, "fattn_graph_launch: %s", cudaGetErrorString(e));
  }
  return FATTN_OK;
}

fattn_status fattn_graph_plan(fattn_ctx *ctx, const fattn_batch *batch, void *stream) {
  fattn__graph_slot *g;
  fattn_mode mode;
  fattn__plan_target t;
  fattn_status st = bucket_of_batch(ctx, batch, "fattn_graph_plan", &g, &mode, &t);
  if (st) return st;
  if (!g->caller_graph)
    return fattn__fail(ctx, FATTN_ERR_STATE,
                       "fattn_graph_plan: mode %d bucket %u was never captured by fattn_graph_begin / fattn_graph_end",
                       mode, g->requests);
  return fattn__plan_into(ctx, batch, stream, &t);
}
