/* meta.h: the per-step metadata that the planner ships and every backend reads.
 * Plain C shared by host code and CUDA (FATTN__HD); one prep routine for both sides. */
#ifndef FATTN_ATTN_META_H
#define FATTN_ATTN_META_H

#include <stdint.h>

#include "fattn.h" /* fattn_mode and fattn_dtype, by name on both sides */

#ifdef __CUDACC__
#define FATTN__HD __host__ __device__ __forceinline__
#else
#define FATTN__HD static inline
#endif

/* Page-table entry for a slot no page backs: out of range on purpose, so that a kernel
 * that reads past a sequence faults under memcheck instead of reading stale KV. */
#define FATTN__PAGE_NONE 0xFFFFFFFFu
/* Query tile the prep routine counts tiles in (kernels may use multiples of it). */
#define FATTN__Q_TILE 64u
/* Two query tiles: the Hopper kernels' work unit, counted apart so that their claims need no
 * skipping of odd tiles. */
#define FATTN__Q_PAIR (2u * FATTN__Q_TILE)
/* A split covers a multiple of this many KV slots (a multiple of the decode tile's 64). */
#define FATTN__SPLIT_ALIGN 128u
/* Split rows available per allowed split (workspace size = max_splits * this). */
#define FATTN__SPLIT_ROWS_PER_SPLIT 64u
/* A split-KV entry gets at most one split per this many KV slots. Overridable at build time
 * (host and CUDA flags alike) so that benchmark variants can compare policies. */
#ifndef FATTN__SPLIT_MIN_KV
#define FATTN__SPLIT_MIN_KV 128u
#endif
/* The minimum and the alignment for a step so small that splits of FATTN__SPLIT_MIN_KV would
 * leave SMs without a block: there, one-tile splits shorten the step (docs/performance.md, decode:
 * bs 1 at context 512 0.49 -> 0.39 ms a 32-layer step), while on a full device more and
 * shorter splits cost 28% at bs 16 x 512 and 5% at bs 16 x 1.5k. */
#ifndef FATTN__SPLIT_MIN_KV_SHORT
#define FATTN__SPLIT_MIN_KV_SHORT 48u
#endif
#define FATTN__SPLIT_ALIGN_SHORT 64u
/* Decode blocks the split policy aims for per SM (target_ctas = this * SMs): several waves of
 * the 2-3 resident blocks an SM, so that the last wave's idle share stays small. */
#ifndef FATTN__CTAS_PER_SM
#define FATTN__CTAS_PER_SM 8u
#endif
/* Blocks an SM of fa2's 2-stage decode kinds (FA2_DEC_MINB, FA2_DEC_MINB_F8 default to them),
 * the wave the split rule of one-query decode steps rounds to: fp8 KV's 8-row kind holds 4
 * (fewer registers, half the bytes a slot: +10% at bs 64-128 over 3; docs/performance.md, decode). */
#ifndef FATTN__DECODE_RESIDENT
#define FATTN__DECODE_RESIDENT 3u
#endif
#ifndef FATTN__DECODE_RESIDENT_F8
#define FATTN__DECODE_RESIDENT_F8 4u
#endif
/* The wave rule adds splits only where each stays this long: shorter ones pay more in block
 * starts and the combine than the rounds save (bs 128 and 256 at context 512: 6.5-8% slower
 * steps with splits of 256; docs/performance.md, decode). */
#define FATTN__WAVE_MIN_KV 1024u

/* One entry of a step. The host stages seq..new_len (fattn__staged); prep fills the rest. */
typedef struct fattn__entry {
  uint32_t seq;      /* page-table row */
  uint32_t q_len;    /* query tokens */
  uint32_t kv_len;   /* KV slots attended: [0, kv_len) */
  uint32_t new_len;  /* slots fattn_store_kv writes: [kv_len - new_len, kv_len) */
  uint32_t mask_row; /* first tree-mask row of this entry, or UINT32_MAX (chain / causal) */
  uint32_t q_start;  /* prefix sum of q_len: first query token */
  uint32_t new_start; /* prefix sum of new_len: first row of the new K/V */
  uint32_t tile_start; /* prefix sum of ceil(q_len / FATTN__Q_TILE) */
  uint32_t num_splits; /* split-KV pieces (1: no split) */
  uint32_t split_len;  /* KV slots per split, a multiple of FATTN__SPLIT_ALIGN(_SHORT) */
  uint32_t split_row;  /* first workspace row: row of (token t, split s) = split_row + t * num_splits + s */
  uint32_t pair_start; /* prefix sum of ceil(q_len / FATTN__Q_PAIR): the Hopper kernels' work units */
} fattn__entry;

