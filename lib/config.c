/* config.c: validation of fattn_config and fattn_model, defaults, graph buckets.
 * Every rejection names the field and the value; nothing here touches a device. */
#include <math.h>
#include <string.h>

#include "lib/internal.h"

#define BAD(...) fattn__failbuf(detail, detail_len, FATTN_ERR_INVALID, __VA_ARGS__)

static int is_pow2(uint32_t x) { return x != 0 && (x & (x - 1)) == 0; }

static int head_dim_ok(uint32_t d) {
  return d == 64 || d == 96 || d == 128 || d == 192 || d == 256;
}

static int elem_bytes(fattn_dtype t) {
  switch (t) {
    case FATTN_DTYPE_BF16:
    case FATTN_DTYPE_FP16: return 2;
    case FATTN_DTYPE_FP8_E4M3: return 1;
  }
  return 0;
}

static fattn_status check_model(const fattn_model *m, char *detail, size_t detail_len) {
  if (m->num_layers == 0 || m->num_layers > FATTN_MAX_LAYERS)
    return BAD("num_layers %u: must be in 1..%d", m->num_layers, FATTN_MAX_LAYERS);
  if (m->num_q_heads == 0 || m->num_q_heads > FATTN_MAX_HEADS)
    return BAD("num_q_heads %u: must be in 1..%d", m->num_q_heads, FATTN_MAX_HEADS);
  if (m->num_kv_heads == 0 || m->num_q_heads % m->num_kv_heads != 0)
    return BAD("num_kv_heads %u: must divide num_q_heads %u", m->num_kv_heads, m->num_q_heads);
  uint32_t dv = m->head_dim_v ? m->head_dim_v : m->head_dim;
  if (m->mla_latent_dim || m->mla_rope_dim) {
    if (m->mla_latent_dim != 512 || m->mla_rope_dim != 64)
      return BAD("mla_latent_dim %u / mla_rope_dim %u: MLA supports 512 / 64",
                 m->mla_latent_dim, m->mla_rope_dim);
    if (m->head_dim != 576 || dv != 512)
      return BAD("head_dim %u / head_dim_v %u: MLA needs 576 (latent + rope) / 512",
                 m->head_dim, dv);
    if (m->num_kv_heads != 1) return BAD("num_kv_heads %u: MLA has one latent head", m->num_kv_heads);
  } else {
    if (!head_dim_ok(m->head_dim))
      return BAD("head_dim %u: supported are 64, 96, 128, 192, 256", m->head_dim);
    if (!head_dim_ok(dv) || dv > m->head_dim)
      return BAD("head_dim_v %u: must be one of 64, 96, 128, 192, 256 and <= head_dim %u", dv,
                 m->head_dim);
  }
  if (!(m->softmax_scale >= 0.0f) || isinf(m->softmax_scale))
    return BAD("softmax_scale %g: must be finite and >= 0 (0 means 1/sqrt(head_dim))",
               (double)m->softmax_scale);
  if (!(m->logit_softcap >= 0.0f) || isinf(m->logit_softcap))
    return BAD("logit_softcap %g: must be finite and >= 0", (double)m->logit_softcap);
  for (uint32_t i = 0; m->layers && i < m->num_layers; i++) {
    const fattn_layer_opts *l = &m->layers[i];
    if (l->sliding_window < FATTN_NO_WINDOW)
      return BAD("layers[%u].sliding_window %d: must be >= 0 or FATTN_NO_WINDOW", i, l->sliding_window);
    if (!(l->k_scale > 0.0f) || !(l->v_scale > 0.0f) || isinf(l->k_scale) || isinf(l->v_scale))
      return BAD("layers[%u] k_scale %g / v_scale %g: must be finite and > 0", i,
                 (double)l->k_scale, (double)l->v_scale);
  }
  for (uint32_t i = 0; m->sinks && i < m->num_layers * m->num_q_heads; i++)
    if (isnan(m->sinks[i]) || m->sinks[i] == INFINITY)
      return BAD("sinks[%u] %g: must be finite or -INFINITY", i, (double)m->sinks[i]);
  return FATTN_OK;
}

/* compute_dtype, after q_dtype and kv_dtype are known good: 0 (q_dtype), q_dtype itself, or e4m3
 * over an fp8 cache (the GEMMs read the cache's bytes as they are). MLA is refused: no MLA kernel
 * has e4m3 GEMMs, and its V is the latent under k_scale, not a V pool under v_scale. */
