/* test_memory.c: the memory plan against hand-computed layouts, config validation with its
 * detail messages, status strings, and create/destroy on the CPU backend. */
#include <math.h>

#include "lib/internal.h"
#include "tests/shapes.h"
#include "tests/support.h"

static char detail[256];

START_TEST(plan_llama8b_exact) {
  fattn_config c;
  fattn_model m;
  fattn_shape_llama8b(&c, &m, FATTN_DEVICE_CPU);
  fattn_memory_report r = FATTN_MEMORY_REPORT_INIT;
  ck_assert_ok(fattn_memory_plan(&c, &m, &r, detail, sizeof detail));
  /* one page: 32 layers x 16 tokens x (K + V) x 8 heads x 128 dims x 2 bytes */
  ck_assert_uint_eq(r.page_bytes, 2097152ull);
  ck_assert_uint_eq(r.num_pages, 40960u); /* 80 GiB / 2 MiB */
  ck_assert_uint_eq(r.pages_per_seq, 8192u);
  ck_assert_uint_eq(r.region_bytes[FATTN_REGION_K_POOL], 32ull * 40960 * 16 * 8 * 128 * 2);
  ck_assert_uint_eq(r.region_bytes[FATTN_REGION_V_POOL], 42949672960ull);
  ck_assert_uint_eq(r.region_bytes[FATTN_REGION_PAGE_TABLE], 256ull * 8192 * 4);
  /* slot: hdr 72 (80 aligned) + 256 entries x 48 + 256 updates x 16 + 256 copies x 8
   * + (256 row copies + 256 fills) x 16 + 16384 words x 4, 256 aligned */
  ck_assert_uint_eq(r.region_bytes[FATTN_REGION_METADATA], 92416ull);
  /* 32 splits x 64 rows x 32 heads x (128 + 1) floats, then 2 scheduler words (256 aligned) */
  ck_assert_uint_eq(r.region_bytes[FATTN_REGION_SPLIT_WORKSPACE], 33816576ull + 256);
  ck_assert_uint_eq(r.region_bytes[FATTN_REGION_GRAPH_STATIC], 0ull);
  ck_assert_uint_eq(r.region_bytes[FATTN_REGION_MODEL], 4096ull);
  ck_assert_uint_eq(r.device_bytes, 85941647616ull + 256);
  ck_assert_uint_eq(r.pinned_bytes, r.region_bytes[FATTN_REGION_PINNED_STAGING]);
  ck_assert(r.pinned_bytes > 4ull * 92416 + 8192ull * 4 * 256);
}
END_TEST

START_TEST(plan_fp8_mla_and_graphs) {
  fattn_config c;
  fattn_model m;
  fattn_test_small(&c, &m);
  fattn_memory_report r = FATTN_MEMORY_REPORT_INIT;
  c.kv_dtype = FATTN_DTYPE_FP8_E4M3;
  ck_assert_ok(fattn_memory_plan(&c, &m, &r, detail, sizeof detail));
  ck_assert_uint_eq(r.page_bytes, 2ull * 4 * (2 * 64 + 2 * 64)); /* 1 byte an element */
  ck_assert_uint_eq(r.num_pages, 64u);
  m.num_q_heads = 16;
  m.num_kv_heads = 1;
  m.head_dim = 576;
  m.head_dim_v = 512;
  m.mla_latent_dim = 512;
  m.mla_rope_dim = 64;
  c.kv_dtype = FATTN_DTYPE_BF16;
  ck_assert_ok(fattn_memory_plan(&c, &m, &r, detail, sizeof detail));
  ck_assert_uint_eq(r.region_bytes[FATTN_REGION_V_POOL], 0ull); /* V is read from the latent */
  ck_assert_uint_eq(r.page_bytes, 2ull * 4 * 576 * 2);
  fattn_test_small(&c, &m);
  c.spec_topk = 4;
  c.spec_steps = 3;
  c.spec_draft_tokens = 8;
  c.graph_modes = (1u << FATTN_MODE_DECODE) | (1u << FATTN_MODE_DRAFT_DECODE) | (1u << FATTN_MODE_TARGET_VERIFY);
  ck_assert_ok(fattn_memory_plan(&c, &m, &r, detail, sizeof detail));
  /* buckets for max_batch 8: 1 2 4 8; area = 80 + entries*48 (+ mask rows*8), 256-aligned */
  ck_assert_uint_eq(r.graph_bytes_per_mode[FATTN_MODE_DECODE], 256ull + 256 + 512 + 512);
  /* 4 branch entries a request: 80 + 192, 80 + 384, 80 + 768, 80 + 1536 */
  ck_assert_uint_eq(r.graph_bytes_per_mode[FATTN_MODE_DRAFT_DECODE], 512ull + 512 + 1024 + 1792);
  /* 8 mask rows a request: 80 + 48 + 64, 80 + 96 + 128, 80 + 192 + 256, 80 + 384 + 512 */
  ck_assert_uint_eq(r.graph_bytes_per_mode[FATTN_MODE_TARGET_VERIFY], 256ull + 512 + 768 + 1024);
  ck_assert_uint_eq(r.region_bytes[FATTN_REGION_GRAPH_STATIC],
                    r.graph_bytes_per_mode[FATTN_MODE_DECODE] + r.graph_bytes_per_mode[FATTN_MODE_DRAFT_DECODE] +
                        r.graph_bytes_per_mode[FATTN_MODE_TARGET_VERIFY]);
}
END_TEST

