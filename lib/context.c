/* context.c: create and destroy. One device allocation and one pinned slab, carved by the
 * layout; backend choice per mode; every failure releases what was taken, in order. */
#include <cuda_runtime_api.h>
#include <stdlib.h>
#include <string.h>

#include "attn/backend.h"
#include "attn/devices.h"
#include "graph/graph.h"
#include "lib/internal.h"

#define FAIL(st, ...) fattn__failbuf(detail, detail_len, (st), __VA_ARGS__)

static int is_prefill_mode(uint32_t mode) {
  return mode == FATTN_MODE_PREFILL || mode == FATTN_MODE_TARGET_VERIFY ||
         mode == FATTN_MODE_DRAFT_EXTEND || mode == FATTN_MODE_CROSS;
}

/* AUTO gives MLA layers of more than this many q heads to FA3 (the Hopper MLA kernel) in every
 * mode: at 128 heads it ran 1.5-2x the portable kernel's speed from 4k contexts up. At this
 * many heads and fewer the portable kernel is faster for one query a sequence (DECODE,
 * DRAFT_DECODE: 16 heads fill a 16-row block, the Hopper tile is 64 rows), but the Hopper
 * kernel packs several queries' heads into one tile and reads the latent once for them, where
 * the portable one reads it once a query: the multi-token modes go to FA3 (16 heads, 2 queries:
 * 1.0-1.5x from 4k contexts up, 0.8-1.06x at 1k; H100, docs/performance.md, MLA). */
#define FATTN__MLA90_AUTO_MIN_HEADS 16u

/* The fastest backend built for this device: for MLA layers, fa3 (the Hopper MLA kernel) above
 * FATTN__MLA90_AUTO_MIN_HEADS or in the multi-token modes where it runs the latent, else fa2;
 * otherwise fa3 for the query-tiled modes on sm_90 where its kernel covers the shape (it hands
 * decode-like steps to fa2 itself), else fa2. */
static fattn_backend auto_backend(uint32_t mode, const fattn__layer_params *l) {
#ifdef FATTN_HAVE_SM90A
  if (l->mla)
    return fattn__fa3_available() && fattn__mla90_supports(l) &&
                   (l->num_q_heads > FATTN__MLA90_AUTO_MIN_HEADS || is_prefill_mode(mode))
               ? FATTN_BACKEND_FA3
               : FATTN_BACKEND_FA2;
  if (is_prefill_mode(mode) && fattn__fa3_available() && fattn__fa3_supports(l)) return FATTN_BACKEND_FA3;
#else
  (void)mode, (void)l;
#endif
  return FATTN_BACKEND_FA2;
}

/* AUTO picks the fastest backend built for the device; an explicit choice that cannot run
 * this model is an error now, never a wrong answer later. An MLA model on the GPU: an option
 * its kernel lacks, and a backend without its kernel for a mode, are refused here; CROSS, which
 * no MLA model has (it has no encoder), is left to no backend (fattn_ctx_backend says AUTO,
 * fattn_plan refuses it naming the mode). */
static fattn_status choose_backends(fattn_ctx *ctx, char *detail, size_t detail_len) {
  fattn__layer_params l = fattn__layer_params_for(ctx, 0);
  const int mla = l.mla && !ctx->n.on_cpu;
  fattn_status st;
  if (mla && (st = fattn__mla_options_check(&ctx->n, ctx->layers, ctx->model_has_sinks, detail, detail_len)))
    return st;
  for (uint32_t mode = 1; mode <= FATTN_MODE_COUNT; mode++) {
    fattn_backend want = is_prefill_mode(mode) ? ctx->n.cfg.prefill_backend : ctx->n.cfg.decode_backend;
    const char *which = is_prefill_mode(mode) ? "prefill_backend" : "decode_backend";
    if (ctx->n.on_cpu) {
      ctx->backend[mode] = FATTN_BACKEND_CPU;
      continue;
    }
    if (want == FATTN_BACKEND_AUTO) want = auto_backend(mode, &l);
    char gap[160];
    if (mla && fattn__mla_mode_check(want, mode, gap, sizeof gap)) {
      if (mode != FATTN_MODE_CROSS)
        return FAIL(FATTN_ERR_UNSUPPORTED, "%s %s: %s", which, want == FATTN_BACKEND_FA3 ? "FA3" : "FA2", gap);
      ctx->backend[mode] = FATTN_BACKEND_AUTO; /* no backend: fattn_plan refuses the mode */
      continue;
    }
    if (want == FATTN_BACKEND_FA3) {
#ifdef FATTN_HAVE_SM90A
      if (!fattn__fa3_available())
        return FAIL(FATTN_ERR_UNSUPPORTED, "%s FA3: device %d is not compute capability 9.0 (sm_90a)", which,
                    ctx->n.cfg.device);
#else
      return FAIL(FATTN_ERR_UNSUPPORTED, "%s FA3: not built (CUDA_ARCHS lacks 90a)", which);
#endif
    }
    if (!fattn__fa2_supports(&l))
      return FAIL(FATTN_ERR_UNSUPPORTED,
                  "%s FA2: no kernel for head_dim %u / head_dim_v %u, q_dtype %u, kv_dtype %u", which,
                  l.head_dim, l.head_dim_v, l.q_dtype, l.kv_dtype);
    ctx->backend[mode] = want;
  }
  return FATTN_OK;
}

