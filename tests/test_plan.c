/* test_plan.c: fattn_plan, fattn_store_kv and fattn_attend through the public API on the CPU
 * backend: every validation error leaves the state unchanged; steps agree across modes and forks. */
#include <math.h>
#include <stdlib.h>

#include "lib/dtype.h"
#include "lib/internal.h"
#include "tests/support.h"

static fattn_ctx *ctx;
static char detail[256];

enum { LAYERS = 2, HQ = 4, HKV = 2, D = 64, DRAFT = 4 };

static void open_ctx(uint32_t topk) {
  fattn_config c;
  fattn_model m;
  fattn_test_small(&c, &m);
  c.kv_budget_pages = 128;
  c.max_seqs = 16;
  c.max_q_tokens = 96;
  c.max_encoder_len = 32;
  if (topk) {
    c.spec_topk = topk;
    c.spec_steps = 2;
    c.spec_draft_tokens = DRAFT;
  }
  ck_assert_msg(fattn_create(&c, &m, &ctx, detail, sizeof detail) == FATTN_OK, "%s", detail);
}

static uint32_t seq_with(uint32_t len) {
  uint32_t s;
  ck_assert_ok(fattn_seq_open(ctx, &s));
  ck_assert_ok(fattn_seq_reserve(ctx, s, len));
  return s;
}

#define REJECT(batch, status, text)                                                   \
  do {                                                                              \
    uint8_t *before_, *after_;                                                      \
    size_t n_ = fattn_test_snapshot(ctx, &before_);                                 \
    const uint64_t taken_ = ctx->ring_taken; /* a rejected batch gives its slot back */ \
    ck_assert_status(fattn_plan(ctx, (batch), NULL), (status));                    \
    ck_assert_uint_eq(ctx->ring_taken, taken_);                                     \
    ck_assert_msg(strstr(fattn_detail(ctx), text), "detail '%s' lacks '%s'", fattn_detail(ctx), text); \
    fattn_test_snapshot(ctx, &after_);                                              \
    ck_assert_msg(memcmp(before_, after_, n_) == 0, "rejected plan changed state"); \
    free(before_);                                                                  \
    free(after_);                                                                   \
    ck_assert_ok(fattn_check(ctx));                                                 \
  } while (0)

