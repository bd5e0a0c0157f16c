/* fuzz_plan.c: libFuzzer harness of fattn_plan and the calls on its step. Input bytes pick a
 * small CPU context with every mode enabled, shape its sequences, plan arbitrary batches and
 * store / attend on them; each verdict is predicted from the header's rules, a rejection must
 * change nothing, a plan must leave metadata that matches the batch, a store must write its
 * step's new slots and no other. */
#include <math.h>

#include "attn/plan.h"
#include "fuzz/common.h"

#define MAX_BATCH 4
#define MAX_TOPK 4
#define MAX_ENTRIES ((MAX_BATCH + 1) * MAX_TOPK)
#define MAX_MASK_ROWS ((MAX_BATCH + 1) * FATTN_MAX_DRAFT_TOKENS)
#define MAX_OPS 64
#define HEAD_DIM 64 /* one q head, one kv head: pool rows of 64 fp8 bytes */

static fattn_ctx *ctx;

/* Speculative shapes: disabled, chains, trees up to the 64-bit mask row. */
static const uint32_t spec_presets[][2] = {{0, 0}, {1, 1}, {1, 8}, {2, 3}, {3, 5}, {MAX_TOPK, FATTN_MAX_DRAFT_TOKENS}};
/* pages, max_batch, max_q_tokens, max_encoder_len, max_seq_len. FATTN_MAX_Q_TOKENS query tokens
 * leaves q_len bounded by the library limit alone where nothing else bounds it (CROSS). */
static const uint32_t size_presets[][5] = {
    {16, 1, 8, 8, 32}, {64, MAX_BATCH, FATTN_MAX_Q_TOKENS, 64, 64}, {40, 2, 16, 1, 48}, {128, MAX_BATCH, 300, 16, 128}};

static fattn_ctx *create(fuzz_bytes *in) {
  uint8_t key[32] = {0};
  key[0] = fuzz_u8(in) % 3;
  key[1] = fuzz_u8(in) % (sizeof spec_presets / sizeof spec_presets[0]);
  key[2] = fuzz_u8(in) % (sizeof size_presets / sizeof size_presets[0]);
  const uint32_t *spec = spec_presets[key[1]], *size = size_presets[key[2]];
  fattn_config cfg = FATTN_CONFIG_INIT;
  fattn_model model = FATTN_MODEL_INIT;
  model.num_layers = 1; /* planning is shape-blind: the smallest model keeps pools tiny */
  model.num_q_heads = 1;
  model.num_kv_heads = 1;
  model.head_dim = HEAD_DIM;
  cfg.device = FATTN_DEVICE_CPU;
  cfg.kv_dtype = FATTN_DTYPE_FP8_E4M3;
  cfg.page_size = 1u << (2 * key[0]); /* 1, 4, 16 */
  cfg.spec_topk = spec[0];
  cfg.spec_draft_tokens = spec[1];
  cfg.spec_steps = spec[0] ? 1 : 0;
  cfg.max_batch = size[1];
  cfg.max_q_tokens = size[2];
  cfg.max_encoder_len = size[3];
  cfg.max_seq_len = size[4];
  cfg.graph_modes = 1u << FATTN_MODE_DECODE; /* buckets for the graph modes: plan_op plans into them too */
  if (spec[0])
    cfg.graph_modes |=
        (1u << FATTN_MODE_TARGET_VERIFY) | (1u << FATTN_MODE_DRAFT_DECODE) | (1u << FATTN_MODE_DRAFT_EXTEND);
  uint32_t pps = (cfg.max_seq_len + cfg.page_size - 1) / cfg.page_size;
  cfg.kv_budget_pages = size[0] > pps ? size[0] : pps;
  char detail[FATTN__DETAIL_LEN];
  fattn_status st;
  fattn_ctx *c = fuzz_context(key, &cfg, &model, &st, detail, sizeof detail);
  if (!c) FUZZ_FAIL("fattn_create of a small valid config: %s: %s", fattn_status_name(st), detail);
  /* Pools start as whatever the allocation held; step_op wants finite values throughout. */
  fattn__layer_params l = fattn__layer_params_for(c, 0);
  memset(l.k_pool, 0, (size_t)l.num_pages * l.page_size * HEAD_DIM);
  memset(l.v_pool, 0, (size_t)l.num_pages * l.page_size * HEAD_DIM);
  return c;
}

