/* common.h: what the fuzz harnesses share: a byte reader over the input, a fatal
 * mismatch report, and a snapshot of the page allocator's state for "nothing changed". */
#ifndef FATTN_FUZZ_COMMON_H
#define FATTN_FUZZ_COMMON_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lib/internal.h"
#include "tests/snapshot.h"

/* Any broken expectation is a finding: say what differed, then trap for libFuzzer. */
#define FUZZ_FAIL(...)                                   \
  do {                                                   \
    fprintf(stderr, "FUZZ MISMATCH %s:%d: ", __FILE__, __LINE__); \
    fprintf(stderr, __VA_ARGS__);                        \
    fputc('\n', stderr);                                 \
    __builtin_trap();                                    \
  } while (0)

/* The input consumed front to back; past its end every byte reads 0 and done is set,
 * so a harness can stop its operation loop there. */
typedef struct fuzz_bytes {
  const uint8_t *data;
  size_t size;
  size_t pos;
} fuzz_bytes;

static inline int fuzz_done(const fuzz_bytes *in) { return in->pos >= in->size; }

static inline uint8_t fuzz_u8(fuzz_bytes *in) { return in->pos < in->size ? in->data[in->pos++] : 0; }

static inline uint32_t fuzz_u16(fuzz_bytes *in) {
  uint32_t lo = fuzz_u8(in);
  return lo | (uint32_t)fuzz_u8(in) << 8;
}

static inline uint32_t fuzz_u32(fuzz_bytes *in) {
  uint32_t lo = fuzz_u16(in);
  return lo | fuzz_u16(in) << 16;
}

static inline uint64_t fuzz_u64(fuzz_bytes *in) {
  uint64_t lo = fuzz_u32(in);
  return lo | (uint64_t)fuzz_u32(in) << 32;
}

/* Whether status is one of FATTN_STATUS_MAP's codes. */
static inline int fuzz_known_status(fattn_status st) {
  switch (st) {
#define FUZZ_STATUS_CASE_(name, value, msg) case FATTN_##name:
    FATTN_STATUS_MAP(FUZZ_STATUS_CASE_)
#undef FUZZ_STATUS_CASE_
    return 1;
  }
  return 0;
}

/* A caller's versioned struct as fattn.h's rule reads it: the *_INIT defaults under its first
 * struct_size bytes. 0 where the rule rejects it: struct_size under min (the end of the first
 * field after it) or over 4096, or a non-zero byte past size (in must span struct_size). */
static inline int fuzz_as_read(void *out, const void *in, const void *defaults, size_t size, size_t min) {
  uint32_t n;
  memcpy(&n, in, sizeof n);
  memcpy(out, defaults, size);
  if (n < min || n > 4096) return 0;
  for (size_t i = size; i < n; i++)
    if (((const uint8_t *)in)[i]) return 0;
  memcpy(out, in, n < size ? n : size);
  return 1;
}

/* The allocator's whole state (tests/snapshot.h). Caller frees. */
static inline uint8_t *fuzz_pages_snapshot(const fattn__pages *p, size_t *bytes) {
  uint8_t *buf = fattn_test_pages_snapshot(p, bytes);
  if (!buf) FUZZ_FAIL("snapshot: out of host memory");
  return buf;
}

/* Traps if the allocator differs from a snapshot taken before call (then frees it). */
static inline void fuzz_expect_unchanged(const fattn__pages *p, uint8_t *before, size_t bytes,
                                         const char *call, fattn_status st) {
  size_t now_bytes;
  uint8_t *now = fuzz_pages_snapshot(p, &now_bytes);
  if (now_bytes != bytes || memcmp(before, now, bytes) != 0)
    FUZZ_FAIL("%s failed with %s but changed the allocator", call, fattn_status_name(st));
  free(now);
  free(before);
}

/* A failed call's detail names the problem: non-empty and terminated inside its buffer. */
static inline void fuzz_expect_detail(const char *detail, size_t len, const char *call) {
  if (!memchr(detail, '\0', len)) FUZZ_FAIL("%s: detail is not NUL-terminated within %zu bytes", call, len);
  if (!detail[0]) FUZZ_FAIL("%s: failed with an empty detail", call);
}

/* A context's whole mutable host state right after fattn_create: the context struct, the
 * allocator's tables and the page table of the device region (host memory on the CPU). */