static fattn_status check_compute(const fattn_config *c, const fattn_model *m, char *detail, size_t detail_len) {
  const fattn_dtype t = c->compute_dtype;
  if (t == 0 || t == c->q_dtype) return FATTN_OK;
  if (t == FATTN_DTYPE_BF16 || t == FATTN_DTYPE_FP16)
    return BAD("compute_dtype %d: a 16-bit compute_dtype must equal q_dtype %d (or give 0)", t, c->q_dtype);
  if (t != FATTN_DTYPE_FP8_E4M3) return BAD("compute_dtype %d: unknown", t);
  if (c->kv_dtype != FATTN_DTYPE_FP8_E4M3)
    return BAD("compute_dtype FP8_E4M3 needs kv_dtype FP8_E4M3 (kv_dtype %d)", c->kv_dtype);
  if (m->mla_latent_dim) return BAD("compute_dtype FP8_E4M3: not for MLA models");
  return FATTN_OK;
}

static fattn_status check_buckets(const fattn_config *c, fattn__norm *n, char *detail,
                                  size_t detail_len) {
  if (c->num_graph_buckets) {
    if (c->num_graph_buckets > FATTN_MAX_GRAPH_BUCKETS || !c->graph_buckets)
      return BAD("num_graph_buckets %u: needs graph_buckets and at most %d", c->num_graph_buckets,
                 FATTN_MAX_GRAPH_BUCKETS);
    for (uint32_t i = 0; i < c->num_graph_buckets; i++) {
      uint32_t b = c->graph_buckets[i];
      if (b == 0 || b > c->max_batch || (i && b <= c->graph_buckets[i - 1]))
        return BAD("graph_buckets[%u] %u: must increase strictly within 1..max_batch %u", i, b,
                   c->max_batch);
      n->buckets[i] = b;
    }
    n->num_buckets = c->num_graph_buckets;
  } else { /* 1, 2, 4, 8, 12, 16, 24, 32, then every 8, cut at max_batch, max_batch last */
    static const uint32_t small[] = {1, 2, 4, 8, 12, 16, 24, 32};
    uint32_t k = 0;
    for (uint32_t i = 0; i < 8 && small[i] < c->max_batch; i++) n->buckets[k++] = small[i];
    for (uint32_t b = 40; b < c->max_batch && k < FATTN_MAX_GRAPH_BUCKETS - 1; b += 8)
      n->buckets[k++] = b;
    n->buckets[k++] = c->max_batch;
    n->num_buckets = k;
  }
  return FATTN_OK;
}

static fattn_status check_backends(const fattn_config *c, fattn__norm *n, char *detail,
                                   size_t detail_len) {
  const fattn_backend pair[2] = {c->prefill_backend, c->decode_backend};
  const char *names[2] = {"prefill_backend", "decode_backend"};
  n->on_cpu = c->device == FATTN_DEVICE_CPU;
  for (int i = 0; i < 2; i++) {
    if ((unsigned)pair[i] > FATTN_BACKEND_CPU || (unsigned)pair[i] == FATTN__BACKEND_RESERVED)
      return BAD("%s %d: unknown backend", names[i], pair[i]);
    if (n->on_cpu && pair[i] != FATTN_BACKEND_AUTO && pair[i] != FATTN_BACKEND_CPU)
      return BAD("%s %d: device FATTN_DEVICE_CPU runs only the CPU backend", names[i], pair[i]);
    if (!n->on_cpu && pair[i] == FATTN_BACKEND_CPU)
      return BAD("%s CPU: needs device = FATTN_DEVICE_CPU (got device %d)", names[i], c->device);
  }
  if (c->device < FATTN_DEVICE_CPU) return BAD("device %d: a CUDA ordinal or FATTN_DEVICE_CPU", c->device);
  return FATTN_OK;
}

