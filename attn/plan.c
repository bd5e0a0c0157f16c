/* plan.c: fattn_plan. Validates a batch against the context (no state touched on error),
 * stages entries and page-table changes in the pinned ring; one prep kernel reads them in place. */
#include <cuda_runtime_api.h>
#include <string.h>

#include "attn/plan.h"

/* What the checks learned: the step's counts, for its header and the kernels' bounds. */
typedef struct plan_info {
  uint32_t entries;
  uint32_t q_tokens;
  uint32_t new_tokens;
  uint32_t tiles;
  uint32_t mask_rows;
} plan_info;

static int spec_mode(fattn_mode m) {
  return m == FATTN_MODE_TARGET_VERIFY || m == FATTN_MODE_DRAFT_DECODE || m == FATTN_MODE_DRAFT_EXTEND;
}

/* What the per-entry checks and the fill read, loaded once a batch: kept in a local, these
 * are not reloaded after each store into the sequence records (a uint32_t store may alias). */
typedef struct entry_src {
  const uint32_t *seq_ids, *q_lens, *kv_lens, *kv_new_lens;
  const fattn__seq *seqs;
  const uint32_t *table, *refcount;
  uint32_t q_default, cross, mode, max_seqs, pages_per_seq, page_shift, check_shared;
  uint32_t draft_tokens, max_encoder_len, max_seq_len;
} entry_src;

static entry_src entry_src_of(const fattn_ctx *ctx, const fattn_batch *b) {
  const fattn__pages *p = &ctx->pages;
  const fattn_config *c = &ctx->n.cfg;
  return (entry_src){b->seq_ids,
                     b->q_lens,
                     b->kv_lens,
                     b->kv_new_lens,
                     p->seqs,
                     p->table,
                     p->refcount,
                     b->mode == FATTN_MODE_TARGET_VERIFY ? c->spec_draft_tokens : 1u,
                     b->mode == FATTN_MODE_CROSS,
                     (uint32_t)b->mode,
                     p->max_seqs,
                     p->pages_per_seq,
                     (uint32_t)__builtin_ctz(p->page_size), /* a power of two */
                     !p->caller_owned,
                     c->spec_draft_tokens,
                     c->max_encoder_len,
                     c->max_seq_len};
}

/* An entry's query tokens, attended slots and stored slots. */
typedef struct entry_lens {
  uint32_t q, kv, nw;
} entry_lens;

/* Entry i's lengths, with the batch's defaults. `plain`, a constant where inlined: the batch
 * gives only seq_ids (no length arrays, not CROSS), as graph and decode steps do. */
static inline __attribute__((always_inline)) entry_lens lens_of(const entry_src *s, uint32_t i, int plain) {
  if (plain) return (entry_lens){s->q_default, s->seqs[s->seq_ids[i]].len, s->q_default};
  const uint32_t q = s->q_lens ? s->q_lens[i] : s->q_default;
  return (entry_lens){q, s->kv_lens ? s->kv_lens[i] : s->seqs[s->seq_ids[i]].len,
                      s->cross ? (s->kv_new_lens ? s->kv_new_lens[i] : 0u) : q};
}