static int is_open(uint32_t seq) { return seq < ctx->pages.max_seqs && ctx->pages.seqs[seq].open; }

/* A sequence id from one byte: mostly an open sequence, else any id (closed, unknown). */
static uint32_t pick_seq(uint8_t b) {
  const fattn__pages *p = &ctx->pages;
  uint32_t open = p->max_seqs - p->seq_free_top;
  if ((b & 0x80) && open) {
    uint32_t k = (b & 0x7f) % open;
    for (uint32_t q = 0; q < p->max_seqs; q++)
      if (p->seqs[q].open && k-- == 0) return q;
  }
  if (b == 0x7f) return UINT32_MAX;
  return (b & 0x7f) % (p->max_seqs + 1);
}

static uint32_t len_of(uint32_t seq) { return is_open(seq) ? ctx->pages.seqs[seq].len : 0; }

/* Shapes the sequences the batches name; fuzz_pages checks these calls themselves. */
static void allocator_op(fuzz_bytes *in, uint8_t op) {
  uint32_t seq = pick_seq(fuzz_u8(in)), id = 0, n = fuzz_u8(in);
  fattn_status st;
  switch (op % 5) {
    case 0: st = fattn_seq_open(ctx, &id); break;
    case 1: st = fattn_seq_reserve(ctx, seq, len_of(seq) + n % 24); break;
    case 2: st = fattn_seq_fork(ctx, seq, n % (len_of(seq) + 1), &id); break;
    case 3: st = fattn_seq_truncate(ctx, seq, n % (len_of(seq) + 1)); break;
    default: st = fattn_seq_close(ctx, seq);
  }
  if (!fuzz_known_status(st)) FUZZ_FAIL("allocator call %u: status %d is not a fattn_status", op % 5, st);
  if (fattn_check(ctx) != FATTN_OK) FUZZ_FAIL("after allocator call %u: fattn_check: %s", op % 5, fattn_detail(ctx));
}

/* Storage for one batch; the batch points only into it. */
typedef struct batch_buf {
  fattn_batch b;
  uint32_t seq_ids[MAX_ENTRIES], q_lens[MAX_ENTRIES], kv_lens[MAX_ENTRIES], kv_new_lens[MAX_ENTRIES];
  uint64_t mask[MAX_MASK_ROWS];
} batch_buf;

/* Lengths near what the mode wants, or anything, or near the top of uint32_t. */
static uint32_t near(fuzz_bytes *in, uint32_t around, uint32_t spread) {
  uint8_t b = fuzz_u8(in);
  if (b == 0xff) return fuzz_u32(in);
  if (b == 0xfe) return UINT32_MAX - fuzz_u8(in) % 128;
  uint32_t d = b % (spread + 1);
  return b & 0x80 ? around + d : (around > d ? around - d : d - around);
}

