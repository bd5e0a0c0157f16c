/* gpu_arena.c: the arena and planner on a CUDA device. One cudaMalloc and one pinned slab per
 * context, faults cleanly handled, prep-kernel metadata equal to the CPU plan, no hot-path calls. */
#include <cuda_runtime_api.h>
#include <stdlib.h>

#include "attn/plan.h"
#include "tests/support.h"
#include "tests/support_gpu.h"

static char detail[256];

static void gpu_small(fattn_config *c, fattn_model *m) {
  fattn_test_small(c, m);
  c->device = 0;
  c->kv_budget_pages = 2048;
  c->max_seqs = 64;
  c->max_batch = 32;
  c->max_seq_len = 1024;
  c->max_q_tokens = 2048;
  c->spec_topk = 2;
  c->spec_steps = 2;
  c->spec_draft_tokens = 4;
  c->staging_slots = 8;
}

START_TEST(create_takes_one_device_and_one_pinned_allocation) {
  fattn_config c;
  fattn_model m;
  gpu_small(&c, &m);
  fattn_ctx *ctx = NULL;
  fattn_test_cuda_devices(); /* the runtime's own start-up stays out of the count */
  fattn_calls_reset();
  fattn_status st = fattn_create(&c, &m, &ctx, detail, sizeof detail);
  fattn_call_counts made = fattn_calls;
  ck_assert_msg(st == FATTN_OK, "%s", detail);
  ck_assert_int_eq(made.device_alloc, 1);
  ck_assert_int_eq(made.host_alloc, 1);
  ck_assert_int_eq(fattn_ctx_backend(ctx, FATTN_MODE_DECODE), FATTN_BACKEND_FA2);
  ck_assert_ok(fattn_check(ctx));
  ck_assert_ok(fattn_destroy(ctx, 0));
}
END_TEST

START_TEST(device_and_pinned_faults_fail_cleanly) {
  fattn_config c;
  fattn_model m;
  gpu_small(&c, &m);
  const fattn_fault_kind kinds[2] = {FATTN_FAULT_DEVICE, FATTN_FAULT_PINNED};
  for (int k = 0; k < 2; k++) {
    fattn_ctx *ctx = NULL;
    fattn_fault_arm(kinds[k], 1);
    fattn_status st = fattn_create(&c, &m, &ctx, detail, sizeof detail);
    long seen = fattn_fault_seen(kinds[k]);
    fattn_fault_arm(kinds[k], 0);
    ck_assert_int_eq(seen, 1);
    ck_assert_status(st, FATTN_ERR_NOMEM);
    ck_assert_ptr_null(ctx);
    ck_assert_ok(fattn_create(&c, &m, &ctx, detail, sizeof detail));
    ck_assert_ok(fattn_destroy(ctx, 0));
  }
}
END_TEST


/* Random sequences, forks and a random batch of the given mode; returns its entry count. */
static uint32_t random_batch(fattn_ctx *ctx, uint64_t *seed, fattn_mode mode, uint32_t *ids, uint32_t *q,
                             fattn_batch *b) {
  uint32_t reqs = 1 + fattn_test_rand(seed) % 16, per = mode == FATTN_MODE_DRAFT_DECODE ? 2 : 1;
  for (uint32_t i = 0; i < reqs * per; i++) {
    uint32_t len = 1 + fattn_test_rand(seed) % 200;
    q[i] = mode == FATTN_MODE_PREFILL ? 1 + fattn_test_rand(seed) % (len < 100 ? len : 100)
           : mode == FATTN_MODE_TARGET_VERIFY ? 4 : 1;
    if (len < q[i]) len = q[i];
    ck_assert_ok(fattn_seq_open(ctx, &ids[i]));
    ck_assert_ok(fattn_seq_reserve(ctx, ids[i], len));
  }
  fattn_batch x = FATTN_BATCH_INIT;
  x.mode = mode;
  x.num_seqs = reqs;
  x.seq_ids = ids;
  x.q_lens = q;
  *b = x;
  return reqs * per;
}

/* The device page table equals the host's mirror (after the stream is drained). */
static void expect_table_equal(fattn_ctx *ctx) {
  const size_t table_bytes = (size_t)ctx->pages.max_seqs * ctx->pages.pages_per_seq * 4;
  uint32_t *dev_table = fattn_test_xmalloc(table_bytes);
  ck_assert_int_eq(cudaMemcpy(dev_table, ctx->dev + ctx->lay.dev_off[FATTN_REGION_PAGE_TABLE], table_bytes,
                              cudaMemcpyDeviceToHost),
                   cudaSuccess);
  ck_assert_int_eq(memcmp(dev_table, ctx->pages.table, table_bytes), 0);
  free(dev_table);
}

