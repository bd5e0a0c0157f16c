/* test_bucket.c: a graph bucket's step, planned on the CPU backend into the bucket's own area
 * (what fattn_graph_launch does before its replay), against the same batch planned eagerly. */
#include <math.h>
#include <stdlib.h>

#include "graph/graph.h"
#include "lib/dtype.h"
#include "tests/support.h"

/* 40 requests: buckets 1, 2, 4, 8, 12, 16, 24, 32, 40. Past 32 the padding to 40 changes the
 * entry count that the split rule would see if it counted padding (3 splits against 2 at 4 kv
 * heads and 384+ slots), so the rounds draw there half the time. */
enum { LAYERS = 2, HQ = 8, HKV = 4, D = 64, TOPK = 2, DRAFT = 4, MAX_BATCH = 40, MAX_LEN = 768 };
enum { MAX_ENTRIES = MAX_BATCH * TOPK, MAX_Q = MAX_ENTRIES * (DRAFT + 1) };

static fattn_ctx *ctx;

static void open_ctx(void) {
  fattn_config c;
  fattn_model m;
  char detail[256];
  fattn_test_small(&c, &m);
  c.max_batch = MAX_BATCH;
  c.max_seqs = MAX_ENTRIES;
  c.max_seq_len = MAX_LEN;
  c.max_q_tokens = MAX_Q;
  m.num_q_heads = HQ;
  m.num_kv_heads = HKV;
  c.page_size = 16;
  c.kv_budget_pages = MAX_ENTRIES * (MAX_LEN / 16);
  c.spec_topk = TOPK;
  c.spec_steps = 2;
  c.spec_draft_tokens = DRAFT;
  for (int mode = FATTN_MODE_DECODE; mode <= FATTN_MODE_DRAFT_EXTEND; mode++) c.graph_modes |= 1u << mode;
  ck_assert_msg(fattn_create(&c, &m, &ctx, detail, sizeof detail) == FATTN_OK, "%s", detail);
}

/* n rows of heads x D bf16 values, a pure function of (seed, row, element). */
static uint16_t *rows(uint64_t seed, uint32_t n, uint32_t heads) {
  uint16_t *x = fattn_test_xmalloc((size_t)n * heads * D * 2);
  for (size_t i = 0; i < (size_t)n * heads * D; i++) {
    uint64_t s = seed * 0x100000001b3ull + i;
    x[i] = fattn__f32_to_bf16((float)((double)(fattn_test_splitmix(&s) % 2001) / 1000.0 - 1.0));
  }
  return x;
}

/* A step's outputs over every layer: [layer][q_tokens, HQ, D] and [layer][q_tokens, HQ]. */
typedef struct outputs {
  uint16_t *out;
  float *lse;
} outputs;

static outputs run_layers(uint32_t q_tokens, const uint16_t *q, const uint16_t *k, const uint16_t *v) {
  outputs o = {fattn_test_xmalloc((size_t)LAYERS * q_tokens * HQ * D * 2),
               fattn_test_xmalloc((size_t)LAYERS * q_tokens * HQ * 4)};
  memset(o.out, 0xff, (size_t)LAYERS * q_tokens * HQ * D * 2); /* NaN: every row must be written */
  for (uint32_t l = 0; l < LAYERS; l++) {
    ck_assert_ok(fattn_store_kv(ctx, l, k, v, NULL));
    ck_assert_ok(fattn_attend(ctx, l, q, o.out + (size_t)l * q_tokens * HQ * D, o.lse + (size_t)l * q_tokens * HQ,
                              NULL));
  }
  return o;
}

/* Both K and V pools, every layer, as bytes. */
static uint8_t *pools(size_t *bytes) {
  const fattn_memory_report *r = fattn_ctx_memory(ctx);
  const uint64_t k = r->region_bytes[FATTN_REGION_K_POOL], v = r->region_bytes[FATTN_REGION_V_POOL];
  uint8_t *p = fattn_test_xmalloc(k + v);
  memcpy(p, ctx->dev + ctx->lay.dev_off[FATTN_REGION_K_POOL], k);
  memcpy(p + k, ctx->dev + ctx->lay.dev_off[FATTN_REGION_V_POOL], v);
  *bytes = k + v;
  return p;
}

/* Rounds of random batches in each graph mode, with lengths up to MAX_LEN so that decode-like
 * steps split. Each batch runs eagerly, then planned into its bucket's area with the padding a
 * replay gets: the live rows must equal the eager step's bit for bit (the split policy counts
 * live entries, so padding changes no split), padding rows must be zeros with LSE -inf, and
 * the second store must leave the pools as the first left them (same bytes into the same
 * slots; padding entries store nothing). */