/* Each bad field gives ERR_INVALID (or the named status) and a detail naming it. */
START_TEST(plan_rejects_with_detail) {
  fattn_config c;
  fattn_model m;
  fattn_memory_report r = FATTN_MEMORY_REPORT_INIT;
#define REJECT(stmt, st, text)                                                     \
  do {                                                                             \
    fattn_test_small(&c, &m);                                                      \
    stmt;                                                                          \
    detail[0] = 0;                                                                 \
    ck_assert_status(fattn_memory_plan(&c, &m, &r, detail, sizeof detail), st);    \
    ck_assert_msg(strstr(detail, text) != NULL, "detail '%s' lacks '%s'", detail, text); \
  } while (0)
  REJECT(c.page_size = 48, FATTN_ERR_INVALID, "page_size 48: not a power of two in 1..256");
  REJECT(c.page_size = 512, FATTN_ERR_INVALID, "page_size 512");
  REJECT(c.page_size = 0, FATTN_ERR_INVALID, "page_size 0");
  REJECT(m.head_dim = 80, FATTN_ERR_INVALID, "head_dim 80");
  REJECT(m.head_dim_v = 128, FATTN_ERR_INVALID, "head_dim_v 128");
  REJECT(m.num_kv_heads = 3, FATTN_ERR_INVALID, "num_kv_heads 3: must divide num_q_heads 4");
  REJECT(m.num_kv_heads = 0, FATTN_ERR_INVALID, "num_kv_heads 0");
  REJECT(m.num_layers = 0, FATTN_ERR_INVALID, "num_layers 0");
  REJECT(c.kv_budget_pages = 15, FATTN_ERR_INVALID, "smaller than one max_seq_len 64 sequence (16 pages)");
  REJECT((c.kv_budget_pages = 0, c.kv_budget_bytes = 1000), FATTN_ERR_INVALID, "KV budget of 0 pages");
  REJECT(c.q_dtype = FATTN_DTYPE_FP8_E4M3, FATTN_ERR_INVALID, "q_dtype");
  REJECT(c.struct_size = 6, FATTN_ERR_INVALID, "fattn_config struct_size 6: smaller than its first field's end (8");
  REJECT(c.struct_size = 0, FATTN_ERR_INVALID, "fattn_config struct_size 0");
  REJECT(m.struct_size = 4, FATTN_ERR_INVALID, "fattn_model struct_size 4");
  REJECT(m.struct_size = 8192, FATTN_ERR_INVALID, "fattn_model struct_size 8192: over 4096 bytes");
  REJECT(c.max_batch = 0, FATTN_ERR_INVALID, "max_batch 0");
  REJECT(c.spec_topk = 2, FATTN_ERR_INVALID, "spec_draft_tokens 0");
  REJECT(c.prefill_backend = FATTN_BACKEND_FA2, FATTN_ERR_INVALID, "runs only the CPU backend");
  REJECT(c.decode_backend = (fattn_backend)3, FATTN_ERR_INVALID, "decode_backend 3: unknown backend");
  REJECT(m.logit_softcap = NAN, FATTN_ERR_INVALID, "logit_softcap");
  REJECT((c.kv_budget_pages = 0xffffffffu, c.max_seq_len = 1), FATTN_ERR_OVERFLOW, "page ids are 32-bit");
  /* an overflow names the fields whose product overflows: 2^38 bytes a page here */
  REJECT((m.num_layers = 1024, m.num_q_heads = 1024, m.num_kv_heads = 1024, m.head_dim = 256, c.page_size = 256,
          c.kv_budget_bytes = ~0ull, c.kv_budget_pages = 0, c.max_seq_len = 0xffffffffu, c.max_seqs = 1u << 22),
         FATTN_ERR_OVERFLOW,
         "kv_budget_bytes 18446744073709551615 (67108863 pages) x page_bytes 274877906944: the device allocation");
  REJECT((m.num_layers = 1024, m.num_q_heads = 1024, m.num_kv_heads = 1024, m.head_dim = 256, c.page_size = 256,
          c.kv_budget_pages = 4294967294u, c.max_seq_len = 256),
         FATTN_ERR_OVERFLOW,
         "kv_budget_pages 4294967294 x page_bytes 274877906944: the K and V pools overflow 64 bits");
  REJECT(c.graph_modes = 1u << FATTN_MODE_PREFILL, FATTN_ERR_INVALID, "graph_modes");
  uint32_t buckets[] = {1, 4, 2};
  REJECT((c.num_graph_buckets = 3, c.graph_buckets = buckets), FATTN_ERR_INVALID, "graph_buckets[2] 2");
#undef REJECT
}
END_TEST