static void build(fuzz_bytes *in, batch_buf *bb) {
  const fattn_config *c = &ctx->n.cfg;
  const uint32_t nd = c->spec_draft_tokens;
  fattn_batch *b = &bb->b;
  memset(bb, 0, sizeof *bb);
  uint8_t flags = fuzz_u8(in);
  /* sometimes an older caller's batch (cut under its first field, or at a later one), or a
   * newer caller's, whose unknown tail is the seq_ids that follow it here */
  static const uint32_t sizes[] = {0, 4, 7, offsetof(fattn_batch, num_seqs), offsetof(fattn_batch, seq_ids),
                                   offsetof(fattn_batch, q_lens), offsetof(fattn_batch, kv_lens),
                                   offsetof(fattn_batch, kv_new_lens), offsetof(fattn_batch, tree_mask),
                                   sizeof(fattn_batch) + 4, sizeof(fattn_batch) + 16};
  b->struct_size = (flags & 0xc0) == 0xc0 ? sizes[fuzz_u8(in) % (sizeof sizes / sizeof sizes[0])]
                                          : (uint32_t)sizeof *b;
  b->mode = (fattn_mode)((int)(fuzz_u8(in) % (FATTN_MODE_COUNT + 3)) - 1); /* -1..7 */
  b->num_seqs = fuzz_u8(in) % (c->max_batch + 2);
  uint32_t per = b->mode == FATTN_MODE_DRAFT_DECODE && c->spec_topk ? c->spec_topk : 1;
  uint32_t entries = b->num_seqs * per;
  uint32_t q_usual = b->mode == FATTN_MODE_TARGET_VERIFY ? nd : b->mode == FATTN_MODE_PREFILL ? 4 : 1;
  for (uint32_t i = 0; i < entries; i++) {
    bb->seq_ids[i] = pick_seq(fuzz_u8(in));
    bb->q_lens[i] = near(in, q_usual, b->mode == FATTN_MODE_DRAFT_EXTEND ? nd + 2 : 2);
    bb->kv_lens[i] = near(in, len_of(bb->seq_ids[i]), 3);
    bb->kv_new_lens[i] = near(in, 1, 4);
  }
  b->seq_ids = (flags & 0x30) == 0x30 ? NULL : bb->seq_ids;
  b->q_lens = flags & 1 ? bb->q_lens : NULL;
  b->kv_lens = flags & 2 ? bb->kv_lens : NULL;
  b->kv_new_lens = flags & 4 ? bb->kv_new_lens : NULL;
  if (!(flags & 8) || !nd) return;
  b->tree_mask = bb->mask;
  for (uint32_t r = 0; r < b->num_seqs * nd; r++) {
    uint64_t self = 1ull << (r % nd), below = self | (self - 1);
    switch (fuzz_u8(in) % 5) {
      case 0: bb->mask[r] = below; break; /* a chain */
      case 1: bb->mask[r] = self; break;
      case 2: bb->mask[r] = self | (fuzz_u64(in) & below); break; /* a tree */
      case 3: bb->mask[r] = fuzz_u64(in); break;
      default: bb->mask[r] = below & ~self; /* does not see itself */
    }
  }
}

/* The verdict the header's rules give, checked in fattn_plan's order: the batch as a
 * whole, the tree mask, then entry by entry, then the step's token total. */
