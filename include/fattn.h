/* fattn.h: the public face of fattn, attention for LLM serving on one GPU.
 * Status codes, model and config descriptions, context lifetime, sequences, steps, graphs. */
#ifndef FATTN_H
#define FATTN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define FATTN_VERSION_MAJOR 0
#define FATTN_VERSION_MINOR 1
#define FATTN_VERSION_PATCH 0
/* One number to compare: major * 10000 + minor * 100 + patch (0.1.0 is 100). */
#define FATTN_VERSION_NUMBER \
  (FATTN_VERSION_MAJOR * 10000 + FATTN_VERSION_MINOR * 100 + FATTN_VERSION_PATCH)

/* ---------------------------------------------------------------- status */

/* X(name, value, message). 0 is OK, every error is negative. */
#define FATTN_STATUS_MAP(X)                                                   \
  X(OK, 0, "success")                                                         \
  X(ERR_INVALID, -1, "invalid argument")                                      \
  X(ERR_NOMEM, -2, "out of memory")                                           \
  X(ERR_CAPACITY, -3, "capacity exhausted (pages, sequences or slots)")       \
  X(ERR_BUSY, -4, "context still has live sequences")                         \
  X(ERR_UNSUPPORTED, -5, "combination not supported by the chosen backend")   \
  X(ERR_CUDA, -6, "CUDA runtime error")                                       \
  X(ERR_NOT_FOUND, -7, "unknown or closed sequence")                          \
  X(ERR_STATE, -8, "call out of order")                                       \
  X(ERR_NO_DEVICE, -9, "no usable CUDA device")                               \
  X(ERR_OVERFLOW, -10, "size arithmetic overflows")                           \
  X(ERR_CORRUPT, -11, "internal invariant violated")

typedef enum fattn_status {
#define FATTN_STATUS_ENUM_(name, value, msg) FATTN_##name = value,
  FATTN_STATUS_MAP(FATTN_STATUS_ENUM_)
#undef FATTN_STATUS_ENUM_
} fattn_status;

const char *fattn_strerror(fattn_status status);    /* "invalid argument" */
const char *fattn_status_name(fattn_status status); /* "FATTN_ERR_INVALID" */
const char *fattn_version(void);                    /* "0.1.0" */
/* FATTN_VERSION_NUMBER of the library linked, to compare with the header compiled against. */
int fattn_version_number(void);

/* Threads, as cuDNN and SQLite's multi-thread mode have it. Distinct contexts may be used from
 * distinct threads at once. One context is used by one thread at a time: every call taking it,
 * the const getters included (a failing one writes the context's detail), needs the caller's
 * exclusion. fattn_strerror, fattn_status_name, fattn_version, fattn_version_number,
 * fattn_region_name and fattn_memory_plan read no mutable global state: any thread may call
 * them at any time. fattn_create and fattn_destroy, of distinct contexts, may run at once: the
 * per-process caches of device facts and kernel attributes are filled idempotently. */

/* ----------------------------------------------------------------- enums */

typedef enum fattn_dtype {
  FATTN_DTYPE_BF16 = 1,
  FATTN_DTYPE_FP16 = 2,
  FATTN_DTYPE_FP8_E4M3 = 3, /* KV cache and fattn_config.compute_dtype; scaled per layer, see fattn_layer_opts */
} fattn_dtype;

typedef enum fattn_backend {
  FATTN_BACKEND_AUTO = 0, /* best available for the device */
  FATTN_BACKEND_FA2 = 1,  /* portable sm_80+ */
  FATTN_BACKEND_FA3 = 2,  /* Hopper sm_90a */
  /* 3 is reserved (unused): fattn_create rejects it as an unknown backend. */
  FATTN_BACKEND_CPU = 4,  /* float64 reference on the host */
} fattn_backend;

typedef enum fattn_mode {
  FATTN_MODE_PREFILL = 1,       /* extend: q_len new tokens over a cached prefix, causal */
  FATTN_MODE_DECODE = 2,        /* one new token per sequence */
  FATTN_MODE_TARGET_VERIFY = 3, /* spec_draft_tokens queries per sequence, tree mask or chain */
  FATTN_MODE_DRAFT_DECODE = 4,  /* topk branch sequences per request, one token each */
  FATTN_MODE_DRAFT_EXTEND = 5,  /* causal extend over the tokens just accepted */
  FATTN_MODE_CROSS = 6,         /* non-causal over a sequence holding encoder KV */
} fattn_mode;
#define FATTN_MODE_COUNT 6

