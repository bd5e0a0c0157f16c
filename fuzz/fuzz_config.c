/* fuzz_config.c: libFuzzer harness of config validation and the memory plan. Input bytes
 * become a fattn_config and fattn_model; fattn_memory_plan must answer a documented status
 * with a detail, and a small CPU plan must create, check and destroy cleanly. */
#include <math.h>

#include "fuzz/common.h"

#define CREATE_LIMIT (64ull << 20) /* device + pinned bytes worth creating per input */
#define DETAIL_GUARD 16

static fattn_layer_opts layers[FATTN_MAX_LAYERS];
static float sinks[FATTN_MAX_LAYERS * FATTN_MAX_HEADS];
static uint32_t buckets[FATTN_MAX_GRAPH_BUCKETS + 8];

/* Mostly one of the values the field is meant to take, sometimes any bits. */
static uint32_t pick(fuzz_bytes *in, const uint32_t *usual, size_t n) {
  uint8_t b = fuzz_u8(in);
  return b < 0xf0 ? usual[b % n] : fuzz_u32(in);
}
#define PICK(in, ...) pick((in), (const uint32_t[]){__VA_ARGS__}, sizeof((const uint32_t[]){__VA_ARGS__}) / 4)

static uint32_t small(fuzz_bytes *in, uint32_t limit) {
  uint8_t b = fuzz_u8(in);
  return b < 0xf0 ? b % (limit + 1) : fuzz_u32(in);
}

static float pick_float(fuzz_bytes *in) {
  static const float usual[] = {0.0f, 1.0f, 0.125f, 30.0f, -1.0f, NAN, INFINITY, -INFINITY, 1e-30f};
  uint8_t b = fuzz_u8(in);
  if (b < 0xf0) return usual[b % (sizeof usual / sizeof usual[0])];
  uint32_t bits = fuzz_u32(in);
  float f;
  memcpy(&f, &bits, sizeof f);
  return f;
}

/* An older caller's struct_size: a multiple of 8 up to size, so that it ends between fields as
 * a real older struct does (0 and 8 and the like break the rule). */
static uint32_t older_size(fuzz_bytes *in, size_t size) { return 8u * (fuzz_u8(in) % (uint32_t)(size / 8 + 1)); }

static void build_model(fuzz_bytes *in, fattn_model *m) {
  const fattn_model init = FATTN_MODEL_INIT;
  *m = init;
  if (fuzz_u8(in) >= 0xf8) m->struct_size = older_size(in, sizeof *m); /* sometimes an older caller */
  m->num_layers = PICK(in, 1, 2, 3, 0, FATTN_MAX_LAYERS, FATTN_MAX_LAYERS + 1);
  m->num_q_heads = PICK(in, 1, 2, 4, 8, 0, FATTN_MAX_HEADS, FATTN_MAX_HEADS + 1, 3);
  m->num_kv_heads = PICK(in, 1, 2, 4, 0, 3, 8);
  m->head_dim = PICK(in, 64, 128, 96, 192, 256, 576, 0, 100);
  m->head_dim_v = PICK(in, 0, 64, 128, 512, 96, 256, 32);
  uint8_t mla = fuzz_u8(in);
  if (mla >= 0xc0) {
    m->mla_latent_dim = PICK(in, 512, 0, 256);
    m->mla_rope_dim = PICK(in, 64, 0, 32);
  }
  m->softmax_scale = pick_float(in);
  m->logit_softcap = pick_float(in);
  uint8_t arrays = fuzz_u8(in);
  /* Filled from the input as far as it goes, the rest with the last valid-looking value. */
  if (arrays & 1) {
    fattn_layer_opts fill = FATTN_LAYER_OPTS_INIT;
    uint32_t n = m->num_layers < FATTN_MAX_LAYERS ? m->num_layers : FATTN_MAX_LAYERS;
    for (uint32_t i = 0; i < n; i++) {
      if (i < 8) {
        fill.sliding_window = (int32_t)PICK(in, (uint32_t)FATTN_NO_WINDOW, 0, 16, 1024, (uint32_t)-2, (uint32_t)INT32_MIN);
        fill.chunk_size = PICK(in, 0, 8, 4096);
        fill.k_scale = pick_float(in);
        fill.v_scale = pick_float(in);
      }
      layers[i] = fill;
    }
    m->layers = layers;
  }
  if (arrays & 2) {
    uint64_t n = (uint64_t)(m->num_layers < FATTN_MAX_LAYERS ? m->num_layers : FATTN_MAX_LAYERS) *
                 (m->num_q_heads < FATTN_MAX_HEADS ? m->num_q_heads : FATTN_MAX_HEADS);
    float fill = 0.0f;
    for (uint64_t i = 0; i < n; i++) {
      if (i < 16) fill = pick_float(in);
      sinks[i] = fill;
    }
    m->sinks = sinks;
  }
}