/* Plans b (n entries) into NaN-poisoned metadata; the device's derivation must equal
 * fattn__prep on the host over the staged input, and its page table the host's mirror. */
static void expect_prep_matches(fattn_ctx *ctx, const fattn_batch *b, uint32_t n) {
  uint8_t *inbox = ctx->dev + ctx->lay.dev_off[FATTN_REGION_METADATA];
  fattn__entry *want_e = malloc(n * sizeof *want_e), *got_e = malloc(n * sizeof *got_e);
  ck_assert_int_eq(cudaMemset(inbox, 0xff, ctx->lay.slot_bytes), cudaSuccess);
  ck_assert_msg(fattn_plan(ctx, b, NULL) == FATTN_OK, "%s", fattn_detail(ctx));
  ck_assert_int_eq(cudaDeviceSynchronize(), cudaSuccess);
  uint32_t used = (ctx->ring_next + ctx->n.staging_slots - 1) % ctx->n.staging_slots;
  uint8_t *staged = ctx->ring + (uint64_t)used * ctx->lay.slot_bytes;
  fattn__step_hdr want = *(fattn__step_hdr *)staged, got;
  for (uint32_t i = 0; i < n; i++)
    fattn__unstage(&want, (const fattn__staged *)(staged + fattn__area_entries_off()) + i, i, &want_e[i]);
  fattn__prep(&want, want_e);
  ck_assert_int_eq(cudaMemcpy(&got, inbox, sizeof got, cudaMemcpyDeviceToHost), cudaSuccess);
  ck_assert_int_eq(cudaMemcpy(got_e, inbox + fattn__area_entries_off(), n * sizeof *got_e, cudaMemcpyDeviceToHost),
                   cudaSuccess);
  ck_assert_int_eq(memcmp(&got, &want, sizeof got), 0);
  ck_assert_int_eq(memcmp(got_e, want_e, n * sizeof *got_e), 0);
  ck_assert_uint_eq(got.num_entries, n);
  expect_table_equal(ctx);
  free(want_e), free(got_e);
}

/* Random batches of every decode-side mode and prefill. */
START_TEST(prep_kernel_matches_host_plan) {
  fattn_config c;
  fattn_model m;
  gpu_small(&c, &m);
  fattn_ctx *ctx;
  ck_assert_ok(fattn_create(&c, &m, &ctx, detail, sizeof detail));
  uint64_t seed = 1;
  const fattn_mode modes[4] = {FATTN_MODE_DECODE, FATTN_MODE_PREFILL, FATTN_MODE_TARGET_VERIFY,
                               FATTN_MODE_DRAFT_DECODE};
  for (int round = 0; round < 40; round++) {
    uint32_t ids[32], q[32];
    fattn_batch b;
    uint32_t n = random_batch(ctx, &seed, modes[round % 4], ids, q, &b);
    expect_prep_matches(ctx, &b, n);
    for (uint32_t i = 0; i < n; i++) ck_assert_ok(fattn_seq_close(ctx, ids[i]));
  }
  ck_assert_ok(fattn_check(ctx));
  ck_assert_ok(fattn_destroy(ctx, 0));
}
END_TEST

/* More entries than the prep block has threads (the scan carries across chunks), and a
 * verify step whose splits overflow the workspace (every entry falls back to one split). */
START_TEST(prep_kernel_many_entries_and_unsplit) {
  fattn_config c;
  fattn_model m;
  gpu_small(&c, &m);
  c.max_batch = 1500;
  c.max_seqs = 3000;
  c.max_q_tokens = 6000;
  c.kv_budget_pages = 1500 * 200;
  c.max_splits = 2; /* 128 workspace rows */
  fattn_ctx *ctx;
  ck_assert_msg(fattn_create(&c, &m, &ctx, detail, sizeof detail) == FATTN_OK, "%s", detail);
  static uint32_t ids[1500], q[1500];
  uint64_t seed = 3;
  for (uint32_t i = 0; i < 1500; i++) {
    ck_assert_ok(fattn_seq_open(ctx, &ids[i]));
    ck_assert_ok(fattn_seq_reserve(ctx, ids[i], 4 + fattn_test_rand(&seed) % 700));
    q[i] = 1;
  }
  fattn_batch b = FATTN_BATCH_INIT;
  b.num_seqs = 1500, b.seq_ids = ids, b.q_lens = q;
  expect_prep_matches(ctx, &b, 1500);
  for (uint32_t i = 0; i < 40; i++) q[i] = 4;
  b.mode = FATTN_MODE_TARGET_VERIFY, b.num_seqs = 40, b.q_lens = NULL;
  for (uint32_t i = 0; i < 40; i++) ck_assert_ok(fattn_seq_reserve(ctx, ids[i], 600 + 4));
  expect_prep_matches(ctx, &b, 40);
  fattn__step_hdr h;
  ck_assert_int_eq(cudaMemcpy(&h, ctx->dev + ctx->lay.dev_off[FATTN_REGION_METADATA], sizeof h,
                              cudaMemcpyDeviceToHost), cudaSuccess);
  ck_assert_uint_eq(h.num_split_rows, 0); /* 40 x 2 splits x 4 rows > 128: no split */
  ck_assert_ok(fattn_destroy(ctx, 1));
}
END_TEST

