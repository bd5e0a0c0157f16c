/* test_rows.c: page-table changes shipped as ranges on the CPU backend: a fork's row as one
 * device-side copy, entries a close or truncate unmapped as one fill; device table == mirror;
 * copy-on-write copies flagged chained exactly where one writes a page another touches. */
#include <stdlib.h>

#include "lib/internal.h"
#include "tests/support.h"

static fattn_ctx *ctx;
static char detail[256];
static uint32_t keeper; /* a sequence of its own: a step of it ships the changes (a decode step
                           of a sequence whose tail page is shared would be rejected) */

enum { LEN = 1024, ROW = LEN / 4 }; /* pages of 4 slots: a full row is 256 entries */

static void open_ctx(void) {
  fattn_config c;
  fattn_model m;
  fattn_test_small(&c, &m);
  c.max_seq_len = LEN;
  c.kv_budget_pages = 8 * ROW;
  c.max_seqs = 16;
  ck_assert_msg(fattn_create(&c, &m, &ctx, detail, sizeof detail) == FATTN_OK, "%s", detail);
  ck_assert_ok(fattn_seq_open(ctx, &keeper));
  ck_assert_ok(fattn_seq_reserve(ctx, keeper, 1));
}

static uint32_t seq_with(uint32_t len) {
  uint32_t s;
  ck_assert_ok(fattn_seq_open(ctx, &s));
  ck_assert_ok(fattn_seq_reserve(ctx, s, len));
  return s;
}

/* What one staging slot carried: on the CPU the slot is copied into the inbox, where it stays. */
typedef struct shipped {
  uint32_t row_copies, fills, updates, words, page_copies, chained;
  const fattn__row_op *ops; /* [row_copies][fills] */
} shipped;

/* Whether a pending copy-on-write copy writes a page that another reads or writes, by the
 * definition: every pair. */
static uint32_t copies_clash(void) {
  const fattn__page_copy *c = ctx->pages.copies;
  for (uint32_t i = 0; i < ctx->pages.num_copies; i++)
    for (uint32_t j = 0; j < ctx->pages.num_copies; j++)
      if (c[j].dst == c[i].src || (i != j && c[j].dst == c[i].dst)) return 1;
  return 0;
}

/* Plans a decode step of the keeper, in one slot, and returns what the slot shipped; the
 * device page table then equals the mirror, the allocator passes its checker, and the page
 * copies are flagged chained exactly where they clash. */
static shipped plan(void) {
  fattn_batch b = FATTN_BATCH_INIT;
  b.num_seqs = 1, b.seq_ids = &keeper;
  const uint64_t taken = ctx->ring_taken;
  const uint32_t pending = ctx->pages.num_copies, clash = copies_clash();
  ck_assert_msg(fattn_plan(ctx, &b, NULL) == FATTN_OK, "%s", fattn_detail(ctx));
  ck_assert_uint_eq(ctx->ring_taken, taken + 1);
  const uint8_t *inbox = ctx->dev + ctx->lay.dev_off[FATTN_REGION_METADATA];
  const fattn__step_hdr *h = (const fattn__step_hdr *)inbox;
  const fattn__pt_update *up = (const fattn__pt_update *)(inbox + ctx->lay.slot_off_updates);
  shipped s = {h->num_row_copies, h->num_row_fills, h->num_pt_updates, 0, h->num_page_copies, h->page_copies_chained,
               (const fattn__row_op *)(inbox + ctx->lay.slot_off_row_ops)};
  ck_assert_uint_eq(s.page_copies, pending);
  ck_assert_uint_eq(s.chained, clash);
  for (uint32_t i = 0; i < s.updates; i++) s.words += up[i].count;
  ck_assert_int_eq(memcmp(ctx->dev + ctx->lay.dev_off[FATTN_REGION_PAGE_TABLE], ctx->pages.table,
                          (size_t)ctx->pages.max_seqs * ctx->pages.pages_per_seq * 4),
                   0);
  ck_assert_ok(fattn_check(ctx));
  return s;
}

/* Speculative rounds at full length: each branch's row ships as one copy, its copy-on-write
 * tail as one word; closing the branches ships one fill each and no word, or nothing where the
 * next round's forks reopen the rows. */
