/* graph.c: CUDA graph pools per (mode, batch-size bucket). Capture binds a bucket's static
 * metadata area and records the caller's layer loop; launch plans into that area and replays. */
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

static fattn_status check_mode(fattn_ctx *ctx, fattn_mode mode, const char *call) {
  if (!ctx) return FATTN_ERR_INVALID;
  if (ctx->n.on_cpu) return fattn__fail(ctx, FATTN_ERR_UNSUPPORTED, "%s: graphs need a CUDA device", call);
  fattn_status st = fattn__on_device(ctx, call);
  if (st) return st;
  if (mode < FATTN_MODE_PREFILL || mode > FATTN_MODE_COUNT || !(ctx->n.cfg.graph_modes & (1u << mode)))
    return fattn__fail(ctx, FATTN_ERR_INVALID, "%s: mode %d has no graph buffers (config graph_modes 0x%x)", call,
                       mode, ctx->n.cfg.graph_modes);
  return FATTN_OK;
}

fattn_status fattn_graph_capture(fattn_ctx *ctx, fattn_mode mode, uint32_t batch_size, fattn_graph_fn fn,
                                 void *user) {
  fattn_status st = check_mode(ctx, mode, "fattn_graph_capture");
  if (st) return st;
  int b = bucket_for(ctx, batch_size);
  if (!fn || batch_size == 0 || b < 0)
    return fattn__fail(ctx, FATTN_ERR_INVALID, "fattn_graph_capture: batch_size %u (1..%u) and fn are required",
                       batch_size, ctx->n.cfg.max_batch);
  fattn__graph_slot *g = slot_of(ctx, mode, (uint32_t)b);
  uint32_t entries = g->requests * entries_per_request(ctx, mode), q = q_per_entry(ctx, mode);
  fattn__step saved = ctx->step;
  fattn__step_bind(ctx, mode, g->area, entries, entries, entries * q, entries * q,
                   entries * fattn__ceil_div(q, FATTN__Q_TILE));
  cudaStream_t s;
  cudaGraph_t graph = NULL;
  cudaGraphExec_t exec = NULL;
  const fattn__plan_target t = {g->area, entries, q, g->box};
  cudaError_t e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  if (e == cudaSuccess) {
    e = cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal);
    if (e == cudaSuccess) {
      ctx->detail[0] = '\0';
      cudaError_t prep = (cudaError_t)fattn__prep_launch_boxed(ctx, &t, s); /* the graph's first node */
      if (prep == cudaSuccess) fn(user, s);
      e = cudaStreamEndCapture(s, &graph);
      if (e == cudaSuccess && prep != cudaSuccess) e = prep;
    }
    if (e == cudaSuccess) e = cudaGraphInstantiate(&exec, graph, 0);
    if (graph) cudaGraphDestroy(graph);
    cudaStreamDestroy(s);
  }
  ctx->step = saved;
  if (e != cudaSuccess) {
    cudaGetLastError();
    return fattn__fail(ctx, FATTN_ERR_CUDA,
                       "fattn_graph_capture: mode %d bucket %u: %s (the captured calls must not allocate or "
                       "synchronise)%s%s",
                       mode, g->requests, cudaGetErrorString(e), ctx->detail[0] ? "; " : "", ctx->detail);
  }
  if (g->exec) cudaGraphExecDestroy((cudaGraphExec_t)g->exec);
  g->exec = exec;
  return FATTN_OK;
}

fattn_status fattn__graph_for(fattn_ctx *ctx, const fattn_batch *batch, void **exec, fattn__plan_target *target) {
  if (!ctx) return FATTN_ERR_INVALID;
  fattn_batch local;
  fattn_status st = fattn__batch_in(ctx, batch, &local, &batch);
  if (st || (st = check_mode(ctx, batch->mode, "fattn_graph_launch"))) return st;
  int b = bucket_for(ctx, batch->num_seqs);
  if (b < 0 || batch->num_seqs == 0)
    return fattn__fail(ctx, FATTN_ERR_INVALID, "fattn_graph_launch: num_seqs %u: must be in 1..max_batch %u",
                       batch->num_seqs, ctx->n.cfg.max_batch);
  fattn__graph_slot *g = slot_of(ctx, batch->mode, (uint32_t)b);
  if (!g->exec)
    return fattn__fail(ctx, FATTN_ERR_STATE, "fattn_graph_launch: no graph captured for mode %d bucket %u",
                       batch->mode, g->requests);
  *exec = g->exec;
  *target = (fattn__plan_target){g->area, g->requests * entries_per_request(ctx, batch->mode),
                                 q_per_entry(ctx, batch->mode), g->box};
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