/* Page `page` of layer l's pool (0 K, 1 V) on the device, and the bytes the test puts there. */
static uint8_t *pool_page(fattn_ctx *ctx, uint32_t l, int pool, uint32_t page, size_t bytes, uint8_t *pattern) {
  for (size_t i = 0; i < bytes; i++) pattern[i] = (uint8_t)(i * 7 + l * 31 + pool * 101);
  uint8_t *base = pool ? ctx->dev + ctx->lay.dev_off[FATTN_REGION_V_POOL] + l * ctx->lay.v_layer_bytes
                       : ctx->dev + ctx->lay.dev_off[FATTN_REGION_K_POOL] + l * ctx->lay.k_layer_bytes;
  return base + page * bytes;
}

/* Copy-on-write on the device: the fork's private tail page holds the parent's bytes, also
 * when copies chain within one plan (a -> b, then b -> c), and when many are independent. */
START_TEST(copy_on_write_copies_every_layer) {
  fattn_config c;
  fattn_model m;
  gpu_small(&c, &m);
  fattn_ctx *ctx;
  ck_assert_ok(fattn_create(&c, &m, &ctx, detail, sizeof detail));
  size_t page = (size_t)c.page_size * m.num_kv_heads * m.head_dim * 2;
  uint8_t *pattern = malloc(page), *back = malloc(page);
  uint32_t a, f;
  ck_assert_ok(fattn_seq_open(ctx, &a));
  ck_assert_ok(fattn_seq_reserve(ctx, a, 6)); /* pages 0, 1 of 4 tokens; 1 half full */
  uint32_t tail = ctx->pages.table[(size_t)a * ctx->pages.pages_per_seq + 1];
  for (uint32_t l = 0; l < m.num_layers; l++)
    for (int pool = 0; pool < 2; pool++) {
      uint8_t *dst = pool_page(ctx, l, pool, tail, page, pattern);
      ck_assert_int_eq(cudaMemcpy(dst, pattern, page, cudaMemcpyHostToDevice), cudaSuccess);
    }
  uint32_t g;
  ck_assert_ok(fattn_seq_fork(ctx, a, 6, &f));
  ck_assert_ok(fattn_seq_reserve(ctx, f, 7)); /* copy tail -> f's page */
  ck_assert_ok(fattn_seq_fork(ctx, f, 6, &g));
  ck_assert_ok(fattn_seq_reserve(ctx, g, 7)); /* copy f's page -> g's page: a chain */
  ck_assert_uint_eq(ctx->pages.num_copies, 2);
  uint32_t copy = ctx->pages.table[(size_t)g * ctx->pages.pages_per_seq + 1];
  ck_assert_uint_ne(copy, tail);
  fattn_batch b = FATTN_BATCH_INIT;
  b.num_seqs = 1;
  b.seq_ids = &g;
  ck_assert_ok(fattn_plan(ctx, &b, NULL));
  ck_assert_int_eq(cudaDeviceSynchronize(), cudaSuccess);
  for (uint32_t l = 0; l < m.num_layers; l++)
    for (int pool = 0; pool < 2; pool++) {
      uint8_t *src = pool_page(ctx, l, pool, copy, page, pattern);
      ck_assert_int_eq(cudaMemcpy(back, src, page, cudaMemcpyDeviceToHost), cudaSuccess);
      ck_assert_msg(memcmp(back, pattern, page) == 0, "layer %u pool %d not copied", l, pool);
    }
  /* Independent copies (one source, six destinations), which the kernel's parts share. */
  uint32_t br[6], dst[6];
  for (int k = 0; k < 6; k++) {
    ck_assert_ok(fattn_seq_fork(ctx, a, 6, &br[k]));
    ck_assert_ok(fattn_seq_reserve(ctx, br[k], 7));
    dst[k] = ctx->pages.table[(size_t)br[k] * ctx->pages.pages_per_seq + 1];
    ck_assert_uint_ne(dst[k], tail);
  }
  ck_assert_uint_eq(ctx->pages.num_copies, 6);
  b.seq_ids = &br[0];
  ck_assert_ok(fattn_plan(ctx, &b, NULL));
  ck_assert_int_eq(cudaDeviceSynchronize(), cudaSuccess);
  for (int k = 0; k < 6; k++)
    for (uint32_t l = 0; l < m.num_layers; l++)
      for (int pool = 0; pool < 2; pool++) {
        uint8_t *src = pool_page(ctx, l, pool, dst[k], page, pattern);
        ck_assert_int_eq(cudaMemcpy(back, src, page, cudaMemcpyDeviceToHost), cudaSuccess);
        ck_assert_msg(memcmp(back, pattern, page) == 0, "copy %d layer %u pool %d not copied", k, l, pool);
      }
  free(pattern);
  free(back);
  ck_assert_ok(fattn_destroy(ctx, 1));
}
END_TEST