START_TEST(forks_ship_copies_and_closes_ship_fills) {
  open_ctx();
  uint32_t r = seq_with(LEN - 2), br[4];
  plan();
  for (int k = 0; k < 4; k++) ck_assert_ok(fattn_seq_fork(ctx, r, LEN - 2, &br[k]));
  ck_assert_ok(fattn_check(ctx));
  shipped s = plan();
  ck_assert_uint_eq(s.row_copies, 4);
  ck_assert_uint_eq(s.words, 0);
  ck_assert_uint_eq(s.fills, 0);
  for (int k = 0; k < 4; k++) {
    ck_assert_uint_eq(s.ops[k].dst, br[k]);
    ck_assert_uint_eq(s.ops[k].src, r);
    ck_assert_uint_eq(s.ops[k].count, ROW);
  }
  for (int k = 0; k < 4; k++) ck_assert_ok(fattn_seq_reserve(ctx, br[k], LEN - 1)); /* the shared tail */
  s = plan();
  ck_assert_uint_eq(s.row_copies, 0);
  ck_assert_uint_eq(s.words, 4);
  for (int k = 0; k < 4; k++) ck_assert_ok(fattn_seq_close(ctx, br[k]));
  for (int k = 0; k < 4; k++) ck_assert_ok(fattn_seq_fork(ctx, r, LEN - 2, &br[k])); /* the next round */
  s = plan(); /* the closed rows' unshipped ranges were all in what the copies rewrite */
  ck_assert_uint_eq(s.row_copies, 4);
  ck_assert_uint_eq(s.words, 0);
  ck_assert_uint_eq(s.fills, 0);
  for (int k = 0; k < 4; k++) ck_assert_ok(fattn_seq_close(ctx, br[k]));
  s = plan();
  ck_assert_uint_eq(s.fills, 4);
  ck_assert_uint_eq(s.words, 0);
  for (int k = 0; k < 4; k++) {
    ck_assert_uint_eq(s.ops[k].src, FATTN__PAGE_NONE);
    ck_assert_uint_eq(s.ops[k].index, 0);
    ck_assert_uint_eq(s.ops[k].count, ROW);
  }
  ck_assert_ok(fattn_destroy(ctx, 1));
}
END_TEST

/* A fork of a sequence with unshipped entries: the copy reads the source's device row, which
 * lacks them, so the fork ships those entries as words; a truncate ships only a fill. */
START_TEST(a_fork_ships_what_its_source_had_not) {
  open_ctx();
  uint32_t r = seq_with(LEN / 2), b;
  plan();
  ck_assert_ok(fattn_seq_reserve(ctx, r, LEN));
  ck_assert_ok(fattn_seq_fork(ctx, r, LEN, &b));
  shipped s = plan();
  ck_assert_uint_eq(s.row_copies, 1);
  ck_assert_uint_eq(s.ops[0].count, ROW);
  ck_assert_uint_eq(s.words, 2 * (ROW / 2)); /* the source's new half, in both rows */
  ck_assert_ok(fattn_seq_truncate(ctx, r, LEN / 4));
  s = plan();
  ck_assert_uint_eq(s.words, 0);
  ck_assert_uint_eq(s.fills, 1);
  ck_assert_uint_eq(s.ops[0].dst, r);
  ck_assert_uint_eq(s.ops[0].index, ROW / 4);
  ck_assert_uint_eq(s.ops[0].count, ROW - ROW / 4);
  ck_assert_ok(fattn_destroy(ctx, 1));
}
END_TEST

/* A fork of a fork in one window copies from the first source's device row, which the same
 * slot then truncates: copies run before the slot's fills and updates. */
START_TEST(chained_forks_copy_from_the_first_source) {
  open_ctx();
  uint32_t r = seq_with(LEN), a, b;
  plan();
  ck_assert_ok(fattn_seq_fork(ctx, r, LEN, &a));
  ck_assert_ok(fattn_seq_fork(ctx, a, LEN / 2, &b));
  ck_assert_ok(fattn_seq_truncate(ctx, r, 1));
  shipped s = plan();
  ck_assert_uint_eq(s.row_copies, 2);
  ck_assert_uint_eq(s.ops[0].src, r);
  ck_assert_uint_eq(s.ops[1].dst, b);
  ck_assert_uint_eq(s.ops[1].src, r);
  ck_assert_uint_eq(s.ops[1].count, ROW / 2);
  ck_assert_uint_eq(s.words, 0);
  ck_assert_uint_eq(s.fills, 1);
  ck_assert_ok(fattn_destroy(ctx, 1));
}
END_TEST

/* A source closed and its id reopened by a fork in the same window: a copy still reads that
 * row, so the fork cannot write it by a copy and ships words; so does a row whose own copy is
 * pending when its id is forked into again. */
START_TEST(rows_a_pending_copy_reads_or_writes_ship_words) {
  open_ctx();
  uint32_t r = seq_with(LEN), a, x, y;
  plan();
  ck_assert_ok(fattn_seq_fork(ctx, r, LEN, &a));
  ck_assert_ok(fattn_seq_close(ctx, r));
  ck_assert_ok(fattn_seq_fork(ctx, a, LEN, &x));
  ck_assert_uint_eq(x, r); /* closed ids come back last in, first out */
  ck_assert_ok(fattn_check(ctx));
  ck_assert_ok(fattn_seq_close(ctx, a));
  ck_assert_ok(fattn_seq_fork(ctx, x, LEN / 2, &y));
  ck_assert_uint_eq(y, a);
  shipped s = plan();
  ck_assert_uint_eq(s.row_copies, 1);
  ck_assert_uint_eq(s.ops[0].dst, a);
  ck_assert_uint_eq(s.words, ROW + ROW / 2);
  ck_assert_uint_eq(s.fills, 1); /* a's entries past y's half */
  ck_assert_ok(fattn_destroy(ctx, 1));
}
END_TEST