/* An older caller's shorter config and model read with the defaults past their struct_size; a
 * newer caller's longer ones only while the bytes this library does not know are zero. */
START_TEST(versioned_inputs_adapt) {
  fattn_config c;
  fattn_model m;
  fattn_memory_report full = FATTN_MEMORY_REPORT_INIT, r = FATTN_MEMORY_REPORT_INIT;
  fattn_test_small(&c, &m);
  ck_assert_ok(fattn_memory_plan(&c, &m, &full, detail, sizeof detail));
  /* older: no graph_modes or flags; what lies there is none of the library's business */
  c.graph_modes = 0xdead;
  c.flags = 0x80;
  ck_assert_status(fattn_memory_plan(&c, &m, &r, detail, sizeof detail), FATTN_ERR_INVALID);
  c.struct_size = offsetof(fattn_config, graph_modes);
  ck_assert_msg(fattn_memory_plan(&c, &m, &r, detail, sizeof detail) == FATTN_OK, "%s", detail);
  ck_assert_mem_eq(&r, &full, sizeof r);
  /* an older model without sinks: a stray pointer there is never read */
  fattn_test_small(&c, &m);
  m.sinks = (const float *)(uintptr_t)8;
  m.struct_size = offsetof(fattn_model, sinks);
  fattn_ctx *ctx = NULL;
  ck_assert_msg(fattn_create(&c, &m, &ctx, detail, sizeof detail) == FATTN_OK, "%s", detail);
  ck_assert_ok(fattn_destroy(ctx, 0));
  /* newer: longer structs whose unknown tail is zero, then one that sets a byte of it */
  struct {
    fattn_config c;
    uint64_t tail[2];
  } cn;
  struct {
    fattn_model m;
    uint64_t tail[2];
  } mn;
  memset(&cn, 0, sizeof cn);
  memset(&mn, 0, sizeof mn);
  fattn_test_small(&cn.c, &mn.m);
  cn.c.struct_size = sizeof cn;
  mn.m.struct_size = sizeof mn;
  ck_assert_msg(fattn_memory_plan(&cn.c, &mn.m, &r, detail, sizeof detail) == FATTN_OK, "%s", detail);
  ck_assert_mem_eq(&r, &full, sizeof r);
  ((uint8_t *)&cn)[sizeof(fattn_config) + 5] = 1;
  ck_assert_status(fattn_memory_plan(&cn.c, &mn.m, &r, detail, sizeof detail), FATTN_ERR_INVALID);
  char want[128];
  snprintf(want, sizeof want, "fattn_config struct_size %zu: byte %zu is not zero", sizeof cn,
           sizeof(fattn_config) + 5);
  ck_assert_msg(strstr(detail, want), "detail '%s' lacks '%s'", detail, want);
  ck_assert_status(fattn_create(&cn.c, &mn.m, &ctx, detail, sizeof detail), FATTN_ERR_INVALID);
  ck_assert_msg(strstr(detail, want), "detail '%s' lacks '%s'", detail, want);
  cn.c.struct_size = sizeof(fattn_config);
  ((uint8_t *)&mn)[sizeof mn - 1] = 7;
  ck_assert_status(fattn_memory_plan(&cn.c, &mn.m, &r, detail, sizeof detail), FATTN_ERR_INVALID);
  snprintf(want, sizeof want, "fattn_model struct_size %zu: byte %zu is not zero", sizeof mn, sizeof mn - 1);
  ck_assert_msg(strstr(detail, want), "detail '%s' lacks '%s'", detail, want);
}
END_TEST

