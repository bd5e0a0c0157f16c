/* test_threads.c: distinct contexts on the CPU backend driven from two threads at once give
 * what each gives alone; creates and destroys of distinct contexts may overlap (make tsan). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "lib/dtype.h"
#include "tests/support.h"

enum { LAYERS = 2, HQ = 4, HKV = 2, D = 64, DRAFT = 4, TOPK = 2, ROUNDS = 6, MAXTOK = 32 };

/* One thread's work: the script's seed, then what it made (a digest of every output and LSE
 * byte, or the first failure). Workers never call Check: its failures unwind the main thread. */
typedef struct work {
  uint64_t seed;
  uint64_t digest;
  uint64_t calls;
  char failed[320];
} work;

static void digest_bytes(uint64_t *h, const void *p, size_t n) {
  const uint8_t *b = p;
  for (size_t i = 0; i < n; i++) *h = (*h ^ b[i]) * 0x100000001b3ull; /* FNV-1a */
}

static void fill_bf16(uint64_t *rng, uint16_t *x, size_t n) {
  for (size_t i = 0; i < n; i++)
    x[i] = fattn__f32_to_bf16((float)((double)(fattn_test_splitmix(rng) % 2001) / 1000.0 - 1.0));
}

#define TRY(w, ctx, call)                                                                    \
  do {                                                                                       \
    fattn_status st_ = (call);                                                               \
    (w)->calls++;                                                                            \
    if (st_ != FATTN_OK) {                                                                   \
      snprintf((w)->failed, sizeof (w)->failed, "%s: %s (%s)", #call, fattn_status_name(st_), \
               fattn_detail(ctx));                                                           \
      goto out;                                                                              \
    }                                                                                        \
  } while (0)

/* Plans one step, then stores and attends every layer with fresh K, V and Q; the outputs join
 * the digest. q_tokens query rows, new_tokens new K/V rows. */
static int run_step(work *w, fattn_ctx *ctx, const fattn_batch *b, uint32_t q_tokens, uint64_t *rng) {
  static _Thread_local uint16_t q[MAXTOK * HQ * D], k[MAXTOK * HKV * D], v[MAXTOK * HKV * D], o[MAXTOK * HQ * D];
  static _Thread_local float lse[MAXTOK * HQ];
  TRY(w, ctx, fattn_plan(ctx, b, NULL));
  for (uint32_t l = 0; l < LAYERS; l++) {
    fill_bf16(rng, q, (size_t)q_tokens * HQ * D);
    fill_bf16(rng, k, (size_t)q_tokens * HKV * D);
    fill_bf16(rng, v, (size_t)q_tokens * HKV * D);
    TRY(w, ctx, fattn_store_kv(ctx, l, k, v, NULL));
    TRY(w, ctx, fattn_attend(ctx, l, q, o, lse, NULL));
    digest_bytes(&w->digest, o, (size_t)q_tokens * HQ * D * 2);
    digest_bytes(&w->digest, lse, (size_t)q_tokens * HQ * 4);
  }
  return 1;
out:
  return 0;
}

/* What a serving loop does to one context: prefill, a fork sharing the prefix, decode steps,
 * a speculative round (draft branches, verify with a tree, truncate), closes; fattn_check
 * after each round. */
static void *script(void *arg) {
  work *w = arg;
  uint64_t rng = w->seed;
  w->digest = 0xcbf29ce484222325ull;
  fattn_config c;
  fattn_model m;
  fattn_test_small(&c, &m);
  c.kv_budget_pages = 96;
  c.max_seqs = 16;
  c.max_q_tokens = MAXTOK;
  c.spec_topk = TOPK;
  c.spec_steps = 2;
  c.spec_draft_tokens = DRAFT;
  char detail[256];
  fattn_ctx *ctx = NULL;
  fattn_memory_report r = FATTN_MEMORY_REPORT_INIT;
  TRY(w, ctx, fattn_memory_plan(&c, &m, &r, detail, sizeof detail));
  TRY(w, ctx, fattn_create(&c, &m, &ctx, detail, sizeof detail));
  for (uint32_t round = 0; round < ROUNDS; round++) {
    const uint32_t len = 6 + (uint32_t)(fattn_test_splitmix(&rng) % 10);
    uint32_t a, f, br[TOPK];
    TRY(w, ctx, fattn_seq_open(ctx, &a));
    TRY(w, ctx, fattn_seq_reserve(ctx, a, len));
    fattn_batch b = FATTN_BATCH_INIT;
    b.mode = FATTN_MODE_PREFILL;
    b.num_seqs = 1;
    b.seq_ids = &a;
    b.q_lens = &len;
    if (!run_step(w, ctx, &b, len, &rng)) goto out;
    TRY(w, ctx, fattn_seq_fork(ctx, a, len - 2, &f));
    uint32_t pair[2] = {a, f}, lens[2];
    for (int s = 0; s < 4; s++) { /* decode both; the fork's first write copies its shared page */
      for (int i = 0; i < 2; i++) {
        TRY(w, ctx, fattn_seq_length(ctx, pair[i], &lens[i]));
        TRY(w, ctx, fattn_seq_reserve(ctx, pair[i], lens[i] + 1));
      }
      b = (fattn_batch)FATTN_BATCH_INIT;
      b.num_seqs = 2;
      b.seq_ids = pair;
      if (!run_step(w, ctx, &b, 2, &rng)) goto out;
    }
    TRY(w, ctx, fattn_seq_length(ctx, a, &lens[0]));
    for (int i = 0; i < TOPK; i++) { /* draft: one branch per candidate token */
      TRY(w, ctx, fattn_seq_fork(ctx, a, lens[0], &br[i]));
      TRY(w, ctx, fattn_seq_reserve(ctx, br[i], lens[0] + 1));
    }
    b = (fattn_batch)FATTN_BATCH_INIT;
    b.mode = FATTN_MODE_DRAFT_DECODE;
    b.num_seqs = 1;
    b.seq_ids = br;
    if (!run_step(w, ctx, &b, TOPK, &rng)) goto out;
    const uint64_t tree[DRAFT] = {1, 3, 5, 11}; /* 0 root; 1, 2 its children; 3 under 1 */
    TRY(w, ctx, fattn_seq_reserve(ctx, a, lens[0] + DRAFT));
    b = (fattn_batch)FATTN_BATCH_INIT;
    b.mode = FATTN_MODE_TARGET_VERIFY;
    b.num_seqs = 1;
    b.seq_ids = &a;
    b.tree_mask = tree;
    if (!run_step(w, ctx, &b, DRAFT, &rng)) goto out;
    TRY(w, ctx, fattn_seq_truncate(ctx, a, lens[0] + 2)); /* two drafts accepted */
    for (int i = 0; i < TOPK; i++) TRY(w, ctx, fattn_seq_close(ctx, br[i]));
    TRY(w, ctx, fattn_seq_close(ctx, f));
    if (round % 2) TRY(w, ctx, fattn_seq_close(ctx, a)); /* the rest stay open until destroy */
    TRY(w, ctx, fattn_check(ctx));
    fattn_stats stats = FATTN_STATS_INIT;
    TRY(w, ctx, fattn_get_stats(ctx, &stats));
    digest_bytes(&w->digest, &stats, sizeof stats);
  }
out:
  if (ctx && fattn_destroy(ctx, 1) != FATTN_OK && !w->failed[0])
    snprintf(w->failed, sizeof w->failed, "fattn_destroy: %s", fattn_detail(ctx));
  return NULL;
}