/* Plans a decode step of keeper, drains the GPU, and adds up the row copies and fills that
 * the step's slots carried (use u of the ring is slot u % slots: only the last slots' count). */
static void plan_keeper(fattn_ctx *ctx, uint32_t keeper, uint32_t *copies, uint32_t *fills) {
  fattn_batch b = FATTN_BATCH_INIT;
  b.num_seqs = 1;
  b.seq_ids = &keeper;
  const uint64_t taken = ctx->ring_taken;
  ck_assert_msg(fattn_plan(ctx, &b, NULL) == FATTN_OK, "%s", fattn_detail(ctx));
  ck_assert_int_eq(cudaDeviceSynchronize(), cudaSuccess);
  const uint64_t first = ctx->ring_taken - taken > ctx->n.staging_slots ? ctx->ring_taken - ctx->n.staging_slots : taken;
  for (uint64_t u = first; u < ctx->ring_taken; u++) {
    const fattn__step_hdr *h = (const fattn__step_hdr *)(ctx->ring + u % ctx->n.staging_slots * ctx->lay.slot_bytes);
    *copies += h->num_row_copies, *fills += h->num_row_fills;
  }
  expect_table_equal(ctx);
}

/* Forks ship as device-side row copies (copy_rows_kernel), closes and truncates as fills (the
 * prep's warps): after random windows of page operations, and after rounds of long forks, the
 * device table equals the mirror, and the slots did carry copies and fills. */
START_TEST(row_copies_and_fills_match_the_mirror) {
  fattn_config c;
  fattn_model m;
  gpu_small(&c, &m);
  fattn_ctx *ctx;
  ck_assert_ok(fattn_create(&c, &m, &ctx, detail, sizeof detail));
  uint32_t keeper, open[40], n = 0, copies = 0, fills = 0;
  uint64_t rng = 11;
  ck_assert_ok(fattn_seq_open(ctx, &keeper));
  ck_assert_ok(fattn_seq_reserve(ctx, keeper, 1));
  ck_assert_ok(fattn_seq_open(ctx, &open[n]));
  ck_assert_ok(fattn_seq_reserve(ctx, open[n++], 1000));
  const int rounds = getenv("FATTN_TEST_QUICK") ? 60 : 300; /* under compute-sanitizer */
  for (int round = 0; round < rounds; round++) {
    fattn_test_page_ops(ctx, &rng, open, &n, 40, c.max_seq_len);
    if (round % 30 == 29) /* a speculative round: two branches of every sequence, full length */
      for (uint32_t i = 0, live = n; i < live && n + 2 <= 40; i++)
        for (int k = 0; k < 2; k++) {
          uint32_t len;
          ck_assert_ok(fattn_seq_length(ctx, open[i], &len));
          ck_assert_ok(fattn_seq_fork(ctx, open[i], len, &open[n++]));
        }
    plan_keeper(ctx, keeper, &copies, &fills);
  }
  ck_assert_uint_gt(copies, (uint32_t)rounds / 3); /* the rounds did exercise both */
  ck_assert_uint_gt(fills, (uint32_t)rounds / 3);
  ck_assert_ok(fattn_check(ctx));
  ck_assert_ok(fattn_destroy(ctx, 1));
}
END_TEST

/* The GPU held busy while the host plans two rings' worth of steps, each shipping new pages
 * of its own sequence: the plan that wraps onto a slot the prep kernel has not read yet must
 * wait (counted) instead of overwriting it, so every step's page-table changes reach the
 * device; afterwards each completion word holds its slot's last use number + 1. */