START_TEST(rejects_bad_batches_unchanged) {
  open_ctx(2);
  uint32_t a = seq_with(10), b = seq_with(20), closed = seq_with(3), bad = 999;
  ck_assert_ok(fattn_seq_close(ctx, closed));
  fattn_batch x = FATTN_BATCH_INIT;
  uint32_t ids[2] = {a, b}, q[2] = {1, 1}, kv[2] = {10, 20};
  x.num_seqs = 2;
  x.seq_ids = ids;
  REJECT(NULL, FATTN_ERR_INVALID, "batch must not be NULL");
  fattn_batch y = x;
  y.struct_size = 6;
  REJECT(&y, FATTN_ERR_INVALID, "fattn_batch struct_size 6: smaller than its first field's end (8");
  struct {
    fattn_batch b;
    uint64_t tail;
  } newer = {x, 0};
  newer.b.struct_size = sizeof newer;
  ((uint8_t *)&newer)[sizeof(fattn_batch) + 2] = 1;
  char want[96];
  snprintf(want, sizeof want, "fattn_batch struct_size %zu: byte %zu is not zero", sizeof newer,
           sizeof(fattn_batch) + 2);
  REJECT(&newer.b, FATTN_ERR_INVALID, want);
  y = x, y.mode = (fattn_mode)9;
  REJECT(&y, FATTN_ERR_INVALID, "mode 9: unknown");
  y = x, y.num_seqs = 0;
  REJECT(&y, FATTN_ERR_INVALID, "num_seqs 0");
  y = x, y.num_seqs = 9;
  REJECT(&y, FATTN_ERR_INVALID, "num_seqs 9: must be in 1..max_batch 8");
  y = x, y.seq_ids = NULL;
  REJECT(&y, FATTN_ERR_INVALID, "seq_ids must not be NULL");
  uint32_t unknown[2] = {a, bad}, gone[2] = {closed, a}, twice[2] = {a, a};
  y = x, y.seq_ids = unknown;
  REJECT(&y, FATTN_ERR_NOT_FOUND, "sequence 999 is not open");
  y = x, y.seq_ids = gone;
  REJECT(&y, FATTN_ERR_NOT_FOUND, "is not open");
  y = x, y.seq_ids = twice;
  REJECT(&y, FATTN_ERR_INVALID, "appears twice");
  q[1] = 2;
  y = x, y.q_lens = q;
  REJECT(&y, FATTN_ERR_INVALID, "batch entry 1: q_len 2, decode takes 1");
  q[1] = 1, kv[0] = 11;
  y = x, y.kv_lens = kv;
  REJECT(&y, FATTN_ERR_INVALID, "kv_len 11 over sequence");
  y = x, y.mode = FATTN_MODE_PREFILL, y.q_lens = q, y.kv_lens = kv;
  q[0] = 12, kv[0] = 10;
  REJECT(&y, FATTN_ERR_INVALID, "batch entry 0: kv_len 10 < q_len 12");
  q[0] = 0;
  REJECT(&y, FATTN_ERR_INVALID, "q_len 0");
  ck_assert_ok(fattn_seq_reserve(ctx, a, 64));
  ck_assert_ok(fattn_seq_reserve(ctx, b, 64));
  q[0] = 64, q[1] = 40, kv[0] = 64, kv[1] = 40;
  REJECT(&y, FATTN_ERR_INVALID, "104 query tokens: over max_q_tokens 96");
  y = x, y.kv_new_lens = q;
  REJECT(&y, FATTN_ERR_INVALID, "kv_new_lens: only CROSS");
  /* speculative modes */
  y = x, y.mode = FATTN_MODE_TARGET_VERIFY, y.q_lens = q, y.kv_lens = NULL;
  q[0] = DRAFT, q[1] = DRAFT + 1;
  REJECT(&y, FATTN_ERR_INVALID, "batch entry 1: q_len 5, verify takes spec_draft_tokens 4");
  uint64_t mask[2 * DRAFT] = {1, 3, 5, 9, 1, 2, 4, 8};
  y = x, y.mode = FATTN_MODE_TARGET_VERIFY, y.tree_mask = mask;
  mask[2] = 2; /* row 2 does not see itself */
  REJECT(&y, FATTN_ERR_INVALID, "tree_mask row 2 (entry 0, draft 2): does not see itself");
  mask[2] = 5, mask[7] = 8 | 16;
  REJECT(&y, FATTN_ERR_INVALID, "tree_mask row 7: bits past spec_draft_tokens 4");
  mask[7] = 8;
  y.mode = FATTN_MODE_PREFILL;
  REJECT(&y, FATTN_ERR_INVALID, "tree_mask: only TARGET_VERIFY");
  y = x, y.mode = FATTN_MODE_DRAFT_EXTEND, y.q_lens = q;
  q[0] = 6, q[1] = 1;
  REJECT(&y, FATTN_ERR_INVALID, "q_len 6, draft extend takes 1..5");
  y = x, y.mode = FATTN_MODE_DRAFT_DECODE, y.num_seqs = 1; /* 1 request = 2 branches */
  uint32_t one[2] = {a, bad};
  y.seq_ids = one;
  REJECT(&y, FATTN_ERR_NOT_FOUND, "batch entry 1: sequence 999 is not open");
  /* CROSS */
  y = x, y.mode = FATTN_MODE_CROSS, y.q_lens = q, y.kv_lens = kv;
  q[0] = q[1] = 1, kv[0] = 33, kv[1] = 3;
  REJECT(&y, FATTN_ERR_INVALID, "encoder length 33 over max_encoder_len 32");
  uint32_t nw[2] = {4, 4};
  kv[0] = 8;
  y.kv_new_lens = nw;
  REJECT(&y, FATTN_ERR_INVALID, "batch entry 1: kv_new_len 4 over encoder length 3");
  /* a write into a page a fork shares */
  uint32_t f;
  ck_assert_ok(fattn_seq_truncate(ctx, a, 10));
  ck_assert_ok(fattn_seq_fork(ctx, a, 10, &f));
  y = x, y.num_seqs = 1, y.kv_lens = NULL; /* decode at slot 9 of a */
  REJECT(&y, FATTN_ERR_INVALID, "new slots of sequence 0 lie in page");
  y.seq_ids = &f; /* and of the fork */
  REJECT(&y, FATTN_ERR_INVALID, "lie in page");
  ck_assert_ok(fattn_seq_close(ctx, f)); /* a's bound still covers the page, now its own */
  y.seq_ids = &a;
  ck_assert_ok(fattn_plan(ctx, &y, NULL));
  ck_assert_ok(fattn_destroy(ctx, 1));
  /* modes the config did not enable */
  open_ctx(0);
  a = seq_with(8);
  x.num_seqs = 1;
  x.seq_ids = &a;
  y = x, y.mode = FATTN_MODE_TARGET_VERIFY;
  REJECT(&y, FATTN_ERR_INVALID, "speculative modes need spec_topk >= 1 at create");
  ck_assert_ok(fattn_destroy(ctx, 1));
}
END_TEST