/* fattn_config.device: run on the host with the float64 reference. */
#define FATTN_DEVICE_CPU (-1)
/* fattn_layer_opts.sliding_window: no window. */
#define FATTN_NO_WINDOW (-1)
/* Largest page_size; page sizes are powers of two in 1..FATTN_MAX_PAGE_SIZE. */
#define FATTN_MAX_PAGE_SIZE 256
/* Largest spec_draft_tokens: a tree-mask row is one uint64_t. */
#define FATTN_MAX_DRAFT_TOKENS 64
/* Largest number of graph batch-size buckets per mode. */
#define FATTN_MAX_GRAPH_BUCKETS 64
/* Largest max_q_tokens: token and tile counts of a step stay far from 32-bit overflow. */
#define FATTN_MAX_Q_TOKENS (1u << 24)
/* Largest number of layers and q heads a model may describe. */
#define FATTN_MAX_LAYERS 1024
#define FATTN_MAX_HEADS 1024

/* ----------------------------------------------------- versioned structs */

/* fattn_model, fattn_config, fattn_batch, fattn_stats and fattn_memory_report open with
 * struct_size, which their *_INIT macro sets to the sizeof the caller was compiled with; new
 * fields are only ever appended. A smaller struct_size (an older caller) is accepted: the
 * fields past it take their *_INIT defaults, and an output struct gets only its struct_size
 * bytes written. A larger one (a newer caller) is accepted while every byte past this
 * library's struct is zero (a new field left at its default); else FATTN_ERR_INVALID, the
 * detail naming the struct and the first non-zero byte. struct_size must reach at least the
 * end of the first field after it, and at most 4096. */

/* --------------------------------------------------------------- model */

/* Per-layer options. A NULL fattn_model.layers means every layer takes the defaults
 * given by FATTN_LAYER_OPTS_INIT. */
typedef struct fattn_layer_opts {
  int32_t sliding_window; /* token i sees j in [i - w, i]; FATTN_NO_WINDOW for none */
  uint32_t chunk_size;    /* chunked local attention: i sees j only in its own chunk; 0 none */
  float k_scale;          /* fp8 KV: stored = k / k_scale, read = stored * k_scale */
  float v_scale;
} fattn_layer_opts;
#define FATTN_LAYER_OPTS_INIT {FATTN_NO_WINDOW, 0, 1.0f, 1.0f}

typedef struct fattn_model {
  uint32_t struct_size; /* sizeof(fattn_model), set by FATTN_MODEL_INIT */
  uint32_t num_layers;
  uint32_t num_q_heads;
  uint32_t num_kv_heads; /* divides num_q_heads: MHA, GQA, MQA */
  uint32_t head_dim;     /* Q and K: 64, 96, 128, 192, 256 (MLA: latent + rope) */
  uint32_t head_dim_v;   /* V and O, <= head_dim; 0 means head_dim */
  uint32_t mla_latent_dim; /* MLA absorbed form: 512; 0 means not MLA. On a GPU: FA2 or FA3
                              (AUTO: FA3 on sm_90a above 16 q heads with the latent in q_dtype),
                              every mode but CROSS, latent rows in q_dtype or fp8 e4m3 (k_scale),
                              no softcap, sinks, window or chunk */
  uint32_t mla_rope_dim;   /* MLA: 64 */
  float softmax_scale;     /* 0 means 1 / sqrt(head_dim) */
  float logit_softcap;     /* s = cap * tanh(s / cap) before masking; 0 means none */
  const fattn_layer_opts *layers; /* [num_layers] or NULL; copied at create */
  const float *sinks; /* [num_layers][num_q_heads] logits joining the denominator, or NULL;
                         copied at create; -INFINITY for a head without a sink. The sink's mass
                         counts in fattn_attend's lse: log(sum_j exp(s_j) + exp(sink)) */
} fattn_model;
#define FATTN_MODEL_INIT {sizeof(fattn_model), 0, 0, 0, 0, 0, 0, 0, 0.0f, 0.0f, NULL, NULL}

/* -------------------------------------------------------------- config */

/* Flags for fattn_config.flags. */
#define FATTN_FLAG_CALLER_PAGES 0x1u /* the caller owns page ids: fattn_seq_map, no allocator */

