/* prep.c: the planner's device-side work done on the host for the CPU backend: apply the
 * staged row copies, page-table updates, fills and copy-on-write copies, then derive the step metadata. */
#include <string.h>

#include "attn/plan.h"

/* One page of one pool: [page_size, kv_heads, d] elements. */
static void copy_pages(fattn_ctx *ctx, const fattn__page_copy *c, uint32_t n) {
  const uint64_t k_page = ctx->lay.k_page_bytes, v_page = ctx->lay.v_page_bytes;
  for (uint32_t l = 0; l < ctx->n.model.num_layers; l++) {
    uint8_t *k = ctx->dev + ctx->lay.dev_off[FATTN_REGION_K_POOL] + l * ctx->lay.k_layer_bytes;
    uint8_t *v = ctx->dev + ctx->lay.dev_off[FATTN_REGION_V_POOL] + l * ctx->lay.v_layer_bytes;
    for (uint32_t i = 0; i < n; i++) {
      memcpy(k + c[i].dst * k_page, k + c[i].src * k_page, k_page);
      if (v_page) memcpy(v + c[i].dst * v_page, v + c[i].src * v_page, v_page);
    }
  }
}

void fattn__prep_host(fattn_ctx *ctx, uint8_t *inbox, const fattn__plan_target *t) {
  fattn__step_hdr *h = (fattn__step_hdr *)inbox;
  const fattn__pt_update *up = (const fattn__pt_update *)(inbox + ctx->lay.slot_off_updates);
  const uint32_t *words = (const uint32_t *)(inbox + ctx->lay.slot_off_words);
  const fattn__row_op *ops = (const fattn__row_op *)(inbox + ctx->lay.slot_off_row_ops);
  uint32_t *table = (uint32_t *)(ctx->dev + ctx->lay.dev_off[FATTN_REGION_PAGE_TABLE]);
  const size_t pps = ctx->lay.pages_per_seq;
  for (uint32_t i = 0; i < h->num_row_copies; i++) /* no copy's source is another's destination */
    memcpy(table + ops[i].dst * pps, table + ops[i].src * pps, (size_t)ops[i].count * 4);
  for (uint32_t i = 0; i < h->num_pt_updates; i++)
    memcpy(table + up[i].row * pps + up[i].index, words + up[i].payload, (size_t)up[i].count * 4);
  for (uint32_t i = h->num_row_copies; i < h->num_row_copies + h->num_row_fills; i++)
    memset(table + ops[i].dst * pps + ops[i].index, 0xff, (size_t)ops[i].count * 4); /* FATTN__PAGE_NONE */
  copy_pages(ctx, (const fattn__page_copy *)(inbox + ctx->lay.slot_off_copies), h->num_page_copies);
  fattn__entry *e = (fattn__entry *)(inbox + fattn__area_entries_off());
  /* Expanded in place from the last: entry i's 48 bytes cover only staged words past i. */
  for (uint32_t i = h->num_entries; i-- > 0;) {
    fattn__staged st;
    memcpy(&st, inbox + fattn__area_entries_off() + (size_t)i * sizeof st, sizeof st);
    fattn__unstage(h, &st, i, &e[i]);
  }
  fattn__prep(h, e);
  if (!t->dst) return;
  memcpy(t->dst, h, sizeof *h);
  memcpy(t->dst + fattn__area_entries_off(), e, (size_t)h->num_entries * sizeof *e);
  memcpy(t->dst + fattn__area_mask_off(t->cap_entries), inbox + fattn__area_mask_off(ctx->n.max_entries),
         (size_t)h->num_mask_rows * 8);
}