static void build_config(fuzz_bytes *in, fattn_config *c) {
  const fattn_config init = FATTN_CONFIG_INIT;
  *c = init;
  if (fuzz_u8(in) >= 0xf8) c->struct_size = older_size(in, sizeof *c);
  c->device = (int32_t)PICK(in, (uint32_t)FATTN_DEVICE_CPU, 0, 1, (uint32_t)-2);
  c->q_dtype = (fattn_dtype)PICK(in, FATTN_DTYPE_BF16, FATTN_DTYPE_FP16, FATTN_DTYPE_FP8_E4M3, 0);
  c->kv_dtype = (fattn_dtype)PICK(in, FATTN_DTYPE_BF16, FATTN_DTYPE_FP16, FATTN_DTYPE_FP8_E4M3, 0, 4);
  c->page_size = PICK(in, 1, 2, 16, 64, 256, 0, 3, 512);
  uint8_t budget = fuzz_u8(in);
  if (budget & 1) c->kv_budget_pages = small(in, 300);
  if (budget & 2) c->kv_budget_bytes = budget & 4 ? fuzz_u64(in) : (uint64_t)small(in, 255) << (budget >> 3);
  c->max_seqs = small(in, 40);
  c->max_batch = small(in, 16);
  c->max_seq_len = PICK(in, 64, 1, 256, 4096, 0, 1000, UINT32_MAX);
  c->max_q_tokens = PICK(in, 64, 1, 0, 4096, UINT32_MAX);
  c->spec_topk = small(in, 65);
  c->spec_steps = small(in, 3);
  c->spec_draft_tokens = PICK(in, 0, 1, 4, 64, 65);
  c->max_encoder_len = PICK(in, 0, 16, 1500, UINT32_MAX);
  c->prefill_backend = (fattn_backend)small(in, 5);
  c->decode_backend = (fattn_backend)small(in, 5);
  c->max_splits = PICK(in, 0, 1, 32, 256, 257);
  c->staging_slots = PICK(in, 0, 1, 4, 64, 65);
  uint8_t graphs = fuzz_u8(in);
  if (graphs & 1) {
    c->num_graph_buckets = small(in, FATTN_MAX_GRAPH_BUCKETS + 1);
    uint32_t at = 0;
    for (uint32_t i = 0; i < c->num_graph_buckets && i < sizeof buckets / sizeof buckets[0]; i++)
      buckets[i] = at += small(in, 3); /* mostly increasing, sometimes repeated */
    if (!(graphs & 2)) c->graph_buckets = buckets;
  }
  c->graph_modes = graphs & 4 ? PICK(in, 1u << FATTN_MODE_DECODE, 0x1c, 0x3c, 1u << FATTN_MODE_PREFILL, 0x80) : 0;
  c->flags = graphs & 8 ? PICK(in, FATTN_FLAG_CALLER_PAGES, 2) : 0;
  c->compute_dtype = graphs & 16 ? (fattn_dtype)PICK(in, FATTN_DTYPE_FP8_E4M3, FATTN_DTYPE_BF16, FATTN_DTYPE_FP16, 4) : 0;
}

/* A failing call wrote a non-empty, terminated detail and nothing past its buffer. */
static void check_detail(const char *detail, size_t len, const char *call) {
  for (size_t i = len; i < len + DETAIL_GUARD; i++)
    if ((uint8_t)detail[i] != 0xa5) FUZZ_FAIL("%s wrote past detail[%zu]", call, len);
  if (len >= 2) fuzz_expect_detail(detail, len, call);
  else if (len == 1 && detail[0]) FUZZ_FAIL("%s: a one-byte detail is not terminated", call);
}

static void check_report(const fattn_config *c, const fattn_memory_report *r) {
  uint64_t dev = 0;
  for (int i = 0; i < FATTN_REGION_PINNED_STAGING; i++) dev += r->region_bytes[i];
  if (dev != r->device_bytes || r->region_bytes[FATTN_REGION_PINNED_STAGING] != r->pinned_bytes)
    FUZZ_FAIL("report: regions add up to %llu device bytes, report says %llu", (unsigned long long)dev,
              (unsigned long long)r->device_bytes);
  if (r->num_pages < r->pages_per_seq || r->page_bytes == 0 ||
      (uint64_t)r->pages_per_seq * c->page_size < c->max_seq_len)
    FUZZ_FAIL("report: %u pages, %u per sequence of %u tokens at %u a page, %llu bytes a page", r->num_pages,
              r->pages_per_seq, c->max_seq_len, c->page_size, (unsigned long long)r->page_bytes);
  if (c->kv_budget_pages && r->num_pages != c->kv_budget_pages)
    FUZZ_FAIL("report: %u pages for a budget of %u", r->num_pages, c->kv_budget_pages);
}