fattn_status fattn__normalize(const fattn_config *cfg, const fattn_model *model,
                              fattn__norm *n, char *detail, size_t detail_len) {
  if (!cfg || !model) return BAD("config and model must not be NULL");
  fattn_status st;
  if ((st = fattn__abi_check(&fattn__abi_config, cfg, detail, detail_len)) ||
      (st = fattn__abi_check(&fattn__abi_model, model, detail, detail_len)))
    return st;
  memset(n, 0, sizeof *n);
  fattn_config c_local;
  fattn_model m_local;
  cfg = fattn__abi_read(&fattn__abi_config, cfg, &c_local);
  model = fattn__abi_read(&fattn__abi_model, model, &m_local);
  n->cfg = *cfg;
  n->model = *model;
  fattn_config *c = &n->cfg;
  if ((st = check_model(model, detail, detail_len))) return st;
  if (c->q_dtype != FATTN_DTYPE_BF16 && c->q_dtype != FATTN_DTYPE_FP16)
    return BAD("q_dtype %d: must be FATTN_DTYPE_BF16 or FATTN_DTYPE_FP16", c->q_dtype);
  if (!elem_bytes(c->kv_dtype)) return BAD("kv_dtype %d: unknown", c->kv_dtype);
  if ((st = check_compute(c, model, detail, detail_len))) return st;
  if (!is_pow2(c->page_size) || c->page_size > FATTN_MAX_PAGE_SIZE)
    return BAD("page_size %u: not a power of two in 1..%d", c->page_size, FATTN_MAX_PAGE_SIZE);
  if (c->max_batch == 0) return BAD("max_batch 0: must be >= 1");
  if (c->max_seq_len == 0) return BAD("max_seq_len 0: must be >= 1");
  if (c->max_q_tokens == 0 || c->max_q_tokens > FATTN_MAX_Q_TOKENS)
    return BAD("max_q_tokens %u: must be in 1..%u", c->max_q_tokens, FATTN_MAX_Q_TOKENS);
  if (c->max_encoder_len > c->max_seq_len)
    return BAD("max_encoder_len %u: over max_seq_len %u (encoder KV lives in a sequence)", c->max_encoder_len,
               c->max_seq_len);
  if (c->spec_topk) {
    if (c->spec_draft_tokens == 0 || c->spec_draft_tokens > FATTN_MAX_DRAFT_TOKENS)
      return BAD("spec_draft_tokens %u: must be in 1..%d with spec_topk %u", c->spec_draft_tokens,
                 FATTN_MAX_DRAFT_TOKENS, c->spec_topk);
    if (c->spec_steps == 0) return BAD("spec_steps 0: must be >= 1 with spec_topk %u", c->spec_topk);
    if (c->spec_topk > 64) return BAD("spec_topk %u: at most 64", c->spec_topk);
  } else if (c->spec_draft_tokens || c->spec_steps) {
    return BAD("spec_draft_tokens %u / spec_steps %u: need spec_topk >= 1", c->spec_draft_tokens,
               c->spec_steps);
  }
  if (c->max_splits > 256) return BAD("max_splits %u: at most 256", c->max_splits);
  if (c->staging_slots > 64) return BAD("staging_slots %u: at most 64", c->staging_slots);
  if (c->flags & ~FATTN_FLAG_CALLER_PAGES) return BAD("flags 0x%x: unknown bits", c->flags);
  if (c->graph_modes & ~(((1u << FATTN_MODE_COUNT) - 1u) << 1))
    return BAD("graph_modes 0x%x: bits are 1 << fattn_mode", c->graph_modes);
  if (c->graph_modes & ((1u << FATTN_MODE_PREFILL) | (1u << FATTN_MODE_CROSS)))
    return BAD("graph_modes 0x%x: graphs serve DECODE, DRAFT_DECODE, TARGET_VERIFY, DRAFT_EXTEND",
               c->graph_modes);
  if ((c->graph_modes & ((1u << FATTN_MODE_TARGET_VERIFY) | (1u << FATTN_MODE_DRAFT_DECODE) |
                         (1u << FATTN_MODE_DRAFT_EXTEND))) && !c->spec_topk)
    return BAD("graph_modes 0x%x: speculative modes need spec_topk >= 1", c->graph_modes);
  if ((st = check_backends(c, n, detail, detail_len))) return st;
  if ((st = check_buckets(c, n, detail, detail_len))) return st;

  n->head_dim_v = model->head_dim_v ? model->head_dim_v : model->head_dim;
  n->kv_elem_bytes = (uint32_t)elem_bytes(c->kv_dtype);
  uint32_t topk = c->spec_topk ? c->spec_topk : 1;
  uint64_t entries = (uint64_t)c->max_batch * topk;
  uint64_t seqs = c->max_seqs ? c->max_seqs
                              : (uint64_t)c->max_batch * (1u + c->spec_topk) +
                                    (c->max_encoder_len ? c->max_batch : 0u);
  if (entries > (1u << 20) || seqs > (1u << 22))
    return BAD("max_batch %u x spec_topk %u / max_seqs %llu: too large", c->max_batch, topk,
               (unsigned long long)seqs);
  if (seqs < entries)
    return BAD("max_seqs %llu: smaller than one step's entries (%llu)", (unsigned long long)seqs,
               (unsigned long long)entries);
  n->max_seqs = (uint32_t)seqs;
  n->max_entries = (uint32_t)entries;
  n->max_mask_rows = c->spec_topk > 1 ? c->max_batch * c->spec_draft_tokens : 0;
  n->max_splits = c->max_splits ? c->max_splits : 32;
  n->staging_slots = c->staging_slots ? c->staging_slots : 4;
  if (!(n->model.softmax_scale > 0.0f)) n->model.softmax_scale = 1.0f / sqrtf((float)model->head_dim);
  n->model.layers = NULL; /* copies live in the context */
  n->model.sinks = NULL;
  n->cfg.graph_buckets = NULL;
  return FATTN_OK;
}