typedef struct fattn_config {
  uint32_t struct_size; /* sizeof(fattn_config), set by FATTN_CONFIG_INIT */
  int32_t device;       /* CUDA device ordinal, or FATTN_DEVICE_CPU */
  fattn_dtype q_dtype;  /* Q, new K/V and O: BF16 or FP16 */
  fattn_dtype kv_dtype; /* cache: BF16, FP16 or FP8_E4M3 */
  uint32_t page_size;   /* tokens per page, power of two in 1..256 */
  uint64_t kv_budget_bytes; /* bytes for all K and V pools; or */
  uint32_t kv_budget_pages; /* pages (wins when non-zero) */
  uint32_t max_seqs;    /* sequences open at once, branches included; 0 means max_batch * max(1, spec_topk) */
  uint32_t max_batch;   /* entries of one step (DRAFT_DECODE: requests; each brings spec_topk) */
  uint32_t max_seq_len; /* tokens per sequence */
  uint32_t max_q_tokens; /* query tokens in one step */
  uint32_t spec_topk;    /* speculative decoding: branches per request; 0 disables it */
  uint32_t spec_steps;   /* draft steps per round */
  uint32_t spec_draft_tokens; /* TARGET_VERIFY queries per request, <= FATTN_MAX_DRAFT_TOKENS */
  uint32_t max_encoder_len;   /* CROSS mode: longest encoder sequence; 0 disables CROSS */
  fattn_backend prefill_backend; /* PREFILL, TARGET_VERIFY, DRAFT_EXTEND, CROSS */
  fattn_backend decode_backend;  /* DECODE, DRAFT_DECODE */
  uint32_t max_splits;   /* split-KV bound fixed at create (graph safe); 0 means 32 */
  uint32_t staging_slots; /* pinned staging ring depth; 0 means 4 */
  uint32_t num_graph_buckets; /* 0 means the default buckets (1, 2, 4, 8, 12, 16, 24, 32, 40, .., 256 cut at max_batch) */
  const uint32_t *graph_buckets; /* [num_graph_buckets], strictly increasing, or NULL */
  uint32_t graph_modes;  /* bit (1 << mode) per mode that gets graph buffers; 0 none */
  uint32_t flags;        /* FATTN_FLAG_* */
  /* The dtype of the two GEMMs (Q K^T, P V) of the prefill-side modes (PREFILL, TARGET_VERIFY,
   * DRAFT_EXTEND, CROSS). 0 means q_dtype: 16-bit MMAs, as before this field. BF16 / FP16 only
   * when equal to q_dtype. FP8_E4M3 needs kv_dtype FP8_E4M3 and a model without MLA
   * (mla_latent_dim 0). Its policy: Q (bf16 / fp16) is quantised to e4m3 in the kernel, one
   * scale per 64 query rows of a tile and q head (their amax / 448); K and V are the cache's fp8
   * values with the layer's k_scale / v_scale; P is rounded to e4m3 in registers; S and O
   * accumulate in fp32; O comes out in q_dtype and the LSE in float. The decode-side modes
   * (DECODE, DRAFT_DECODE) keep their kernels, and backends without an fp8 kernel (FA2, the CPU
   * reference) compute as before (16-bit MMAs over the widened cache; float64): only FA3 on
   * sm_90a runs e4m3 GEMMs, so the same context's answers differ by backend within fp8's error. */
  fattn_dtype compute_dtype;
} fattn_config;
#define FATTN_CONFIG_INIT                                                        \
  {sizeof(fattn_config), 0, FATTN_DTYPE_BF16, FATTN_DTYPE_BF16, 16, 0, 0, 0, 1, \
   4096, 4096, 0, 0, 0, 0, FATTN_BACKEND_AUTO, FATTN_BACKEND_AUTO, 0, 0, 0, NULL, 0, 0, (fattn_dtype)0}

/* ---------------------------------------------------------- memory plan */

typedef enum fattn_region {
  FATTN_REGION_K_POOL = 0,   /* all layers: [layers][pages, page_size, kv_heads, head_dim] */
  FATTN_REGION_V_POOL,       /* all layers: [layers][pages, page_size, kv_heads, head_dim_v]; 0 for MLA */
  FATTN_REGION_PAGE_TABLE,   /* [max_seqs, pages_per_seq] int32 */
  FATTN_REGION_METADATA,     /* per-step device metadata written by the planner */
  FATTN_REGION_SPLIT_WORKSPACE, /* split-KV partial O and LSE */
  FATTN_REGION_GRAPH_STATIC, /* per-(mode, bucket) metadata for captured graphs */
  FATTN_REGION_MODEL,        /* sinks and per-layer options on the device */
  FATTN_REGION_PINNED_STAGING, /* host: staging ring, sequence tables, free stack */
  FATTN_REGION_COUNT
} fattn_region;