static fattn_status predict(const fattn_batch *b, uint32_t *entries, uint64_t *q_total) {
  const fattn_config *c = &ctx->n.cfg;
  const fattn__pages *p = &ctx->pages;
  const uint32_t nd = c->spec_draft_tokens;
  const int spec = b->mode == FATTN_MODE_TARGET_VERIFY || b->mode == FATTN_MODE_DRAFT_DECODE ||
                   b->mode == FATTN_MODE_DRAFT_EXTEND;
  *entries = 0;
  *q_total = 0;
  if (b->mode < FATTN_MODE_PREFILL || b->mode > FATTN_MODE_CROSS) return FATTN_ERR_INVALID;
  if ((spec && !c->spec_topk) || (b->mode == FATTN_MODE_CROSS && !c->max_encoder_len)) return FATTN_ERR_INVALID;
  if (b->num_seqs == 0 || b->num_seqs > c->max_batch || !b->seq_ids) return FATTN_ERR_INVALID;
  if (b->kv_new_lens && b->mode != FATTN_MODE_CROSS) return FATTN_ERR_INVALID;
  if (b->tree_mask) {
    if (b->mode != FATTN_MODE_TARGET_VERIFY || c->spec_topk < 2) return FATTN_ERR_INVALID;
    for (uint32_t r = 0; r < b->num_seqs * nd; r++) {
      uint64_t row = b->tree_mask[r];
      if (!((row >> (r % nd)) & 1) || (nd < 64 && (row >> nd) != 0)) return FATTN_ERR_INVALID;
    }
  }
  uint32_t n = b->num_seqs * (b->mode == FATTN_MODE_DRAFT_DECODE ? c->spec_topk : 1);
  for (uint32_t i = 0; i < n; i++) {
    uint32_t seq = b->seq_ids[i];
    if (!is_open(seq)) return FATTN_ERR_NOT_FOUND;
    for (uint32_t j = 0; j < i; j++)
      if (b->seq_ids[j] == seq) return FATTN_ERR_INVALID;
    uint32_t len = p->seqs[seq].len;
    uint32_t q = b->q_lens ? b->q_lens[i] : b->mode == FATTN_MODE_TARGET_VERIFY ? nd : 1;
    uint32_t kv = b->kv_lens ? b->kv_lens[i] : len;
    uint32_t nw = b->mode != FATTN_MODE_CROSS ? q : b->kv_new_lens ? b->kv_new_lens[i] : 0;
    int q_ok = b->mode == FATTN_MODE_DECODE || b->mode == FATTN_MODE_DRAFT_DECODE ? q == 1
               : b->mode == FATTN_MODE_TARGET_VERIFY                             ? q == nd
               : b->mode == FATTN_MODE_DRAFT_EXTEND                              ? q >= 1 && q <= nd + 1
                                                                                 : q >= 1;
    if (!q_ok) return FATTN_ERR_INVALID;
    if (b->mode == FATTN_MODE_CROSS ? kv > c->max_encoder_len || nw > kv : kv < q) return FATTN_ERR_INVALID;
    if (kv > c->max_seq_len || kv > len) return FATTN_ERR_INVALID;
    /* the new slots [kv - nw, kv) are written: none may lie in a page another sequence shares */
    const uint32_t *row = p->table + (size_t)seq * p->pages_per_seq;
    for (uint64_t slot = (uint64_t)kv - nw; slot < kv; slot++)
      if (p->refcount[row[slot / p->page_size]] > 1) return FATTN_ERR_INVALID;
    *q_total += q;
  }
  *entries = n;
  return *q_total > c->max_q_tokens ? FATTN_ERR_INVALID : FATTN_OK;
}

/* An accepted batch: the step holds exactly its entries (planned into a graph bucket's area
 * (t->dst), then padded to the bucket with entries that see nothing), prep's derived fields add
 * up, and every page-table change and copy was shipped. */
