/* pages.c: the KV page allocator and sequences. O(1) page alloc/free from a free stack,
 * refcounts for forks, copy-on-write of a shared tail page, dirty ranges for the planner. */
#include <string.h>

#include "lib/internal.h"

_Static_assert(sizeof(fattn__seq) == 32, "a sequence record takes half a cache line, never two");

fattn_status fattn__pages_init(fattn_ctx *ctx) {
  fattn__pages *p = &ctx->pages;
  fattn__heap *h = ctx->heap;
  p->num_pages = ctx->lay.num_pages;
  p->pages_per_seq = ctx->lay.pages_per_seq;
  p->page_size = ctx->n.cfg.page_size;
  p->max_seqs = ctx->n.max_seqs;
  p->max_seq_len = ctx->n.cfg.max_seq_len;
  p->caller_owned = (ctx->n.cfg.flags & FATTN_FLAG_CALLER_PAGES) != 0;
  p->cap_copies = ctx->lay.cap_copies;
  p->copy_stamp = 1u << 31; /* above any count fattn_check leaves in scratch */
  size_t np = p->num_pages, ms = p->max_seqs;
  p->free_stack = fattn__heap_alloc(h, np * 4);
  p->refcount = fattn__heap_alloc(h, np * 4);
  p->scratch = fattn__heap_alloc(h, np * 4);
  p->table = fattn__heap_alloc(h, ms * p->pages_per_seq * 4);
  p->seqs = fattn__heap_alloc(h, ms * sizeof(fattn__seq));
  p->seq_free = fattn__heap_alloc(h, ms * 4);
  p->dirty = fattn__heap_alloc(h, ms * 4);
  p->copies = fattn__heap_alloc(h, (size_t)p->cap_copies * sizeof(fattn__page_copy));
  p->cap_row_copies = ctx->lay.cap_row_copies;
  p->row_copies = fattn__heap_alloc(h, (size_t)p->cap_row_copies * sizeof(fattn__row_op));
  if (!p->free_stack || !p->refcount || !p->scratch || !p->table || !p->seqs || !p->seq_free ||
      !p->dirty || !p->copies || !p->row_copies)
    return fattn__fail(ctx, FATTN_ERR_NOMEM, "host tables: the pinned slab's heap is too small");
  /* Pages come off the stack in increasing order, ids in increasing order: easy to read. */
  p->free_top = p->caller_owned ? 0 : p->num_pages;
  for (uint32_t i = 0; i < p->free_top; i++) p->free_stack[i] = p->num_pages - 1 - i;
  memset(p->table, 0xff, ms * p->pages_per_seq * 4);
  p->seq_free_top = p->max_seqs;
  for (uint32_t i = 0; i < p->max_seqs; i++) p->seq_free[i] = p->max_seqs - 1 - i;
  return FATTN_OK;
}

/* Entries [lo, hi) of row changed: the next plan ships them. */
static inline void mark(fattn__pages *p, uint32_t row, uint32_t lo, uint32_t hi) {
  fattn__seq *s = &p->seqs[row];
  if (lo >= hi) return;
  if (!s->listed) {
    s->listed = 1;
    s->dirty_lo = lo;
    s->dirty_hi = hi;
    p->dirty[p->num_dirty++] = row;
    return;
  }
  if (lo < s->dirty_lo) s->dirty_lo = lo;
  if (hi > s->dirty_hi) s->dirty_hi = hi;
}

static uint32_t *row_of(fattn__pages *p, uint32_t seq) {
  return p->table + (size_t)seq * p->pages_per_seq;
}

static uint32_t pages_for(const fattn__pages *p, uint32_t tokens) {
  return (uint32_t)(((uint64_t)tokens + p->page_size - 1) >> __builtin_ctz(p->page_size)); /* a power of two */
}

static void page_unref(fattn__pages *p, uint32_t page) {
  if (--p->refcount[page] == 0) {
    p->free_stack[p->free_top++] = page;
    p->frees++;
  }
}