typedef struct fattn_memory_report {
  uint32_t struct_size; /* sizeof(fattn_memory_report), set by FATTN_MEMORY_REPORT_INIT */
  uint64_t region_bytes[FATTN_REGION_COUNT];
  uint64_t device_bytes;  /* the one device allocation (host memory on the CPU backend) */
  uint64_t pinned_bytes;  /* the one pinned host allocation */
  uint32_t num_pages;
  uint32_t pages_per_seq;
  uint64_t page_bytes;    /* K + V bytes one page holds over all layers */
  uint64_t graph_bytes_per_mode[FATTN_MODE_COUNT + 1]; /* indexed by fattn_mode */
} fattn_memory_report;
#define FATTN_MEMORY_REPORT_INIT {sizeof(fattn_memory_report), {0}, 0, 0, 0, 0, 0, {0}}

const char *fattn_region_name(fattn_region region); /* "k_pool", ... */

/* Pure: lays out every region without touching a device. On error, detail (if not NULL,
 * detail_len bytes) says which field was wrong. */
fattn_status fattn_memory_plan(const fattn_config *cfg, const fattn_model *model,
                               fattn_memory_report *report, char *detail, size_t detail_len);

/* -------------------------------------------------------------- context */

typedef struct fattn_ctx fattn_ctx;

/* One device allocation and one pinned host allocation; nothing is allocated afterwards.
 * On failure *out is NULL and, if detail is not NULL, it holds the reason. */
fattn_status fattn_create(const fattn_config *cfg, const fattn_model *model, fattn_ctx **out,
                          char *detail, size_t detail_len);
/* NULL is a no-op. With live sequences: FATTN_ERR_BUSY unless force is non-zero. */
fattn_status fattn_destroy(fattn_ctx *ctx, int force);

/* Detail of the last failing call on this context: which argument and why. Never NULL. The
 * pointer is the context's own buffer, valid until fattn_destroy; its text holds until the next
 * call on the context (copy it to keep it). A NULL ctx gives a static string. */
const char *fattn_detail(const fattn_ctx *ctx);
/* The plan the context was created with: valid, and unchanged, until fattn_destroy. NULL for a
 * NULL ctx. */
const fattn_memory_report *fattn_ctx_memory(const fattn_ctx *ctx);
/* Backend that runs mode on this context (after AUTO was resolved); FATTN_BACKEND_AUTO where no
 * backend runs it (an MLA model on a GPU in CROSS, which no MLA model has: fattn_plan refuses it
 * with FATTN_ERR_UNSUPPORTED, the detail naming the mode). */
fattn_backend fattn_ctx_backend(const fattn_ctx *ctx, fattn_mode mode);

/* Invariants: free + owned = total, each page free once or owned with refcount equal to
 * its references, every page-table entry in range or the sentinel. OK or ERR_CORRUPT. */
fattn_status fattn_check(fattn_ctx *ctx);

typedef struct fattn_stats {
  uint32_t struct_size; /* sizeof(fattn_stats), set by FATTN_STATS_INIT */
  uint32_t pages_total;
  uint32_t pages_free;
  uint32_t seqs_open;
  uint64_t page_allocs;
  uint64_t page_frees;
  uint64_t steps_planned;
  uint64_t staging_waits; /* plans that found the staging ring full (back-pressure) */
  uint64_t cow_copies;    /* shared pages copied before a write */
} fattn_stats;
#define FATTN_STATS_INIT {sizeof(fattn_stats), 0, 0, 0, 0, 0, 0, 0, 0}
fattn_status fattn_get_stats(const fattn_ctx *ctx, fattn_stats *stats);

/* ------------------------------------------------------------ sequences */

/* A sequence owns an ordered list of pages holding its KV; its length is the number of
 * token slots it covers. Page-table changes are shipped to the device at the next plan. */
fattn_status fattn_seq_open(fattn_ctx *ctx, uint32_t *seq);
/* Grows the sequence to num_tokens slots (never shrinks). Out of pages: ERR_CAPACITY and
 * nothing changed. A write slot that lands in a shared page gets a private copy first.
 * FATTN_FLAG_CALLER_PAGES: takes no page; num_tokens must lie within the mapped entries
 * (else ERR_CAPACITY): map first, then reserve. */
