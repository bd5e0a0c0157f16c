/* fuzz_pages.c: libFuzzer harness of the page allocator. Input bytes pick a small CPU
 * context (fattn's pages or the caller's), then open/reserve/fork/truncate/close/map/DECODE-plan
 * operations that run on the real allocator and on a shadow model; any difference traps. */
#include "fuzz/common.h"

#define MAX_SEQS 64
#define MAX_PAGES 128
#define MAX_PPS 256 /* pages per sequence: max_seq_len 256 at one token a page */
#define MAX_OPS 256

/* What the allocator should hold, derived from the API's documentation only. Page ids and
 * sequence ids are learnt from the real allocator when it hands them out (any free one is
 * correct); everything else is predicted. */
typedef struct shadow_seq {
  int open;
  uint32_t len;
  uint32_t npages;
  uint32_t pages[MAX_PPS];
} shadow_seq;

typedef struct shadow {
  int caller_owned; /* FATTN_FLAG_CALLER_PAGES: pages come from fattn_seq_map, no refcounts */
  uint32_t page_size, pages_per_seq, num_pages, max_seqs, max_seq_len, max_batch, max_q_tokens, cap_copies;
  uint32_t pending_copies; /* copy-on-write copies the next successful plan ships */
  uint32_t refcount[MAX_PAGES];
  shadow_seq seqs[MAX_SEQS];
} shadow;

static fattn_ctx *ctx;
static shadow sh;

static uint32_t pages_for(uint32_t tokens) { return (tokens + sh.page_size - 1) / sh.page_size; }

static uint32_t shadow_free(void) {
  if (sh.caller_owned) return 0; /* no free stack: every page is the caller's */
  uint32_t n = 0;
  for (uint32_t pg = 0; pg < sh.num_pages; pg++) n += sh.refcount[pg] == 0;
  return n;
}

static uint32_t shadow_open_count(void) {
  uint32_t n = 0;
  for (uint32_t s = 0; s < sh.max_seqs; s++) n += sh.seqs[s].open;
  return n;
}

static const uint32_t *real_row(uint32_t seq) {
  return ctx->pages.table + (size_t)seq * ctx->pages.pages_per_seq;
}

static void unref(uint32_t page) {
  if (sh.refcount[page] == 0) FUZZ_FAIL("shadow: page %u released more often than taken", page);
  sh.refcount[page]--;
}

/* A page the real allocator just handed out must have been free. */
static void take(uint32_t page, const char *call) {
  if (page >= sh.num_pages) FUZZ_FAIL("%s handed out page %u of %u", call, page, sh.num_pages);
  if (sh.refcount[page] != 0)
    FUZZ_FAIL("%s handed out page %u, still referenced %u times", call, page, sh.refcount[page]);
  sh.refcount[page] = 1;
}

/* A sequence id the real allocator just handed out must have been closed. */
static shadow_seq *take_seq(uint32_t id, const char *call) {
  if (id >= sh.max_seqs) FUZZ_FAIL("%s handed out sequence %u of %u", call, id, sh.max_seqs);
  if (sh.seqs[id].open) FUZZ_FAIL("%s handed out sequence %u, which is open", call, id);
  shadow_seq *s = &sh.seqs[id];
  memset(s, 0, sizeof *s);
  s->open = 1;
  return s;
}

static shadow_seq *open_seq(uint32_t id) {
  return id < sh.max_seqs && sh.seqs[id].open ? &sh.seqs[id] : NULL;
}