/* An output struct gets exactly its caller's struct_size bytes: an older caller's tail is
 * never written, a newer caller's zero tail stays zero. */
START_TEST(versioned_outputs_adapt) {
  fattn_config c;
  fattn_model m;
  fattn_test_small(&c, &m);
  fattn_memory_report full = FATTN_MEMORY_REPORT_INIT;
  ck_assert_ok(fattn_memory_plan(&c, &m, &full, detail, sizeof detail));
  struct {
    fattn_memory_report r;
    uint8_t tail[24];
  } out;
  const size_t older = offsetof(fattn_memory_report, device_bytes); /* region bytes only */
  memset(&out, 0xa5, sizeof out);
  out.r.struct_size = (uint32_t)older;
  ck_assert_ok(fattn_memory_plan(&c, &m, &out.r, detail, sizeof detail));
  ck_assert_uint_eq(out.r.struct_size, older);
  ck_assert_mem_eq(out.r.region_bytes, full.region_bytes, sizeof full.region_bytes);
  for (size_t i = older; i < sizeof out; i++) ck_assert_uint_eq(((uint8_t *)&out)[i], 0xa5);
  memset(&out, 0, sizeof out);
  out.r.struct_size = sizeof out;
  ck_assert_ok(fattn_memory_plan(&c, &m, &out.r, detail, sizeof detail));
  ck_assert_mem_eq((uint8_t *)&out.r + 4, (uint8_t *)&full + 4, sizeof full - 4);
  for (size_t i = 0; i < sizeof out.tail; i++) ck_assert_uint_eq(out.tail[i], 0);
  out.tail[3] = 1;
  ck_assert_status(fattn_memory_plan(&c, &m, &out.r, detail, sizeof detail), FATTN_ERR_INVALID);
  ck_assert_msg(strstr(detail, "fattn_memory_report struct_size"), "%s", detail);
  out.r.struct_size = 71;
  ck_assert_status(fattn_memory_plan(&c, &m, &out.r, detail, sizeof detail), FATTN_ERR_INVALID);
  ck_assert_msg(strstr(detail, "fattn_memory_report struct_size 71: smaller than its first field's end (72"), "%s",
                detail);
  /* stats: an older caller's struct without the counters */
  fattn_ctx *ctx = NULL;
  ck_assert_ok(fattn_create(&c, &m, &ctx, detail, sizeof detail));
  uint32_t s;
  ck_assert_ok(fattn_seq_open(ctx, &s));
  ck_assert_ok(fattn_seq_reserve(ctx, s, 9));
  struct {
    fattn_stats st;
    uint8_t tail[16];
  } so;
  const size_t counters = offsetof(fattn_stats, page_allocs);
  memset(&so, 0x5a, sizeof so);
  so.st.struct_size = (uint32_t)counters;
  ck_assert_ok(fattn_get_stats(ctx, &so.st));
  ck_assert_uint_eq(so.st.pages_total, 64);
  ck_assert_uint_eq(so.st.pages_free, 61);
  ck_assert_uint_eq(so.st.seqs_open, 1);
  for (size_t i = counters; i < sizeof so; i++) ck_assert_uint_eq(((uint8_t *)&so)[i], 0x5a);
  memset(&so, 0, sizeof so);
  so.st.struct_size = sizeof so;
  ck_assert_ok(fattn_get_stats(ctx, &so.st));
  ck_assert_uint_eq(so.st.page_allocs, 3);
  so.tail[15] = 2;
  ck_assert_status(fattn_get_stats(ctx, &so.st), FATTN_ERR_INVALID);
  char want[96];
  snprintf(want, sizeof want, "fattn_stats struct_size %zu: byte %zu is not zero", sizeof so, sizeof so - 1);
  ck_assert_msg(strstr(fattn_detail(ctx), want), "detail '%s' lacks '%s'", fattn_detail(ctx), want);
  ck_assert_ok(fattn_destroy(ctx, 1));
}
END_TEST