fattn_status fattn_seq_reserve(fattn_ctx *ctx, uint32_t seq, uint32_t num_tokens);
/* New sequence sharing the first num_tokens slots of src (whole pages by reference). */
fattn_status fattn_seq_fork(fattn_ctx *ctx, uint32_t src, uint32_t num_tokens, uint32_t *dst);
/* Shrinks to num_tokens slots, releasing pages past it (rejected draft tokens); caller pages
 * past it are unmapped, never freed. */
fattn_status fattn_seq_truncate(fattn_ctx *ctx, uint32_t seq, uint32_t num_tokens);
/* Releases every page reference and the id. */
fattn_status fattn_seq_close(fattn_ctx *ctx, uint32_t seq);
fattn_status fattn_seq_length(const fattn_ctx *ctx, uint32_t seq, uint32_t *num_tokens);
/* FATTN_FLAG_CALLER_PAGES only: entries [first, first + count) of seq's page table become
 * pages[0..count) (each < num_pages; first at most the entries mapped: no holes). The length
 * is unchanged: mapping pages never changes which tokens are visible, only fattn_seq_reserve
 * and fattn_seq_truncate do (a page re-mapped after a truncate brings no rejected draft slot
 * back). fattn never frees caller pages. */
fattn_status fattn_seq_map(fattn_ctx *ctx, uint32_t seq, uint32_t first, uint32_t count,
                           const uint32_t *pages);

/* ---------------------------------------------------------------- steps */

/* One step. Entry i attends with q_lens[i] query tokens to the first kv_lens[i] slots of
 * sequence seq_ids[i]; its new tokens are the last q_lens[i] of those (the last
 * kv_new_lens[i] in CROSS mode). Tokens are packed entry after entry:
 *   q   [q_tokens, q_heads, head_dim]      out [q_tokens, q_heads, head_dim_v]
 *   k   [new_tokens, kv_heads, head_dim]   v   [new_tokens, kv_heads, head_dim_v]
 *   lse [q_tokens, q_heads] float, natural log of the softmax denominator over the scaled
 *       (softcapped) logits, the head's sink included: log(sum_j exp(s_j) + exp(sink))
 * DECODE, DRAFT_DECODE: q_lens NULL means 1 each. DRAFT_DECODE lists num_seqs * spec_topk
 * branch sequences, request after request (num_seqs counts requests).
 * TARGET_VERIFY: q_lens NULL means spec_draft_tokens each; tree_mask (spec_topk > 1) is
 * [num_seqs][spec_draft_tokens] rows, bit j of row i: draft i sees draft j; NULL is a chain.
 * DRAFT_EXTEND: q_lens are the accepted counts (<= spec_draft_tokens + 1).
 * CROSS: non-causal; kv_lens are encoder lengths; kv_new_lens[i] encoder tokens are given
 * to fattn_store_kv this step (NULL means none: the encoder KV is already cached). */
typedef struct fattn_batch {
  uint32_t struct_size; /* sizeof(fattn_batch), set by FATTN_BATCH_INIT */
  fattn_mode mode;
  uint32_t num_seqs;
  const uint32_t *seq_ids;     /* [num_seqs] (DRAFT_DECODE: [num_seqs * spec_topk]) */
  const uint32_t *q_lens;      /* [entries] or NULL, see above */
  const uint32_t *kv_lens;     /* [entries] or NULL: each sequence's length */
  const uint32_t *kv_new_lens; /* CROSS only, [entries] or NULL */
  const uint64_t *tree_mask;   /* TARGET_VERIFY with spec_topk > 1, or NULL */
} fattn_batch;
#define FATTN_BATCH_INIT {sizeof(fattn_batch), FATTN_MODE_DECODE, 0, NULL, NULL, NULL, NULL, NULL}

/* Streams are cudaStream_t passed as void* so that the header needs no CUDA; ignored on the
 * CPU backend. Pointers to q, k, v, out, lse are device pointers (host on the CPU backend).
 * fattn_plan, fattn_store_kv, fattn_attend and the fattn_graph_* calls run on the calling
 * thread's current CUDA device, which must be the context's (cudaSetDevice first): else
 * FATTN_ERR_STATE, the detail naming both devices. fattn_create and fattn_destroy make
 * the context's device current themselves (cudaSetDevice) and leave it current. Contexts on
 * several devices (ordinals below 64) may live in one process: device facts (SM count, PDL)
 * and kernel attributes are cached per device.
 * A context's steps (each fattn_plan, fattn_graph_launch or fattn_graph_plan with the calls or
 * the replay after it) share its metadata areas, so they must run on the device in the order
 * they were made: issue them on one stream, or order the streams yourself (cudaStreamWaitEvent). */