/* Everything observable agrees with the shadow, and fattn_check holds. */
static void compare(const char *call) {
  const fattn__pages *p = &ctx->pages;
  if (fattn_check(ctx) != FATTN_OK) FUZZ_FAIL("after %s: fattn_check: %s", call, fattn_detail(ctx));
  fattn_stats stats = FATTN_STATS_INIT;
  if (fattn_get_stats(ctx, &stats) != FATTN_OK) FUZZ_FAIL("fattn_get_stats failed");
  if (stats.pages_free != shadow_free())
    FUZZ_FAIL("after %s: %u pages free, shadow says %u", call, stats.pages_free, shadow_free());
  if (stats.seqs_open != shadow_open_count())
    FUZZ_FAIL("after %s: %u sequences open, shadow says %u", call, stats.seqs_open, shadow_open_count());
  if (p->num_copies != sh.pending_copies)
    FUZZ_FAIL("after %s: %u copies pending, shadow says %u", call, p->num_copies, sh.pending_copies);
  for (uint32_t pg = 0; pg < sh.num_pages; pg++)
    if (p->refcount[pg] != sh.refcount[pg])
      FUZZ_FAIL("after %s: page %u refcount %u, shadow says %u", call, pg, p->refcount[pg], sh.refcount[pg]);
  for (uint32_t q = 0; q < sh.max_seqs; q++) {
    const shadow_seq *s = &sh.seqs[q];
    uint32_t len = 0;
    fattn_status st = fattn_seq_length(ctx, q, &len);
    if (!s->open) {
      if (st != FATTN_ERR_NOT_FOUND) FUZZ_FAIL("after %s: closed sequence %u: length gives %s", call, q, fattn_status_name(st));
      continue;
    }
    if (st != FATTN_OK || len != s->len)
      FUZZ_FAIL("after %s: sequence %u length %u (%s), shadow says %u", call, q, len, fattn_status_name(st), s->len);
    if (p->seqs[q].npages != s->npages)
      FUZZ_FAIL("after %s: sequence %u maps %u pages, shadow says %u", call, q, p->seqs[q].npages, s->npages);
    for (uint32_t i = 0; i < s->npages; i++)
      if (real_row(q)[i] != s->pages[i])
        FUZZ_FAIL("after %s: sequence %u entry %u is page %u, shadow says %u", call, q, i, real_row(q)[i], s->pages[i]);
  }
}

/* A sequence id from one byte: mostly an open sequence, else any id (closed, unknown). */
static uint32_t pick_seq(uint8_t b) {
  uint32_t open = shadow_open_count();
  if ((b & 0x80) && open) {
    uint32_t k = (b & 0x7f) % open;
    for (uint32_t q = 0; q < sh.max_seqs; q++)
      if (sh.seqs[q].open && k-- == 0) return q;
  }
  if (b == 0x7f) return UINT32_MAX;
  return (b & 0x7f) % (sh.max_seqs + 1);
}

static uint32_t len_of(uint32_t seq) {
  const shadow_seq *s = open_seq(seq);
  return s ? s->len : 0;
}

/* The status checked, then either the shadow's effect (by apply) or nothing changed. */
static void expect(fattn_status got, fattn_status want, const char *call, uint8_t *before, size_t bytes) {
  if (got != want)
    FUZZ_FAIL("%s returned %s, shadow predicts %s (detail: %s)", call, fattn_status_name(got),
              fattn_status_name(want), fattn_detail(ctx));
  if (got != FATTN_OK) {
    fuzz_expect_detail(fattn_detail(ctx), FATTN__DETAIL_LEN, call);
    fuzz_expect_unchanged(&ctx->pages, before, bytes, call, got);
  } else {
    free(before);
  }
}

static void op_open(void) {
  size_t bytes;
  uint8_t *before = fuzz_pages_snapshot(&ctx->pages, &bytes);
  uint32_t id = UINT32_MAX;
  fattn_status want = shadow_open_count() == sh.max_seqs ? FATTN_ERR_CAPACITY : FATTN_OK;
  fattn_status got = fattn_seq_open(ctx, &id);
  expect(got, want, "fattn_seq_open", before, bytes);
  if (got == FATTN_OK) take_seq(id, "fattn_seq_open");
}

static void op_reserve(uint32_t seq, uint32_t n) {
  size_t bytes;
  uint8_t *before = fuzz_pages_snapshot(&ctx->pages, &bytes);
  shadow_seq *s = open_seq(seq);
  fattn_status want = FATTN_OK;
  int cow = 0;
  if (!s) {
    want = FATTN_ERR_NOT_FOUND;
  } else if (n > sh.max_seq_len) {
    want = FATTN_ERR_INVALID;
  } else if (sh.caller_owned) {
    if (n > s->len && pages_for(n) > s->npages) want = FATTN_ERR_CAPACITY; /* only within the mapped pages */
  } else if (n > s->len) {
    /* the next slot lands in the shared tail page: it needs a private copy */
    cow = s->len % sh.page_size != 0 && sh.refcount[s->pages[s->npages - 1]] > 1;
    uint32_t want_pages = pages_for(n) - s->npages + (uint32_t)cow;
    if (want_pages > shadow_free() || (cow && sh.pending_copies == sh.cap_copies)) want = FATTN_ERR_CAPACITY;
  }
  fattn_status got = fattn_seq_reserve(ctx, seq, n);
  expect(got, want, "fattn_seq_reserve", before, bytes);
  if (got != FATTN_OK || n <= s->len) return;
  if (sh.caller_owned) { /* the length grows, no page is taken */
    s->len = n;
    return;
  }
  const uint32_t *row = real_row(seq);
  if (cow) {
    uint32_t old = s->pages[s->npages - 1], fresh = row[s->npages - 1];
    take(fresh, "fattn_seq_reserve (copy-on-write)");
    unref(old);
    s->pages[s->npages - 1] = fresh;
    const fattn__page_copy *last = &ctx->pages.copies[sh.pending_copies];
    if (last->src != old || last->dst != fresh)
      FUZZ_FAIL("copy-on-write of sequence %u: queued %u -> %u, expected %u -> %u", seq, last->src,
                last->dst, old, fresh);
    sh.pending_copies++;
  }
  for (uint32_t i = s->npages; i < pages_for(n); i++) {
    take(row[i], "fattn_seq_reserve");
    s->pages[i] = row[i];
  }
  s->npages = pages_for(n);
  s->len = n;
}