static void run_threads(work *w, int n) {
  pthread_t t[4];
  for (int i = 0; i < n; i++) ck_assert_int_eq(pthread_create(&t[i], NULL, script, &w[i]), 0);
  for (int i = 0; i < n; i++) ck_assert_int_eq(pthread_join(t[i], NULL), 0);
  for (int i = 0; i < n; i++) ck_assert_msg(!w[i].failed[0], "thread %d: %s", i, w[i].failed);
}

/* Two contexts, one per thread, at once: each digest equals its single-threaded run's. */
START_TEST(two_contexts_two_threads_match_one_thread) {
  work alone[2] = {{.seed = 11}, {.seed = 12}};
  for (int i = 0; i < 2; i++) {
    script(&alone[i]);
    ck_assert_msg(!alone[i].failed[0], "alone %d: %s", i, alone[i].failed);
  }
  ck_assert(alone[0].digest != alone[1].digest); /* the scripts differ */
  for (int rep = 0; rep < 3; rep++) {
    work both[2] = {{.seed = 11}, {.seed = 12}};
    run_threads(both, 2);
    for (int i = 0; i < 2; i++) {
      ck_assert_uint_eq(both[i].digest, alone[i].digest);
      ck_assert_uint_eq(both[i].calls, alone[i].calls);
    }
  }
}
END_TEST

/* The same script on both threads: equal digests, whichever thread ran ahead. */
START_TEST(same_script_on_two_threads) {
  work w[2] = {{.seed = 5}, {.seed = 5}};
  run_threads(w, 2);
  ck_assert_uint_eq(w[0].digest, w[1].digest);
  ck_assert_uint_gt(w[0].calls, 100);
}
END_TEST

static void *create_destroy(void *arg) {
  work *w = arg;
  fattn_config c;
  fattn_model m;
  fattn_test_small(&c, &m);
  char detail[256];
  for (int i = 0; i < 20; i++) {
    fattn_ctx *ctx = NULL;
    uint32_t s;
    if (fattn_create(&c, &m, &ctx, detail, sizeof detail) != FATTN_OK) {
      snprintf(w->failed, sizeof w->failed, "fattn_create: %s", detail);
      return NULL;
    }
    if (fattn_seq_open(ctx, &s) != FATTN_OK || fattn_seq_reserve(ctx, s, 9) != FATTN_OK ||
        fattn_check(ctx) != FATTN_OK || fattn_destroy(ctx, 1) != FATTN_OK) {
      snprintf(w->failed, sizeof w->failed, "iteration %d: %s", i, fattn_detail(ctx));
      return NULL;
    }
    w->calls += 5;
    if (!fattn_strerror(FATTN_ERR_STATE)[0] || fattn_version_number() != FATTN_VERSION_NUMBER) {
      snprintf(w->failed, sizeof w->failed, "status names or version");
      return NULL;
    }
  }
  return NULL;
}

/* fattn_create and fattn_destroy of distinct contexts overlap (each makes a jemalloc arena). */
START_TEST(creates_and_destroys_overlap) {
  work w[2] = {{.seed = 0}, {.seed = 0}};
  pthread_t t[2];
  for (int i = 0; i < 2; i++) ck_assert_int_eq(pthread_create(&t[i], NULL, create_destroy, &w[i]), 0);
  for (int i = 0; i < 2; i++) ck_assert_int_eq(pthread_join(t[i], NULL), 0);
  for (int i = 0; i < 2; i++) {
    ck_assert_msg(!w[i].failed[0], "thread %d: %s", i, w[i].failed);
    ck_assert_uint_eq(w[i].calls, 100);
  }
}
END_TEST

FATTN_SUITE("threads", FATTN_TEST_CPU, two_contexts_two_threads_match_one_thread, same_script_on_two_threads,
            creates_and_destroys_overlap)
