/* internal.h: the context and what the modules of fattn share (never installed).
 * Config normalisation, layout, host tables, staging ring, the planned step, errors. */
#ifndef FATTN_LIB_INTERNAL_H
#define FATTN_LIB_INTERNAL_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include "fattn.h"
#include "attn/params.h"

#define FATTN__DETAIL_LEN 256
#define FATTN__ALIGN 256u /* every region starts on this boundary */

#define FATTN__UNUSED(x) ((void)(x))
/* The backend value fattn.h keeps reserved between FA3 and CPU: create rejects it as unknown. */
#define FATTN__BACKEND_RESERVED 3u

/* Config and model after defaults were applied and everything was validated. */
typedef struct fattn__norm {
  fattn_config cfg;
  fattn_model model;
  uint32_t head_dim_v;
  uint32_t kv_elem_bytes;
  uint32_t max_seqs;
  uint32_t max_entries; /* entries of one step: max_batch * max(1, spec_topk) */
  uint32_t max_mask_rows;
  uint32_t max_splits;
  uint32_t staging_slots;
  uint32_t num_buckets;
  uint32_t buckets[FATTN_MAX_GRAPH_BUCKETS];
  int on_cpu;
} fattn__norm;

/* Where every region lies: device offsets into the one device allocation, pinned offsets
 * into the one pinned slab. Derived by fattn__layout_compute, a pure function. */
typedef struct fattn__layout {
  uint64_t dev_off[FATTN_REGION_COUNT];
  uint64_t k_layer_bytes; /* one layer's K pool */
  uint64_t v_layer_bytes;
  uint64_t k_page_bytes;  /* one page of one layer's K pool: [page_size, kv_heads, head_dim] */
  uint64_t v_page_bytes;  /* 0 for MLA */
  uint32_t num_pages;
  uint32_t pages_per_seq;
  uint32_t split_rows_cap;
  /* one staged slot: an area of max_entries, then [pt updates][copies][row ops][payload words] */
  uint32_t cap_updates;
  uint32_t cap_copies;
  uint32_t cap_row_copies; /* a slot's row ops: cap_row_copies copies, then cap_updates fills */
  uint32_t cap_words;
  uint64_t slot_off_updates, slot_off_copies, slot_off_row_ops, slot_off_words;
  uint64_t slot_bytes;
  /* pinned slab: [ctx][staging ring][heap served to jemalloc] */
  uint64_t pin_off_ring;
  uint64_t pin_off_heap;
  uint64_t heap_bytes;
} fattn__layout;

fattn_status fattn__normalize(const fattn_config *cfg, const fattn_model *model,
                              fattn__norm *out, char *detail, size_t detail_len);
/* MLA on the GPU backends (lib/config.c, pure, so that the CPU suite reads the details that
 * create and plan give). fattn__mla_mode_check: FATTN_OK where backend has an MLA kernel for
 * mode (FA2, and FA3 where sm_90a is built: every mode but CROSS), else FATTN_ERR_UNSUPPORTED,
 * the detail naming the mode.
 * fattn__mla_options_check: FATTN_ERR_UNSUPPORTED naming the first option of n (with the layer
 * options and whether the model has sinks, which create copies out of n) that the MLA kernel
 * lacks: a 16-bit latent of another type than Q, softcap, sinks, a window, a chunk. */
fattn_status fattn__mla_mode_check(fattn_backend backend, uint32_t mode, char *detail, size_t detail_len);
fattn_status fattn__mla_options_check(const fattn__norm *n, const fattn_layer_opts *layers, int has_sinks,
                                      char *detail, size_t detail_len);
fattn_status fattn__layout_compute(const fattn__norm *n, fattn__layout *lay,
                                   fattn_memory_report *report, char *detail, size_t detail_len);
/* Bytes of one graph's static area for a bucket of the given requests. */
uint64_t fattn__graph_area_bytes(const fattn__norm *n, fattn_mode mode, uint32_t requests);

/* lib/abi.c: a versioned public struct (struct_size first) of this library's version. */
typedef struct fattn__abi {
  const char *name;     /* "fattn_config", as details name it */
  const char *init;     /* "FATTN_CONFIG_INIT" */
  uint32_t size;        /* sizeof in this library */
  uint32_t min;         /* the smallest struct_size: struct_size and the first field after it */
  const void *defaults; /* the *_INIT value */
} fattn__abi;

extern const fattn__abi fattn__abi_config, fattn__abi_model, fattn__abi_batch, fattn__abi_stats,
    fattn__abi_report;

/* OK for the caller's struct (not NULL) of any version: struct_size at least abi->min, and
 * past abi->size only bytes of zero; else ERR_INVALID naming the struct (and the first
 * non-zero byte) in detail. Input and output structs alike. */
fattn_status fattn__abi_check(const fattn__abi *abi, const void *user, char *detail, size_t detail_len);
/* A checked caller's struct in this library's layout: user itself when its struct_size is
 * this library's, else local (abi->size bytes) with the defaults under the caller's bytes. */