static void op_fork(uint32_t src, uint32_t n) {
  size_t bytes;
  uint8_t *before = fuzz_pages_snapshot(&ctx->pages, &bytes);
  const shadow_seq *s = open_seq(src);
  fattn_status want = FATTN_OK;
  if (!s) want = FATTN_ERR_NOT_FOUND;
  else if (sh.caller_owned) want = FATTN_ERR_STATE;
  else if (n > s->len) want = FATTN_ERR_INVALID;
  else if (shadow_open_count() == sh.max_seqs) want = FATTN_ERR_CAPACITY;
  uint32_t dst = UINT32_MAX;
  fattn_status got = fattn_seq_fork(ctx, src, n, &dst);
  expect(got, want, "fattn_seq_fork", before, bytes);
  if (got != FATTN_OK) return;
  shadow_seq *d = take_seq(dst, "fattn_seq_fork");
  d->len = n;
  d->npages = pages_for(n);
  for (uint32_t i = 0; i < d->npages; i++) { /* the same page ids, by reference */
    d->pages[i] = s->pages[i];
    sh.refcount[s->pages[i]]++;
  }
}

static void release_past(shadow_seq *s, uint32_t n) {
  for (uint32_t i = pages_for(n); i < s->npages && !sh.caller_owned; i++) unref(s->pages[i]); /* never the caller's */
  s->npages = pages_for(n);
  s->len = n;
}

static void op_truncate(uint32_t seq, uint32_t n) {
  size_t bytes;
  uint8_t *before = fuzz_pages_snapshot(&ctx->pages, &bytes);
  shadow_seq *s = open_seq(seq);
  fattn_status want = !s ? FATTN_ERR_NOT_FOUND : n > s->len ? FATTN_ERR_INVALID : FATTN_OK;
  fattn_status got = fattn_seq_truncate(ctx, seq, n);
  expect(got, want, "fattn_seq_truncate", before, bytes);
  if (got == FATTN_OK) release_past(s, n);
}

static void op_close(uint32_t seq) {
  size_t bytes;
  uint8_t *before = fuzz_pages_snapshot(&ctx->pages, &bytes);
  shadow_seq *s = open_seq(seq);
  fattn_status got = fattn_seq_close(ctx, seq);
  expect(got, s ? FATTN_OK : FATTN_ERR_NOT_FOUND, "fattn_seq_close", before, bytes);
  if (got != FATTN_OK) return;
  release_past(s, 0);
  s->open = 0;
}

/* Caller-owned pages: entries [first, first + count) become pages[]; the length never changes
 * here (reserve and truncate set it). Page ids may repeat. */
static void op_map(uint32_t seq, uint32_t first, uint32_t count, const uint32_t *pages) {
  size_t bytes;
  uint8_t *before = fuzz_pages_snapshot(&ctx->pages, &bytes);
  shadow_seq *s = open_seq(seq);
  fattn_status want = FATTN_OK;
  if (!s) want = FATTN_ERR_NOT_FOUND;
  else if (!sh.caller_owned) want = FATTN_ERR_STATE;
  else if ((count && !pages) || first > s->npages || (uint64_t)first + count > sh.pages_per_seq)
    want = FATTN_ERR_INVALID;
  for (uint32_t i = 0; want == FATTN_OK && i < count; i++)
    if (pages[i] >= sh.num_pages) want = FATTN_ERR_INVALID;
  fattn_status got = fattn_seq_map(ctx, seq, first, count, pages);
  expect(got, want, "fattn_seq_map", before, bytes);
  if (got != FATTN_OK) return;
  if (count) memcpy(s->pages + first, pages, (size_t)count * 4);
  if (first + count > s->npages) s->npages = first + count;
}