static inline __attribute__((always_inline)) fattn_status check_entry(fattn_ctx *ctx, const entry_src *s,
                                                                       uint32_t stamp, uint32_t i, int plain,
                                                                       entry_lens *out) {
  const uint32_t seq = s->seq_ids[i];
  if (seq >= s->max_seqs || !s->seqs[seq].open)
    return fattn__fail(ctx, FATTN_ERR_NOT_FOUND, "batch entry %u: sequence %u is not open", i, seq);
  if (s->seqs[seq].stamp == stamp)
    return fattn__fail(ctx, FATTN_ERR_INVALID, "batch entry %u: sequence %u appears twice", i, seq);
  const uint32_t len = s->seqs[seq].len;
  const entry_lens L = lens_of(s, i, plain);
  const uint32_t q = L.q, kv = L.kv, nw = L.nw;
  /* A plain entry's q_len is the mode's default, which the mode's rule admits, and its kv_len
   * the sequence's length: of the length rules only kv_len >= q_len and the cap are left. */
  if (!plain) switch (s->mode) {
    case FATTN_MODE_DECODE:
    case FATTN_MODE_DRAFT_DECODE:
      if (q != 1) return fattn__fail(ctx, FATTN_ERR_INVALID, "batch entry %u: q_len %u, decode takes 1", i, q);
      break;
    case FATTN_MODE_TARGET_VERIFY:
      if (q != s->draft_tokens)
        return fattn__fail(ctx, FATTN_ERR_INVALID, "batch entry %u: q_len %u, verify takes spec_draft_tokens %u",
                           i, q, s->draft_tokens);
      break;
    case FATTN_MODE_DRAFT_EXTEND:
      if (q == 0 || q > s->draft_tokens + 1)
        return fattn__fail(ctx, FATTN_ERR_INVALID, "batch entry %u: q_len %u, draft extend takes 1..%u", i, q,
                           s->draft_tokens + 1);
      break;
    default:
      if (q == 0) return fattn__fail(ctx, FATTN_ERR_INVALID, "batch entry %u: q_len 0", i);
  }
  if (!plain && s->cross) {
    if (kv > s->max_encoder_len)
      return fattn__fail(ctx, FATTN_ERR_INVALID, "batch entry %u: encoder length %u over max_encoder_len %u", i,
                         kv, s->max_encoder_len);
    if (nw > kv)
      return fattn__fail(ctx, FATTN_ERR_INVALID, "batch entry %u: kv_new_len %u over encoder length %u", i, nw, kv);
  } else if (kv < q) {
    return fattn__fail(ctx, FATTN_ERR_INVALID, "batch entry %u: kv_len %u < q_len %u", i, kv, q);
  }
  if (kv > s->max_seq_len)
    return fattn__fail(ctx, FATTN_ERR_INVALID, "batch entry %u: kv_len %u over max_seq_len %u", i, kv,
                       s->max_seq_len);
  if (!plain && kv > len)
    return fattn__fail(ctx, FATTN_ERR_INVALID, "batch entry %u: kv_len %u over sequence %u's %u reserved slots", i,
                       kv, seq, len);
  /* A write into a shared page would change the other sequences too; past the sequence's
   * `shared` bound every page is its own, so most entries read no page-table word here, and
   * the rest only those of their new pages below it. */
  const uint32_t first_new = (kv - nw) >> s->page_shift, bound = s->seqs[seq].shared;
  if (s->check_shared && nw && first_new < bound) {
    const uint32_t *row = s->table + (size_t)seq * s->pages_per_seq;
    for (uint32_t pg = first_new; pg <= (kv - 1) >> s->page_shift && pg < bound; pg++)
      if (s->refcount[row[pg]] > 1)
        return fattn__fail(ctx, FATTN_ERR_INVALID,
                           "batch entry %u: new slots of sequence %u lie in page %u, shared with a fork", i, seq,
                           row[pg]);
  }
  *out = L;
  return FATTN_OK;
}

static fattn_status check_mask(fattn_ctx *ctx, const fattn_batch *b, uint32_t *rows) {
  uint32_t nd = ctx->n.cfg.spec_draft_tokens;
  *rows = 0;
  if (!b->tree_mask) return FATTN_OK;
  if (b->mode != FATTN_MODE_TARGET_VERIFY || ctx->n.cfg.spec_topk < 2)
    return fattn__fail(ctx, FATTN_ERR_INVALID, "tree_mask: only TARGET_VERIFY with spec_topk > 1 takes one");
  uint64_t beyond = nd == 64 ? 0 : ~((1ull << nd) - 1);
  for (uint32_t r = 0; r < b->num_seqs * nd; r++) {
    uint64_t row = b->tree_mask[r];
    if (!(row >> (r % nd) & 1u))
      return fattn__fail(ctx, FATTN_ERR_INVALID, "tree_mask row %u (entry %u, draft %u): does not see itself", r,
                         r / nd, r % nd);
    if (row & beyond)
      return fattn__fail(ctx, FATTN_ERR_INVALID, "tree_mask row %u: bits past spec_draft_tokens %u", r, nd);
  }
  *rows = b->num_seqs * nd;
  return FATTN_OK;
}