/* fa3's TMA tensor maps, once per layer, when a mode runs FA3 and its tiles fit the pages;
 * otherwise fa3 gathers with cp.async and tmaps stays NULL. */
static fattn_status make_tmaps(fattn_ctx *ctx, char *detail, size_t detail_len) {
#ifdef FATTN_HAVE_SM90A
  int fa3 = 0;
  for (uint32_t mode = 1; mode <= FATTN_MODE_COUNT; mode++) fa3 |= ctx->backend[mode] == FATTN_BACKEND_FA3;
  if (!fa3) return FATTN_OK;
  const uint32_t L = ctx->n.model.num_layers;
  uint8_t *raw = fattn__heap_alloc(ctx->heap, (size_t)L * FATTN__TMAP_BYTES + FATTN__TMAP_ALIGN);
  if (!raw) return FAIL(FATTN_ERR_NOMEM, "fa3 tensor maps in the pinned slab");
  uint8_t *maps = (uint8_t *)fattn__align_up((uintptr_t)raw, FATTN__TMAP_ALIGN);
  for (uint32_t i = 0; i < L; i++) {
    fattn__layer_params l = fattn__layer_params_for(ctx, i);
    int err = fattn__fa3_encode_maps(&l, maps + (size_t)i * FATTN__TMAP_BYTES);
    if (err == (int)cudaErrorNotSupported) return FATTN_OK;
    if (err) return FAIL(FATTN_ERR_CUDA, "fa3 tensor map of layer %u: %s", i, cudaGetErrorString((cudaError_t)err));
  }
  ctx->tmaps = maps;
#else
  (void)ctx, (void)detail, (void)detail_len;
#endif
  return FATTN_OK;
}

static fattn_status open_device(const fattn__norm *n, uint32_t *num_sms, char *detail,
                                size_t detail_len) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    cudaGetLastError();
    return FAIL(FATTN_ERR_NO_DEVICE, "device %d: no CUDA device is present", n->cfg.device);
  }
  if (n->cfg.device >= count)
    return FAIL(FATTN_ERR_NO_DEVICE, "device %d: only %d CUDA devices", n->cfg.device, count);
  if (n->cfg.device >= FATTN__MAX_DEVICES)
    return FAIL(FATTN_ERR_UNSUPPORTED, "device %d: fattn serves device ordinals below %d", n->cfg.device,
                FATTN__MAX_DEVICES);
  /* The context's device stays current after fattn_create: giving the caller's back could
   * start a CUDA context on a device the process never meant to use. */
  struct cudaDeviceProp prop;
  if (cudaSetDevice(n->cfg.device) != cudaSuccess ||
      cudaGetDeviceProperties(&prop, n->cfg.device) != cudaSuccess)
    return FAIL(FATTN_ERR_CUDA, "device %d: %s", n->cfg.device, cudaGetErrorString(cudaGetLastError()));
  if (prop.major < 8)
    return FAIL(FATTN_ERR_UNSUPPORTED, "device %d: compute capability %d.%d, fattn needs 8.0+",
                n->cfg.device, prop.major, prop.minor);
  *num_sms = (uint32_t)prop.multiProcessorCount;
  (void)fattn__pdl_on();
  return FATTN_OK;
}