/* A DECODE step: each entry's one new token lands in its tail slot, which must be its own. */
static void op_plan(const uint32_t *ids, uint32_t count) {
  size_t bytes;
  uint8_t *before = fuzz_pages_snapshot(&ctx->pages, &bytes);
  fattn_status want = FATTN_OK;
  if (count == 0 || count > sh.max_batch) want = FATTN_ERR_INVALID;
  for (uint32_t i = 0; want == FATTN_OK && i < count; i++) {
    const shadow_seq *s = open_seq(ids[i]);
    int repeated = 0;
    for (uint32_t j = 0; j < i; j++) repeated |= ids[j] == ids[i];
    if (!s) want = FATTN_ERR_NOT_FOUND;
    else if (repeated || s->len == 0) want = FATTN_ERR_INVALID;
    else if (sh.refcount[s->pages[(s->len - 1) / sh.page_size]] > 1) want = FATTN_ERR_INVALID;
  }
  if (want == FATTN_OK && count > sh.max_q_tokens) want = FATTN_ERR_INVALID;
  fattn_batch batch = FATTN_BATCH_INIT;
  batch.mode = FATTN_MODE_DECODE;
  batch.num_seqs = count;
  batch.seq_ids = ids;
  fattn_status got = fattn_plan(ctx, &batch, NULL);
  expect(got, want, "fattn_plan", before, bytes);
  if (got != FATTN_OK) return;
  sh.pending_copies = 0;
  /* Every change was shipped: the device page table (host memory here) is the mirror. */
  const fattn__pages *p = &ctx->pages;
  if (p->num_dirty != 0) FUZZ_FAIL("fattn_plan left %u page-table rows unshipped", p->num_dirty);
  const uint32_t *dev = (const uint32_t *)(ctx->dev + ctx->lay.dev_off[FATTN_REGION_PAGE_TABLE]);
  for (size_t i = 0; i < (size_t)p->max_seqs * p->pages_per_seq; i++)
    if (dev[i] != p->table[i])
      FUZZ_FAIL("after fattn_plan: device page table [%zu / %u] = %u, host mirror %u", i / p->pages_per_seq,
                (uint32_t)(i % p->pages_per_seq), dev[i], p->table[i]);
  const fattn__step_hdr *h = ctx->step.hdr;
  if (!ctx->step.planned || h->num_entries != count || h->num_q_tokens != count)
    FUZZ_FAIL("fattn_plan OK but the step holds %u entries / %u tokens, %u planned", h->num_entries,
              h->num_q_tokens, count);
  for (uint32_t i = 0; i < count; i++)
    if (ctx->step.entries[i].seq != ids[i] || ctx->step.entries[i].kv_len != sh.seqs[ids[i]].len)
      FUZZ_FAIL("step entry %u: sequence %u kv_len %u, planned %u with length %u", i,
                ctx->step.entries[i].seq, ctx->step.entries[i].kv_len, ids[i], sh.seqs[ids[i]].len);
}

/* Token counts: either a small step from the current length (copy-on-write, page edges)
 * or anywhere up to just past max_seq_len (capacity, invalid). */
static uint32_t pick_len(fuzz_bytes *in, uint32_t len) {
  uint8_t b = fuzz_u8(in);
  if (b & 0x80) return fuzz_u16(in) % (sh.max_seq_len + 3);
  return len + (b & 0x7f) % (2 * sh.page_size + 1);
}

/* Two bytes choose one of 60 configs at the edges that matter: one-token to 16-token
 * pages; budgets at or near one max_seq_len sequence; one, few or many sequences (few
 * also bounds the copy-on-write queue, many rows of long tables overflow a staging slot);
 * batch and query limits below the sequence count. Few configs let fuzz_context keep a
 * context for each. */
typedef struct preset {
  uint32_t pages;
  uint32_t len; /* 0: the longest the budget holds (<= MAX_PPS), 1: that less one, 2: one page and a token, 3: 1 */
  uint32_t seqs, batch, q_tokens;
} preset;

static const preset presets[] = {
    {8, 0, 1, 1, 2},          {8, 1, 3, 3, 64},      {13, 2, 8, 8, 64},     {13, 0, 3, 1, 2},
    {32, 3, 8, 8, 3},         {32, 0, MAX_SEQS, MAX_SEQS, 64}, {MAX_PAGES, 0, MAX_SEQS, MAX_SEQS, 64},
    {MAX_PAGES, 2, MAX_SEQS, 8, 64}, {8, 2, MAX_SEQS, MAX_SEQS, 5}, {13, 1, 8, 8, 64},
    {32, 2, 3, 3, 64},        {MAX_PAGES, 1, 8, 8, 8},
};
#define NUM_PRESETS (sizeof presets / sizeof presets[0])