/* Validates the batch, ships page-table changes and step metadata; no sync, no allocation.
 * A rejected batch leaves every state unchanged. */
fattn_status fattn_plan(fattn_ctx *ctx, const fattn_batch *batch, void *stream);
/* Writes this step's new K and V of one layer into their pages (fp8: quantised). */
fattn_status fattn_store_kv(fattn_ctx *ctx, uint32_t layer, const void *k, const void *v,
                            void *stream);
/* Attention of one layer for the planned step. lse may be NULL. */
fattn_status fattn_attend(fattn_ctx *ctx, uint32_t layer, const void *q, void *out, float *lse,
                          void *stream);

/* --------------------------------------------------------------- graphs */

typedef void (*fattn_graph_fn)(void *user, void *stream);

/* Captures fn for (mode, bucket of batch_size) under cudaStreamCaptureModeGlobal; fn calls
 * fattn_store_kv / fattn_attend (and its own kernels) on the stream it is given, with buffers
 * that hold the bucket's query tokens (bucket x spec_topk for DRAFT_DECODE, x
 * spec_draft_tokens for TARGET_VERIFY, x (spec_draft_tokens + 1) for DRAFT_EXTEND). A body
 * that allocates or synchronises fails the capture (FATTN_ERR_CUDA). Needs a CUDA device and
 * the mode's bit in fattn_config.graph_modes. */
fattn_status fattn_graph_capture(fattn_ctx *ctx, fattn_mode mode, uint32_t batch_size,
                                 fattn_graph_fn fn, void *user);
/* Plans batch into the smallest bucket >= its size and launches that bucket's graph. The
 * batch is padded with entries that see nothing: their output rows are zeros. */
fattn_status fattn_graph_launch(fattn_ctx *ctx, const fattn_batch *batch, void *stream);

/* Graphs of your own: a capture of yours (a whole model step, with your projections between
 * the layers) that holds fattn's calls for (mode, bucket of batch_size).
 *   cudaStreamBeginCapture(s, ...); fattn_graph_begin(ctx, mode, bs, s);
 *   per layer: your kernels, fattn_store_kv(.., s), fattn_attend(.., s);
 *   fattn_graph_end(ctx); cudaStreamEndCapture(s, &graph); cudaGraphInstantiate(...);
 *   per step: fattn_graph_plan(ctx, &batch, s); cudaGraphLaunch(exec, s);
 * fattn_graph_begin needs stream to be capturing (else FATTN_ERR_INVALID); it points the step
 * at the bucket's static metadata area, as fattn_graph_capture does, and records the bucket's
 * prep node on stream: the store_kv / attend calls until fattn_graph_end record against that
 * area, with buffers that hold the bucket's query tokens (see fattn_graph_capture). Make them
 * on stream or on streams your capture orders after it; make no fattn_plan, fattn_graph_plan,
 * fattn_graph_launch or fattn_graph_capture until fattn_graph_end (the last three are refused,
 * FATTN_ERR_STATE; fattn_plan would re-point the step). One capture is open at a time.
 * fattn_graph_end closes it and gives the step binding before fattn_graph_begin back; if the
 * stream is no longer capturing (a captured call synchronised or allocated), FATTN_ERR_CUDA,
 * and the bucket is not made ready by it. Needs a CUDA device and the mode's bit in
 * fattn_config.graph_modes. */
fattn_status fattn_graph_begin(fattn_ctx *ctx, fattn_mode mode, uint32_t batch_size, void *stream);
fattn_status fattn_graph_end(fattn_ctx *ctx);
/* The host half of fattn_graph_launch: validates and plans batch into its bucket's area (padded
 * as there) and posts the staging slot to the bucket's mailbox; no sync, no allocation. The
 * bucket must have been made ready by fattn_graph_begin / fattn_graph_end (else
 * FATTN_ERR_STATE). Each successful fattn_graph_plan must be followed by exactly one launch of
 * a graph holding that bucket's fattn calls, on stream (or ordered after it), before the
 * context's next plan of any kind: the replay's prep node consumes the post. Otherwise the
 * bucket's next replay runs the step this plan posted (a replay reads the oldest unread post),
 * and the staging slot it took stays taken until a replay reads it: a plan that needs that
 * slot meanwhile waits forever. */
fattn_status fattn_graph_plan(fattn_ctx *ctx, const fattn_batch *batch, void *stream);

#ifdef __cplusplus
}
#endif
#endif /* FATTN_H */