fattn_status fattn__batch_in(fattn_ctx *ctx, const fattn_batch *user, fattn_batch *local, const fattn_batch **out) {
  if (!user) return fattn__fail(ctx, FATTN_ERR_INVALID, "batch must not be NULL");
  if (user->struct_size == sizeof *user) { /* this library's own, the usual case: read in place */
    *out = user;
    return FATTN_OK;
  }
  fattn_status st = fattn__abi_check(&fattn__abi_batch, user, ctx->detail, sizeof ctx->detail);
  if (st) return st;
  *out = fattn__abi_read(&fattn__abi_batch, user, local);
  return FATTN_OK;
}

/* The batch's own checks, before any entry: no state is read but the config's. */
static fattn_status check_batch(fattn_ctx *ctx, const fattn_batch *b, uint32_t cap_entries, plan_info *info) {
  const fattn_config *c = &ctx->n.cfg;
  if (b->mode < FATTN_MODE_PREFILL || b->mode > FATTN_MODE_COUNT)
    return fattn__fail(ctx, FATTN_ERR_INVALID, "mode %d: unknown", b->mode);
  if (ctx->backend[b->mode] == FATTN_BACKEND_AUTO) { /* only MLA leaves a mode to no backend (lib/context.c) */
    fattn__mla_mode_check(FATTN_BACKEND_FA2, b->mode, fattn__detail_buf(ctx), sizeof ctx->detail);
    return FATTN_ERR_UNSUPPORTED;
  }
  if (spec_mode(b->mode) && !c->spec_topk)
    return fattn__fail(ctx, FATTN_ERR_INVALID, "mode %d: speculative modes need spec_topk >= 1 at create", b->mode);
  if (b->mode == FATTN_MODE_CROSS && !c->max_encoder_len)
    return fattn__fail(ctx, FATTN_ERR_INVALID, "mode CROSS: needs max_encoder_len > 0 at create");
  if (b->num_seqs == 0 || b->num_seqs > c->max_batch)
    return fattn__fail(ctx, FATTN_ERR_INVALID, "num_seqs %u: must be in 1..max_batch %u", b->num_seqs, c->max_batch);
  if (!b->seq_ids) return fattn__fail(ctx, FATTN_ERR_INVALID, "seq_ids must not be NULL");
  if (b->kv_new_lens && b->mode != FATTN_MODE_CROSS)
    return fattn__fail(ctx, FATTN_ERR_INVALID, "kv_new_lens: only CROSS takes it (new slots are the last q_len)");
  uint32_t n = b->num_seqs * (b->mode == FATTN_MODE_DRAFT_DECODE ? c->spec_topk : 1u);
  if (n > cap_entries)
    return fattn__fail(ctx, FATTN_ERR_INVALID, "%u entries: over the %u this plan target holds", n, cap_entries);
  memset(info, 0, sizeof *info);
  info->entries = n;
  return check_mask(ctx, b, &info->mask_rows);
}

/* Checks every entry and, where `out` is given, writes each one as it passes (one pass over
 * the batch and the sequence records); sums the step's counts into info. */
/* The duplicate check's stamp for a new pass: one above every stamp a record holds. When the
 * 32-bit counter wraps, every record's stamp is cleared first (O(max_seqs) once in 2^32 passes,
 * no allocation): else a record stamped 2^32 passes ago, or never (0), would match. */
static uint32_t next_plan_stamp(fattn_ctx *ctx) {
  if (__builtin_expect(++ctx->plan_stamp == 0, 0)) {
    fattn__seq *seqs = ctx->pages.seqs;
    for (uint32_t i = 0; i < ctx->pages.max_seqs; i++) seqs[i].stamp = 0;
    ctx->plan_stamp = 1;
  }
  return ctx->plan_stamp;
}