const void *fattn__abi_read(const fattn__abi *abi, const void *user, void *local);
/* Writes full, this library's layout, into a checked caller's struct up to its struct_size
 * (never past it); its struct_size stays the caller's. */
void fattn__abi_write(const fattn__abi *abi, void *user, const void *full);

/* A sequence of the page allocator. */
typedef struct fattn__seq {
  uint32_t len;      /* token slots covered */
  uint32_t npages;   /* leading page-table entries mapped */
  uint32_t dirty_lo; /* page-table entries [dirty_lo, dirty_hi) not yet shipped */
  uint32_t dirty_hi;
  uint32_t stamp;    /* last plan pass that named it, to find duplicates; 0: none since the counter wrapped */
  uint32_t shared;   /* entries [0, shared) may be shared with a fork; later ones are its own */
  uint8_t open;
  uint8_t listed;    /* in the dirty list */
  uint8_t root;      /* a pending row copy reads its device row: no copy may write it */
  uint8_t pad;       /* 32 bytes: a record in one cache line (the array is line-aligned) */
  uint32_t copy;     /* 1 + its pending row copy in fattn__pages.row_copies, or 0 */
} fattn__seq;

typedef struct fattn__pages {
  uint32_t num_pages;
  uint32_t pages_per_seq;
  uint32_t page_size;
  uint32_t max_seqs;
  uint32_t caller_owned; /* FATTN_FLAG_CALLER_PAGES */
  uint32_t max_seq_len;
  uint32_t *free_stack;  /* [num_pages] */
  uint32_t free_top;
  uint32_t *refcount;    /* [num_pages] */
  uint32_t *table;       /* host mirror [max_seqs, pages_per_seq] */
  fattn__seq *seqs;      /* [max_seqs] */
  uint32_t *seq_free;    /* [max_seqs] stack of closed ids */
  uint32_t seq_free_top;
  uint32_t *dirty;       /* [max_seqs] rows with unshipped entries */
  uint32_t num_dirty;
  fattn__page_copy *copies; /* [cap_copies] copy-on-write copies not yet shipped */
  uint32_t num_copies;
  uint32_t cap_copies;
  fattn__row_op *row_copies; /* [cap_row_copies] forks' device-side row copies not yet shipped */
  uint32_t num_row_copies;
  uint32_t cap_row_copies;
  uint32_t *scratch;     /* [num_pages] for fattn_check, and the planner's copy-clash stamps */
  uint32_t copy_stamp;   /* the last stamp the planner wrote into scratch */
  uint64_t allocs, frees, cow_copies;
} fattn__pages;

/* What the last fattn_plan left for store_kv and attend: where the metadata is, and the
 * bounds that size the grids (exact counts eagerly, the bucket's bounds in a graph). */
typedef struct fattn__step {
  int planned;
  uint32_t mode;
  uint32_t cap_entries;
  uint32_t cap_q_tokens;
  uint32_t cap_new_tokens;
  uint32_t cap_tiles;
  fattn__step_hdr *hdr;    /* device (host on CPU) */
  fattn__entry *entries;
  uint64_t *mask;
} fattn__step;

typedef struct fattn__heap fattn__heap;

/* What one launch of a graph posts for its prep node: the staging slot its replay reads. */
typedef struct fattn__post {
  fattn__step_hdr hdr; /* the slot's header, read once over the bus with the rest */
  uint64_t seq;        /* the slot's use number + 1: stored in its completion word */
  uint32_t index;      /* the staging slot */
  uint32_t num_words;  /* page-table payload words in the slot */
} fattn__post;

/* Posts a bucket holds at once: the host may post launch n + 1 while launch n's replay has not
 * started, and waits only before overwriting the post of launch n + 1 - POSTS. */
#define FATTN__MAILBOX_POSTS 2

/* A graph bucket's mailbox (pinned): its prep node, captured once, finds here which staging
 * slot this replay reads, so that a replay costs the host one launch, not two. Launch n posts
 * into post[n % POSTS]; replays of one bucket run in launch order (a context's steps are
 * ordered), so the prep of launch n finds n in read. */
typedef struct fattn__mailbox {
  fattn__post post[FATTN__MAILBOX_POSTS];
  uint64_t read;   /* device: posts its prep nodes have read */
  uint64_t posted; /* host: posts written; a failed launch takes its post back */
} fattn__mailbox;

/* A captured graph of one (mode, bucket) and the static metadata area it reads. */
typedef struct fattn__graph_slot {
  void *exec;        /* cudaGraphExec_t, NULL until captured */
  uint8_t *area;     /* [hdr][entries][mask rows] in the graph region */
  uint32_t requests; /* the bucket */
  int caller_graph;  /* a graph of the caller's holds this bucket's prep node (fattn_graph_end succeeded) */
  fattn__mailbox *box; /* pinned: the staging slot its next replay reads */
} fattn__graph_slot;

/* The capture between fattn_graph_begin and fattn_graph_end (slot NULL when none is open):
 * store_kv and attend record against the bucket's area until the step binding before it
 * comes back. */
