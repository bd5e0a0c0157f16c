/* kernels.c: `fattn-bench decode`, `prefill` and `mla`. Times fattn_attend on paged KV filled
 * with random data, beside a pure-read kernel over the same pages (the roofline). */
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench.h"
#include "lib/internal.h"
#include "tests/support_gpu.h"

int fattn_bench_ring_pages(const fattn__layer_params *l, const fattn__step_params *s, uint32_t entries,
                           float *sink, void *stream);
int fattn_bench_hold(uint32_t us, void *stream);
double fattn_bench_hold_mhz(void);
int fattn_bench_read_pages(const fattn__layer_params *l, const fattn__step_params *s, uint32_t entries,
                           float *sink, void *stream);

typedef struct kshape {
  fattn_mode mode;
  uint32_t bs, q_len, kv_len, page, hq, hkv, d;
  fattn_dtype kv_dtype;
  const uint32_t *lens; /* a varlen prefill: entry i's q_len = kv_len = lens[i] (q_len, kv_len: the longest) */
  int mla;              /* absorbed MLA: hkv 1, d the latent row (576), O 512 wide, no V pool */
} kshape;

/* DeepSeek-V3's absorbed MLA: a latent row of 512 (V) and 64 rope dims (K is the 576). */
#define MLA_LATENT 512u
#define MLA_ROPE 64u

/* What one timed shape gave: attend's and the pure read's medians, and the work they did. */
typedef struct kresult {
  double ms, read_ms, bytes, flops;
} kresult;

/* `prefill --backend fa2|fa3`: the prefill-side backend every context of the run uses. */
static fattn_backend prefill_backend = FATTN_BACKEND_AUTO;
/* `prefill --kv bf16|fp8` and `--compute bf16|fp8`: the cache of the prefill rows, and the
 * config's compute_dtype of every context of the run (0: Q's type; fp8 implies an fp8 cache). */
static fattn_dtype prefill_kv = FATTN_DTYPE_BF16, compute_dtype;
/* `decode --max-splits N`: the split-KV bound of every context of the run (0: the default). */
static uint32_t max_splits;
/* `decode --backend fa2|fa3`: the decode-side backend (fa3 hands decode steps to fa2's kernels
 * unless the library was built with FA3_TAKES_DECODE=1, as measured in docs/performance.md). */
static fattn_backend decode_backend = FATTN_BACKEND_AUTO;
/* `decode --roofline ring`: the read column times a decode block's copy ring alone over the
 * same pages (bench/read_pages.cu) instead of plain whole-page reads. */
static int roofline_ring;
static int host_timing; /* --timing host: a timed call's span includes the host's launches */
/* `decode --bs N`: only the shapes of that batch (0: all); `--repeat N`: the shapes N times,
 * each time in a context of its own (fresh pool memory), to tell a slow run from a slow pool */
static uint32_t only_bs, repeats = 1;

static void fail(const char *what, const char *why) {
  fprintf(stderr, "%s: %s\n", what, why);
  exit(1);
}

/* `--backend fa2|fa3` into *b; 0 where opt and val are not that option. */
static int backend_arg(const char *opt, const char *val, fattn_backend *b) {
  if (strcmp(opt, "--backend") != 0) return 0;
  if (strcmp(val, "fa2") == 0) *b = FATTN_BACKEND_FA2;
  else if (strcmp(val, "fa3") == 0) *b = FATTN_BACKEND_FA3;
  else return 0;
  return 1;
}

/* `opt bf16|fp8` into *t; 0 where opt and val are not that option. */
static int dtype_arg(const char *opt, const char *want, const char *val, fattn_dtype *t) {
  if (strcmp(opt, want) != 0) return 0;
  if (strcmp(val, "bf16") == 0) *t = FATTN_DTYPE_BF16;
  else if (strcmp(val, "fp8") == 0) *t = FATTN_DTYPE_FP8_E4M3;
  else return 0;
  return 1;
}

/* The dtype names of the rows and the CSV. */
static const char *dtype_name(fattn_dtype t) { return t == FATTN_DTYPE_FP8_E4M3 ? "fp8" : "bf16"; }