START_TEST(bucket_step_equals_eager) {
  const fattn_mode modes[] = {FATTN_MODE_DECODE, FATTN_MODE_DRAFT_DECODE, FATTN_MODE_TARGET_VERIFY,
                              FATTN_MODE_DRAFT_EXTEND};
  uint64_t seed = 11;
  uint32_t split_steps = 0; /* steps with a split entry: the split rule was exercised */
  for (uint32_t m = 0; m < 4; m++) {
    const fattn_mode mode = modes[m];
    const uint32_t per = mode == FATTN_MODE_DRAFT_DECODE ? TOPK : 1;
    const uint32_t q_bucket = mode == FATTN_MODE_TARGET_VERIFY ? DRAFT
                              : mode == FATTN_MODE_DRAFT_EXTEND  ? DRAFT + 1
                                                                 : 1;
    open_ctx();
    for (uint32_t round = 0; round < 4; round++) {
      const uint32_t requests = round % 2 ? 33 + fattn_test_rand(&seed) % 7 : 1 + fattn_test_rand(&seed) % MAX_BATCH;
      const uint32_t n = requests * per;
      uint32_t ids[MAX_ENTRIES], q_lens[MAX_ENTRIES], q_tokens = 0;
      uint64_t mask[MAX_BATCH * DRAFT];
      for (uint32_t i = 0; i < n; i++) {
        q_lens[i] = mode == FATTN_MODE_DRAFT_EXTEND ? 1 + fattn_test_rand(&seed) % (DRAFT + 1) : q_bucket;
        ck_assert_ok(fattn_seq_open(ctx, &ids[i]));
        ck_assert_ok(fattn_seq_reserve(ctx, ids[i], q_lens[i] + fattn_test_rand(&seed) % (MAX_LEN - q_lens[i])));
        q_tokens += q_lens[i];
      }
      for (uint32_t r = 0; r < requests * DRAFT; r++) { /* a tree: each draft sees itself and some before */
        const uint64_t self = 1ull << (r % DRAFT);
        mask[r] = self | (fattn_test_rand(&seed) & (self - 1));
      }
      fattn_batch b = FATTN_BATCH_INIT;
      b.mode = mode;
      b.num_seqs = requests;
      b.seq_ids = ids;
      b.q_lens = mode == FATTN_MODE_DRAFT_EXTEND ? q_lens : NULL;
      b.tree_mask = mode == FATTN_MODE_TARGET_VERIFY && round % 2 ? mask : NULL;
      /* the bucket: the smallest that holds the batch, padded to its entries */
      uint32_t bk = 0;
      while (ctx->n.buckets[bk] < requests) bk++;
      const fattn__graph_slot *g = &ctx->graphs[(size_t)mode * ctx->n.num_buckets + bk];
      const uint32_t cap = g->requests * per, padded_q = q_tokens + (cap - n) * q_bucket;
      uint16_t *q = rows(seed, padded_q, HQ), *k = rows(seed + 1, q_tokens, HKV), *v = rows(seed + 2, q_tokens, HKV);

      ck_assert_msg(fattn_plan(ctx, &b, NULL) == FATTN_OK, "%s", fattn_detail(ctx));
      uint32_t split_entries = 0;
      for (uint32_t i = 0; i < n; i++) split_entries += ctx->step.entries[i].num_splits > 1;
      split_steps += split_entries > 0;
      outputs eager = run_layers(q_tokens, q, k, v);
      size_t bytes;
      uint8_t *stored = pools(&bytes);

      const fattn__plan_target t = {g->area, cap, q_bucket, g->box};
      ck_assert_msg(fattn__plan_into(ctx, &b, NULL, &t) == FATTN_OK, "%s", fattn_detail(ctx));
      ck_assert_uint_eq(ctx->step.cap_entries, cap);
      ck_assert_uint_eq(ctx->step.hdr->num_entries, cap);
      ck_assert_uint_eq(ctx->step.hdr->num_live, n);
      for (uint32_t i = 0; i < n; i++) /* the same split of every live entry */
        split_entries -= ctx->step.entries[i].num_splits > 1;
      ck_assert_uint_eq(split_entries, 0);
      outputs bucket = run_layers(padded_q, q, k, v);
      uint8_t *stored_again = pools(&bytes);
      ck_assert_msg(memcmp(stored, stored_again, bytes) == 0, "mode %d: the bucket's store changed the pools", mode);

      for (uint32_t l = 0; l < LAYERS; l++) {
        const uint16_t *e = eager.out + (size_t)l * q_tokens * HQ * D, *o = bucket.out + (size_t)l * padded_q * HQ * D;
        const float *el = eager.lse + (size_t)l * q_tokens * HQ, *ol = bucket.lse + (size_t)l * padded_q * HQ;
        ck_assert_msg(memcmp(e, o, (size_t)q_tokens * HQ * D * 2) == 0, "mode %d round %u layer %u: live rows differ",
                      mode, round, l);
        ck_assert_msg(memcmp(el, ol, (size_t)q_tokens * HQ * 4) == 0, "mode %d round %u layer %u: live LSEs differ",
                      mode, round, l);
        for (size_t i = (size_t)q_tokens * HQ * D; i < (size_t)padded_q * HQ * D; i++)
          ck_assert_msg(o[i] == 0, "mode %d: padding element %zu is 0x%04x", mode, i, o[i]);
        for (size_t i = (size_t)q_tokens * HQ; i < (size_t)padded_q * HQ; i++)
          ck_assert_msg(isinf(ol[i]) && ol[i] < 0, "mode %d: padding LSE %zu is %g", mode, i, (double)ol[i]);
      }
      free(eager.out), free(eager.lse), free(bucket.out), free(bucket.lse);
      free(stored), free(stored_again), free(q), free(k), free(v);
      for (uint32_t i = 0; i < n; i++) ck_assert_ok(fattn_seq_close(ctx, ids[i]));
      ck_assert_ok(fattn_check(ctx));
    }
    ck_assert_ok(fattn_destroy(ctx, 0));
  }
  ck_assert_uint_ge(split_steps, 4);
}
END_TEST

FATTN_SUITE("bucket", FATTN_TEST_CPU, bucket_step_equals_eager)