/* An older caller's batch without the length arrays plans as one with them NULL, whatever
 * lies past its struct_size; a newer caller's longer batch plans while its tail is zero. */
START_TEST(versioned_batches_adapt) {
  open_ctx(0);
  uint32_t ids[2] = {seq_with(5), seq_with(9)};
  fattn_batch older = FATTN_BATCH_INIT;
  older.num_seqs = 2;
  older.seq_ids = ids;
  older.q_lens = older.kv_lens = older.kv_new_lens = (const uint32_t *)(uintptr_t)8; /* never read */
  older.tree_mask = (const uint64_t *)(uintptr_t)8;
  older.struct_size = offsetof(fattn_batch, q_lens);
  ck_assert_msg(fattn_plan(ctx, &older, NULL) == FATTN_OK, "%s", fattn_detail(ctx));
  ck_assert_uint_eq(ctx->step.cap_entries, 2);
  ck_assert_uint_eq(ctx->step.cap_q_tokens, 2);
  struct {
    fattn_batch b;
    uint64_t tail[2];
  } newer;
  memset(&newer, 0, sizeof newer);
  newer.b.mode = FATTN_MODE_DECODE;
  newer.b.num_seqs = 2;
  newer.b.seq_ids = ids;
  newer.b.struct_size = sizeof newer;
  ck_assert_msg(fattn_plan(ctx, &newer.b, NULL) == FATTN_OK, "%s", fattn_detail(ctx));
  ck_assert_uint_eq(ctx->steps_planned, 2);
  ck_assert_ok(fattn_destroy(ctx, 1));
}
END_TEST

/* The duplicate check's 32-bit stamp wraps after 2^32 plan passes: then a sequence opened and
 * never planned, or one planned 2^32 passes before, is no duplicate, and a real one still is. */
