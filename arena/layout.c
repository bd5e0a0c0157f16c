/* layout.c: the memory plan. A pure function of config and model that places every region
 * of the device allocation and the pinned slab, with overflow-checked size arithmetic. */
#include <stdio.h>
#include <string.h>

#include "lib/internal.h"

/* Each overflow names the fields whose product overflows, with their values. */
#define OVERFLOW(...) fattn__failbuf(detail, detail_len, FATTN_ERR_OVERFLOW, __VA_ARGS__)

/* a * b * c * d, or 0 with *ok cleared on overflow. */
static uint64_t mul4(uint64_t a, uint64_t b, uint64_t c, uint64_t d, int *ok) {
  uint64_t r;
  if (__builtin_mul_overflow(a, b, &r) || __builtin_mul_overflow(r, c, &r) ||
      __builtin_mul_overflow(r, d, &r)) {
    *ok = 0;
    return 0;
  }
  return r;
}

static uint64_t add(uint64_t a, uint64_t b, int *ok) {
  uint64_t r;
  if (__builtin_add_overflow(a, b, &r)) *ok = 0;
  return r;
}

/* Bytes of one staged slot and its sub-offsets. */
static uint64_t slot_layout(const fattn__norm *n, fattn__layout *lay) {
  /* The first part is an area of max_entries entries, so prep derives in place. */
  uint64_t o = fattn__align_up(fattn__area_mask_off(n->max_entries) + (uint64_t)n->max_mask_rows * sizeof(uint64_t), 16);
  lay->slot_off_updates = o;
  o = fattn__align_up(o + (uint64_t)lay->cap_updates * sizeof(fattn__pt_update), 16);
  lay->slot_off_copies = o;
  o = fattn__align_up(o + (uint64_t)lay->cap_copies * sizeof(fattn__page_copy), 16);
  lay->slot_off_row_ops = o;
  o = fattn__align_up(o + ((uint64_t)lay->cap_row_copies + lay->cap_updates) * sizeof(fattn__row_op), 16);
  lay->slot_off_words = o;
  o = fattn__align_up(o + (uint64_t)lay->cap_words * sizeof(uint32_t), FATTN__ALIGN);
  return o;
}

uint64_t fattn__graph_area_bytes(const fattn__norm *n, fattn_mode mode, uint32_t b) {
  uint32_t per = mode == FATTN_MODE_DRAFT_DECODE ? n->cfg.spec_topk : 1;
  uint32_t rows = (mode == FATTN_MODE_TARGET_VERIFY && n->cfg.spec_topk > 1) ? n->cfg.spec_draft_tokens : 0;
  return fattn__align_up(fattn__area_mask_off(b * per) + (uint64_t)b * rows * sizeof(uint64_t), FATTN__ALIGN);
}

/* Host tables served by the heap: count and payload, for its size. */
static void heap_tables(const fattn__norm *n, const fattn__layout *lay, uint64_t *bytes,
                        uint32_t *count) {
  const uint64_t np = lay->num_pages, ms = n->max_seqs;
  const uint64_t parts[] = {
      np * 4,                                   /* free stack */
      np * 4,                                   /* refcounts */
      np * 4,                                   /* check scratch */
      ms * lay->pages_per_seq * 4,              /* page-table mirror */
      ms * sizeof(fattn__seq),                  /* sequences */
      ms * 4,                                   /* closed ids */
      ms * 4,                                   /* dirty rows */
      (uint64_t)lay->cap_copies * sizeof(fattn__page_copy),
      (uint64_t)lay->cap_row_copies * sizeof(fattn__row_op),
      (uint64_t)n->model.num_layers * sizeof(fattn_layer_opts),
      (uint64_t)n->staging_slots * sizeof(uint64_t), /* staging completion words */
      (uint64_t)(FATTN_MODE_COUNT + 1) * n->num_buckets * sizeof(fattn__graph_slot),
      (uint64_t)(FATTN_MODE_COUNT + 1) * n->num_buckets * sizeof(fattn__mailbox), /* graph mailboxes */
      (uint64_t)n->model.num_layers * FATTN__TMAP_BYTES + FATTN__TMAP_ALIGN, /* fa3 tensor maps */
  };
  *bytes = 0;
  for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++) *bytes += parts[i];
  *count = (uint32_t)(sizeof parts / sizeof parts[0]);
}