static inline __attribute__((always_inline)) fattn_status check_entries_as(fattn_ctx *ctx, const fattn_batch *b,
                                                                           plan_info *info, fattn__staged *out,
                                                                           int plain) {
  const fattn_config *c = &ctx->n.cfg;
  const uint32_t n = info->entries, stamp = next_plan_stamp(ctx);
  const entry_src src = entry_src_of(ctx, b);
  fattn__seq *seqs = ctx->pages.seqs;
  uint64_t q_tokens = 0, new_tokens = 0;
  uint32_t tiles = 0;
  fattn_status st;
  for (uint32_t i = 0; i < n; i++) {
    entry_lens L = {0, 0, 0};
    if ((st = check_entry(ctx, &src, stamp, i, plain, &L))) return st;
    seqs[src.seq_ids[i]].stamp = stamp;
    if (out) out[i] = (fattn__staged){src.seq_ids[i], L.q, L.kv, L.nw};
    if (!plain) {
      q_tokens += L.q;
      new_tokens += L.nw;
      tiles += fattn__ceil_div(L.q, FATTN__Q_TILE);
    }
  }
  if (plain) { /* every entry alike */
    q_tokens = new_tokens = (uint64_t)n * src.q_default;
    tiles = n * fattn__ceil_div(src.q_default, FATTN__Q_TILE);
  }
  if (q_tokens > c->max_q_tokens)
    return fattn__fail(ctx, FATTN_ERR_INVALID, "%llu query tokens: over max_q_tokens %u",
                       (unsigned long long)q_tokens, c->max_q_tokens);
  if (new_tokens > UINT32_MAX / 2)
    return fattn__fail(ctx, FATTN_ERR_INVALID, "%llu new KV tokens: too many", (unsigned long long)new_tokens);
  info->q_tokens = (uint32_t)q_tokens;
  info->new_tokens = (uint32_t)new_tokens;
  info->tiles = tiles;
  return FATTN_OK;
}

/* check_entries_as compiled twice: for batches of seq_ids alone, and for the rest. */
static fattn_status check_entries(fattn_ctx *ctx, const fattn_batch *b, plan_info *info, fattn__staged *out) {
  if (!b->q_lens && !b->kv_lens && b->mode != FATTN_MODE_CROSS) return check_entries_as(ctx, b, info, out, 1);
  return check_entries_as(ctx, b, info, out, 0);
}

/* The slot's completion word: its last use's number + 1 once that prep kernel stopped reading it. */
static uint64_t slot_done(const fattn_ctx *ctx, uint32_t i) {
  return __atomic_load_n(&ctx->done[i], __ATOMIC_ACQUIRE);
}

/* Waits until slot i's completion word reaches seq. Waiting is back-pressure (counted);
 * polling the caller's stream meanwhile surfaces a dead context. */
static fattn_status wait_done(fattn_ctx *ctx, uint32_t i, uint64_t seq, void *stream) {
  if (slot_done(ctx, i) >= seq) return FATTN_OK;
  ctx->staging_waits++;
  while (slot_done(ctx, i) < seq) {
    cudaError_t e = cudaStreamQuery((cudaStream_t)stream);
    if (e != cudaSuccess && e != cudaErrorNotReady)
      return fattn__fail(ctx, FATTN_ERR_CUDA, "staging slot %u: %s", i, cudaGetErrorString(e));
  }
  return FATTN_OK;
}

/* A free staging slot. Use n of the ring goes to slot n % slots, so the slot is free once
 * use n - slots has stored its completion word (the GPU being a whole ring behind waits). */
static fattn_status take_slot(fattn_ctx *ctx, void *stream, uint8_t **slot, uint32_t *index) {
  const uint32_t i = ctx->ring_next, slots = ctx->n.staging_slots;
  const uint64_t use = ctx->ring_taken;
  fattn_status st;
  if (!ctx->n.on_cpu && use >= slots && (st = wait_done(ctx, i, use - slots + 1, stream))) return st;
  ctx->ring_next = (i + 1) % slots;
  ctx->ring_taken = use + 1;
  *slot = ctx->ring + (uint64_t)i * ctx->lay.slot_bytes;
  *index = i;
  return FATTN_OK;
}

/* Entries [dirty_lo, end) of a sequence's unshipped range lie within its pages and ship as
 * words; the rest were unmapped since (FATTN__PAGE_NONE in the mirror) and ship as a fill. */
static uint32_t words_end(const fattn__seq *s) {
  const uint32_t end = s->npages < s->dirty_hi ? s->npages : s->dirty_hi;
  return end > s->dirty_lo ? end : s->dirty_lo;
}