/* Copy-on-write copies of one window: independent ones (one source, three destinations) run
 * in any order; a copy of a copy, or a page closed and taken again as a destination, makes the
 * window chained. Stamps of earlier plans leave a later independent window independent. */
START_TEST(page_copies_chain_only_where_they_clash) {
  open_ctx();
  uint32_t r = seq_with(LEN - 2), br[3], a, b;
  plan();
  for (int k = 0; k < 3; k++) ck_assert_ok(fattn_seq_fork(ctx, r, LEN - 2, &br[k]));
  for (int k = 0; k < 3; k++) ck_assert_ok(fattn_seq_reserve(ctx, br[k], LEN - 1)); /* r's shared tail */
  shipped s = plan();
  ck_assert_uint_eq(s.page_copies, 3);
  ck_assert_uint_eq(s.chained, 0);
  ck_assert_ok(fattn_seq_fork(ctx, r, LEN - 2, &a));
  ck_assert_ok(fattn_seq_reserve(ctx, a, LEN - 1)); /* r's tail -> a's page */
  ck_assert_ok(fattn_seq_fork(ctx, a, LEN - 1, &b));
  ck_assert_ok(fattn_seq_reserve(ctx, b, LEN)); /* a's page -> b's page */
  s = plan();
  ck_assert_uint_eq(s.page_copies, 2);
  ck_assert_uint_eq(s.chained, 1);
  ck_assert_ok(fattn_seq_close(ctx, b));
  ck_assert_ok(fattn_seq_close(ctx, a));
  ck_assert_ok(fattn_seq_fork(ctx, r, LEN - 2, &a));
  ck_assert_ok(fattn_seq_reserve(ctx, a, LEN - 1));
  const uint32_t taken = ctx->pages.copies[0].dst;
  ck_assert_ok(fattn_seq_close(ctx, a)); /* its copy's page goes back on the free stack */
  ck_assert_ok(fattn_seq_fork(ctx, r, LEN - 2, &a));
  ck_assert_ok(fattn_seq_reserve(ctx, a, LEN - 1));
  ck_assert_uint_eq(ctx->pages.copies[1].dst, taken); /* the same page, a destination twice */
  s = plan();
  ck_assert_uint_eq(s.page_copies, 2);
  ck_assert_uint_eq(s.chained, 1);
  for (int k = 0; k < 3; k++) ck_assert_ok(fattn_seq_close(ctx, br[k]));
  for (int k = 0; k < 3; k++) ck_assert_ok(fattn_seq_fork(ctx, r, LEN - 2, &br[k]));
  for (int k = 0; k < 3; k++) ck_assert_ok(fattn_seq_reserve(ctx, br[k], LEN - 1));
  s = plan();
  ck_assert_uint_eq(s.page_copies, 3);
  ck_assert_uint_eq(s.chained, 0);
  ck_assert_ok(fattn_destroy(ctx, 1));
}
END_TEST

/* Random forks, reserves, truncates and closes between plans: the device table equals the
 * mirror after each plan (checked in plan()). */
START_TEST(random_windows_keep_the_device_table_equal) {
  open_ctx();
  uint64_t rng = 7;
  uint32_t open[15], n = 0, copies = 0, fills = 0, copying = 0, chained = 0; /* the keeper is the 16th */
  open[n++] = seq_with(LEN / 2);
  for (int round = 0; round < 400; round++) {
    fattn_test_page_ops(ctx, &rng, open, &n, 15, LEN);
    shipped sh = plan();
    copies += sh.row_copies, fills += sh.fills, copying += sh.page_copies > 0, chained += sh.chained;
  }
  printf("random windows: %u with page copies, %u of them chained\n", copying, chained);
  ck_assert_uint_gt(copies, 100); /* the windows did exercise both */
  ck_assert_uint_gt(fills, 100);
  ck_assert_ok(fattn_destroy(ctx, 1));
}
END_TEST

FATTN_SUITE("rows", FATTN_TEST_CPU, forks_ship_copies_and_closes_ship_fills, a_fork_ships_what_its_source_had_not,
            chained_forks_copy_from_the_first_source, rows_a_pending_copy_reads_or_writes_ship_words,
            page_copies_chain_only_where_they_clash, random_windows_keep_the_device_table_equal)