/* The columns of decode.csv and prefill.csv; compute_dtype last, so that the columns before it
 * keep their places (tools/prefill_flow.sh cuts them by number). */
#define KERNEL_CSV_HEADER "mode,bs,q,kv,page,hq,hkv,d,kv_dtype,ms,gbps,read_gbps,tflops,mhz,read_mhz,compute_dtype\n"

/* A one-layer context holding bs sequences of kv_len slots whose pages interleave (grown a
 * page at a time, round robin), with random K and V. */
static fattn_ctx *make_ctx(const kshape *k, uint32_t *ids) {
  fattn_config c = FATTN_CONFIG_INIT;
  fattn_model m = FATTN_MODEL_INIT;
  m.num_layers = 1, m.num_q_heads = k->hq, m.num_kv_heads = k->hkv, m.head_dim = k->d;
  if (k->mla) m.head_dim_v = m.mla_latent_dim = MLA_LATENT, m.mla_rope_dim = k->d - MLA_LATENT;
  /* An fp8 pool is filled with e4m3(N(0, 1)) bytes directly (below): at scale 1 they read as the
   * 16-bit rows' N(0, 1) data, within e4m3's range (|x| <= 448) with room to spare. */
  const fattn_layer_opts fp8_opts = {FATTN_NO_WINDOW, 0, 1.0f, 1.0f};
  if (k->kv_dtype == FATTN_DTYPE_FP8_E4M3) m.layers = &fp8_opts;
  c.device = 0;
  c.kv_dtype = k->kv_dtype;
  c.compute_dtype = compute_dtype;
  c.prefill_backend = prefill_backend;
  c.decode_backend = decode_backend;
  c.max_splits = max_splits;
  c.page_size = k->page;
  c.max_batch = k->bs;
  c.max_seq_len = k->kv_len;
  c.kv_budget_pages = (uint32_t)((uint64_t)k->bs * ((k->kv_len + k->page - 1) / k->page) + 1);
  c.max_q_tokens = k->bs * k->q_len;
  c.max_encoder_len = k->mode == FATTN_MODE_CROSS ? k->kv_len : 0;
  if (k->mode == FATTN_MODE_TARGET_VERIFY) c.spec_topk = 1, c.spec_steps = 1, c.spec_draft_tokens = k->q_len;
  char detail[256];
  fattn_ctx *ctx;
  if (fattn_create(&c, &m, &ctx, detail, sizeof detail)) fail("fattn_create", detail);
  for (uint32_t i = 0; i < k->bs; i++) fattn_seq_open(ctx, &ids[i]);
  for (uint32_t len = k->page; len < k->kv_len + k->page; len += k->page)
    for (uint32_t i = 0; i < k->bs; i++) {
      const uint32_t kv = k->lens ? k->lens[i] : k->kv_len;
      if (len < kv + k->page && fattn_seq_reserve(ctx, ids[i], len < kv ? len : kv)) fail("reserve", fattn_detail(ctx));
    }
  fattn__layer_params l = fattn__layer_params_for(ctx, 0);
  size_t n = (size_t)l.num_pages * l.page_size * l.num_kv_heads * l.head_dim;
  if (fattn_test_gpu_randn(l.k_pool, n, k->kv_dtype, 1.0f, 11) ||
      (l.v_pool && fattn_test_gpu_randn(l.v_pool, n, k->kv_dtype, 1.0f, 12)))
    fail("fill", "cuRAND");
  return ctx;
}

/* Times fn-like work: 3 warm-ups, then the median of 21 event-timed runs. which 0: attend,
 * 1: the pure-read kernel over the same pages. *mhz: the median SM clock the runs started at
 * (the holding kernel's; 0 with host timing, which runs none). */