static uint32_t page_take(fattn__pages *p) {
  uint32_t page = p->free_stack[--p->free_top];
  p->refcount[page] = 1;
  p->allocs++;
  return page;
}

static fattn_status check_seq(fattn_ctx *ctx, uint32_t seq, const char *call) {
  if (!ctx) return FATTN_ERR_INVALID;
  if (seq >= ctx->pages.max_seqs || !ctx->pages.seqs[seq].open)
    return fattn__fail(ctx, FATTN_ERR_NOT_FOUND, "%s: sequence %u is not open", call, seq);
  return FATTN_OK;
}

fattn_status fattn_seq_open(fattn_ctx *ctx, uint32_t *seq) {
  if (!ctx) return FATTN_ERR_INVALID;
  if (!seq) return fattn__fail(ctx, FATTN_ERR_INVALID, "fattn_seq_open: seq must not be NULL");
  fattn__pages *p = &ctx->pages;
  if (p->seq_free_top == 0)
    return fattn__fail(ctx, FATTN_ERR_CAPACITY, "fattn_seq_open: all %u sequences are open", p->max_seqs);
  uint32_t id = p->seq_free[--p->seq_free_top];
  fattn__seq *s = &p->seqs[id];
  /* a closed row may still have entries to ship, a row copy to receive or to give */
  const fattn__seq keep = *s;
  memset(s, 0, sizeof *s);
  s->listed = keep.listed;
  s->dirty_lo = keep.dirty_lo;
  s->dirty_hi = keep.dirty_hi;
  s->root = keep.root;
  s->copy = keep.copy;
  s->open = 1;
  *seq = id;
  return FATTN_OK;
}

fattn_status fattn_seq_reserve(fattn_ctx *ctx, uint32_t seq, uint32_t num_tokens) {
  fattn_status st = check_seq(ctx, seq, "fattn_seq_reserve");
  if (st) return st;
  fattn__pages *p = &ctx->pages;
  fattn__seq *s = &p->seqs[seq];
  if (num_tokens > p->max_seq_len)
    return fattn__fail(ctx, FATTN_ERR_INVALID, "fattn_seq_reserve: num_tokens %u over max_seq_len %u",
                       num_tokens, p->max_seq_len);
  if (num_tokens <= s->len) return FATTN_OK;
  if (p->caller_owned) { /* the caller's pages: the length may grow within the mapped entries only */
    if (pages_for(p, num_tokens) > s->npages)
      return fattn__fail(ctx, FATTN_ERR_CAPACITY,
                         "fattn_seq_reserve: sequence %u maps %u pages (%u slots), %u tokens need %u: map "
                         "them first (fattn_seq_map)",
                         seq, s->npages, s->npages * p->page_size, num_tokens, pages_for(p, num_tokens));
    s->len = num_tokens;
    return FATTN_OK;
  }
  uint32_t *row = row_of(p, seq);
  uint32_t need = pages_for(p, num_tokens);
  /* a tail page at or past the `shared` bound is the sequence's own: no table or refcount read */
  const int looked = (s->len & (p->page_size - 1)) != 0 && s->npages - 1 < s->shared;
  const int cow = looked && p->refcount[row[s->npages - 1]] > 1;
  uint32_t want = need - s->npages + (cow ? 1u : 0u);
  if (want > p->free_top)
    return fattn__fail(ctx, FATTN_ERR_CAPACITY,
                       "fattn_seq_reserve: sequence %u needs %u pages for %u tokens, %u free", seq,
                       want, num_tokens, p->free_top);
  if (cow && p->num_copies == p->cap_copies)
    return fattn__fail(ctx, FATTN_ERR_CAPACITY,
                       "fattn_seq_reserve: %u copy-on-write pages wait for the next fattn_plan",
                       p->num_copies);
  uint32_t first = s->npages;
  if (cow) { /* the tail page is shared and the next token lands in it: private copy */
    uint32_t old = row[s->npages - 1], page = page_take(p);
    p->copies[p->num_copies++] = (fattn__page_copy){old, page};
    p->cow_copies++;
    page_unref(p, old);
    row[s->npages - 1] = page;
    first = s->npages - 1;
  }
  /* looked up and unshared, or just copied: the tail page is its own, and so is all after it */
  if (looked) s->shared = s->npages - 1;
  for (uint32_t i = s->npages; i < need; i++) row[i] = page_take(p);
  s->npages = need;
  s->len = num_tokens;
  mark(p, seq, first, need);
  return FATTN_OK;
}

