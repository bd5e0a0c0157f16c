/* test_pages.c: the page allocator and sequences. Every operation is followed by fattn_check;
 * capacity and argument errors leave the allocator byte-for-byte unchanged. */
#include <stdlib.h>

#include "lib/internal.h"
#include "tests/support.h"

static fattn_ctx *ctx;
static char detail[256];

static void open_ctx(uint32_t page_size, uint32_t pages, uint32_t flags) {
  fattn_config c;
  fattn_model m;
  fattn_test_small(&c, &m);
  c.page_size = page_size;
  c.kv_budget_pages = pages;
  c.max_seq_len = page_size * 4;
  c.flags = flags;
  ck_assert_msg(fattn_create(&c, &m, &ctx, detail, sizeof detail) == FATTN_OK, "%s", detail);
}

#define ASSERT_UNCHANGED(call, status)                                 \
  do {                                                                 \
    uint8_t *before_, *after_;                                         \
    size_t n_ = fattn_test_snapshot(ctx, &before_);                    \
    ck_assert_status((call), (status));                               \
    fattn_test_snapshot(ctx, &after_);                                 \
    ck_assert_msg(memcmp(before_, after_, n_) == 0, "%s changed state", #call); \
    free(before_);                                                     \
    free(after_);                                                      \
  } while (0)

#define CHECKED(call)                                                        \
  do {                                                                       \
    ck_assert_ok(call);                                                      \
    ck_assert_msg(fattn_check(ctx) == FATTN_OK, "after %s: %s", #call, fattn_detail(ctx)); \
  } while (0)

static uint32_t free_pages(void) {
  fattn_stats s = FATTN_STATS_INIT;
  ck_assert_ok(fattn_get_stats(ctx, &s));
  return s.pages_free;
}

START_TEST(reserve_truncate_close) {
  open_ctx(4, 16, 0);
  uint32_t a, len;
  CHECKED(fattn_seq_open(ctx, &a));
  CHECKED(fattn_seq_reserve(ctx, a, 5)); /* 2 pages */
  ck_assert_uint_eq(free_pages(), 14);
  CHECKED(fattn_seq_reserve(ctx, a, 3)); /* never shrinks */
  ck_assert_ok(fattn_seq_length(ctx, a, &len));
  ck_assert_uint_eq(len, 5);
  CHECKED(fattn_seq_reserve(ctx, a, 16));
  ck_assert_uint_eq(free_pages(), 12);
  CHECKED(fattn_seq_truncate(ctx, a, 9)); /* keeps 3 pages */
  ck_assert_uint_eq(free_pages(), 13);
  CHECKED(fattn_seq_truncate(ctx, a, 0));
  ck_assert_uint_eq(free_pages(), 16);
  CHECKED(fattn_seq_reserve(ctx, a, 1));
  CHECKED(fattn_seq_close(ctx, a));
  ck_assert_uint_eq(free_pages(), 16);
  ck_assert_status(fattn_seq_length(ctx, a, &len), FATTN_ERR_NOT_FOUND);
  ck_assert_ok(fattn_destroy(ctx, 0));
}
END_TEST

START_TEST(errors_leave_state_unchanged) {
  open_ctx(4, 16, 0);
  uint32_t a, b, c, d, e, f;
  CHECKED(fattn_seq_open(ctx, &a));
  CHECKED(fattn_seq_reserve(ctx, a, 16));
  CHECKED(fattn_seq_open(ctx, &b));
  CHECKED(fattn_seq_reserve(ctx, b, 16));
  CHECKED(fattn_seq_open(ctx, &c));
  CHECKED(fattn_seq_reserve(ctx, c, 16));
  CHECKED(fattn_seq_open(ctx, &d));
  CHECKED(fattn_seq_reserve(ctx, d, 14)); /* all 16 pages owned */
  CHECKED(fattn_seq_open(ctx, &e));
  ASSERT_UNCHANGED(fattn_seq_reserve(ctx, e, 1), FATTN_ERR_CAPACITY);
  ck_assert_msg(strstr(fattn_detail(ctx), "needs 1 pages for 1 tokens, 0 free"), "%s", fattn_detail(ctx));
  ASSERT_UNCHANGED(fattn_seq_reserve(ctx, d, 17), FATTN_ERR_INVALID);
  ASSERT_UNCHANGED(fattn_seq_reserve(ctx, 99, 1), FATTN_ERR_NOT_FOUND);
  ASSERT_UNCHANGED(fattn_seq_truncate(ctx, a, 17), FATTN_ERR_INVALID);
  ASSERT_UNCHANGED(fattn_seq_fork(ctx, a, 17, &f), FATTN_ERR_INVALID);
  ASSERT_UNCHANGED(fattn_seq_fork(ctx, a, 4, NULL), FATTN_ERR_INVALID);
  ASSERT_UNCHANGED(fattn_seq_map(ctx, a, 0, 1, &f), FATTN_ERR_STATE);
  ASSERT_UNCHANGED(fattn_seq_close(ctx, 1000), FATTN_ERR_NOT_FOUND);
  CHECKED(fattn_seq_close(ctx, e));
  CHECKED(fattn_seq_truncate(ctx, c, 12)); /* one page free */
  CHECKED(fattn_seq_fork(ctx, d, 14, &e));
  CHECKED(fattn_seq_reserve(ctx, e, 15)); /* copy-on-write of the shared tail takes it */
  ck_assert_uint_eq(free_pages(), 0);
  ASSERT_UNCHANGED(fattn_seq_reserve(ctx, c, 13), FATTN_ERR_CAPACITY);
  CHECKED(fattn_seq_fork(ctx, d, 14, &f));
  ASSERT_UNCHANGED(fattn_seq_reserve(ctx, f, 15), FATTN_ERR_CAPACITY); /* the copy has no page */
  ck_assert_ok(fattn_destroy(ctx, 1));
}
END_TEST

START_TEST(fork_shares_and_copies_on_write) {
  open_ctx(4, 32, 0);
  uint32_t a, b;
  CHECKED(fattn_seq_open(ctx, &a));
  CHECKED(fattn_seq_reserve(ctx, a, 10)); /* pages 0 1 2, the last one partial */
  CHECKED(fattn_seq_fork(ctx, a, 10, &b));
  ck_assert_uint_eq(free_pages(), 29); /* nothing copied yet */
  const uint32_t *ra = ctx->pages.table + (size_t)a * ctx->pages.pages_per_seq;
  const uint32_t *rb = ctx->pages.table + (size_t)b * ctx->pages.pages_per_seq;
  for (int i = 0; i < 3; i++) ck_assert_uint_eq(ra[i], rb[i]);
  ck_assert_uint_eq(ctx->pages.refcount[ra[2]], 2);
  ck_assert_uint_eq(ctx->pages.seqs[a].shared, 3); /* both sides may share pages 0..2 */
  ck_assert_uint_eq(ctx->pages.seqs[b].shared, 3);
  CHECKED(fattn_seq_reserve(ctx, b, 11)); /* writes into the shared tail: private copy */
  ck_assert_uint_eq(ctx->pages.seqs[b].shared, 2); /* the copy and all after it are b's own */
  CHECKED(fattn_seq_reserve(ctx, a, 11)); /* a's tail, looked up: b no longer shares it */
  ck_assert_uint_eq(ctx->pages.num_copies, 1);
  ck_assert_uint_eq(ctx->pages.seqs[a].shared, 2);
  ck_assert_uint_ne(ra[2], rb[2]);
  ck_assert_uint_eq(ra[1], rb[1]);
  ck_assert_uint_eq(ctx->pages.num_copies, 1);
  ck_assert_uint_eq(ctx->pages.copies[0].src, ra[2]);
  ck_assert_uint_eq(ctx->pages.copies[0].dst, rb[2]);
  ck_assert_uint_eq(free_pages(), 28);
  CHECKED(fattn_seq_fork(ctx, a, 8, &b)); /* whole pages only: no copy when growing */
  CHECKED(fattn_seq_reserve(ctx, b, 9));
  ck_assert_uint_eq(ctx->pages.num_copies, 1);
  CHECKED(fattn_seq_close(ctx, a));
  CHECKED(fattn_seq_truncate(ctx, b, 2));
  ck_assert_uint_eq(ctx->pages.seqs[b].shared, 1); /* truncation lowers the bound */
  ck_assert_ok(fattn_destroy(ctx, 1));
}
END_TEST

/* The caller's pages: map places them, reserve and truncate alone set the length (mapping
 * never changes which tokens are visible). */
START_TEST(caller_owned_pages) {
  open_ctx(4, 16, FATTN_FLAG_CALLER_PAGES);
  uint32_t a, len, pages[3] = {7, 3, 9}, bad = 16;
  CHECKED(fattn_seq_open(ctx, &a));
  ck_assert_uint_eq(free_pages(), 0); /* fattn hands out no pages itself */
  ASSERT_UNCHANGED(fattn_seq_reserve(ctx, a, 4), FATTN_ERR_CAPACITY); /* nothing mapped yet */
  ck_assert_msg(strstr(fattn_detail(ctx), "maps 0 pages (0 slots), 4 tokens need 1"), "%s", fattn_detail(ctx));
  ASSERT_UNCHANGED(fattn_seq_map(ctx, a, 1, 1, pages), FATTN_ERR_INVALID); /* hole */
  ASSERT_UNCHANGED(fattn_seq_map(ctx, a, 0, 1, &bad), FATTN_ERR_INVALID);
  ASSERT_UNCHANGED(fattn_seq_map(ctx, a, 3, 2, pages), FATTN_ERR_INVALID);
  CHECKED(fattn_seq_map(ctx, a, 0, 3, pages));
  ck_assert_ok(fattn_seq_length(ctx, a, &len));
  ck_assert_uint_eq(len, 0); /* mapped, not yet visible */
  ASSERT_UNCHANGED(fattn_seq_reserve(ctx, a, 13), FATTN_ERR_CAPACITY); /* past the 12 mapped slots */
  CHECKED(fattn_seq_reserve(ctx, a, 12));
  CHECKED(fattn_seq_reserve(ctx, a, 3)); /* never shrinks */
  ck_assert_ok(fattn_seq_length(ctx, a, &len));
  ck_assert_uint_eq(len, 12);
  CHECKED(fattn_seq_map(ctx, a, 3, 0, NULL)); /* no pages, none needed (fuzz_pages found the memcpy) */
  ck_assert_ok(fattn_seq_length(ctx, a, &len));
  ck_assert_uint_eq(len, 12);
  /* rejected draft slots stay gone when the scheduler re-maps a page it kept */
  CHECKED(fattn_seq_truncate(ctx, a, 10));
  CHECKED(fattn_seq_map(ctx, a, 0, 1, pages));
  ck_assert_ok(fattn_seq_length(ctx, a, &len));
  ck_assert_uint_eq(len, 10);
  CHECKED(fattn_seq_map(ctx, a, 2, 1, &pages[2])); /* the tail page, written afresh */
  ck_assert_ok(fattn_seq_length(ctx, a, &len));
  ck_assert_uint_eq(len, 10);
  CHECKED(fattn_seq_truncate(ctx, a, 5)); /* entries past the 2 pages of 5 tokens are unmapped */
  ck_assert_uint_eq(ctx->pages.seqs[a].npages, 2);
  CHECKED(fattn_seq_map(ctx, a, 2, 1, &pages[2]));
  ck_assert_ok(fattn_seq_length(ctx, a, &len));
  ck_assert_uint_eq(len, 5);
  CHECKED(fattn_seq_reserve(ctx, a, 12));
  CHECKED(fattn_seq_close(ctx, a));
  ck_assert_ok(fattn_destroy(ctx, 0));
}
END_TEST

/* Each failing call on a context writes its own detail, the const getters included: none may
 * leave the previous error's text behind. */
START_TEST(every_failure_writes_its_detail) {
  open_ctx(4, 16, 0);
  uint32_t a, len, id;
  CHECKED(fattn_seq_open(ctx, &a));
  CHECKED(fattn_seq_reserve(ctx, a, 4));
  fattn_stats small = FATTN_STATS_INIT;
  small.struct_size = 0;
  fattn_batch batch = FATTN_BATCH_INIT;
#define OWN_DETAIL(call, status, text)                                                           \
  do {                                                                                           \
    ck_assert_status(fattn_seq_reserve(ctx, a, 99), FATTN_ERR_INVALID); /* an earlier error */   \
    ck_assert_status((call), (status));                                                          \
    ck_assert_msg(strstr(fattn_detail(ctx), text), "%s: detail '%s' lacks '%s'", #call, fattn_detail(ctx), text); \
  } while (0)
  OWN_DETAIL(fattn_seq_length(ctx, 99, &len), FATTN_ERR_NOT_FOUND, "fattn_seq_length: sequence 99 is not open");
  OWN_DETAIL(fattn_seq_length(ctx, a, NULL), FATTN_ERR_INVALID, "fattn_seq_length: num_tokens must not be NULL");
  OWN_DETAIL(fattn_get_stats(ctx, NULL), FATTN_ERR_INVALID, "fattn_get_stats: stats must not be NULL");
  OWN_DETAIL(fattn_get_stats(ctx, &small), FATTN_ERR_INVALID, "stats struct_size 0");
  OWN_DETAIL(fattn_seq_open(ctx, NULL), FATTN_ERR_INVALID, "fattn_seq_open: seq must not be NULL");
  OWN_DETAIL(fattn_seq_fork(ctx, 99, 0, &id), FATTN_ERR_NOT_FOUND, "fattn_seq_fork: sequence 99");
  OWN_DETAIL(fattn_seq_truncate(ctx, a, 5), FATTN_ERR_INVALID, "fattn_seq_truncate: num_tokens 5");
  OWN_DETAIL(fattn_seq_close(ctx, 99), FATTN_ERR_NOT_FOUND, "fattn_seq_close: sequence 99");
  OWN_DETAIL(fattn_seq_map(ctx, a, 0, 0, NULL), FATTN_ERR_STATE, "fattn_seq_map: needs FATTN_FLAG_CALLER_PAGES");
  OWN_DETAIL(fattn_plan(ctx, NULL, NULL), FATTN_ERR_INVALID, "batch must not be NULL");
  OWN_DETAIL(fattn_store_kv(ctx, 0, NULL, NULL, NULL), FATTN_ERR_STATE, "fattn_store_kv: no step planned");
  OWN_DETAIL(fattn_attend(ctx, 0, NULL, NULL, NULL, NULL), FATTN_ERR_STATE, "fattn_attend: no step planned");
  OWN_DETAIL(fattn_graph_capture(ctx, FATTN_MODE_DECODE, 1, NULL, NULL), FATTN_ERR_UNSUPPORTED,
             "fattn_graph_capture: graphs need a CUDA device");
  OWN_DETAIL(fattn_graph_launch(ctx, &batch, NULL), FATTN_ERR_UNSUPPORTED, "fattn_graph_launch: graphs need");
  OWN_DETAIL(fattn_graph_begin(ctx, FATTN_MODE_DECODE, 1, NULL), FATTN_ERR_UNSUPPORTED,
             "fattn_graph_begin: graphs need a CUDA device");
  OWN_DETAIL(fattn_graph_end(ctx), FATTN_ERR_UNSUPPORTED, "fattn_graph_end: graphs need a CUDA device");
  OWN_DETAIL(fattn_graph_plan(ctx, &batch, NULL), FATTN_ERR_UNSUPPORTED, "fattn_graph_plan: graphs need");
  OWN_DETAIL(fattn_graph_plan(ctx, NULL, NULL), FATTN_ERR_INVALID, "batch must not be NULL");
  OWN_DETAIL(fattn_destroy(ctx, 0), FATTN_ERR_BUSY, "1 sequences still open");
  OWN_DETAIL(fattn_ctx_backend(ctx, (fattn_mode)0) == FATTN_BACKEND_AUTO ? FATTN_ERR_INVALID : FATTN_OK,
             FATTN_ERR_INVALID, "fattn_ctx_backend: mode 0: unknown");
#undef OWN_DETAIL
  ck_assert_status(fattn_graph_begin(NULL, FATTN_MODE_DECODE, 1, NULL), FATTN_ERR_INVALID);
  ck_assert_status(fattn_graph_end(NULL), FATTN_ERR_INVALID);
  ck_assert_status(fattn_graph_plan(NULL, &batch, NULL), FATTN_ERR_INVALID);
  ck_assert_ok(fattn_destroy(ctx, 1));
}
END_TEST

START_TEST(check_catches_corruption) {
  open_ctx(4, 16, 0);
  /* host tables are line-aligned, so no 32-byte sequence record straddles two lines */
  ck_assert_uint_eq((uintptr_t)ctx->pages.seqs % 64, 0);
  ck_assert_uint_eq((uintptr_t)ctx->pages.refcount % 64, 0);
  uint32_t a;
  CHECKED(fattn_seq_open(ctx, &a));
  CHECKED(fattn_seq_reserve(ctx, a, 8));
  ctx->pages.refcount[ctx->pages.table[0]]++;
  ck_assert_status(fattn_check(ctx), FATTN_ERR_CORRUPT);
  ctx->pages.refcount[ctx->pages.table[0]]--;
  ck_assert_ok(fattn_check(ctx));
  ctx->pages.table[3] = 5;
  ck_assert_status(fattn_check(ctx), FATTN_ERR_CORRUPT);
  ctx->pages.table[3] = FATTN__PAGE_NONE;
  uint32_t f;
  CHECKED(fattn_seq_fork(ctx, a, 8, &f));
  ctx->pages.seqs[f].shared = 1; /* page 1 is shared past the fork's bound */
  ck_assert_status(fattn_check(ctx), FATTN_ERR_CORRUPT);
  ck_assert_msg(strstr(fattn_detail(ctx), "past its bound"), "%s", fattn_detail(ctx));
  ctx->pages.seqs[f].shared = 2;
  ck_assert_ok(fattn_check(ctx));
  ctx->pages.free_stack[0] = ctx->pages.free_stack[1];
  ck_assert_status(fattn_check(ctx), FATTN_ERR_CORRUPT);
  ck_assert_ok(fattn_destroy(ctx, 1));
}
END_TEST

START_TEST(sequence_ids_run_out) {
  open_ctx(1, 64, 0);
  uint32_t ids[8], extra;
  for (int i = 0; i < 8; i++) CHECKED(fattn_seq_open(ctx, &ids[i]));
  ASSERT_UNCHANGED(fattn_seq_open(ctx, &extra), FATTN_ERR_CAPACITY);
  ASSERT_UNCHANGED(fattn_seq_fork(ctx, ids[0], 0, &extra), FATTN_ERR_CAPACITY);
  for (int i = 0; i < 8; i++) CHECKED(fattn_seq_close(ctx, ids[i]));
  ck_assert_ok(fattn_destroy(ctx, 0));
}
END_TEST

FATTN_SUITE("pages", FATTN_TEST_CPU, reserve_truncate_close, errors_leave_state_unchanged,
            fork_shares_and_copies_on_write, caller_owned_pages, every_failure_writes_its_detail,
            check_catches_corruption, sequence_ids_run_out)