/* Whether a pending copy writes a page that another reads or writes (a page taken twice, or a
 * copy of a copy): then the device runs them in queue order. O(copies): each destination is
 * stamped in scratch. Stamps rise from 2^31, above fattn_check's counts there; a stale one
 * that matched would only send independent copies down the ordered path, never the reverse. */
static uint32_t copies_chained(fattn__pages *p) {
  const fattn__page_copy *c = p->copies;
  const uint32_t stamp = ++p->copy_stamp;
  uint32_t clash = 0;
  for (uint32_t i = 0; i < p->num_copies; i++) {
    clash |= p->scratch[c[i].dst] == stamp;
    p->scratch[c[i].dst] = stamp;
  }
  for (uint32_t i = 0; i < p->num_copies && !clash; i++) clash = p->scratch[c[i].src] == stamp;
  return clash;
}

/* Moves the pending row copies (all: they fit), then dirty ranges as many as fit, and the
 * page copies into a slot. Once shipped, no copy is pending: rows are free to copy again. */
static void stage_changes(fattn_ctx *ctx, uint8_t *slot, fattn__step_hdr *h) {
  fattn__pages *p = &ctx->pages;
  fattn__pt_update *up = (fattn__pt_update *)(slot + ctx->lay.slot_off_updates);
  fattn__row_op *ops = (fattn__row_op *)(slot + ctx->lay.slot_off_row_ops);
  uint32_t *words = (uint32_t *)(slot + ctx->lay.slot_off_words);
  const uint32_t nc = p->num_row_copies, cap = ctx->lay.cap_words;
  memcpy(ops, p->row_copies, (size_t)nc * sizeof *ops);
  for (uint32_t i = 0; i < nc; i++) {
    p->seqs[ops[i].dst].copy = 0;
    p->seqs[ops[i].src].root = 0;
  }
  p->num_row_copies = 0;
  fattn__row_op *fills = ops + nc;
  uint32_t nu = 0, nf = 0, nw = 0, left = p->num_dirty;
  while (left) {
    const uint32_t row = p->dirty[left - 1];
    fattn__seq *s = &p->seqs[row];
    const uint32_t end = words_end(s);
    if (s->dirty_lo < end) {
      if (nw == cap) break;
      const uint32_t count = end - s->dirty_lo < cap - nw ? end - s->dirty_lo : cap - nw;
      up[nu++] = (fattn__pt_update){row, s->dirty_lo, count, nw};
      memcpy(words + nw, p->table + (size_t)row * p->pages_per_seq + s->dirty_lo, (size_t)count * 4);
      nw += count;
      s->dirty_lo += count;
      if (s->dirty_lo < end) break; /* the slot's words are full: the rest goes in the next */
    }
    if (s->dirty_lo < s->dirty_hi)
      fills[nf++] = (fattn__row_op){row, FATTN__PAGE_NONE, s->dirty_lo, s->dirty_hi - s->dirty_lo};
    s->dirty_lo = s->dirty_hi;
    s->listed = 0;
    left--;
  }
  p->num_dirty = left;
  h->num_pt_updates = nu;
  h->num_row_copies = nc;
  h->num_row_fills = nf;
  memcpy(slot + ctx->lay.slot_off_copies, p->copies, (size_t)p->num_copies * sizeof(fattn__page_copy));
  h->num_page_copies = p->num_copies;
  h->page_copies_chained = copies_chained(p);
  p->num_copies = 0;
}

/* Page-table payload words a slot carries: the last update's payload ends them. */
static uint32_t staged_words(const fattn_ctx *ctx, const uint8_t *slot) {
  const fattn__step_hdr *h = (const fattn__step_hdr *)slot;
  if (!h->num_pt_updates) return 0;
  const fattn__pt_update *last = (const fattn__pt_update *)(slot + ctx->lay.slot_off_updates) + h->num_pt_updates - 1;
  return last->payload + last->count;
}

/* On the CPU only the used prefix of a slot is copied: header, entries, masks, change lists. */
static uint64_t used_bytes(const fattn_ctx *ctx, const uint8_t *slot) {
  const fattn__step_hdr *h = (const fattn__step_hdr *)slot;
  if (h->num_pt_updates) return ctx->lay.slot_off_words + (uint64_t)staged_words(ctx, slot) * 4;
  if (h->num_row_copies || h->num_row_fills) return ctx->lay.slot_off_words;
  return h->num_page_copies ? ctx->lay.slot_off_row_ops : ctx->lay.slot_off_updates;
}