START_TEST(duplicate_check_survives_the_stamp_wrap) {
  open_ctx(0);
  uint32_t a = seq_with(4), old = seq_with(4);
  fattn_batch x = FATTN_BATCH_INIT;
#define PLAN(n, ...)                                                            \
  do {                                                                          \
    const uint32_t ids_[] = {__VA_ARGS__};                                      \
    x.num_seqs = (n), x.seq_ids = ids_;                                         \
    ck_assert_msg(fattn_plan(ctx, &x, NULL) == FATTN_OK, "%s", fattn_detail(ctx)); \
  } while (0)
  PLAN(1, old); /* stamped with one of the counter's first values */
  ctx->plan_stamp = UINT32_MAX - 1u;
  PLAN(1, a); /* the counter's last value */
  uint32_t fresh = seq_with(4);
  PLAN(1, fresh); /* the pass that wraps */
  for (int pass = 0; pass < 3; pass++) PLAN(1, old);
  PLAN(2, fresh, old);
  uint32_t twice[2] = {fresh, fresh};
  x.num_seqs = 2, x.seq_ids = twice;
  ck_assert_status(fattn_plan(ctx, &x, NULL), FATTN_ERR_INVALID);
  ck_assert_msg(strstr(fattn_detail(ctx), "appears twice"), "%s", fattn_detail(ctx));
  ctx->plan_stamp = UINT32_MAX;
  ck_assert_status(fattn_plan(ctx, &x, NULL), FATTN_ERR_INVALID); /* a duplicate in the wrapping pass */
  ck_assert_msg(strstr(fattn_detail(ctx), "appears twice"), "%s", fattn_detail(ctx));
  PLAN(2, a, old);
#undef PLAN
  ck_assert_ok(fattn_destroy(ctx, 1));
}
END_TEST

/* Token pos of stream seed: the same values whichever sequence holds it. [n, heads, D] bf16 */
static uint16_t *tokens(uint32_t seed, uint32_t pos, uint32_t n, uint32_t heads) {
  uint16_t *x = malloc((size_t)n * heads * D * 2);
  for (uint32_t t = 0; t < n; t++)
    for (uint32_t i = 0; i < heads * D; i++) {
      uint64_t z = ((uint64_t)seed << 40) ^ ((uint64_t)(pos + t) << 16) ^ i;
      z = (z ^ (z >> 31)) * 0x94d049bb133111ebull;
      z ^= z >> 29;
      float v = (float)((double)(z % 2001) / 1000.0 - 1.0 + 1e-3);
      x[(size_t)t * heads * D + i] = fattn__f32_to_bf16(v);
    }
  return x;
}

/* One step over entries (seq, q_len) at each sequence's current length (DRAFT_DECODE: n
 * branches, n / spec_topk requests): store the
 * K/V of stream kv_seed at positions [len - q_len, len), attend with Q of q_seed. */
static void step(fattn_mode mode, uint32_t n, const uint32_t *seqs, const uint32_t *q_lens,
                 const uint32_t *kv_seed, uint32_t q_seed, uint16_t *out, float *lse) {
  fattn_batch b = FATTN_BATCH_INIT;
  b.mode = mode;
  b.num_seqs = mode == FATTN_MODE_DRAFT_DECODE ? n / ctx->n.cfg.spec_topk : n; /* requests */
  b.seq_ids = seqs;
  b.q_lens = q_lens;
  ck_assert_msg(fattn_plan(ctx, &b, NULL) == FATTN_OK, "%s", fattn_detail(ctx));
  uint32_t total = 0;
  for (uint32_t i = 0; i < n; i++) total += q_lens[i];
  uint16_t *k = malloc((size_t)total * HKV * D * 2), *v = malloc((size_t)total * HKV * D * 2);
  uint16_t *q = malloc((size_t)total * HQ * D * 2);
  for (uint32_t i = 0, row = 0; i < n; i++) {
    uint32_t len;
    fattn_seq_length(ctx, seqs[i], &len);
    uint16_t *ks = tokens(kv_seed[i], len - q_lens[i], q_lens[i], HKV);
    uint16_t *vs = tokens(kv_seed[i] + 1000, len - q_lens[i], q_lens[i], HKV);
    uint16_t *qs = tokens(q_seed, len - q_lens[i], q_lens[i], HQ);
    memcpy(k + (size_t)row * HKV * D, ks, (size_t)q_lens[i] * HKV * D * 2);
    memcpy(v + (size_t)row * HKV * D, vs, (size_t)q_lens[i] * HKV * D * 2);
    memcpy(q + (size_t)row * HQ * D, qs, (size_t)q_lens[i] * HQ * D * 2);
    row += q_lens[i];
    free(ks), free(vs), free(qs);
  }
  for (uint32_t l = 0; l < LAYERS; l++) {
    ck_assert_ok(fattn_store_kv(ctx, l, k, v, NULL));
    ck_assert_ok(fattn_attend(ctx, l, q, out, lse, NULL));
  }
  free(k), free(v), free(q);
}

