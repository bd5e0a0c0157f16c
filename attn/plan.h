/* plan.h: the planner's internal face for graph/ (plan into a bucket's static metadata).
 * fattn_plan itself is public; this adds where the derived metadata lands. */
#ifndef FATTN_ATTN_PLAN_H
#define FATTN_ATTN_PLAN_H

#include "lib/internal.h"

/* Where prep writes the step's header, entries and mask rows: the eager inbox (dst NULL)
 * or a graph bucket's static area of at most cap_entries entries. */
typedef struct fattn__plan_target {
  uint8_t *dst;          /* device area laid out as [hdr][entries][mask rows], or NULL */
  uint32_t cap_entries;  /* entries the area holds (0: the eager inbox's max); a graph's
                            batch is padded to it with entries that see nothing */
  uint32_t pad_q_len;    /* query tokens of a padding entry (its rows come out as zeros) */
  fattn__mailbox *box;   /* a graph's mailbox: the slot is posted there, prep runs in the graph */
} fattn__plan_target;

/* Points the step at a metadata area of cap_entries entries, with the bounds that size the
 * kernels' grids: what store_kv and attend use next (also under graph capture). */
void fattn__step_bind(fattn_ctx *ctx, fattn_mode mode, uint8_t *area, uint32_t cap_entries, uint32_t entries,
                      uint32_t q_tokens, uint32_t new_tokens, uint32_t tiles);

/* The caller's batch (any version) in this library's layout at *out: user itself, or local
 * holding it with the defaults of the fields it lacks. NULL or a bad struct_size fails. */
fattn_status fattn__batch_in(fattn_ctx *ctx, const fattn_batch *user, fattn_batch *local, const fattn_batch **out);

fattn_status fattn__plan_into(fattn_ctx *ctx, const fattn_batch *batch, void *stream,
                              const fattn__plan_target *target);

/* attn/prep.cu: reads staging slot `index` (host pointer `slot`, num_words payload words) in
 * place, applies its updates and copies, derives the metadata into the target, then stores
 * `seq` into the slot's completion word. A prep that fails to launch frees the slot itself. */
int fattn__prep_launch(fattn_ctx *ctx, const uint8_t *slot, uint32_t index, uint64_t seq, uint32_t num_words,
                       const fattn__plan_target *target, void *stream);
/* The prep node of a graph (captured into stream): the same work, for whichever slot the
 * target's mailbox names when the graph replays. Page copies never go this way. */
int fattn__prep_launch_boxed(fattn_ctx *ctx, const fattn__plan_target *target, void *stream);
/* The same work on the host, for the CPU backend. */
void fattn__prep_host(fattn_ctx *ctx, uint8_t *inbox, const fattn__plan_target *target);

#endif /* FATTN_ATTN_PLAN_H */
