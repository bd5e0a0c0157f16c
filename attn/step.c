/* step.c: fattn_store_kv and fattn_attend. Builds the parameter structs for one layer of the
 * planned step and hands them to the backend the context chose for the step's mode. */
#include <cuda_runtime_api.h>

#include "attn/backend.h"
#include "lib/internal.h"

static fattn_status check_call(fattn_ctx *ctx, uint32_t layer, const char *call) {
  if (!ctx) return FATTN_ERR_INVALID;
  if (!ctx->step.planned) return fattn__fail(ctx, FATTN_ERR_STATE, "%s: no step planned (call fattn_plan first)", call);
  if (layer >= ctx->n.model.num_layers)
    return fattn__fail(ctx, FATTN_ERR_INVALID, "%s: layer %u, the model has %u", call, layer, ctx->n.model.num_layers);
  return fattn__on_device(ctx, call);
}

static fattn__step_params step_params(fattn_ctx *ctx) {
  const fattn__step *st = &ctx->step;
  fattn__step_params s;
  s.mode = st->mode;
  s.hdr = st->hdr;
  s.entries = st->entries;
  s.mask = st->mask;
  s.cap_entries = st->cap_entries;
  s.cap_q_tokens = st->cap_q_tokens;
  s.cap_new_tokens = st->cap_new_tokens;
  s.cap_tiles = st->cap_tiles;
  s.max_splits = ctx->n.max_splits;
  uint8_t *ws = ctx->dev + ctx->lay.dev_off[FATTN_REGION_SPLIT_WORKSPACE];
  s.split_o = (float *)ws;
  s.split_lse = (float *)(ws + (uint64_t)ctx->lay.split_rows_cap * ctx->n.model.num_q_heads * ctx->n.head_dim_v * 4);
  s.tile_counter = (uint32_t *)(s.split_lse + (uint64_t)ctx->lay.split_rows_cap * ctx->n.model.num_q_heads);
#ifdef FATTN_STAMPS
  s.stamps = ctx->stamps;
#endif
  return s;
}

static fattn_status cuda_status(fattn_ctx *ctx, int err, const char *call) {
  if (err == 0) return FATTN_OK;
  return fattn__fail(ctx, FATTN_ERR_CUDA, "%s: %s", call, cudaGetErrorString((cudaError_t)err));
}

fattn_status fattn_store_kv(fattn_ctx *ctx, uint32_t layer, const void *k, const void *v, void *stream) {
  fattn_status st = check_call(ctx, layer, "fattn_store_kv");
  if (st) return st;
  int mla = ctx->n.model.mla_latent_dim != 0;
  if (ctx->step.cap_new_tokens && (!k || (!v && !mla)))
    return fattn__fail(ctx, FATTN_ERR_INVALID, "fattn_store_kv: k%s must not be NULL", mla ? "" : " and v");
  if (ctx->step.cap_new_tokens == 0) return FATTN_OK;
  fattn__layer_params l = fattn__layer_params_for(ctx, layer);
  fattn__step_params s = step_params(ctx);
  if (ctx->n.on_cpu) {
    fattn__ref_store_kv(l, s, k, v);
    return FATTN_OK;
  }
  return cuda_status(ctx, fattn__fa2_store_kv(l, s, k, v, stream), "fattn_store_kv");
}

fattn_status fattn_attend(fattn_ctx *ctx, uint32_t layer, const void *q, void *out, float *lse, void *stream) {
  fattn_status st = check_call(ctx, layer, "fattn_attend");
  if (st) return st;
  if (!q || !out) return fattn__fail(ctx, FATTN_ERR_INVALID, "fattn_attend: q and out must not be NULL");
  fattn__layer_params l = fattn__layer_params_for(ctx, layer);
  fattn__step_params s = step_params(ctx);
  switch (ctx->backend[ctx->step.mode]) {
    case FATTN_BACKEND_CPU:
      fattn__ref_attend(l, s, q, out, lse, NULL);
      return FATTN_OK;
    case FATTN_BACKEND_FA2:
      return cuda_status(ctx, fattn__fa2_attend(l, s, q, out, lse, stream), "fattn_attend");
#ifdef FATTN_HAVE_SM90A
    case FATTN_BACKEND_FA3:
      return cuda_status(ctx, fattn__fa3_attend(l, s, q, out, lse, stream), "fattn_attend");
#endif
    default:
      return fattn__fail(ctx, FATTN_ERR_UNSUPPORTED, "fattn_attend: backend %d", ctx->backend[ctx->step.mode]);
  }
}