/* cfg as the caller gave it, seen as the library reads it. */
static void create_and_destroy(const fattn_config *cfg, const fattn_config *seen, const fattn_model *model,
                               const fattn_memory_report *plan) {
  char detail[FATTN__DETAIL_LEN];
  fattn_ctx *ctx = NULL;
  fattn_status st = fattn_create(cfg, model, &ctx, detail, sizeof detail);
  /* On the host nothing but memory can fail, and the plan was small. */
  if (st != FATTN_OK || !ctx) FUZZ_FAIL("fattn_create after an OK plan: %s: %s", fattn_status_name(st), detail);
  fattn_memory_report held = *fattn_ctx_memory(ctx);
  if (memcmp(&held, plan, sizeof held) != 0) FUZZ_FAIL("fattn_ctx_memory differs from fattn_memory_plan's report");
  if ((st = fattn_check(ctx)) != FATTN_OK) FUZZ_FAIL("fattn_check of a new context: %s", fattn_detail(ctx));
  fattn_stats stats = FATTN_STATS_INIT;
  if (fattn_get_stats(ctx, &stats) != FATTN_OK || stats.pages_total != plan->num_pages || stats.seqs_open != 0 ||
      stats.pages_free != (seen->flags & FATTN_FLAG_CALLER_PAGES ? 0 : plan->num_pages))
    FUZZ_FAIL("stats of a new context: %u of %u pages free, %u sequences open", stats.pages_free,
              stats.pages_total, stats.seqs_open);
  for (int mode = FATTN_MODE_PREFILL; mode <= FATTN_MODE_COUNT; mode++)
    if (fattn_ctx_backend(ctx, (fattn_mode)mode) != FATTN_BACKEND_CPU)
      FUZZ_FAIL("mode %d runs on backend %d on the host", mode, fattn_ctx_backend(ctx, (fattn_mode)mode));
  if ((st = fattn_destroy(ctx, 0)) != FATTN_OK) FUZZ_FAIL("fattn_destroy of an idle context: %s", fattn_status_name(st));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fuzz_bytes in = {data, size, 0};
  fattn_config cfg;
  fattn_model model;
  build_config(&in, &cfg);
  build_model(&in, &model);
  fattn_memory_report report = FATTN_MEMORY_REPORT_INIT;
  if (fuzz_u8(&in) >= 0xf8) report.struct_size = older_size(&in, sizeof report);
  const fattn_config init = FATTN_CONFIG_INIT;
  fattn_config seen;
  fuzz_as_read(&seen, &cfg, &init, sizeof seen, offsetof(fattn_config, device) + sizeof seen.device);
  static const size_t lens[] = {FATTN__DETAIL_LEN, 1, 0, 24};
  size_t detail_len = lens[fuzz_u8(&in) % 4];
  char detail[FATTN__DETAIL_LEN + DETAIL_GUARD];
  memset(detail, 0xa5, sizeof detail);
  fattn_status st = fattn_memory_plan(&cfg, &model, &report, detail_len ? detail : NULL, detail_len);
  if (!fuzz_known_status(st)) FUZZ_FAIL("fattn_memory_plan: status %d is not a fattn_status", st);
  if (st != FATTN_OK) {
    if (detail_len) check_detail(detail, detail_len, "fattn_memory_plan");
    return 0;
  }
  if (detail_len && detail[0]) FUZZ_FAIL("fattn_memory_plan OK with a detail: %s", detail);
  if (seen.compute_dtype && seen.compute_dtype != seen.q_dtype &&
      !(seen.compute_dtype == FATTN_DTYPE_FP8_E4M3 && seen.kv_dtype == FATTN_DTYPE_FP8_E4M3))
    FUZZ_FAIL("compute_dtype %d accepted with q_dtype %d, kv_dtype %d", seen.compute_dtype, seen.q_dtype,
              seen.kv_dtype);
  if (report.struct_size < sizeof report) return 0; /* an older caller's: the fields checked may be cut */
  check_report(&seen, &report);
  if (seen.device == FATTN_DEVICE_CPU && report.device_bytes + report.pinned_bytes < CREATE_LIMIT)
    create_and_destroy(&cfg, &seen, &model, &report);
  return 0;
}