fattn_status fattn__on_device(fattn_ctx *ctx, const char *call) {
  if (ctx->device < 0) return FATTN_OK;
  const int dev = fattn__current_device();
  if (dev == ctx->device) return FATTN_OK;
  return fattn__fail(ctx, FATTN_ERR_STATE,
                     "%s: the calling thread's current CUDA device is %d, the context's is device %d "
                     "(cudaSetDevice(%d) first)",
                     call, dev, ctx->device, ctx->device);
}

static void release(fattn_ctx *ctx) {
  int gpu = !ctx->n.on_cpu;
  fattn__graphs_close(ctx);
  fattn__heap_close(ctx->heap);
  if (gpu) cudaFree(ctx->dev);
  else free(ctx->dev);
  void *slab = ctx->pinned;
  if (gpu) cudaFreeHost(slab);
  else free(slab);
}

/* The slab holds the context itself, the staging ring and the heap, zeroed. */
static fattn_status take_memory(const fattn__norm *n, const fattn__layout *lay,
                                const fattn_memory_report *r, fattn_ctx **out, char *detail,
                                size_t detail_len) {
  void *slab = NULL;
  if (n->on_cpu) {
    if (posix_memalign(&slab, 4096, r->pinned_bytes) != 0) slab = NULL;
  } else if (cudaHostAlloc(&slab, r->pinned_bytes, cudaHostAllocMapped) != cudaSuccess) {
    cudaGetLastError();
    slab = NULL;
  }
  if (!slab) return FAIL(FATTN_ERR_NOMEM, "pinned slab of %llu bytes", (unsigned long long)r->pinned_bytes);
  memset(slab, 0, r->pinned_bytes);
  fattn_ctx *ctx = (fattn_ctx *)slab;
  ctx->pinned = (uint8_t *)slab;
  ctx->n = *n;
  ctx->lay = *lay;
  ctx->report = *r;
  ctx->device = n->on_cpu ? -1 : n->cfg.device;
  ctx->pinned_dev = ctx->pinned;
  void *slab_dev = NULL; /* the prep kernel reads staging slots in place through this mapping */
  if (!n->on_cpu && cudaHostGetDevicePointer(&slab_dev, slab, 0) != cudaSuccess) {
    cudaGetLastError();
    release(ctx);
    return FAIL(FATTN_ERR_UNSUPPORTED, "device %d: cannot map the pinned slab (zero-copy staging needs it)",
                n->cfg.device);
  }
  if (slab_dev) ctx->pinned_dev = (uint8_t *)slab_dev;
  void *dev = NULL;
  if (n->on_cpu) {
    if (posix_memalign(&dev, FATTN__ALIGN, r->device_bytes ? r->device_bytes : FATTN__ALIGN) != 0) dev = NULL;
  } else if (cudaMalloc(&dev, r->device_bytes) != cudaSuccess) {
    cudaGetLastError();
    dev = NULL;
  }
  if (!dev) {
    release(ctx);
    return FAIL(FATTN_ERR_NOMEM, "device allocation of %llu bytes", (unsigned long long)r->device_bytes);
  }
  ctx->dev = (uint8_t *)dev;
  ctx->ring = ctx->pinned + lay->pin_off_ring;
  if (fattn__heap_open(ctx->pinned + lay->pin_off_heap, lay->heap_bytes, &ctx->heap) != FATTN_OK) {
    ctx->heap = NULL;
    release(ctx);
    return FAIL(FATTN_ERR_NOMEM, "jemalloc arena over the pinned slab");
  }
  *out = ctx;
  return FATTN_OK;
}