static void check_step(const fattn_batch *b, uint32_t n, uint64_t q_total, const fattn__plan_target *t) {
  const fattn__step *s = &ctx->step;
  const fattn__step_hdr *h = s->hdr;
  const fattn__pages *p = &ctx->pages;
  const uint32_t nd = ctx->n.cfg.spec_draft_tokens;
  const uint32_t all = t->dst ? t->cap_entries : n;
  q_total += (uint64_t)(all - n) * t->pad_q_len;
  if (!s->planned || s->mode != (uint32_t)b->mode || s->cap_entries != all || h->num_entries != all ||
      h->num_live != n || (t->dst && (const uint8_t *)h != t->dst))
    FUZZ_FAIL("step: planned %d mode %u with %u / %u entries (%u live), batch mode %d with %u of %u", s->planned,
              s->mode, s->cap_entries, h->num_entries, h->num_live, b->mode, n, all);
  if (s->cap_q_tokens != q_total || h->num_q_tokens != q_total)
    FUZZ_FAIL("step: %u / %u query tokens, batch has %llu", s->cap_q_tokens, h->num_q_tokens, (unsigned long long)q_total);
  uint64_t q = 0, nw = 0, tiles = 0, pairs = 0, rows = 0;
  for (uint32_t i = 0; i < all; i++) {
    const fattn__entry *e = &s->entries[i];
    if (e->q_start != q || e->new_start != nw || e->tile_start != tiles || e->pair_start != pairs)
      FUZZ_FAIL("entry %u: starts q %u new %u tile %u pair %u, prefix sums are %llu %llu %llu %llu", i, e->q_start,
                e->new_start, e->tile_start, e->pair_start, (unsigned long long)q, (unsigned long long)nw,
                (unsigned long long)tiles, (unsigned long long)pairs);
    q += e->q_len;
    nw += e->new_len;
    tiles += (e->q_len + (uint64_t)FATTN__Q_TILE - 1) / FATTN__Q_TILE;
    pairs += (e->q_len + (uint64_t)FATTN__Q_PAIR - 1) / FATTN__Q_PAIR;
    if (i >= n) { /* padding: sees nothing, stores nothing */
      if (e->q_len != t->pad_q_len || e->kv_len || e->new_len || e->num_splits != 1 || e->split_row != UINT32_MAX ||
          e->mask_row != UINT32_MAX)
        FUZZ_FAIL("padding entry %u: q %u kv %u new %u, %u splits from row %u, mask row %u", i, e->q_len, e->kv_len,
                  e->new_len, e->num_splits, e->split_row, e->mask_row);
      continue;
    }
    uint32_t want_q = b->q_lens ? b->q_lens[i] : b->mode == FATTN_MODE_TARGET_VERIFY ? nd : 1;
    uint32_t want_kv = b->kv_lens ? b->kv_lens[i] : p->seqs[b->seq_ids[i]].len;
    uint32_t want_nw = b->mode != FATTN_MODE_CROSS ? want_q : b->kv_new_lens ? b->kv_new_lens[i] : 0;
    if (e->seq != b->seq_ids[i] || e->q_len != want_q || e->kv_len != want_kv || e->new_len != want_nw)
      FUZZ_FAIL("entry %u: seq %u q %u kv %u new %u, batch gives %u %u %u %u", i, e->seq, e->q_len, e->kv_len,
                e->new_len, b->seq_ids[i], want_q, want_kv, want_nw);
    if (e->mask_row != (b->tree_mask ? i * nd : UINT32_MAX))
      FUZZ_FAIL("entry %u: mask_row %u", i, e->mask_row);
    if (e->num_splits == 0) FUZZ_FAIL("entry %u: no split", i);
    if (e->num_splits > 1) {
      uint64_t cover = (uint64_t)e->num_splits * e->split_len;
      if (e->split_len % FATTN__SPLIT_ALIGN_SHORT || cover < e->kv_len || cover - e->split_len >= e->kv_len ||
          e->num_splits > h->max_splits || e->split_row != rows)
        FUZZ_FAIL("entry %u: %u splits of %u slots from row %u over kv_len %u (max %u, row %llu)", i, e->num_splits,
                  e->split_len, e->split_row, e->kv_len, h->max_splits, (unsigned long long)rows);
      rows += (uint64_t)e->num_splits * e->q_len;
    } else if (e->split_len != e->kv_len || e->split_row != UINT32_MAX) {
      FUZZ_FAIL("entry %u: one split of %u slots, row %u, over kv_len %u", i, e->split_len, e->split_row, e->kv_len);
    }
  }
  if (s->cap_new_tokens != nw || h->num_new_tokens != nw)
    FUZZ_FAIL("step: %u / %u new tokens, entries add up to %llu", s->cap_new_tokens, h->num_new_tokens, (unsigned long long)nw);
  /* the kernels size their grids by the tile count: it must cover every query token */
  if (s->cap_tiles != tiles || h->num_tiles != tiles)
    FUZZ_FAIL("step: %u / %u query tiles, %llu query tokens need %llu", s->cap_tiles, h->num_tiles,
              (unsigned long long)q, (unsigned long long)tiles);
  if (h->num_pairs != pairs)
    FUZZ_FAIL("step: %u tile pairs, entries add up to %llu", h->num_pairs, (unsigned long long)pairs);
  if (h->num_split_rows != rows || rows > ctx->lay.split_rows_cap)
    FUZZ_FAIL("step: %u split rows, entries use %llu of %u", h->num_split_rows, (unsigned long long)rows,
              ctx->lay.split_rows_cap);
  uint32_t mask_rows = b->tree_mask ? b->num_seqs * nd : 0;
  if (h->num_mask_rows != mask_rows || (mask_rows && memcmp(s->mask, b->tree_mask, (size_t)mask_rows * 8) != 0))
    FUZZ_FAIL("step: %u mask rows differ from the batch's %u", h->num_mask_rows, mask_rows);
  if (p->num_dirty || p->num_copies)
    FUZZ_FAIL("after fattn_plan: %u rows and %u copies unshipped", p->num_dirty, p->num_copies);
  const uint32_t *dev = (const uint32_t *)(ctx->dev + ctx->lay.dev_off[FATTN_REGION_PAGE_TABLE]);
  if (memcmp(dev, p->table, (size_t)p->max_seqs * p->pages_per_seq * 4) != 0)
    FUZZ_FAIL("after fattn_plan: the device page table differs from the host mirror");
}