/* The GEMM dtype a layer's kernels get from compute_dtype: q_dtype for 0 and for an older
 * caller's config that ends before the field, e4m3 where asked. */
static uint32_t layer_compute(const fattn_config *c, const fattn_model *m) {
  fattn_ctx *ctx = NULL;
  ck_assert_msg(fattn_create(c, m, &ctx, detail, sizeof detail) == FATTN_OK, "%s", detail);
  const uint32_t t = fattn__layer_params_for(ctx, 1).compute_dtype;
  ck_assert_ok(fattn_destroy(ctx, 0));
  return t;
}

/* compute_dtype: 0 or q_dtype, or e4m3 over an fp8 cache of a model without MLA; every other
 * value is refused naming it, and a refused create hands out no context. */
START_TEST(compute_dtype_checked) {
  fattn_config c;
  fattn_model m;
  fattn_memory_report r = FATTN_MEMORY_REPORT_INIT, full = FATTN_MEMORY_REPORT_INIT;
  fattn_test_small(&c, &m);
  ck_assert_int_eq(c.compute_dtype, 0); /* FATTN_CONFIG_INIT: q_dtype's 16-bit MMAs */
  ck_assert_uint_eq(layer_compute(&c, &m), FATTN_DTYPE_BF16);
  c.compute_dtype = FATTN_DTYPE_BF16;
  ck_assert_uint_eq(layer_compute(&c, &m), FATTN_DTYPE_BF16);
  c.q_dtype = c.kv_dtype = FATTN_DTYPE_FP16;
  c.compute_dtype = 0;
  ck_assert_uint_eq(layer_compute(&c, &m), FATTN_DTYPE_FP16);
  c.compute_dtype = FATTN_DTYPE_FP16;
  ck_assert_uint_eq(layer_compute(&c, &m), FATTN_DTYPE_FP16);
  c.kv_dtype = FATTN_DTYPE_FP8_E4M3;
  c.compute_dtype = FATTN_DTYPE_FP8_E4M3;
  ck_assert_uint_eq(layer_compute(&c, &m), FATTN_DTYPE_FP8_E4M3);
  /* fp8 compute changes no byte of the plan: the cache is the fp8 cache either way */
  ck_assert_ok(fattn_memory_plan(&c, &m, &r, detail, sizeof detail));
  c.compute_dtype = 0;
  ck_assert_ok(fattn_memory_plan(&c, &m, &full, detail, sizeof detail));
  ck_assert_mem_eq(&r, &full, sizeof r);
  /* an older caller's config ends before the field: what lies there is not read */
  fattn_test_small(&c, &m);
  c.compute_dtype = (fattn_dtype)7;
  ck_assert_status(fattn_memory_plan(&c, &m, &r, detail, sizeof detail), FATTN_ERR_INVALID);
  c.struct_size = offsetof(fattn_config, compute_dtype);
  ck_assert_uint_eq(layer_compute(&c, &m), FATTN_DTYPE_BF16);
#define REJECT(stmt, text)                                                                  \
  do {                                                                                      \
    fattn_test_small(&c, &m);                                                               \
    stmt;                                                                                   \
    fattn_ctx *ctx = (fattn_ctx *)1;                                                        \
    ck_assert_status(fattn_memory_plan(&c, &m, &r, detail, sizeof detail), FATTN_ERR_INVALID); \
    ck_assert_msg(strstr(detail, text) != NULL, "detail '%s' lacks '%s'", detail, text);    \
    ck_assert_status(fattn_create(&c, &m, &ctx, detail, sizeof detail), FATTN_ERR_INVALID); \
    ck_assert_ptr_null(ctx);                                                                \
    ck_assert_msg(strstr(detail, text) != NULL, "detail '%s' lacks '%s'", detail, text);    \
  } while (0)
  REJECT(c.compute_dtype = (fattn_dtype)7, "compute_dtype 7: unknown");
  REJECT(c.compute_dtype = (fattn_dtype)-1, "compute_dtype -1: unknown");
  REJECT((c.kv_dtype = FATTN_DTYPE_FP8_E4M3, c.compute_dtype = (fattn_dtype)4), "compute_dtype 4: unknown");
  REJECT(c.compute_dtype = FATTN_DTYPE_FP16, "compute_dtype 2: a 16-bit compute_dtype must equal q_dtype 1");
  REJECT((c.q_dtype = c.kv_dtype = FATTN_DTYPE_FP16, c.compute_dtype = FATTN_DTYPE_BF16),
         "compute_dtype 1: a 16-bit compute_dtype must equal q_dtype 2");
  REJECT(c.compute_dtype = FATTN_DTYPE_FP8_E4M3, "compute_dtype FP8_E4M3 needs kv_dtype FP8_E4M3 (kv_dtype 1)");
  REJECT((c.q_dtype = c.kv_dtype = FATTN_DTYPE_FP16, c.compute_dtype = FATTN_DTYPE_FP8_E4M3),
         "compute_dtype FP8_E4M3 needs kv_dtype FP8_E4M3 (kv_dtype 2)");
  REJECT((m.num_q_heads = 16, m.num_kv_heads = 1, m.head_dim = 576, m.head_dim_v = 512, m.mla_latent_dim = 512,
          m.mla_rope_dim = 64, c.kv_dtype = FATTN_DTYPE_FP8_E4M3, c.compute_dtype = FATTN_DTYPE_FP8_E4M3),
         "compute_dtype FP8_E4M3: not for MLA models");
#undef REJECT
}
END_TEST