typedef struct fuzz_image {
  uint8_t *bytes;
  size_t size;
} fuzz_image;

#define FUZZ_IMAGE_PARTS 10
static inline size_t fuzz_image_parts(fattn_ctx *c, void **where, size_t *len) {
  fattn__pages *p = &c->pages;
  size_t np = p->num_pages, ms = p->max_seqs;
  void *w[] = {c, p->free_stack, p->refcount, p->table, p->seqs, p->seq_free, p->dirty, p->copies, p->row_copies,
               c->dev + c->lay.dev_off[FATTN_REGION_PAGE_TABLE]};
  size_t l[] = {sizeof *c, np * 4, np * 4, ms * p->pages_per_seq * 4, ms * sizeof(fattn__seq), ms * 4, ms * 4,
                (size_t)p->cap_copies * sizeof(fattn__page_copy), (size_t)p->cap_row_copies * sizeof(fattn__row_op),
                (size_t)c->report.region_bytes[FATTN_REGION_PAGE_TABLE]};
  _Static_assert(sizeof w / sizeof w[0] == FUZZ_IMAGE_PARTS, "callers size their arrays by FUZZ_IMAGE_PARTS");
  memcpy(where, w, sizeof w);
  memcpy(len, l, sizeof l);
  return sizeof w / sizeof w[0];
}

/* Contexts cost a 16 MiB slab each (the heap's reserve), which would make creation the
 * whole cost of an input: harnesses that fuzz what happens after create keep contexts by
 * config and roll them back to their just-created image, so every input still starts from
 * exactly what fattn_create returns. */
#define FUZZ_CACHE_SLOTS 64
typedef struct fuzz_cached {
  uint8_t key[32];
  fattn_ctx *ctx;
  fuzz_image image;
  uint64_t last_use;
} fuzz_cached;

static inline void fuzz_image_take(fattn_ctx *c, fuzz_image *img) {
  void *w[FUZZ_IMAGE_PARTS];
  size_t l[FUZZ_IMAGE_PARTS], n = fuzz_image_parts(c, w, l), total = 0;
  for (size_t i = 0; i < n; i++) total += l[i];
  img->bytes = malloc(total);
  if (!img->bytes) FUZZ_FAIL("image: out of host memory");
  img->size = total;
  uint8_t *o = img->bytes;
  for (size_t i = 0; i < n; i++) memcpy(o, w[i], l[i]), o += l[i];
}

static inline void fuzz_image_restore(fattn_ctx *c, const fuzz_image *img) {
  /* Part sizes come from the image's own copy of the struct, equal to the live one's. */
  void *w[FUZZ_IMAGE_PARTS];
  size_t l[FUZZ_IMAGE_PARTS], n = fuzz_image_parts(c, w, l);
  const uint8_t *o = img->bytes;
  for (size_t i = 0; i < n; i++) memcpy(w[i], o, l[i]), o += l[i];
}

/* A context for cfg/model named by key (the input bytes that chose them), restored to its
 * just-created state; NULL with *st set where fattn_create fails. Never destroy it. */
static inline fattn_ctx *fuzz_context(const uint8_t key[32], const fattn_config *cfg, const fattn_model *model,
                                      fattn_status *st, char *detail, size_t detail_len) {
  static fuzz_cached cache[FUZZ_CACHE_SLOTS];
  static uint64_t clock;
  fuzz_cached *victim = &cache[0];
  clock++;
  for (int i = 0; i < FUZZ_CACHE_SLOTS; i++) {
    fuzz_cached *e = &cache[i];
    if (e->ctx && memcmp(e->key, key, 32) == 0) {
      e->last_use = clock;
      fuzz_image_restore(e->ctx, &e->image);
      *st = FATTN_OK;
      return e->ctx;
    }
    if (e->last_use < victim->last_use) victim = e;
  }
  if (victim->ctx) {
    fattn_destroy(victim->ctx, 1);
    free(victim->image.bytes);
    memset(victim, 0, sizeof *victim);
  }
  fattn_ctx *c = NULL;
  if ((*st = fattn_create(cfg, model, &c, detail, detail_len)) != FATTN_OK) return NULL;
  memcpy(victim->key, key, 32);
  victim->ctx = c;
  victim->last_use = clock;
  fuzz_image_take(c, &victim->image);
  return c;
}

#endif /* FATTN_FUZZ_COMMON_H */