/* DECODE of token t equals the last row of PREFILL over t tokens, through the whole API. */
START_TEST(decode_equals_prefill_row) {
  open_ctx(0);
  uint32_t a = seq_with(13), b = seq_with(14), seeds[2] = {7, 7}, q13[1] = {13}, q14[1] = {14}, one[1] = {1};
  uint16_t out_a[HQ * D], out_b[14 * HQ * D];
  float lse_a[HQ], lse_b[14 * HQ];
  step(FATTN_MODE_PREFILL, 1, &a, q13, seeds, 3, out_b, lse_b);
  ck_assert_ok(fattn_seq_reserve(ctx, a, 14));
  step(FATTN_MODE_DECODE, 1, &a, one, seeds, 3, out_a, lse_a);
  /* the step header carries the decode kind's residency, fixed at create for the split rule */
  ck_assert_uint_eq(ctx->step.hdr->decode_resident, fattn__decode_resident(0, D, HQ / HKV));
  step(FATTN_MODE_PREFILL, 1, &b, q14, seeds, 3, out_b, lse_b);
  ck_assert_int_eq(memcmp(out_a, out_b + 13 * HQ * D, sizeof out_a), 0);
  ck_assert_int_eq(memcmp(lse_a, lse_b + 13 * HQ, sizeof lse_a), 0);
  for (int h = 0; h < HQ; h++) ck_assert(isfinite(lse_a[h]) && lse_a[h] != 0.0f);
  ck_assert_ok(fattn_check(ctx));
  ck_assert_ok(fattn_destroy(ctx, 1));
}
END_TEST

/* The model's arrays reach the kernels through fattn_create: a sink far above every score sets
 * its head's LSE and empties its O, a head without one matches a model without sinks bit for
 * bit, and layer 1's window of 2 leaves rows 0-2 as they were and changes the later ones. */
START_TEST(model_sinks_and_layer_opts_reach_attend) {
  enum { T = 12 };
  static uint16_t out[2][LAYERS][T * HQ * D];
  static float lse[2][LAYERS][T * HQ];
  float sinks[LAYERS * HQ];
  for (int i = 0; i < LAYERS * HQ; i++) sinks[i] = i % HQ == 0 ? 150.0f : -INFINITY;
  fattn_layer_opts opts[LAYERS] = {FATTN_LAYER_OPTS_INIT, FATTN_LAYER_OPTS_INIT};
  opts[1].sliding_window = 2;
  uint16_t *k = tokens(5, 0, T, HKV), *v = tokens(6, 0, T, HKV), *q = tokens(7, 0, T, HQ);
  for (int with = 0; with < 2; with++) {
    fattn_config c;
    fattn_model m;
    fattn_test_small(&c, &m);
    m.sinks = with ? sinks : NULL;
    m.layers = with ? opts : NULL;
    ck_assert_msg(fattn_create(&c, &m, &ctx, detail, sizeof detail) == FATTN_OK, "%s", detail);
    uint32_t s = seq_with(T), q_len[1] = {T};
    fattn_batch b = FATTN_BATCH_INIT;
    b.mode = FATTN_MODE_PREFILL;
    b.num_seqs = 1;
    b.seq_ids = &s;
    b.q_lens = q_len;
    ck_assert_msg(fattn_plan(ctx, &b, NULL) == FATTN_OK, "%s", fattn_detail(ctx));
    for (uint32_t l = 0; l < LAYERS; l++) {
      ck_assert_ok(fattn_store_kv(ctx, l, k, v, NULL));
      ck_assert_ok(fattn_attend(ctx, l, q, out[with][l], lse[with][l], NULL));
    }
    ck_assert_ok(fattn_destroy(ctx, 1));
  }
  for (uint32_t t = 0; t < T; t++) {
    for (uint32_t h = 0; h < HQ; h++) {
      const size_t r = (size_t)t * HQ + h;
      if (h == 0) {
        ck_assert_msg(fabsf(lse[1][0][r] - 150.0f) <= 1e-3f, "row %u: LSE %g under a sink of 150", t,
                      (double)lse[1][0][r]);
        for (uint32_t c = 0; c < D; c++) ck_assert_uint_eq(out[1][0][r * D + c] & 0x7fffu, 0u);
      } else {
        ck_assert_int_eq(memcmp(&lse[1][0][r], &lse[0][0][r], sizeof(float)), 0);
        ck_assert_int_eq(memcmp(&out[1][0][r * D], &out[0][0][r * D], D * 2), 0);
        const int same = memcmp(&out[1][1][r * D], &out[0][1][r * D], D * 2) == 0;
        ck_assert_msg(same == (t <= 2), "layer 1 row %u head %u: the window of 2 %s", t, h,
                      same ? "changed nothing" : "changed a row that sees all its keys");
      }
    }
  }
  free(k), free(v), free(q);
}
END_TEST