START_TEST(slot_reuse_waits_for_the_gpu) {
  fattn_config c;
  fattn_model m;
  gpu_small(&c, &m);
  fattn_ctx *ctx;
  ck_assert_ok(fattn_create(&c, &m, &ctx, detail, sizeof detail));
  cudaStream_t s;
  ck_assert_int_eq(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  const uint32_t slots = c.staging_slots, plans = 2 * slots + 3;
  uint32_t ids[64];
  fattn_batch b = FATTN_BATCH_INIT;
  b.num_seqs = 1;
  for (int round = 0; round < 3; round++) {
    fattn_stats before = FATTN_STATS_INIT, after = FATTN_STATS_INIT;
    ck_assert_ok(fattn_get_stats(ctx, &before));
    ck_assert_int_eq(fattn_test_gpu_hold(s, 50000), 0);
    for (uint32_t k = 0; k < plans; k++) {
      ck_assert_ok(fattn_seq_open(ctx, &ids[k]));
      ck_assert_ok(fattn_seq_reserve(ctx, ids[k], 1 + (k * 37 + round * 11) % 300));
      b.seq_ids = &ids[k];
      ck_assert_msg(fattn_plan(ctx, &b, s) == FATTN_OK, "%s", fattn_detail(ctx));
    }
    ck_assert_int_eq(cudaStreamSynchronize(s), cudaSuccess);
    ck_assert_ok(fattn_get_stats(ctx, &after));
    ck_assert_uint_ge(after.staging_waits - before.staging_waits, 1);
    for (uint32_t i = 0; i < slots; i++) {
      uint64_t last = ctx->ring_taken - 1 - (ctx->ring_taken - 1 + slots - i) % slots;
      ck_assert_uint_eq(ctx->done[i], last + 1);
    }
    b.seq_ids = &ids[plans - 1];
    expect_prep_matches(ctx, &b, 1); /* one more plan; compares the whole page table */
    for (uint32_t k = 0; k < plans; k++) ck_assert_ok(fattn_seq_close(ctx, ids[k]));
  }
  ck_assert_ok(fattn_check(ctx));
  cudaStreamDestroy(s);
  ck_assert_ok(fattn_destroy(ctx, 0));
}
END_TEST

/* Sequence operations and plans on the device: no allocation, no synchronising call while
 * the staging ring has room. */
START_TEST(plan_makes_no_forbidden_call_on_gpu) {
  fattn_config c;
  fattn_model m;
  gpu_small(&c, &m);
  fattn_ctx *ctx;
  ck_assert_ok(fattn_create(&c, &m, &ctx, detail, sizeof detail));
  uint32_t ids[8];
  for (int i = 0; i < 8; i++) ck_assert_ok(fattn_seq_open(ctx, &ids[i]));
  fattn_batch b = FATTN_BATCH_INIT;
  b.num_seqs = 8;
  b.seq_ids = ids;
  int fails = 0;
  for (int i = 0; i < 8; i++) ck_assert_ok(fattn_seq_reserve(ctx, ids[i], 1));
  ck_assert_ok(fattn_plan(ctx, &b, NULL)); /* the first launch loads the module: not the hot path */
  for (int round = 0; round < 20; round++) {
    ck_assert_int_eq(cudaDeviceSynchronize(), cudaSuccess);
    fattn_calls_reset();
    for (uint32_t s = 0; s < c.staging_slots - 1; s++) { /* fewer plans than slots: no wait */
      for (int i = 0; i < 8; i++) {
        uint32_t len;
        fattn_seq_length(ctx, ids[i], &len);
        fails += fattn_seq_reserve(ctx, ids[i], len + 1) != FATTN_OK;
      }
      fails += fattn_plan(ctx, &b, NULL) != FATTN_OK;
    }
    fattn_call_counts made = fattn_calls;
    ck_assert_int_eq(fails, 0);
    ck_assert_int_eq(made.malloc + made.free + made.device_alloc + made.host_alloc + made.sync, 0);
  }
  ck_assert_ok(fattn_destroy(ctx, 1));
}
END_TEST

FATTN_SUITE("gpu_arena", FATTN_TEST_GPU, create_takes_one_device_and_one_pinned_allocation,
            device_and_pinned_faults_fail_cleanly, prep_kernel_matches_host_plan, prep_kernel_many_entries_and_unsplit,
            copy_on_write_copies_every_layer, row_copies_and_fills_match_the_mirror, slot_reuse_waits_for_the_gpu,
            plan_makes_no_forbidden_call_on_gpu)