static fattn_ctx *create(fuzz_bytes *in) {
  uint8_t key[32] = {0};
  uint8_t b = fuzz_u8(in);
  key[0] = b % 5;
  key[2] = b >= 5 * 25; /* about half the inputs: the caller's pages */
  key[1] = fuzz_u8(in) % NUM_PRESETS;
  const preset *pr = &presets[key[1]];
  fattn_config cfg = FATTN_CONFIG_INIT;
  fattn_model model = FATTN_MODEL_INIT;
  model.num_layers = 1; /* the allocator is shape-blind: the smallest model keeps pools tiny */
  model.num_q_heads = 1;
  model.num_kv_heads = 1;
  model.head_dim = 64;
  cfg.device = FATTN_DEVICE_CPU;
  cfg.kv_dtype = FATTN_DTYPE_FP8_E4M3;
  cfg.page_size = 1u << key[0];
  cfg.kv_budget_pages = pr->pages;
  uint32_t longest = cfg.kv_budget_pages * cfg.page_size;
  if (longest > MAX_PPS) longest = MAX_PPS;
  const uint32_t lens[] = {longest, longest - 1, cfg.page_size + 1, 1};
  cfg.max_seq_len = lens[pr->len];
  cfg.max_seqs = pr->seqs;
  cfg.max_batch = pr->batch;
  cfg.max_q_tokens = pr->q_tokens;
  cfg.flags = key[2] ? FATTN_FLAG_CALLER_PAGES : 0;
  char detail[FATTN__DETAIL_LEN];
  fattn_status st;
  fattn_ctx *c = fuzz_context(key, &cfg, &model, &st, detail, sizeof detail);
  if (!c) FUZZ_FAIL("fattn_create of a small valid config: %s: %s", fattn_status_name(st), detail);
  memset(&sh, 0, sizeof sh);
  sh.caller_owned = key[2];
  sh.page_size = cfg.page_size;
  sh.pages_per_seq = (cfg.max_seq_len + cfg.page_size - 1) / cfg.page_size;
  sh.num_pages = cfg.kv_budget_pages;
  sh.max_seqs = cfg.max_seqs;
  sh.max_seq_len = cfg.max_seq_len;
  sh.max_batch = cfg.max_batch;
  sh.max_q_tokens = cfg.max_q_tokens;
  sh.cap_copies = c->pages.cap_copies;
  return c;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fuzz_bytes in = {data, size, 0};
  ctx = create(&in);
  compare("fattn_create");
  for (int n = 0; n < MAX_OPS && !fuzz_done(&in); n++) {
    uint8_t op = fuzz_u8(&in);
    uint32_t seq = pick_seq(fuzz_u8(&in));
    switch (op % 7) {
      case 0: op_open(); compare("fattn_seq_open"); break;
      case 1: op_reserve(seq, pick_len(&in, len_of(seq))); compare("fattn_seq_reserve"); break;
      case 2: op_fork(seq, fuzz_u8(&in) % (len_of(seq) + 2)); compare("fattn_seq_fork"); break;
      case 3: op_truncate(seq, fuzz_u8(&in) % (len_of(seq) + 2)); compare("fattn_seq_truncate"); break;
      case 4: op_close(seq); compare("fattn_seq_close"); break;
      case 5: {
        uint32_t pages[MAX_PPS], first = fuzz_u8(&in) % (sh.pages_per_seq + 2), count = fuzz_u8(&in) % 5;
        uint8_t how = fuzz_u8(&in);
        if (how == 0xff) first = 0, count = sh.pages_per_seq; /* the whole row at once */
        for (uint32_t i = 0; i < count; i++) /* mostly in range, some repeated, a few past the pool */
          pages[i] = how & 1 ? fuzz_u8(&in) % (sh.num_pages + 2) : (how + i) % sh.num_pages;
        op_map(seq, first, count, how == 0xfe ? NULL : pages);
        compare("fattn_seq_map");
        break;
      }
      default: {
        uint32_t ids[MAX_SEQS + 1], count = fuzz_u8(&in) % (sh.max_batch + 2);
        ids[0] = seq;
        for (uint32_t i = 1; i < count; i++) ids[i] = pick_seq(fuzz_u8(&in));
        op_plan(ids, count);
        compare("fattn_plan");
      }
    }
  }
  /* Live sequences keep the context busy unless forced (the context itself is kept for
   * the next input with this config, see fuzz_context). */
  if (shadow_open_count()) {
    fattn_status st = fattn_destroy(ctx, 0);
    if (st != FATTN_ERR_BUSY) FUZZ_FAIL("fattn_destroy(ctx, 0) with live sequences: %s", fattn_status_name(st));
  }
  ctx = NULL;
  return 0;
}