/* A fork that writes into its shared tail page gets a private copy holding the prefix:
 * its decode equals that of a sequence that was given the same tokens outright. */
START_TEST(fork_copy_on_write_keeps_prefix) {
  open_ctx(0);
  uint32_t a = seq_with(10), seeds[1] = {5}, q10[1] = {10}, one[1] = {1}, f, g = seq_with(11);
  uint16_t out_f[HQ * D], out_g[11 * HQ * D], out_a[HQ * D];
  float lse[11 * HQ];
  step(FATTN_MODE_PREFILL, 1, &a, q10, seeds, 9, out_g, lse);
  ck_assert_ok(fattn_seq_fork(ctx, a, 10, &f));
  ck_assert_ok(fattn_seq_reserve(ctx, f, 11)); /* slot 10 is in the shared page 2: copy */
  fattn_stats st = FATTN_STATS_INIT;
  fattn_get_stats(ctx, &st);
  ck_assert_uint_eq(st.cow_copies, 1);
  uint32_t other[1] = {77};
  step(FATTN_MODE_DECODE, 1, &f, one, seeds, 9, out_f, lse);
  ck_assert_ok(fattn_seq_reserve(ctx, a, 11)); /* the parent's own token differs */
  step(FATTN_MODE_DECODE, 1, &a, one, other, 9, out_a, lse);
  uint32_t q11[1] = {11};
  step(FATTN_MODE_PREFILL, 1, &g, q11, seeds, 9, out_g, lse);
  ck_assert_int_eq(memcmp(out_f, out_g + 10 * HQ * D, sizeof out_f), 0);
  ck_assert_int_ne(memcmp(out_a, out_f, sizeof out_f), 0);
  ck_assert_ok(fattn_check(ctx));
  ck_assert_ok(fattn_destroy(ctx, 1));
}
END_TEST