/* A graph bucket's area of the batch's mode that holds it, when `into` asks for one and there
 * is one; else the eager inbox. fattn_graph_launch takes the smallest; any larger one is as
 * valid a target for the planner and pads more. */
static fattn__plan_target target_for(const fattn_batch *b, uint8_t into) {
  const fattn__plan_target eager = {NULL, 0, 0, NULL};
  const fattn__norm *nm = &ctx->n;
  const uint32_t nd = nm->cfg.spec_draft_tokens;
  if (!(into & 1) || b->mode < FATTN_MODE_PREFILL || b->mode > FATTN_MODE_COUNT ||
      !(nm->cfg.graph_modes & (1u << b->mode)) || b->num_seqs == 0)
    return eager;
  uint32_t k = 0;
  while (k < nm->num_buckets && nm->buckets[k] < b->num_seqs) k++;
  if (k < nm->num_buckets) {
    k += (uint32_t)(into >> 1) % (nm->num_buckets - k);
    const fattn__graph_slot *g = &ctx->graphs[(size_t)b->mode * nm->num_buckets + k];
    const uint32_t per = b->mode == FATTN_MODE_DRAFT_DECODE ? nm->cfg.spec_topk : 1;
    const uint32_t q = b->mode == FATTN_MODE_TARGET_VERIFY ? nd : b->mode == FATTN_MODE_DRAFT_EXTEND ? nd + 1 : 1;
    return (fattn__plan_target){g->area, g->requests * per, q, g->box};
  }
  return eager;
}

static void plan_op(fuzz_bytes *in) {
  batch_buf bb;
  build(in, &bb);
  const fattn_batch init = FATTN_BATCH_INIT;
  fattn_batch seen; /* the batch as the library reads it */
  const int readable = fuzz_as_read(&seen, &bb.b, &init, sizeof seen, offsetof(fattn_batch, mode) + sizeof seen.mode);
  const fattn__plan_target t = target_for(&seen, fuzz_u8(in));
  uint32_t n = 0;
  uint64_t q_total = 0;
  fattn_status want = readable ? predict(&seen, &n, &q_total) : FATTN_ERR_INVALID;
  size_t bytes;
  uint8_t *before = fuzz_pages_snapshot(&ctx->pages, &bytes);
  const fattn__step step_before = ctx->step;
  const uint64_t planned_before = ctx->steps_planned;
  fattn_status got = t.dst ? fattn__plan_into(ctx, &bb.b, NULL, &t) : fattn_plan(ctx, &bb.b, NULL);
  if (!fuzz_known_status(got)) FUZZ_FAIL("fattn_plan: status %d is not a fattn_status", got);
  if ((got == FATTN_OK) != (want == FATTN_OK) || (got != FATTN_OK && got != want))
    FUZZ_FAIL("fattn_plan (mode %d, %u seqs%s) returned %s, the rules give %s (detail: %s)", bb.b.mode,
              bb.b.num_seqs, t.dst ? ", into a bucket" : "", fattn_status_name(got), fattn_status_name(want),
              fattn_detail(ctx));
  if (fattn_check(ctx) != FATTN_OK) FUZZ_FAIL("after fattn_plan: fattn_check: %s", fattn_detail(ctx));
  if (got == FATTN_OK) {
    free(before);
    check_step(&seen, n, q_total, &t);
    return;
  }
  fuzz_expect_detail(fattn_detail(ctx), FATTN__DETAIL_LEN, "fattn_plan");
  fuzz_expect_unchanged(&ctx->pages, before, bytes, "fattn_plan", got);
  const fattn__step *now = &ctx->step;
  if (now->planned != step_before.planned || now->mode != step_before.mode ||
      now->cap_entries != step_before.cap_entries || now->cap_q_tokens != step_before.cap_q_tokens ||
      now->cap_new_tokens != step_before.cap_new_tokens || now->cap_tiles != step_before.cap_tiles ||
      now->hdr != step_before.hdr || now->entries != step_before.entries || now->mask != step_before.mask ||
      planned_before != ctx->steps_planned)
    FUZZ_FAIL("rejected fattn_plan changed the planned step");
}