static double time_it(fattn_ctx *ctx, int which, const void *q, void *out, uint32_t entries, float *sink,
                      double *mhz) {
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  fattn__layer_params l = fattn__layer_params_for(ctx, 0);
  fattn__step_params s;
  memset(&s, 0, sizeof s);
  s.hdr = ctx->step.hdr, s.entries = ctx->step.entries, s.cap_entries = entries, s.max_splits = ctx->n.max_splits;
  double t[21], clk[21];
  for (int r = -3; r < 21; r++) {
    if (!host_timing && fattn_bench_hold(50, NULL)) fail("hold kernel", "launch failed");
    cudaEventRecord(a, 0);
    int e = which ? (roofline_ring ? fattn_bench_ring_pages : fattn_bench_read_pages)(&l, &s, entries, sink, NULL)
                  : (int)fattn_attend(ctx, 0, q, out, NULL, NULL);
    cudaEventRecord(b, 0);
    cudaEventSynchronize(b);
    if (e) fail("timed call", which ? "read kernel" : fattn_detail(ctx));
    float ms;
    cudaEventElapsedTime(&ms, a, b);
    if (r >= 0) t[r] = ms, clk[r] = host_timing ? 0. : fattn_bench_hold_mhz();
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  *mhz = fattn_bench_median(clk, 21);
  return fattn_bench_median(t, 21);
}

/* Times one shape and prints its row; csv (may be NULL) gets the row too. */
static kresult run_shape(const kshape *k, FILE *csv) {
  kresult res = {0, 0, 0, 0};
  if (roofline_ring && (k->d != 128 || k->kv_dtype == FATTN_DTYPE_FP8_E4M3)) return res; /* the ring's shapes only */
  uint32_t *ids = malloc(k->bs * sizeof *ids), *q_lens = malloc(k->bs * sizeof *q_lens);
  fattn_ctx *ctx = make_ctx(k, ids);
  uint32_t qn = 0;
  double seen = 0; /* query-slot pairs a head sees (a causal query: the prefix and itself) */
  for (uint32_t i = 0; i < k->bs; i++) {
    const double q = k->lens ? k->lens[i] : k->q_len, kv = k->lens ? k->lens[i] : k->kv_len;
    q_lens[i] = (uint32_t)q;
    qn += q_lens[i];
    seen += k->mode == FATTN_MODE_PREFILL ? q * (kv - q) + q * (q + 1) / 2 : q * kv;
  }
  fattn_batch b = FATTN_BATCH_INIT;
  b.mode = k->mode, b.num_seqs = k->bs, b.seq_ids = ids, b.q_lens = q_lens;
  void *q, *out;
  float *sink;
  const uint32_t dv = k->mla ? MLA_LATENT : k->d;
  cudaMalloc(&q, (size_t)qn * k->hq * k->d * 2);
  cudaMalloc(&out, (size_t)qn * k->hq * dv * 2);
  cudaMalloc((void **)&sink, 1 << 20);
  fattn_test_gpu_randn(q, (size_t)qn * k->hq * k->d, FATTN_DTYPE_BF16, 1.0f, 13);
  if (fattn_plan(ctx, &b, NULL)) fail("fattn_plan", fattn_detail(ctx));
  double mhz, read_mhz;
  double ms = time_it(ctx, 0, q, out, k->bs, sink, &mhz), read_ms = time_it(ctx, 1, q, out, k->bs, sink, &read_mhz);
  double elem = k->kv_dtype == FATTN_DTYPE_FP8_E4M3 ? 1 : 2;
  const double bytes = (double)k->bs * k->kv_len * k->hkv * (k->d + (k->mla ? 0u : dv)) * elem; /* MLA: V is K's head */
  const double flops = 2.0 * k->hq * seen * (k->d + dv);
  const char *mode = k->mla ? "mla" : k->mode == FATTN_MODE_DECODE ? "decode" : k->mode == FATTN_MODE_TARGET_VERIFY ? "verify"
                     : k->lens ? "varlen" : k->mode == FATTN_MODE_PREFILL ? "causal" : "noncausal";
  const char *dt = dtype_name(k->kv_dtype), *gemm = dtype_name(compute_dtype);
  printf("%-9s %4u %6u %6u %4u %3u/%-2u %4u %-4s %-4s %9.4f %8.1f %8.1f %6.3f %8.1f %5.0f/%-4.0f\n", mode, k->bs,
         k->q_len, k->kv_len, k->page, k->hq, k->hkv, k->d, dt, gemm, ms, bytes / ms / 1e6, bytes / read_ms / 1e6,
         read_ms / ms, flops / ms / 1e9, mhz, read_mhz);
  if (csv)
    fprintf(csv, "%s,%u,%u,%u,%u,%u,%u,%u,%s,%.6f,%.2f,%.2f,%.2f,%.0f,%.0f,%s\n", mode, k->bs, k->q_len, k->kv_len,
            k->page, k->hq, k->hkv, k->d, dt, ms, bytes / ms / 1e6, bytes / read_ms / 1e6, flops / ms / 1e9, mhz,
            read_mhz, gemm);
  fflush(stdout);
  cudaFree(q), cudaFree(out), cudaFree(sink);
  fattn_destroy(ctx, 1);
  free(ids), free(q_lens);
  res.ms = ms, res.read_ms = read_ms, res.bytes = bytes, res.flops = flops;
  return res;
}

/* gemm: the prefill-side GEMMs' type (compute_dtype; Q's bf16 where not set). */
static void header(void) {
  printf("%-9s %4s %6s %6s %4s %6s %4s %-4s %-4s %9s %8s %8s %6s %8s %10s\n", "mode", "bs", "q", "kv", "page", "heads",
         "d", "kv", "gemm", "ms", "GB/s", "read", "frac", "TFLOP/s", "MHz");
}

/* Options: --max-splits N (the split-KV bound of the contexts; default 32), --backend fa2|fa3
 * (the decode side's; default AUTO), --roofline read|ring (the read column's kernel), --timing
 * gpu|host (default gpu: each timed call queued behind a 50 us holding kernel, so that its
 * events time the GPU's work; host: from an idle GPU, the host's launch latency included),
 * --bs N (only that batch's shapes), --repeat N (the shapes N times). The MHz column: the median
 * SM clock at the start of the attend's and the read's timed calls (GPU timing only). */
int fattn_bench_decode(int argc, char **argv) {
  for (int i = 1; i < argc; i += 2) {
    if (i + 1 < argc && strcmp(argv[i], "--roofline") == 0 &&
        (strcmp(argv[i + 1], "read") == 0 || strcmp(argv[i + 1], "ring") == 0)) {
      roofline_ring = strcmp(argv[i + 1], "ring") == 0;
      continue;
    }
    if (i + 1 < argc && strcmp(argv[i], "--timing") == 0 &&
        (strcmp(argv[i + 1], "gpu") == 0 || strcmp(argv[i + 1], "host") == 0)) {
      host_timing = strcmp(argv[i + 1], "host") == 0;
      continue;
    }
    if (i + 1 >= argc || !((strcmp(argv[i], "--max-splits") == 0 && sscanf(argv[i + 1], "%u", &max_splits) == 1) ||
                           (strcmp(argv[i], "--bs") == 0 && sscanf(argv[i + 1], "%u", &only_bs) == 1) ||
                           (strcmp(argv[i], "--repeat") == 0 && sscanf(argv[i + 1], "%u", &repeats) == 1 &&
                            repeats >= 1u && repeats <= 100u) ||
                           backend_arg(argv[i], argv[i + 1], &decode_backend)))
      fail("fattn-bench decode", "options: --max-splits N, --backend fa2|fa3, --roofline read|ring, --timing gpu|host, "
                                 "--bs N, --repeat N (1..100)");
  }
  if (!fattn_bench_has_gpu()) fail("fattn-bench decode", "needs a CUDA device");
  static const kshape shapes[] = {
      {FATTN_MODE_DECODE, 64, 1, 4096, 16, 32, 8, 128, FATTN_DTYPE_BF16, NULL, 0},
      {FATTN_MODE_DECODE, 64, 1, 4096, 128, 32, 8, 128, FATTN_DTYPE_BF16, NULL, 0},
      {FATTN_MODE_DECODE, 128, 1, 8192, 16, 32, 8, 128, FATTN_DTYPE_BF16, NULL, 0},
      {FATTN_MODE_DECODE, 128, 1, 8192, 128, 32, 8, 128, FATTN_DTYPE_BF16, NULL, 0},
      {FATTN_MODE_DECODE, 1, 1, 32768, 16, 32, 8, 128, FATTN_DTYPE_BF16, NULL, 0},
      {FATTN_MODE_DECODE, 1, 1, 32768, 128, 32, 8, 128, FATTN_DTYPE_BF16, NULL, 0},
      {FATTN_MODE_DECODE, 64, 1, 4096, 1, 32, 8, 128, FATTN_DTYPE_BF16, NULL, 0},
      {FATTN_MODE_DECODE, 64, 1, 4096, 16, 32, 8, 128, FATTN_DTYPE_FP8_E4M3, NULL, 0},
      {FATTN_MODE_DECODE, 128, 1, 8192, 16, 32, 8, 128, FATTN_DTYPE_FP8_E4M3, NULL, 0},
      {FATTN_MODE_TARGET_VERIFY, 64, 8, 4096, 16, 32, 8, 128, FATTN_DTYPE_BF16, NULL, 0},
  };
  FILE *csv = fopen("build/decode.csv", "w");
  if (!csv) fail("build/decode.csv", "cannot write");
  fprintf(csv, KERNEL_CSV_HEADER);
  printf("fattn decode attention (Llama-3.1-8B heads), one layer, median of 21, max_splits %u; read = %s over the same pages;"
         " %s\n",
         max_splits ? max_splits : 32u, roofline_ring ? "a decode block's copy ring alone" : "pure-read kernel",
         host_timing ? "host timing (launch latency included)" : "GPU timing (calls queued behind a holding kernel)");
  header();
  for (uint32_t r = 0; r < repeats; r++)
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
      if (!only_bs || shapes[i].bs == only_bs) run_shape(&shapes[i], csv);
  fclose(csv);
  printf("csv: build/decode.csv\n");
  return 0;
}

/* The shapes serving engines run most, Llama-3.1-8B heads (32 q / 8 kv, d 128): extend (chunked
 * prefill) of q 512 / 2k / 8k new tokens over cached prefixes of 0 / 8k / 32k, bs 1 and 16, at
 * pages 16 and 128; then a varlen batch of 16 prompts drawn from 64 to 8k tokens. */
static void serve_rows(FILE *csv) {
  static const uint32_t qs[3] = {512, 2048, 8192}, prefixes[3] = {0, 8192, 32768}, bss[2] = {1, 16}, pages[2] = {16, 128};
  for (int pi = 0; pi < 2; pi++)
    for (int bi = 0; bi < 2; bi++)
      for (int qi = 0; qi < 3; qi++)
        for (int xi = 0; xi < 3; xi++) {
          kshape k = {FATTN_MODE_PREFILL, bss[bi], qs[qi], prefixes[xi] + qs[qi], pages[pi], 32, 8, 128, prefill_kv,
                      NULL, 0};
          run_shape(&k, csv);
        }
  uint32_t lens[16], longest = 0, seed = 12345u;
  for (int i = 0; i < 16; i++) { /* log-uniform over [64, 8192], a fixed draw */
    seed = seed * 1664525u + 1013904223u;
    lens[i] = (uint32_t)(64.0 * exp2((double)(seed >> 8) / (double)(1u << 24) * 7.0));
    longest = lens[i] > longest ? lens[i] : longest;
  }
  for (int pi = 0; pi < 2; pi++) {
    kshape k = {FATTN_MODE_PREFILL, 16, longest, longest, pages[pi], 32, 8, 128, prefill_kv, lens, 0};
    run_shape(&k, csv);
  }
}

/* The FA3 paper's setup: 16k tokens a batch, hidden 2048, bf16, causal and non-causal; then
 * the same d 128 x 8k shape over other page sizes, extend (q 512 over an 8k prefix), and the
 * serving rows (serve_rows). Options: --backend fa2|fa3 (default AUTO), --csv PATH, --rows
 * paper|serve|all (default all), --only D,SEQ[,causal] (that paper shape alone, non-causal
 * unless causal is 1: for profilers), --kv bf16|fp8 (the cache; default bf16), --compute
 * bf16|fp8 (compute_dtype; fp8 takes an fp8 cache; default bf16: 16-bit MMAs). */
int fattn_bench_prefill(int argc, char **argv) {
  const char *path = "build/prefill.csv", *rows = "all";
  unsigned only_d = 0, only_seq = 0, only_causal = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (backend_arg(argv[i], argv[i + 1], &prefill_backend) || dtype_arg(argv[i], "--kv", argv[i + 1], &prefill_kv) ||
        dtype_arg(argv[i], "--compute", argv[i + 1], &compute_dtype))
      continue;
    if (strcmp(argv[i], "--csv") == 0) path = argv[i + 1];
    else if (strcmp(argv[i], "--rows") == 0 &&
             (!strcmp(argv[i + 1], "paper") || !strcmp(argv[i + 1], "serve") || !strcmp(argv[i + 1], "all")))
      rows = argv[i + 1];
    else if (strcmp(argv[i], "--only") == 0 && sscanf(argv[i + 1], "%u,%u,%u", &only_d, &only_seq, &only_causal) >= 2)
      continue;
    else fail("fattn-bench prefill", "options: --backend fa2|fa3, --csv PATH, --rows paper|serve|all, --only D,SEQ[,1], "
                                     "--kv bf16|fp8, --compute bf16|fp8");
  }
  if (compute_dtype == FATTN_DTYPE_FP8_E4M3) prefill_kv = FATTN_DTYPE_FP8_E4M3; /* e4m3 GEMMs read an fp8 cache */
  if (!fattn_bench_has_gpu()) fail("fattn-bench prefill", "needs a CUDA device");
  FILE *csv = fopen(path, "w");
  if (!csv) fail(path, "cannot write");
  fprintf(csv, KERNEL_CSV_HEADER);
  printf("fattn prefill attention (FA3 paper setup: 16k tokens, hidden 2048, page 128; then serving shapes),"
         " median of 21; GPU timing (calls queued behind a holding kernel); kv %s, gemm %s\n",
         dtype_name(prefill_kv), dtype_name(compute_dtype));
  header();
  static const uint32_t dims[3] = {64, 128, 256}, lens[6] = {512, 1024, 2048, 4096, 8192, 16384};
  const int paper = strcmp(rows, "serve") != 0, serve = strcmp(rows, "paper") != 0 && !only_d;
  for (int di = 0; di < 3 && paper; di++)
    for (int li = 0; li < 6; li++)
      for (int causal = 1; causal >= 0; causal--) {
        if (only_d && (dims[di] != only_d || lens[li] != only_seq || causal != (int)(only_causal == 1))) continue;
        uint32_t len = lens[li], h = 2048 / dims[di];
        kshape k = {causal ? FATTN_MODE_PREFILL : FATTN_MODE_CROSS, 16384 / len, len, len, 128, h, h, dims[di],
                    prefill_kv, NULL, 0};
        run_shape(&k, csv);
      }
  static const uint32_t pages[3] = {16, 64, 256};
  for (int p = 0; p < 3 && paper && !only_d; p++) {
    kshape k = {FATTN_MODE_CROSS, 2, 8192, 8192, pages[p], 16, 16, 128, prefill_kv, NULL, 0};
    run_shape(&k, csv);
  }
  kshape ext = {FATTN_MODE_PREFILL, 8, 512, 8192 + 512, 128, 32, 8, 128, prefill_kv, NULL, 0};
  if (paper && !only_d) run_shape(&ext, csv);
  if (serve) serve_rows(csv);
  fclose(csv);
  printf("csv: %s\n", path);
  return 0;
}