static const char *mode_name(uint32_t mode) {
  static const char *const names[FATTN_MODE_COUNT + 1] = {"?", "PREFILL", "DECODE", "TARGET_VERIFY",
                                                          "DRAFT_DECODE", "DRAFT_EXTEND", "CROSS"};
  return mode <= FATTN_MODE_COUNT ? names[mode] : "?";
}

/* FA3 runs MLA on its own kernel (attn/mla/mla90.cu) where it was built. */
#ifdef FATTN_HAVE_SM90A
#define FA3_RUNS_MLA 1
#else
#define FA3_RUNS_MLA 0
#endif

fattn_status fattn__mla_mode_check(fattn_backend backend, uint32_t mode, char *detail, size_t detail_len) {
  const int gpu = backend == FATTN_BACKEND_FA2 || (backend == FATTN_BACKEND_FA3 && FA3_RUNS_MLA);
  if (backend == FATTN_BACKEND_CPU || (gpu && mode != FATTN_MODE_CROSS)) return FATTN_OK;
  if (backend == FATTN_BACKEND_FA3 && !FA3_RUNS_MLA)
    return fattn__failbuf(detail, detail_len, FATTN_ERR_UNSUPPORTED,
                          "MLA mode %s: FA3 was built without its MLA kernel (CUDA_ARCHS lacks 90a; FA2 runs MLA in "
                          "every mode but CROSS)",
                          mode_name(mode));
  return fattn__failbuf(detail, detail_len, FATTN_ERR_UNSUPPORTED,
                        "MLA mode %s: no GPU kernel (an MLA model has no encoder; the CPU backend runs it)",
                        mode_name(mode));
}

fattn_status fattn__mla_options_check(const fattn__norm *n, const fattn_layer_opts *layers, int has_sinks,
                                      char *detail, size_t detail_len) {
#define MLA_LACKS(...) fattn__failbuf(detail, detail_len, FATTN_ERR_UNSUPPORTED, __VA_ARGS__)
  if (n->cfg.kv_dtype != n->cfg.q_dtype && n->cfg.kv_dtype != FATTN_DTYPE_FP8_E4M3)
    return MLA_LACKS("kv_dtype %d: MLA on the GPU reads latent rows in q_dtype %d or fp8 e4m3", n->cfg.kv_dtype,
                     n->cfg.q_dtype);
  if (n->model.logit_softcap != 0.0f)
    return MLA_LACKS("logit_softcap %g: MLA on the GPU has no softcap", (double)n->model.logit_softcap);
  if (has_sinks) return MLA_LACKS("sinks: MLA on the GPU has no sinks");
  for (uint32_t i = 0; layers && i < n->model.num_layers; i++) {
    if (layers[i].sliding_window != FATTN_NO_WINDOW)
      return MLA_LACKS("layers[%u].sliding_window %d: MLA on the GPU has no window", i, layers[i].sliding_window);
    if (layers[i].chunk_size != 0)
      return MLA_LACKS("layers[%u].chunk_size %u: MLA on the GPU has no chunked attention", i, layers[i].chunk_size);
  }
  return FATTN_OK;
#undef MLA_LACKS
}