/* Step header: counts the kernels read on the device (graphs replay with new counts). */
typedef struct fattn__step_hdr {
  uint32_t mode;          /* fattn_mode */
  uint32_t num_entries;
  uint32_t num_q_tokens;  /* filled by prep */
  uint32_t num_new_tokens; /* filled by prep */
  uint32_t num_tiles;     /* filled by prep: total query tiles */
  uint32_t num_split_rows; /* filled by prep */
  uint32_t max_splits;    /* bound fixed at create */
  uint32_t split_rows_cap; /* workspace rows available */
  uint32_t target_ctas;   /* split policy: blocks wanted to fill the device */
  uint32_t decode_groups; /* blocks a decode entry runs a split (fattn__decode_groups) */
  uint32_t causal;        /* 0 for CROSS */
  uint32_t num_pt_updates; /* page-table updates in this slot (see fattn__pt_update) */
  uint32_t num_page_copies; /* copy-on-write copies in this slot */
  uint32_t page_copies_chained; /* a copy reads or writes a page another writes: run them in order */
  uint32_t num_row_copies; /* fork rows copied device-side, before the updates (fattn__row_op) */
  uint32_t num_row_fills;  /* ranges set to FATTN__PAGE_NONE, beside the updates (fattn__row_op) */
  uint32_t num_mask_rows;
  uint32_t num_live;      /* entries before graph padding (0: all); the split policy counts these */
  uint32_t decode_resident; /* blocks an SM of the one-query decode kind (fattn__decode_resident) */
  uint32_t num_pairs;     /* filled by prep: total tile pairs (FATTN__Q_PAIR rows) */
} fattn__step_hdr;

/* An entry as the planner stages it in pinned memory: 16 bytes where the full entry takes 48, so
 * the host writes and the prep kernel reads a third of the bytes (three lines of four). */
typedef struct fattn__staged {
  uint32_t seq, q_len, kv_len, new_len;
} fattn__staged;

/* Entry i from its staged form: live entries i take tree-mask rows i * (rows / live) onward
 * where the step has mask rows; padding entries (i >= num_live) none. */
FATTN__HD void fattn__unstage(const fattn__step_hdr *h, const fattn__staged *s, uint32_t i, fattn__entry *x) {
  const uint32_t live = h->num_live ? h->num_live : h->num_entries;
  const uint32_t per = h->num_mask_rows && live ? h->num_mask_rows / live : 0u;
  x->seq = s->seq;
  x->q_len = s->q_len;
  x->kv_len = s->kv_len;
  x->new_len = s->new_len;
  x->mask_row = per && i < live ? i * per : UINT32_MAX;
  x->q_start = x->new_start = x->tile_start = x->num_splits = x->split_len = x->split_row = x->pair_start = 0u;
}

/* Page-table update: row[index .. index + count) = the next count words of the payload. */
typedef struct fattn__pt_update {
  uint32_t row;
  uint32_t index;
  uint32_t count;
  uint32_t payload; /* offset of the first page id in the slot's payload words */
} fattn__pt_update;

/* Page-table work staged as a range, not as words. A copy (src a row): row dst[0 .. count) gets
 * row src[0 .. count) as the device held it before the slot's updates, so a fork ships O(1)
 * words; copies of a slot run concurrently (no copy's src is another's dst). A fill (src
 * FATTN__PAGE_NONE): row dst[index .. index + count) = FATTN__PAGE_NONE, the entries a truncate
 * or close unmapped; fills and updates of a slot touch disjoint entries. */
typedef struct fattn__row_op {
  uint32_t dst;
  uint32_t src;
  uint32_t index;
  uint32_t count;
} fattn__row_op;