/* Model data the kernels read: sinks on the device, layer options on the host. */
static fattn_status copy_model(fattn_ctx *ctx, const fattn_model *model, char *detail,
                               size_t detail_len) {
  uint32_t L = ctx->n.model.num_layers, H = ctx->n.model.num_q_heads;
  ctx->layers = fattn__heap_alloc(ctx->heap, (size_t)L * sizeof(fattn_layer_opts));
  ctx->done = fattn__heap_alloc(ctx->heap, ctx->n.staging_slots * sizeof(uint64_t));
  if (!ctx->layers || !ctx->done) return FAIL(FATTN_ERR_NOMEM, "host tables in the pinned slab");
  memset(ctx->done, 0, ctx->n.staging_slots * sizeof(uint64_t));
  const fattn_layer_opts dflt = FATTN_LAYER_OPTS_INIT;
  ctx->model_has_sinks = model->sinks != NULL;
  for (uint32_t i = 0; i < L; i++) ctx->layers[i] = model->layers ? model->layers[i] : dflt;
  uint8_t *sinks = ctx->dev + ctx->lay.dev_off[FATTN_REGION_MODEL];
  uint8_t *table = ctx->dev + ctx->lay.dev_off[FATTN_REGION_PAGE_TABLE];
  uint64_t table_bytes = ctx->report.region_bytes[FATTN_REGION_PAGE_TABLE];
  uint8_t *ws = ctx->dev + ctx->lay.dev_off[FATTN_REGION_SPLIT_WORKSPACE]; /* scheduler words start at 0 */
  uint64_t ws_bytes = ctx->report.region_bytes[FATTN_REGION_SPLIT_WORKSPACE];
  if (ctx->n.on_cpu) {
    if (model->sinks) memcpy(sinks, model->sinks, (size_t)L * H * sizeof(float));
    memset(table, 0xff, table_bytes);
    memset(ws, 0, ws_bytes);
    return FATTN_OK;
  }
  if ((model->sinks && cudaMemcpy(sinks, model->sinks, (size_t)L * H * sizeof(float),
                                  cudaMemcpyHostToDevice) != cudaSuccess) ||
      cudaMemset(table, 0xff, table_bytes) != cudaSuccess || cudaMemset(ws, 0, ws_bytes) != cudaSuccess)
    return FAIL(FATTN_ERR_CUDA, "initialising the device tables: %s", cudaGetErrorString(cudaGetLastError()));
  return FATTN_OK;
}

fattn_status fattn_create(const fattn_config *cfg, const fattn_model *model, fattn_ctx **out,
                          char *detail, size_t detail_len) {
  if (detail && detail_len) detail[0] = '\0';
  if (!out) return FAIL(FATTN_ERR_INVALID, "out must not be NULL");
  *out = NULL;
  fattn__norm n;
  fattn__layout lay;
  fattn_memory_report r = FATTN_MEMORY_REPORT_INIT;
  fattn_model m_local; /* the caller's arrays (sinks, layers), read at create: the normalised copy */
  fattn_status st = fattn__normalize(cfg, model, &n, detail, detail_len); /* keeps no caller pointers */
  if (!st) model = fattn__abi_read(&fattn__abi_model, model, &m_local);
  if (!st) st = fattn__layout_compute(&n, &lay, &r, detail, detail_len);
  uint32_t sms = 132; /* the CPU backend plans as for an H200 so that plans are comparable */
  if (!st && !n.on_cpu) st = open_device(&n, &sms, detail, detail_len);
  if (st) return st;
  fattn_ctx *ctx = NULL;
  if ((st = take_memory(&n, &lay, &r, &ctx, detail, detail_len))) return st;
  ctx->num_sms = sms;
  ctx->decode_resident = n.model.mla_latent_dim
                             ? FATTN__DECODE_RESIDENT_MLA
                             : fattn__decode_resident(n.cfg.kv_dtype == FATTN_DTYPE_FP8_E4M3, n.model.head_dim,
                                                      n.model.num_q_heads / n.model.num_kv_heads);
  if ((st = copy_model(ctx, model, detail, detail_len)) || (st = choose_backends(ctx, detail, detail_len)) ||
      (st = make_tmaps(ctx, detail, detail_len)) ||
      (st = fattn__pages_init(ctx)) || (st = fattn__graphs_init(ctx))) {
    if (st == FATTN_ERR_NOMEM && detail && detail_len && !detail[0])
      FAIL(st, "host tables: the pinned slab's heap is too small");
    release(ctx);
    return st;
  }
  ctx->detail[0] = '\0';
  *out = ctx;
  return FATTN_OK;
}

fattn_status fattn_destroy(fattn_ctx *ctx, int force) {
  if (!ctx) return FATTN_OK;
  uint32_t open = fattn__seqs_open(&ctx->pages);
  if (open && !force)
    return fattn__fail(ctx, FATTN_ERR_BUSY, "%u sequences still open (close them or force)", open);
  if (ctx->device >= 0 && fattn__current_device() != ctx->device) cudaSetDevice(ctx->device); /* left current */
  release(ctx);
  return FATTN_OK;
}