/* DRAFT_DECODE over topk branches of one request equals DECODE of each branch. */
START_TEST(draft_decode_equals_decode_per_branch) {
  open_ctx(2);
  uint32_t a = seq_with(9), seeds[2] = {4, 6}, q9[1] = {9}, one[2] = {1, 1}, br[2];
  uint16_t out[9 * HQ * D], dd[2 * HQ * D], d0[HQ * D];
  float lse[9 * HQ], lse_dd[2 * HQ], lse0[HQ];
  step(FATTN_MODE_PREFILL, 1, &a, q9, seeds, 2, out, lse);
  for (int i = 0; i < 2; i++) {
    ck_assert_ok(fattn_seq_fork(ctx, a, 9, &br[i]));
    ck_assert_ok(fattn_seq_reserve(ctx, br[i], 10));
  }
  step(FATTN_MODE_DRAFT_DECODE, 2, br, one, seeds, 2, dd, lse_dd);
  ck_assert_ok(fattn_seq_truncate(ctx, br[0], 9));
  ck_assert_ok(fattn_seq_reserve(ctx, br[0], 10));
  step(FATTN_MODE_DECODE, 1, &br[0], one, seeds, 2, d0, lse0);
  ck_assert_int_eq(memcmp(dd, d0, sizeof d0), 0);
  ck_assert_int_ne(memcmp(dd, dd + HQ * D, sizeof d0), 0); /* the branches saw different tokens */
  ck_assert_ok(fattn_destroy(ctx, 1));
}
END_TEST

/* Page-table changes larger than one staging slot go first in slots of their own; after the
 * plan the planner's table equals the allocator's. */
START_TEST(large_changes_take_several_slots) {
  fattn_config c;
  fattn_model m;
  fattn_test_small(&c, &m);
  c.page_size = 1;
  c.max_seq_len = 4096;
  c.kv_budget_pages = 5 * 4096;
  c.max_q_tokens = 8;
  ck_assert_msg(fattn_create(&c, &m, &ctx, detail, sizeof detail) == FATTN_OK, "%s", detail);
  uint32_t ids[5], cap = ctx->lay.cap_words;
  for (int i = 0; i < 5; i++) ids[i] = seq_with(4096); /* 20480 changed entries */
  ck_assert_uint_gt(5u * 4096u, 2u * cap);
  fattn_stats before = FATTN_STATS_INIT, after = FATTN_STATS_INIT;
  fattn_batch b = FATTN_BATCH_INIT;
  uint32_t twice[2] = {ids[0], ids[0]};
  b.num_seqs = 2, b.seq_ids = twice; /* rejected before any change is shipped */
  REJECT(&b, FATTN_ERR_INVALID, "appears twice");
  fattn_get_stats(ctx, &before);
  uint32_t ring = ctx->ring_next;
  b.num_seqs = 5, b.seq_ids = ids;
  ck_assert_ok(fattn_plan(ctx, &b, NULL));
  fattn_get_stats(ctx, &after);
  ck_assert_uint_eq(after.steps_planned, before.steps_planned + 1);
  uint32_t slots = (ctx->ring_next + ctx->n.staging_slots - ring) % ctx->n.staging_slots;
  ck_assert_uint_ge(slots, 3); /* 20480 words over slots of cap_words */
  ck_assert_uint_eq(ctx->pages.num_dirty, 0);
  for (uint32_t i = 0; i < 5; i++) { /* the step's own slot, taken last, carries the entries */
    const fattn__entry *e = &ctx->step.entries[i];
    ck_assert_uint_eq(e->seq, ids[i]);
    ck_assert_uint_eq(e->q_len, 1);
    ck_assert_uint_eq(e->kv_len, 4096);
  }
  ck_assert_int_eq(memcmp(ctx->dev + ctx->lay.dev_off[FATTN_REGION_PAGE_TABLE], ctx->pages.table,
                          (size_t)ctx->pages.max_seqs * ctx->pages.pages_per_seq * 4), 0);
  ck_assert_ok(fattn_check(ctx));
  ck_assert_ok(fattn_destroy(ctx, 1));
}
END_TEST

FATTN_SUITE("plan", FATTN_TEST_CPU, rejects_bad_batches_unchanged, decode_equals_prefill_row,
            fork_copy_on_write_keeps_prefix, draft_decode_equals_decode_per_branch,
            large_changes_take_several_slots, versioned_batches_adapt, duplicate_check_survives_the_stamp_wrap,
            model_sinks_and_layer_opts_reach_attend)