/* Values fp8 e4m3 holds exactly (k_scale 1): bf16 bits and the byte they store as. A new
 * token's row spells its index in these, 3 bits an element, so a pool row names its writer. */
static const uint16_t exact_bf16[8] = {0x3f80, 0x4000, 0x3f00, 0x3fc0, 0xbf80, 0xc000, 0xbf00, 0x3e80};
static const uint8_t exact_e4m3[8] = {0x38, 0x40, 0x30, 0x3c, 0xb8, 0xc0, 0xb0, 0x28};
static uint32_t spelled(uint32_t token, uint32_t c, int is_v) {
  uint32_t tag = is_v ? ~token : token;
  return (tag >> (3 * (c % 11))) & 7u;
}

static int finite_bf16(uint16_t bits) { return (bits & 0x7f80) != 0x7f80; }

/* fattn_store_kv / fattn_attend on whatever step is planned: none yet, a rejected plan's
 * predecessor, or one whose sequences changed since (the device table keeps the planned
 * pages until the next plan). A rejected call touches no pool; a store writes, for each
 * entry's new token, exactly its spelled row into the slot the planned table names. */
static void step_op(fuzz_bytes *in) {
  const uint8_t how = fuzz_u8(in);
  const uint32_t layer = how & 0x40 ? (how & 0x20 ? UINT32_MAX : 1u + fuzz_u8(in)) : 0u;
  const fattn__step *st = &ctx->step;
  fattn__layer_params l = fattn__layer_params_for(ctx, 0);
  const size_t pool_bytes = (size_t)l.num_pages * l.page_size * HEAD_DIM; /* one kv head, fp8 */
  const uint32_t new_tokens = st->planned ? st->hdr->num_new_tokens : 0;
  const uint32_t q_tokens = st->planned ? st->hdr->num_q_tokens : 0;
  const int attend = how & 1, null_arg = (how & 0x1e) == 0x1e;
  /* the CPU oracle's cost grows with q tokens x kv slots: big CROSS steps are only rejected */
  const int runnable = !null_arg && q_tokens <= 4096;
  fattn_status want = !st->planned ? FATTN_ERR_STATE
                      : layer != 0 ? FATTN_ERR_INVALID
                      : attend     ? (!runnable ? FATTN_ERR_INVALID : FATTN_OK)
                                   : (null_arg && new_tokens ? FATTN_ERR_INVALID : FATTN_OK);
  uint8_t *pools = malloc(2 * pool_bytes);
  const uint32_t out_rows = attend && runnable ? q_tokens : 0;
  size_t in_rows = (attend ? out_rows : new_tokens) + 1, out_elems = (size_t)out_rows * HEAD_DIM + 64;
  uint16_t *k = malloc(in_rows * HEAD_DIM * 2), *v = malloc(in_rows * HEAD_DIM * 2), *out = malloc(out_elems * 2);
  float *lse = malloc(((size_t)out_rows + 16) * 4);
  if (!pools || !k || !v || !out || !lse) FUZZ_FAIL("step_op: out of host memory");
  memcpy(pools, l.k_pool, pool_bytes);
  memcpy(pools + pool_bytes, l.v_pool, pool_bytes);
  for (size_t t = 0; t < in_rows; t++)
    for (uint32_t c = 0; c < HEAD_DIM; c++) {
      k[t * HEAD_DIM + c] = exact_bf16[spelled((uint32_t)t, c, 0)];
      v[t * HEAD_DIM + c] = exact_bf16[spelled((uint32_t)t, c, 1)];
    }
  memset(out, 0xff, out_elems * 2); /* NaN everywhere: attend must overwrite its rows, only those */
  memset(lse, 0xff, ((size_t)out_rows + 16) * 4);
  const void *q = runnable ? k : NULL; /* the spelled rows serve as queries too */
  fattn_status got = attend ? fattn_attend(ctx, layer, q, out, how & 0x80 ? lse : NULL, NULL)
                            : fattn_store_kv(ctx, layer, null_arg ? NULL : k, null_arg ? NULL : v, NULL);
  const char *call = attend ? "fattn_attend" : "fattn_store_kv";
  if (got != want)
    FUZZ_FAIL("%s (layer %u, %s) returned %s, the rules give %s (detail: %s)", call, layer,
              st->planned ? "planned" : "nothing planned", fattn_status_name(got), fattn_status_name(want),
              fattn_detail(ctx));
  if (got != FATTN_OK) fuzz_expect_detail(fattn_detail(ctx), FATTN__DETAIL_LEN, call);
  /* Every pool row the call may write, then every row compared with what it should hold. */
  uint8_t *expect_k = pools, *expect_v = pools + pool_bytes;
  for (uint32_t i = 0; got == FATTN_OK && !attend && i < st->hdr->num_entries; i++) {
    const fattn__entry *e = &st->entries[i];
    for (uint32_t r = 0; r < e->new_len; r++) {
      uint32_t slot = e->kv_len - e->new_len + r, t = e->new_start + r;
      uint32_t page = (uint32_t)l.page_table[(size_t)e->seq * l.pages_per_seq + slot / l.page_size];
      if (page >= l.num_pages)
        FUZZ_FAIL("entry %u: new slot %u of sequence %u has no page in the planned table", i, slot, e->seq);
      size_t row = ((size_t)page * l.page_size + slot % l.page_size) * HEAD_DIM;
      for (uint32_t c = 0; c < HEAD_DIM; c++) {
        expect_k[row + c] = exact_e4m3[spelled(t, c, 0)];
        expect_v[row + c] = exact_e4m3[spelled(t, c, 1)];
      }
    }
  }
  for (size_t b = 0; b < pool_bytes; b++)
    if (((const uint8_t *)l.k_pool)[b] != expect_k[b] || ((const uint8_t *)l.v_pool)[b] != expect_v[b])
      FUZZ_FAIL("after %s (%s): pool byte %zu (page %zu slot %zu) is %02x / %02x, should be %02x / %02x", call,
                fattn_status_name(got), b, b / HEAD_DIM / l.page_size, b / HEAD_DIM % l.page_size,
                ((const uint8_t *)l.k_pool)[b], ((const uint8_t *)l.v_pool)[b], expect_k[b], expect_v[b]);
  if (got == FATTN_OK && attend) {
    for (size_t i = 0; i < out_elems; i++) /* finite inputs, finite rows; the tail untouched */
      if (i < (size_t)q_tokens * HEAD_DIM ? !finite_bf16(out[i]) : out[i] != 0xffff)
        FUZZ_FAIL("fattn_attend: out[%zu] = %04x (%u query tokens)", i, out[i], q_tokens);
    for (size_t i = 0; (how & 0x80) && i < (size_t)q_tokens + 16; i++)
      if (i < q_tokens ? isnan(lse[i]) : !isnan(lse[i]))
        FUZZ_FAIL("fattn_attend: lse[%zu] = %g (%u query tokens)", i, (double)lse[i], q_tokens);
  }
  free(pools), free(k), free(v), free(out), free(lse);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fuzz_bytes in = {data, size, 0};
  ctx = create(&in);
  for (int n = 0; n < MAX_OPS && !fuzz_done(&in); n++) {
    uint8_t op = fuzz_u8(&in);
    if (op < 0x80) allocator_op(&in, op);
    else if (op < 0xe0) plan_op(&in);
    else step_op(&in);
  }
  ctx = NULL;
  return 0;
}