START_TEST(status_strings) {
  ck_assert_str_eq(fattn_status_name(FATTN_ERR_CAPACITY), "FATTN_ERR_CAPACITY");
  ck_assert_str_eq(fattn_status_name(FATTN_OK), "FATTN_OK");
  ck_assert_str_eq(fattn_strerror(FATTN_ERR_BUSY), "context still has live sequences");
  ck_assert_str_eq(fattn_strerror((fattn_status)-99), "unknown status");
  ck_assert_str_eq(fattn_version(), "0.1.0");
  /* the number agrees with the macros and the string, as SQLite's and libuv's do */
  ck_assert_int_eq(fattn_version_number(), FATTN_VERSION_NUMBER);
  ck_assert_int_eq(FATTN_VERSION_NUMBER,
                   FATTN_VERSION_MAJOR * 10000 + FATTN_VERSION_MINOR * 100 + FATTN_VERSION_PATCH);
  int major = -1, minor = -1, patch = -1;
  ck_assert_int_eq(sscanf(fattn_version(), "%d.%d.%d", &major, &minor, &patch), 3);
  ck_assert_int_eq(fattn_version_number(), major * 10000 + minor * 100 + patch);
  ck_assert_int_eq(FATTN_VERSION_NUMBER, 100);
  ck_assert_str_eq(fattn_region_name(FATTN_REGION_PAGE_TABLE), "page_table");
}
END_TEST

START_TEST(create_destroy_cpu) {
  fattn_config c;
  fattn_model m;
  fattn_test_small(&c, &m);
  fattn_ctx *ctx = (fattn_ctx *)1;
  c.page_size = 3;
  ck_assert_status(fattn_create(&c, &m, &ctx, detail, sizeof detail), FATTN_ERR_INVALID);
  ck_assert_ptr_null(ctx);
  ck_assert_str_eq(detail, "page_size 3: not a power of two in 1..256");
  fattn_test_small(&c, &m);
  ck_assert_ok(fattn_create(&c, &m, &ctx, detail, sizeof detail));
  ck_assert_int_eq(fattn_ctx_backend(ctx, FATTN_MODE_DECODE), FATTN_BACKEND_CPU);
  ck_assert_uint_eq(fattn_ctx_memory(ctx)->num_pages, 64u);
  ck_assert_ok(fattn_check(ctx));
  uint32_t s;
  ck_assert_ok(fattn_seq_open(ctx, &s));
  ck_assert_status(fattn_destroy(ctx, 0), FATTN_ERR_BUSY);
  ck_assert_str_eq(fattn_detail(ctx), "1 sequences still open (close them or force)");
  ck_assert_ok(fattn_destroy(ctx, 1));
  ck_assert_ok(fattn_destroy(NULL, 0));
}
END_TEST

FATTN_SUITE("memory", FATTN_TEST_CPU, plan_llama8b_exact, plan_fp8_mla_and_graphs, plan_rejects_with_detail,
            versioned_inputs_adapt, versioned_outputs_adapt, compute_dtype_checked, status_strings,
            create_destroy_cpu)