typedef struct fattn__capture {
  fattn__graph_slot *slot;
  fattn_mode mode;
  void *stream; /* the capturing cudaStream_t */
  fattn__step saved;
} fattn__capture;

struct fattn_ctx {
  fattn__norm n;
  fattn__layout lay;
  fattn_memory_report report;
  fattn_backend backend[FATTN_MODE_COUNT + 1];
  fattn_layer_opts *layers; /* [num_layers] host copy */
  int device;               /* CUDA ordinal, -1 for CPU */
  uint32_t num_sms;
  uint32_t decode_resident; /* fattn__decode_resident of the model and KV type, for step headers */
  int model_has_sinks;
  uint8_t *dev;    /* the one device allocation (host memory on the CPU backend) */
  uint8_t *pinned; /* the one pinned slab (holds this struct) */
  fattn__heap *heap;
  fattn__pages pages;
  /* staging ring: the prep kernel reads a slot in place (mapped pinned memory) and, after
   * its last read, stores the slot's use number + 1 into the slot's completion word */
  uint8_t *ring;       /* [staging_slots][slot_bytes] pinned */
  uint64_t *done;      /* [staging_slots] completion words, pinned, written by the GPU */
  uint8_t *pinned_dev; /* the slab as the device addresses it */
  uint64_t ring_taken; /* slots taken so far: use n goes to slot n % staging_slots */
  uint32_t ring_next;
  uint64_t staging_waits;
  uint64_t steps_planned;
  uint32_t plan_stamp;       /* the last duplicate-check stamp (attn/plan.c); never 0 once planned */
  fattn__step step;
  fattn__graph_slot *graphs; /* [FATTN_MODE_COUNT + 1][num_buckets] */
  fattn__capture capture;
  void *tmaps;               /* [num_layers][K, V] CUtensorMap for fa3's TMA; NULL if unused */
#ifdef FATTN_STAMPS
  unsigned long long *stamps; /* measurement builds: attn/stamps.h's buffer, set by fattn-bench */
#endif
  char detail[FATTN__DETAIL_LEN];
};

/* The context's detail buffer. Every failing call writes it, the const getters included:
 * a context is never a const object (it lives in the pinned slab), so the cast is defined. */
static inline char *fattn__detail_buf(const fattn_ctx *ctx) { return (char *)ctx->detail; }

/* OK where the calling thread's current CUDA device is the context's (always on the CPU
 * backend); else ERR_STATE, the detail naming call and both devices. */
fattn_status fattn__on_device(fattn_ctx *ctx, const char *call);

/* Writes the detail message (printf style) and returns status; never allocates. */
fattn_status fattn__fail(const fattn_ctx *ctx, fattn_status status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
fattn_status fattn__vfail(char *buf, size_t len, fattn_status status, const char *fmt, va_list ap);
fattn_status fattn__failbuf(char *buf, size_t len, fattn_status status, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* arena/heap.c: a jemalloc arena whose extents come from [base, base + bytes). */
fattn_status fattn__heap_open(void *base, uint64_t bytes, fattn__heap **out);
void *fattn__heap_alloc(fattn__heap *heap, size_t bytes);
void fattn__heap_close(fattn__heap *heap);
uint64_t fattn__heap_overhead(uint64_t payload_bytes, uint32_t allocations);

/* arena/pages.c */
fattn_status fattn__pages_init(fattn_ctx *ctx);

/* fa3 tensor maps: bytes of one (K and V of a layer), and their alignment. */
#define FATTN__TMAP_BYTES 256u
#define FATTN__TMAP_ALIGN 64u

/* Derived per-layer parameters the backends take. */
fattn__layer_params fattn__layer_params_for(const fattn_ctx *ctx, uint32_t layer);

static inline uint64_t fattn__align_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

/* Offsets inside a metadata area [hdr][entries][mask rows] of cap_entries entries: the start
 * of every staged slot, the eager inbox, and each graph bucket's static area. */
static inline uint64_t fattn__area_entries_off(void) {
  return fattn__align_up(sizeof(fattn__step_hdr), 16);
}
static inline uint64_t fattn__area_mask_off(uint32_t cap_entries) {
  return fattn__align_up(fattn__area_entries_off() + (uint64_t)cap_entries * sizeof(fattn__entry), 16);
}

/* Frees staging slot i whose prep will never run (its launch failed): seq is what that prep
 * would have stored into the slot's completion word. */
static inline void fattn__slot_release(fattn_ctx *ctx, uint32_t i, uint64_t seq) {
  __atomic_store_n(&ctx->done[i], seq, __ATOMIC_RELEASE);
}

/* A pinned-slab address as the device sees it. */
static inline void *fattn__pinned_dev(const fattn_ctx *ctx, const void *host) {
  return ctx->pinned_dev + ((const uint8_t *)host - ctx->pinned);
}

static inline uint32_t fattn__seqs_open(const fattn__pages *p) { return p->max_seqs - p->seq_free_top; }

#endif /* FATTN_LIB_INTERNAL_H */