/* A post is free once the prep that read it has stored its slot's completion word (slots are
 * reused only after that, so the word never passes a pending post's seq). Only the post of
 * FATTN__MAILBOX_POSTS launches ago is overwritten: the replay before may still be queued. */
static fattn_status post_box(fattn_ctx *ctx, fattn__mailbox *box, const uint8_t *slot, uint32_t index,
                             void *stream) {
  fattn_status st;
  fattn__post *p = &box->post[box->posted % FATTN__MAILBOX_POSTS];
  if (p->seq && (st = wait_done(ctx, p->index, p->seq, stream))) return st;
  p->hdr = *(const fattn__step_hdr *)slot;
  p->index = index;
  p->num_words = staged_words(ctx, slot);
  p->seq = ctx->ring_taken;
  box->posted++;
  return FATTN_OK;
}

/* On the GPU nothing is copied: the prep kernel (a graph's own node, for a graph) reads the
 * slot in place and frees it. */
static fattn_status submit(fattn_ctx *ctx, uint8_t *slot, uint32_t index, const fattn__plan_target *t,
                           void *stream) {
  uint8_t *inbox = ctx->dev + ctx->lay.dev_off[FATTN_REGION_METADATA];
  if (ctx->n.on_cpu) {
    memcpy(inbox, slot, used_bytes(ctx, slot));
    fattn__prep_host(ctx, inbox, t);
    return FATTN_OK;
  }
  if (t->box) return post_box(ctx, t->box, slot, index, stream);
  cudaError_t e = (cudaError_t)fattn__prep_launch(ctx, slot, index, ctx->ring_taken, staged_words(ctx, slot), t,
                                                  stream);
  if (e != cudaSuccess) return fattn__fail(ctx, FATTN_ERR_CUDA, "prep kernel: %s", cudaGetErrorString(e));
  return FATTN_OK;
}

static void fill_header(fattn_ctx *ctx, fattn__step_hdr *h, fattn_mode mode) {
  memset(h, 0, sizeof *h);
  h->mode = (uint32_t)mode;
  h->max_splits = ctx->n.max_splits;
  h->split_rows_cap = ctx->lay.split_rows_cap;
  h->target_ctas = FATTN__CTAS_PER_SM * ctx->num_sms;
  h->decode_groups = fattn__decode_groups(ctx->n.model.mla_latent_dim != 0, ctx->n.model.num_q_heads,
                                          ctx->n.model.num_kv_heads);
  h->decode_resident = ctx->decode_resident;
  h->causal = mode != FATTN_MODE_CROSS;
}

void fattn__step_bind(fattn_ctx *ctx, fattn_mode mode, uint8_t *area, uint32_t cap_entries, uint32_t entries,
                      uint32_t q_tokens, uint32_t new_tokens, uint32_t tiles) {
  ctx->step = (fattn__step){1,
                            (uint32_t)mode,
                            entries,
                            q_tokens,
                            new_tokens,
                            tiles,
                            (fattn__step_hdr *)area,
                            (fattn__entry *)(area + fattn__area_entries_off()),
                            (uint64_t *)(area + fattn__area_mask_off(cap_entries))};
}

/* Whether the pending page-table changes fit the step's own slot (the usual case; not after
 * bulk re-maps). Page and row copies bound for a graph never do: its prep node runs neither. */
static int changes_fit(const fattn_ctx *ctx, const fattn__plan_target *t) {
  const fattn__pages *p = &ctx->pages;
  if (p->num_dirty > ctx->lay.cap_updates || (t->box && (p->num_copies || p->num_row_copies))) return 0;
  uint64_t words = 0;
  for (uint32_t i = 0; i < p->num_dirty; i++) {
    const fattn__seq *s = &p->seqs[p->dirty[i]];
    words += words_end(s) - s->dirty_lo;
  }
  return words <= ctx->lay.cap_words;
}