/* Copy-on-write: page dst gets page src's contents (every layer, K and V). */
typedef struct fattn__page_copy {
  uint32_t src;
  uint32_t dst;
} fattn__page_copy;

/* Whether fa2's decode kinds run 8-row tiles with the products transposed for entries of
 * `rows` packed rows (q heads a kv head times queries an entry). */
FATTN__HD int fattn__narrow_tiles(uint32_t rows, uint32_t head_dim) { return rows <= 8u && head_dim <= 128u; }

/* Blocks an SM of the kind that runs one-query decode steps of a layer shape: fa2's 8-row tiles
 * at fp8 KV, or any other 2-stage kind (group: q heads a kv head). */
FATTN__HD uint32_t fattn__decode_resident(int kv_fp8, uint32_t head_dim, uint32_t group) {
  return kv_fp8 && fattn__narrow_tiles(group, head_dim) ? FATTN__DECODE_RESIDENT_F8 : FATTN__DECODE_RESIDENT;
}

/* Never overflows: q_len may come close to UINT32_MAX in a rejected batch's arithmetic. */
FATTN__HD uint32_t fattn__ceil_div(uint32_t a, uint32_t b) { return a / b + (a % b != 0u); }

/* The MLA kernel (attn/fa2/fa2_mla.cu): the packed (query, head) rows one block takes. 32 where
 * there are more than 16 heads, so that each latent row a block loads feeds 32 heads (the most
 * that four warps' O slices of 128 dims hold under 128 registers); 16 below, where a 32-row
 * tile would be mostly padding. */
FATTN__HD uint32_t fattn__mla_rows(uint32_t q_heads) { return q_heads <= 16u ? 16u : 32u; }
/* Blocks an SM of the MLA decode kernel where its shared memory allows two (sm_90: 2 x 111 KiB;
 * sm_80 holds one), the wave of the split rule for MLA layers. */
#ifndef FATTN__DECODE_RESIDENT_MLA
#define FATTN__DECODE_RESIDENT_MLA 2u
#endif
/* Blocks a decode entry runs for each of its splits, the unit of the split policy: one a kv head,
 * or one a group of fattn__mla_rows q heads for MLA (one latent head shared by every q head). */
FATTN__HD uint32_t fattn__decode_groups(int mla, uint32_t q_heads, uint32_t kv_heads) {
  return mla ? fattn__ceil_div(q_heads, fattn__mla_rows(q_heads)) : kv_heads;
}

/* Of 1..hi splits of each of per_entry (entry, decode group) pairs, the count whose blocks take the
 * fewest rounds of `wave` resident blocks per split (rounds / splits least; ties to fewer
 * splits, which save the combine): ceil(n * per_entry / wave) rounds of kv_len / n slots. */
FATTN__HD uint32_t fattn__wave_splits(uint32_t per_entry, uint32_t wave, uint32_t hi) {
  uint32_t best = 1u;
  uint64_t best_rounds = fattn__ceil_div(per_entry, wave), blocks = per_entry, rounds = best_rounds;
  for (uint32_t n = 2u; n <= hi; n++) {
    blocks += per_entry;
    while (rounds * wave < blocks) rounds++;
    if (rounds * best < best_rounds * n) { best = n; best_rounds = rounds; }
  }
  return best;
}

/* The modes whose steps may split their KV: the decode-like ones. */
FATTN__HD int fattn__mode_splits(uint32_t mode) {
  return mode == FATTN_MODE_DECODE || mode == FATTN_MODE_TARGET_VERIFY || mode == FATTN_MODE_DRAFT_DECODE;
}

/* Split policy, identical on host and device. Decode-like modes split long KV so that
 * num_entries * decode_groups * splits reaches target_ctas, in splits of FATTN__SPLIT_MIN_KV or
 * more, or of FATTN__SPLIT_MIN_KV_SHORT where those would not give every SM a block;
 * prefill-like modes never split. */