/* Queues the device-side copy of src's first n entries into dst's row where it can (the rows
 * stay disjoint: dst is no row's source and has no copy of its own), and returns from where
 * dst's entries must still ship as words: those src had not shipped, and any its own source
 * lacks. Where it cannot, all n ship. The copy reads the source's device row before the
 * slot's updates, so it copies from the row a pending copy of src reads. A row has at most
 * one pending copy, so cap_row_copies (max_seqs) always has room. */
static uint32_t row_copy(fattn__pages *p, uint32_t src, uint32_t dst, uint32_t n) {
  fattn__seq *s = &p->seqs[src], *d = &p->seqs[dst];
  if (d->copy || d->root) return 0;
  uint32_t root = src, count = n;
  if (s->copy) {
    const fattn__row_op *c = &p->row_copies[s->copy - 1];
    root = c->src;
    if (c->count < count) count = c->count;
  }
  if (!count) return 0;
  p->row_copies[p->num_row_copies++] = (fattn__row_op){dst, root, 0, count};
  d->copy = p->num_row_copies;
  p->seqs[root].root = 1;
  if (d->listed && d->dirty_lo < count) { /* a closed row's range: the copy rewrites [0, count) */
    d->dirty_lo = count;
    if (d->dirty_hi < count) d->dirty_hi = count;
  }
  return s->listed && s->dirty_lo < count ? s->dirty_lo : count;
}

fattn_status fattn_seq_fork(fattn_ctx *ctx, uint32_t src, uint32_t num_tokens, uint32_t *dst) {
  fattn_status st = check_seq(ctx, src, "fattn_seq_fork");
  if (st) return st;
  fattn__pages *p = &ctx->pages;
  if (!dst) return fattn__fail(ctx, FATTN_ERR_INVALID, "fattn_seq_fork: dst must not be NULL");
  if (p->caller_owned)
    return fattn__fail(ctx, FATTN_ERR_STATE, "fattn_seq_fork: caller-owned pages: map the pages yourself");
  if (num_tokens > p->seqs[src].len)
    return fattn__fail(ctx, FATTN_ERR_INVALID, "fattn_seq_fork: num_tokens %u over sequence %u's length %u",
                       num_tokens, src, p->seqs[src].len);
  uint32_t id;
  if ((st = fattn_seq_open(ctx, &id))) return st;
  uint32_t n = pages_for(p, num_tokens);
  const uint32_t *from = row_of(p, src);
  uint32_t *to = row_of(p, id);
  for (uint32_t i = 0; i < n; i++) {
    to[i] = from[i];
    p->refcount[from[i]]++;
  }
  fattn__seq *s = &p->seqs[src], *d = &p->seqs[id];
  d->npages = n;
  d->len = num_tokens;
  d->shared = n;
  if (s->shared < n) s->shared = n;
  mark(p, id, row_copy(p, src, id, n), n);
  *dst = id;
  return FATTN_OK;
}

static void shrink(fattn__pages *p, uint32_t seq, uint32_t num_tokens) {
  fattn__seq *s = &p->seqs[seq];
  uint32_t *row = row_of(p, seq);
  uint32_t keep = pages_for(p, num_tokens);
  if (!p->caller_owned)
    for (uint32_t i = keep; i < s->npages; i++) page_unref(p, row[i]);
  for (uint32_t i = keep; i < s->npages; i++) row[i] = FATTN__PAGE_NONE;
  mark(p, seq, keep, s->npages);
  s->npages = keep;
  if (s->shared > keep) s->shared = keep;
  s->len = num_tokens;
}