fattn_status fattn__layout_compute(const fattn__norm *n, fattn__layout *lay,
                                   fattn_memory_report *r, char *detail, size_t detail_len) {
  const fattn_config *c = &n->cfg;
  const fattn_model *m = &n->model;
  int ok = 1;
  memset(lay, 0, sizeof *lay);
  memset(r, 0, sizeof *r);
  r->struct_size = sizeof *r;

  const int mla = m->mla_latent_dim != 0;
  uint64_t k_row = (uint64_t)m->num_kv_heads * m->head_dim * n->kv_elem_bytes;
  uint64_t v_row = mla ? 0 : (uint64_t)m->num_kv_heads * n->head_dim_v * n->kv_elem_bytes;
  uint64_t page_bytes = mul4(m->num_layers, c->page_size, k_row + v_row, 1, &ok);
  if (!ok)
    return OVERFLOW("num_layers %u x page_size %u x %llu bytes a token: one page's size overflows 64 bits",
                    m->num_layers, c->page_size, (unsigned long long)(k_row + v_row));
  uint64_t pages = c->kv_budget_pages ? c->kv_budget_pages : c->kv_budget_bytes / page_bytes;
  uint64_t pps = ((uint64_t)c->max_seq_len + c->page_size - 1) / c->page_size;
  if (pages < pps)
    return fattn__failbuf(detail, detail_len, FATTN_ERR_INVALID,
                          "KV budget of %llu pages (%llu bytes, %llu bytes a page): smaller than one "
                          "max_seq_len %u sequence (%llu pages)",
                          (unsigned long long)pages, (unsigned long long)c->kv_budget_bytes,
                          (unsigned long long)page_bytes, c->max_seq_len, (unsigned long long)pps);
  if (pages >= FATTN__PAGE_NONE)
    return fattn__failbuf(detail, detail_len, FATTN_ERR_OVERFLOW,
                          "KV budget of %llu pages: page ids are 32-bit", (unsigned long long)pages);
  lay->num_pages = (uint32_t)pages;
  lay->pages_per_seq = (uint32_t)pps;
  lay->split_rows_cap = n->max_splits * FATTN__SPLIT_ROWS_PER_SPLIT;
  lay->cap_updates = n->max_seqs;
  lay->cap_copies = n->max_seqs;
  lay->cap_row_copies = n->max_seqs;
  /* Room for two full rows a slot, within [4 Ki, 1 Mi] words: larger bursts take more slots. */
  uint64_t words = pps * 2 > (uint64_t)n->max_seqs * 2 ? pps * 2 : (uint64_t)n->max_seqs * 2;
  lay->cap_words = (uint32_t)(words < 4096 ? 4096 : words > (1u << 20) ? (1u << 20) : words);
  lay->slot_bytes = slot_layout(n, lay);

  lay->k_page_bytes = (uint64_t)c->page_size * k_row;
  lay->v_page_bytes = (uint64_t)c->page_size * v_row;
  /* The pools, and the device allocation they dominate, overflow only with the KV budget. */
  lay->k_layer_bytes = fattn__align_up(mul4(pages, lay->k_page_bytes, 1, 1, &ok), FATTN__ALIGN);
  lay->v_layer_bytes = fattn__align_up(mul4(pages, lay->v_page_bytes, 1, 1, &ok), FATTN__ALIGN);
  uint64_t *rb = r->region_bytes;
  rb[FATTN_REGION_K_POOL] = mul4(lay->k_layer_bytes, m->num_layers, 1, 1, &ok);
  rb[FATTN_REGION_V_POOL] = mul4(lay->v_layer_bytes, m->num_layers, 1, 1, &ok);
  add(rb[FATTN_REGION_K_POOL], rb[FATTN_REGION_V_POOL], &ok);
  char budget[64];
  if (c->kv_budget_pages) snprintf(budget, sizeof budget, "kv_budget_pages %u", c->kv_budget_pages);
  else
    snprintf(budget, sizeof budget, "kv_budget_bytes %llu (%llu pages)", (unsigned long long)c->kv_budget_bytes,
             (unsigned long long)pages);
  if (!ok)
    return OVERFLOW("%s x page_bytes %llu: the K and V pools overflow 64 bits", budget,
                    (unsigned long long)page_bytes);
  rb[FATTN_REGION_PAGE_TABLE] = fattn__align_up(mul4(n->max_seqs, pps, 4, 1, &ok), FATTN__ALIGN);
  if (!ok)
    return OVERFLOW("max_seqs %u x max_seq_len %u / page_size %u: the page table overflows 64 bits", n->max_seqs,
                    c->max_seq_len, c->page_size);
  rb[FATTN_REGION_METADATA] = lay->slot_bytes;
  /* partial O and LSE of every split row, then fa3's two tile-scheduler words */
  rb[FATTN_REGION_SPLIT_WORKSPACE] = fattn__align_up(
      mul4(lay->split_rows_cap, m->num_q_heads, (uint64_t)n->head_dim_v + 1, 4, &ok) + 8u, FATTN__ALIGN);
  if (!ok)
    return OVERFLOW("max_splits %u x num_q_heads %u x head_dim_v %u: the split workspace overflows 64 bits",
                    n->max_splits, m->num_q_heads, n->head_dim_v);
  for (uint32_t mode = 1; mode <= FATTN_MODE_COUNT; mode++) {
    if (!(c->graph_modes & (1u << mode))) continue;
    uint64_t sum = 0;
    for (uint32_t b = 0; b < n->num_buckets; b++) sum += fattn__graph_area_bytes(n, (fattn_mode)mode, n->buckets[b]);
    r->graph_bytes_per_mode[mode] = sum;
    rb[FATTN_REGION_GRAPH_STATIC] += sum;
  }
  rb[FATTN_REGION_MODEL] = fattn__align_up((uint64_t)m->num_layers * m->num_q_heads * 4, FATTN__ALIGN);

  uint64_t off = 0;
  for (int i = 0; i < FATTN_REGION_PINNED_STAGING; i++) {
    lay->dev_off[i] = off;
    off = add(off, rb[i], &ok);
  }
  if (!ok)
    return OVERFLOW("%s x page_bytes %llu: the device allocation (the pools and the other regions) overflows 64 "
                    "bits", budget, (unsigned long long)page_bytes);
  r->device_bytes = off;

  uint64_t heap_payload;
  uint32_t heap_count;
  heap_tables(n, lay, &heap_payload, &heap_count);
  lay->pin_off_ring = fattn__align_up(sizeof(fattn_ctx), 4096);
  lay->pin_off_heap = fattn__align_up(
      add(lay->pin_off_ring, mul4(n->staging_slots, lay->slot_bytes, 1, 1, &ok), &ok), 4096);
  lay->heap_bytes = fattn__heap_overhead(heap_payload, heap_count);
  rb[FATTN_REGION_PINNED_STAGING] = add(lay->pin_off_heap, lay->heap_bytes, &ok);
  r->pinned_bytes = rb[FATTN_REGION_PINNED_STAGING];
  if (!ok)
    return OVERFLOW("staging_slots %u x %llu bytes a slot: the pinned slab overflows 64 bits", n->staging_slots,
                    (unsigned long long)lay->slot_bytes);
  r->num_pages = lay->num_pages;
  r->pages_per_seq = lay->pages_per_seq;
  r->page_bytes = page_bytes;
  return FATTN_OK;
}

fattn_status fattn_memory_plan(const fattn_config *cfg, const fattn_model *model,
                               fattn_memory_report *report, char *detail, size_t detail_len) {
  if (detail && detail_len) detail[0] = '\0';
  if (!report)
    return fattn__failbuf(detail, detail_len, FATTN_ERR_INVALID, "report must not be NULL");
  fattn_status st = fattn__abi_check(&fattn__abi_report, report, detail, detail_len);
  if (st) return st;
  fattn__norm n;
  fattn__layout lay;
  if ((st = fattn__normalize(cfg, model, &n, detail, detail_len))) return st;
  fattn_memory_report r = FATTN_MEMORY_REPORT_INIT;
  st = fattn__layout_compute(&n, &lay, &r, detail, detail_len);
  if (st == FATTN_OK) fattn__abi_write(&fattn__abi_report, report, &r); /* the caller's struct_size bytes */
  return st;
}