const char *fattn_detail(const fattn_ctx *ctx) { return ctx ? ctx->detail : "no context"; }

const fattn_memory_report *fattn_ctx_memory(const fattn_ctx *ctx) { return ctx ? &ctx->report : NULL; }

fattn_backend fattn_ctx_backend(const fattn_ctx *ctx, fattn_mode mode) {
  if (!ctx) return FATTN_BACKEND_AUTO;
  if (mode < FATTN_MODE_PREFILL || mode > FATTN_MODE_COUNT) {
    fattn__fail(ctx, FATTN_ERR_INVALID, "fattn_ctx_backend: mode %d: unknown", mode);
    return FATTN_BACKEND_AUTO;
  }
  return ctx->backend[mode];
}

fattn_status fattn_get_stats(const fattn_ctx *ctx, fattn_stats *stats) {
  if (!ctx) return FATTN_ERR_INVALID;
  if (!stats) return fattn__fail(ctx, FATTN_ERR_INVALID, "fattn_get_stats: stats must not be NULL");
  fattn_status st = fattn__abi_check(&fattn__abi_stats, stats, fattn__detail_buf(ctx), sizeof ctx->detail);
  if (st) return st;
  const fattn_stats s = {sizeof(fattn_stats),
                         ctx->pages.num_pages,
                         ctx->pages.free_top,
                         fattn__seqs_open(&ctx->pages),
                         ctx->pages.allocs,
                         ctx->pages.frees,
                         ctx->steps_planned,
                         ctx->staging_waits,
                         ctx->pages.cow_copies};
  fattn__abi_write(&fattn__abi_stats, stats, &s);
  return FATTN_OK;
}

fattn__layer_params fattn__layer_params_for(const fattn_ctx *ctx, uint32_t layer) {
  const fattn__norm *n = &ctx->n;
  const fattn_layer_opts *o = &ctx->layers[layer];
  fattn__layer_params l;
  memset(&l, 0, sizeof l);
  l.num_q_heads = n->model.num_q_heads;
  l.num_kv_heads = n->model.num_kv_heads;
  l.head_dim = n->model.head_dim;
  l.head_dim_v = n->head_dim_v;
  l.mla = n->model.mla_latent_dim != 0;
  l.page_size = n->cfg.page_size;
  l.pages_per_seq = ctx->lay.pages_per_seq;
  l.num_pages = ctx->lay.num_pages;
  l.q_dtype = (uint32_t)n->cfg.q_dtype;
  l.kv_dtype = (uint32_t)n->cfg.kv_dtype;
  l.compute_dtype = n->cfg.compute_dtype == FATTN_DTYPE_FP8_E4M3 ? (uint32_t)FATTN_DTYPE_FP8_E4M3 : l.q_dtype;
  l.scale = n->model.softmax_scale;
  l.softcap = n->model.logit_softcap;
  l.window = o->sliding_window;
  l.chunk = o->chunk_size;
  l.k_scale = n->cfg.kv_dtype == FATTN_DTYPE_FP8_E4M3 ? o->k_scale : 1.0f;
  l.v_scale = n->cfg.kv_dtype == FATTN_DTYPE_FP8_E4M3 ? o->v_scale : 1.0f;
  l.sinks = ctx->model_has_sinks
                ? (const float *)(ctx->dev + ctx->lay.dev_off[FATTN_REGION_MODEL]) + (size_t)layer * l.num_q_heads
                : NULL;
  l.k_pool = ctx->dev + ctx->lay.dev_off[FATTN_REGION_K_POOL] + (uint64_t)layer * ctx->lay.k_layer_bytes;
  l.v_pool = l.mla ? NULL
                   : ctx->dev + ctx->lay.dev_off[FATTN_REGION_V_POOL] + (uint64_t)layer * ctx->lay.v_layer_bytes;
  l.page_table = (int32_t *)(ctx->dev + ctx->lay.dev_off[FATTN_REGION_PAGE_TABLE]);
  l.tmaps = ctx->tmaps ? (const uint8_t *)ctx->tmaps + (size_t)layer * FATTN__TMAP_BYTES : NULL;
  return l;
}