fattn_status fattn_seq_truncate(fattn_ctx *ctx, uint32_t seq, uint32_t num_tokens) {
  fattn_status st = check_seq(ctx, seq, "fattn_seq_truncate");
  if (st) return st;
  fattn__pages *p = &ctx->pages;
  if (num_tokens > p->seqs[seq].len)
    return fattn__fail(ctx, FATTN_ERR_INVALID, "fattn_seq_truncate: num_tokens %u over sequence %u's length %u",
                       num_tokens, seq, p->seqs[seq].len);
  shrink(p, seq, num_tokens);
  return FATTN_OK;
}

fattn_status fattn_seq_close(fattn_ctx *ctx, uint32_t seq) {
  fattn_status st = check_seq(ctx, seq, "fattn_seq_close");
  if (st) return st;
  fattn__pages *p = &ctx->pages;
  shrink(p, seq, 0);
  p->seqs[seq].open = 0;
  p->seq_free[p->seq_free_top++] = seq;
  return FATTN_OK;
}

fattn_status fattn_seq_length(const fattn_ctx *ctx, uint32_t seq, uint32_t *num_tokens) {
  if (!ctx) return FATTN_ERR_INVALID;
  if (!num_tokens) return fattn__fail(ctx, FATTN_ERR_INVALID, "fattn_seq_length: num_tokens must not be NULL");
  if (seq >= ctx->pages.max_seqs || !ctx->pages.seqs[seq].open)
    return fattn__fail(ctx, FATTN_ERR_NOT_FOUND, "fattn_seq_length: sequence %u is not open", seq);
  *num_tokens = ctx->pages.seqs[seq].len;
  return FATTN_OK;
}

fattn_status fattn_seq_map(fattn_ctx *ctx, uint32_t seq, uint32_t first, uint32_t count,
                           const uint32_t *pages) {
  fattn_status st = check_seq(ctx, seq, "fattn_seq_map");
  if (st) return st;
  fattn__pages *p = &ctx->pages;
  fattn__seq *s = &p->seqs[seq];
  if (!p->caller_owned)
    return fattn__fail(ctx, FATTN_ERR_STATE, "fattn_seq_map: needs FATTN_FLAG_CALLER_PAGES");
  if (count && !pages) return fattn__fail(ctx, FATTN_ERR_INVALID, "fattn_seq_map: pages must not be NULL");
  if (first > s->npages)
    return fattn__fail(ctx, FATTN_ERR_INVALID, "fattn_seq_map: first %u leaves a hole after entry %u",
                       first, s->npages);
  if ((uint64_t)first + count > p->pages_per_seq)
    return fattn__fail(ctx, FATTN_ERR_INVALID, "fattn_seq_map: entries %u..%llu over %u per sequence",
                       first, (unsigned long long)first + count, p->pages_per_seq);
  for (uint32_t i = 0; i < count; i++)
    if (pages[i] >= p->num_pages)
      return fattn__fail(ctx, FATTN_ERR_INVALID, "fattn_seq_map: pages[%u] = %u, only %u pages", i,
                         pages[i], p->num_pages);
  if (count) memcpy(row_of(p, seq) + first, pages, (size_t)count * 4); /* pages may be NULL when count is 0 */
  if (first + count > s->npages) s->npages = first + count;
  /* the length stays: which tokens are visible is reserve's and truncate's business alone, so
   * re-mapping after a truncate never brings rejected draft slots back */
  mark(p, seq, first, first + count);
  return FATTN_OK;
}