static fattn__staged *slot_entries(uint8_t *slot) { return (fattn__staged *)(slot + fattn__area_entries_off()); }

fattn_status fattn__plan_into(fattn_ctx *ctx, const fattn_batch *b, void *stream,
                              const fattn__plan_target *t) {
  if (!ctx) return FATTN_ERR_INVALID;
  plan_info info;
  uint32_t cap = t->cap_entries ? t->cap_entries : ctx->n.max_entries;
  fattn_batch local; /* an older or newer caller's batch, in this library's layout */
  fattn_status st = fattn__batch_in(ctx, b, &local, &b);
  if (st || (st = check_batch(ctx, b, cap, &info))) return st;
  uint8_t *slot = NULL;
  uint32_t index = 0;
  if (changes_fit(ctx, t)) { /* entries checked straight into the slot; a rejected batch gives it back */
    const uint32_t ring_next = ctx->ring_next;
    const uint64_t ring_taken = ctx->ring_taken;
    if ((st = take_slot(ctx, stream, &slot, &index))) return st;
    if ((st = check_entries(ctx, b, &info, slot_entries(slot)))) {
      ctx->ring_next = ring_next;
      ctx->ring_taken = ring_taken;
      return st;
    }
    ctx->step.planned = 0;
    fill_header(ctx, (fattn__step_hdr *)slot, b->mode);
    stage_changes(ctx, slot, (fattn__step_hdr *)slot);
  } else {
    if ((st = check_entries(ctx, b, &info, NULL))) return st;
    ctx->step.planned = 0;
    /* Changes beyond one slot's room go first, in slots that carry no entries; so do page
     * and row copies bound for a graph, whose prep node launches no copy kernel. */
    while (1) {
      if ((st = take_slot(ctx, stream, &slot, &index))) return st;
      fattn__step_hdr *h = (fattn__step_hdr *)slot;
      fill_header(ctx, h, b->mode);
      stage_changes(ctx, slot, h);
      if (ctx->pages.num_dirty == 0 && !(t->box && (h->num_page_copies || h->num_row_copies))) break;
      const fattn__plan_target inplace = {NULL, 0, 0, NULL};
      if ((st = submit(ctx, slot, index, &inplace, stream))) return st;
    }
    /* The same batch over the same records: passes again, now writing the entries. */
    if ((st = check_entries(ctx, b, &info, slot_entries(slot)))) return st;
  }
  fattn__step_hdr *h = (fattn__step_hdr *)slot;
  fattn__staged *e = slot_entries(slot);
  h->num_mask_rows = info.mask_rows;
  h->num_live = info.entries;
  uint32_t padded = t->dst ? t->cap_entries : info.entries;
  for (uint32_t i = info.entries; i < padded; i++) /* kv_len 0: sees nothing, writes zeros */
    e[i] = (fattn__staged){0u, t->pad_q_len, 0u, 0u};
  h->num_entries = padded;
  if (info.mask_rows) memcpy(slot + fattn__area_mask_off(ctx->n.max_entries), b->tree_mask, (size_t)info.mask_rows * 8);
  if ((st = submit(ctx, slot, index, t, stream))) return st;
  /* Eager steps read the inbox, an area of max_entries entries; graphs their bucket's area. */
  uint8_t *area = t->dst ? t->dst : ctx->dev + ctx->lay.dev_off[FATTN_REGION_METADATA];
  uint32_t area_cap = t->dst ? t->cap_entries : ctx->n.max_entries;
  uint32_t pads = padded - info.entries;
  fattn__step_bind(ctx, b->mode, area, area_cap, padded, info.q_tokens + pads * t->pad_q_len, info.new_tokens,
                   info.tiles + pads * fattn__ceil_div(t->pad_q_len, FATTN__Q_TILE));
  ctx->steps_planned++;
  return FATTN_OK;
}

fattn_status fattn_plan(fattn_ctx *ctx, const fattn_batch *batch, void *stream) {
  const fattn__plan_target eager = {NULL, 0, 0, NULL};
  fattn_status st = ctx ? fattn__on_device(ctx, "fattn_plan") : FATTN_ERR_INVALID;
  return st ? st : fattn__plan_into(ctx, batch, stream, &eager);
}