FATTN__HD uint32_t fattn__splits_for(const fattn__step_hdr *h, uint32_t kv_len, uint32_t q_len,
                                      uint32_t *align) {
  *align = FATTN__SPLIT_ALIGN;
  if (!fattn__mode_splits(h->mode)) return 1u;
  uint32_t per_entry = (h->num_live ? h->num_live : h->num_entries) * h->decode_groups;
  if (per_entry == 0u) return 1u;
  uint32_t want = fattn__ceil_div(h->target_ctas, per_entry);
  uint32_t by_len = kv_len / FATTN__SPLIT_MIN_KV;
  if ((uint64_t)per_entry * by_len < h->target_ctas / FATTN__CTAS_PER_SM) {
    by_len = kv_len / FATTN__SPLIT_MIN_KV_SHORT;
    *align = FATTN__SPLIT_ALIGN_SHORT;
  }
  uint32_t n = want < by_len ? want : by_len;
  if (n > h->max_splits) n = h->max_splits;
  /* Steps of one-query entries that fill a wave of the decode kind: equal blocks run in
   * rounds, so fattn__wave_splits picks the count, taken where it is no more than the target's
   * or its splits stay long (docs/performance.md, decode). */
  const uint32_t wave = h->decode_resident * (h->target_ctas / FATTN__CTAS_PER_SM);
  if (q_len == 1u && wave && (uint64_t)per_entry * (n ? n : 1u) >= wave) {
    uint32_t hi = fattn__ceil_div(2u * h->target_ctas, per_entry);
    if (hi > by_len) hi = by_len;
    if (hi > h->max_splits) hi = h->max_splits;
    const uint32_t w = fattn__wave_splits(per_entry, wave, hi);
    if (w <= n || kv_len / w >= FATTN__WAVE_MIN_KV) n = w;
  }
  if (n < 2u || q_len == 0u) return 1u;
  return n;
}

/* The split of one entry, decided from the entry alone so that the device can derive every
 * entry in parallel (attn/prep.cu) and still agree with fattn__prep. */
FATTN__HD void fattn__split_of(const fattn__step_hdr *h, fattn__entry *x) {
  uint32_t align, n = fattn__splits_for(h, x->kv_len, x->q_len, &align), len = x->kv_len;
  if (n > 1u) {
    len = fattn__ceil_div(fattn__ceil_div(x->kv_len, n), align) * align;
    n = fattn__ceil_div(x->kv_len, len);
    if (n < 2u) {
      n = 1u;
      len = x->kv_len;
    }
  }
  x->num_splits = n;
  x->split_len = len;
}

/* Workspace rows an entry's splits take. */
FATTN__HD uint64_t fattn__split_rows(const fattn__entry *x) {
  return x->num_splits > 1u ? (uint64_t)x->num_splits * x->q_len : 0u;
}

/* A step whose splits would overflow the workspace runs with no split at all: one rule that
 * needs only the total, so the plan is valid for any batch and parallel on the device. */
FATTN__HD void fattn__unsplit(fattn__entry *x) {
  x->num_splits = 1u;
  x->split_len = x->kv_len;
  x->split_row = UINT32_MAX;
}

/* Fills the derived fields of entries and header (the host's sequential version). */
FATTN__HD void fattn__prep(fattn__step_hdr *h, fattn__entry *e) {
  uint32_t q = 0, nw = 0, tiles = 0, pairs = 0;
  uint64_t rows = 0;
  for (uint32_t i = 0; i < h->num_entries; i++) {
    fattn__entry *x = &e[i];
    x->q_start = q;
    x->new_start = nw;
    x->tile_start = tiles;
    x->pair_start = pairs;
    fattn__split_of(h, x);
    x->split_row = x->num_splits > 1u ? (uint32_t)rows : UINT32_MAX;
    rows += fattn__split_rows(x);
    q += x->q_len;
    nw += x->new_len;
    tiles += fattn__ceil_div(x->q_len, FATTN__Q_TILE);
    pairs += fattn__ceil_div(x->q_len, FATTN__Q_PAIR);
  }
  if (rows > h->split_rows_cap) {
    for (uint32_t i = 0; i < h->num_entries; i++) fattn__unsplit(&e[i]);
    rows = 0;
  }
  h->num_q_tokens = q;
  h->num_new_tokens = nw;
  h->num_tiles = tiles;
  h->num_pairs = pairs;
  h->num_split_rows = (uint32_t)rows;
}

#endif /* FATTN_ATTN_META_H */