/* Every invariant of the allocator; O(pages + table). */
fattn_status fattn_check(fattn_ctx *ctx) {
  if (!ctx) return FATTN_ERR_INVALID;
  fattn__pages *p = &ctx->pages;
  uint32_t *refs = p->scratch;
  memset(refs, 0, (size_t)p->num_pages * 4);
  for (uint32_t i = 0; i < p->free_top; i++) {
    uint32_t pg = p->free_stack[i];
    if (pg >= p->num_pages || refs[pg]++ != 0 || p->refcount[pg] != 0)
      return fattn__fail(ctx, FATTN_ERR_CORRUPT, "free stack[%u] = page %u: out of range, repeated or referenced", i, pg);
  }
  uint32_t free_seen = p->free_top, open = 0;
  memset(refs, 0, (size_t)p->num_pages * 4);
  for (uint32_t q = 0; q < p->max_seqs; q++) {
    const fattn__seq *s = &p->seqs[q];
    const uint32_t *row = p->table + (size_t)q * p->pages_per_seq;
    if (s->open) open++;
    uint32_t mapped = s->open ? s->npages : 0;
    /* fattn's sequences hold exactly the pages of their length; the caller's at least those */
    if (s->open && (p->caller_owned ? s->npages < pages_for(p, s->len) : s->npages != pages_for(p, s->len)))
      return fattn__fail(ctx, FATTN_ERR_CORRUPT, "sequence %u: %u pages for %u tokens", q, s->npages, s->len);
    for (uint32_t i = 0; i < p->pages_per_seq; i++) {
      uint32_t pg = row[i];
      if (i >= mapped) {
        if (pg != FATTN__PAGE_NONE)
          return fattn__fail(ctx, FATTN_ERR_CORRUPT, "sequence %u entry %u: page %u past its %u pages", q, i, pg, mapped);
        continue;
      }
      if (pg >= p->num_pages)
        return fattn__fail(ctx, FATTN_ERR_CORRUPT, "sequence %u entry %u: page %u out of range", q, i, pg);
      refs[pg]++;
    }
  }
  if (open != fattn__seqs_open(p))
    return fattn__fail(ctx, FATTN_ERR_CORRUPT, "%u sequences open, %u ids handed out", open, fattn__seqs_open(p));
  for (uint32_t i = 0; i < p->num_row_copies; i++) { /* pending row copies read rows none of them writes */
    const fattn__row_op *c = &p->row_copies[i];
    if (c->dst >= p->max_seqs || c->src >= p->max_seqs || !c->count || c->count > p->pages_per_seq ||
        p->seqs[c->dst].copy != i + 1 || p->seqs[c->dst].root || !p->seqs[c->src].root || p->seqs[c->src].copy)
      return fattn__fail(ctx, FATTN_ERR_CORRUPT, "row copy %u: %u entries of row %u into row %u, rows not disjoint", i,
                         c->count, c->src, c->dst);
  }
  for (uint32_t q = 0; q < p->max_seqs; q++)
    if (p->seqs[q].copy > p->num_row_copies)
      return fattn__fail(ctx, FATTN_ERR_CORRUPT, "sequence %u: row copy %u of %u pending", q, p->seqs[q].copy,
                         p->num_row_copies);
  if (p->caller_owned) return FATTN_OK;
  for (uint32_t q = 0; q < p->max_seqs; q++) { /* the planner skips the refcounts past `shared` */
    const fattn__seq *s = &p->seqs[q];
    const uint32_t *row = p->table + (size_t)q * p->pages_per_seq;
    for (uint32_t i = s->shared; s->open && i < s->npages; i++)
      if (refs[row[i]] > 1)
        return fattn__fail(ctx, FATTN_ERR_CORRUPT, "sequence %u entry %u: page %u is shared, past its bound %u", q,
                           i, row[i], s->shared);
  }
  uint32_t owned = 0;
  for (uint32_t pg = 0; pg < p->num_pages; pg++) {
    if (refs[pg] != p->refcount[pg])
      return fattn__fail(ctx, FATTN_ERR_CORRUPT, "page %u: refcount %u, referenced %u times", pg, p->refcount[pg], refs[pg]);
    if (refs[pg]) owned++;
  }
  if (owned + free_seen != p->num_pages)
    return fattn__fail(ctx, FATTN_ERR_CORRUPT, "%u owned + %u free != %u pages", owned, free_seen, p->num_pages);
  return FATTN_OK;
}