/* DeepSeek-V3 absorbed MLA decode: heads 128 (one GPU) and 16 (a tensor-parallel shard), bs 1 to
 * 128, contexts 1k to 64k, q_len 1 (DECODE) and 2 (TARGET_VERIFY of one MTP draft), page 64,
 * bf16 and fp8 e4m3 latent; beside the pure read of the same latent pages.
 * TFLOP/s counts 2 (576 + 512) FLOPs a q head and slot. Options: --csv PATH (default
 * build/mla.csv, the columns bench/peers/peers.py mla reads), --backend fa2|fa3 (the portable
 * kernel or the Hopper one, on both sides; default AUTO), --heads N, --bs N, --ctx N, --q N,
 * --kv bf16|fp8 (those rows; one row alone is what ncu wants), --max-splits N (the config's
 * split bound, default 32). */
int fattn_bench_mla(int argc, char **argv) {
  const char *path = "build/mla.csv";
  fattn_dtype only_kv = 0;
  unsigned only_heads = 0, only_ctx = 0, only_q = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (strcmp(argv[i], "--csv") == 0) path = argv[i + 1];
    else if (backend_arg(argv[i], argv[i + 1], &decode_backend)) prefill_backend = decode_backend;
    else if (dtype_arg(argv[i], "--kv", argv[i + 1], &only_kv)) continue;
    else if (!((strcmp(argv[i], "--heads") == 0 && sscanf(argv[i + 1], "%u", &only_heads) == 1) ||
               (strcmp(argv[i], "--bs") == 0 && sscanf(argv[i + 1], "%u", &only_bs) == 1) ||
               (strcmp(argv[i], "--ctx") == 0 && sscanf(argv[i + 1], "%u", &only_ctx) == 1) ||
               (strcmp(argv[i], "--q") == 0 && sscanf(argv[i + 1], "%u", &only_q) == 1) ||
               (strcmp(argv[i], "--max-splits") == 0 && sscanf(argv[i + 1], "%u", &max_splits) == 1)))
      fail("fattn-bench mla", "options: --csv PATH, --backend fa2|fa3 (both sides), --heads N, --bs N, --ctx N, "
                              "--q 1|2, --kv bf16|fp8, --max-splits N");
  }
  if (!fattn_bench_has_gpu()) fail("fattn-bench mla", "needs a CUDA device");
  FILE *csv = fopen(path, "w");
  if (!csv) fail(path, "cannot write");
  fprintf(csv, "heads,bs,ctx,q_len,page,kv_dtype,ms,gbs,tflops,roof_gbs\n");
  printf("fattn MLA decode (DeepSeek-V3 absorbed: latent %u + rope %u, one latent head), page 64, bf16 and fp8"
         " latent, median of 21; GB/s of latent read, read = pure-read kernel over the same pages; GPU timing\n",
         MLA_LATENT, MLA_ROPE);
  header();
  static const uint32_t heads[2] = {128, 16}, bss[4] = {1, 16, 64, 128}, ctxs[4] = {1024, 4096, 16384, 65536};
  static const fattn_dtype kvs[2] = {FATTN_DTYPE_BF16, FATTN_DTYPE_FP8_E4M3};
  for (int ki = 0; ki < 2; ki++)
    for (int hi = 0; hi < 2; hi++)
      for (int bi = 0; bi < 4; bi++)
        for (int ci = 0; ci < 4; ci++)
          for (uint32_t ql = 1; ql <= 2; ql++) {
            if ((only_heads && heads[hi] != only_heads) || (only_bs && bss[bi] != only_bs) ||
                (only_ctx && ctxs[ci] != only_ctx) || (only_q && ql != only_q) ||
                (only_kv && kvs[ki] != only_kv))
              continue;
            const fattn_mode mode = ql == 1 ? FATTN_MODE_DECODE : FATTN_MODE_TARGET_VERIFY;
            const kshape k = {mode, bss[bi], ql, ctxs[ci], 64, heads[hi], 1, MLA_LATENT + MLA_ROPE, kvs[ki], NULL, 1};
            const kresult r = run_shape(&k, NULL); /* this table's columns, not run_shape's */
            fprintf(csv, "%u,%u,%u,%u,64,%s,%.6f,%.2f,%.2f,%.2f\n", k.hq, k.bs, k.kv_len, ql, dtype_name(kvs[ki]), r.ms,
                    r.bytes / r.ms / 1e6, r.flops / r.ms / 1e9, r.bytes / r.read_ms / 1e6);
          }
  fclose(csv);
  printf("csv: %s\n", path);
  return 0;
}
