/* gpu_mla.c: the MLA kernel (attn/fa2/fa2_mla.cu) in every mode and MLA's store_kv against the
 * float64 reference, on the fa2 sweep's case machinery (tests/gpu_fa2.c, with FATTN_TEST_MLA);
 * graph replays of MLA's decode-side modes through the public API against their eager steps. */
#define FATTN_TEST_MLA 1
#include "tests/gpu_fa2.c"

/* tests/gpu_mla90.c runs the kernel cases on the Hopper MLA kernel, which needs sm_90. */
#ifdef FATTN_TEST_MLA90
#define MLA_NEEDS_KERNEL()                                                                   \
  do {                                                                                       \
    if (!fattn__fa3_available()) FATTN_TEST_SKIP("mla90 needs a compute capability 9.0 device"); \
  } while (0)
#else
#define MLA_NEEDS_KERNEL() ((void)0)
#endif

static const uint32_t MLA_HEADS[5] = {8, 16, 32, 64, 128};
static const uint32_t MLA_PAGES[4] = {1, 16, 64, 128};

/* Absorbed MLA: 576-wide Q and latent rows (no V pool), 512-wide O. Lengths are drawn from 1,
 * page - 1, page, page + 1, a random short one and up to 4097 (split-KV in the decode modes). */
static cfg mla_cfg_mode(uint32_t mode, uint32_t heads, uint32_t ps, uint32_t qt, uint32_t max_bs) {
  cfg c = base_cfg(mode, 576, 512, qt, qt, ps, heads, 1);
  c.mla = 1;
  c.max_bs = max_bs;
  c.long_len = 4097;
  c.budget = 600000;
  return c;
}
static cfg mla_cfg(uint32_t heads, uint32_t ps, uint32_t qt, uint32_t max_bs) {
  return mla_cfg_mode(FATTN_MODE_DECODE, heads, ps, qt, max_bs);
}

#ifndef FATTN_TEST_MLA90 /* store_kv runs fa2 alone */
/* New latent rows into their pages: the K row of 576, nothing for V (v is NULL). */
START_TEST(mla_store_kv) {
  int fails = 0;
  for (int k = 0; k < 8; k++) { /* the latent in Q's type, then quantised to fp8 with k_scale */
    const uint32_t qt = k & 1 ? FP : BF, kt = k < 4 ? qt : F8;
    fattn__layer_params l;
    memset(&l, 0, sizeof l);
    l.num_q_heads = 16; l.num_kv_heads = 1; l.head_dim = 576; l.head_dim_v = 512; l.mla = 1; l.page_size = MLA_PAGES[k % 4];
    l.q_dtype = qt; l.kv_dtype = kt; l.compute_dtype = qt; l.k_scale = kt == F8 ? 0.37f : 1.f; l.v_scale = 1.f;
    fails += !store_case(l, FATTN_MODE_DECODE);
  }
  ck_assert_int_eq(fails, 0);
}
END_TEST

/* fp8 e4m3 latent rows (k_scale, which O's V part takes too), landing raw and widened to fp16
 * in shared memory: decode with split-KV, draft decode, verify's tree masks and prefill, at 8 to
 * 128 heads, bf16 and fp16 Q. FA3 hands fp8 latents to this kernel, so the Hopper MLA kernel's
 * build of these cases has no fp8 ones. */
START_TEST(mla_fp8_latent) {
  const int f0 = total_fail;
  static const struct { uint32_t mode; int tree; uint32_t heads, ps; const char *tag; } M[6] = {
      {FATTN_MODE_DECODE, 0, 16, 64, " mla fp8 decode"},
      {FATTN_MODE_DECODE, 0, 128, 1, " mla fp8 decode"},
      {FATTN_MODE_DRAFT_DECODE, 0, 32, 128, " mla fp8 draft decode"},
      {FATTN_MODE_TARGET_VERIFY, 1, 16, 16, " mla fp8 verify tree"},
      {FATTN_MODE_TARGET_VERIFY, 1, 128, 64, " mla fp8 verify tree"},
      {FATTN_MODE_PREFILL, 0, 8, 16, " mla fp8 prefill"}};
  for (int k = 0; k < 6; k++) {
    cfg c = mla_cfg_mode(M[k].mode, M[k].heads, M[k].ps, k % 2 ? FP : BF, 16);
    c.kt = F8;
    c.tree = M[k].tree;
    if (M[k].mode == FATTN_MODE_PREFILL) c.long_len = 300, c.max_bs = 4;
    group(&c, 2, M[k].tag);
  }
  ck_assert_int_eq(total_fail - f0, 0);
}
END_TEST
#endif

/* Every head count (16- and 32-row tiles, 1 to 4 head groups) on every page size, bf16 and fp16
 * in turn, batches up to 64; each case's split steps run again under wide caps, whose bytes
 * must equal the first run's (a graph bucket's padding changes only the caps). */
START_TEST(mla_decode) {
  MLA_NEEDS_KERNEL();
  const int f0 = total_fail, step = getenv("FATTN_TEST_QUICK") ? 3 : 1; /* under compute-sanitizer: 7 of 20 */
  for (int h = 0; h < 5; h++)
    for (int p = h % step; p < 4; p += step) {
      cfg c = mla_cfg(MLA_HEADS[h], MLA_PAGES[p], (h + p) % 2 ? FP : BF, 64);
      group(&c, 2, " mla");
    }
  ck_assert_int_eq(total_fail - f0, 0);
}
END_TEST

/* One sequence over up to 4097 slots: the most splits (up to 32, rows of more than 4 splits
 * through the combine's shared-memory merges), at 16 and at 128 heads. */
START_TEST(mla_decode_long) {
  MLA_NEEDS_KERNEL();
  const int f0 = total_fail;
  for (int k = 0; k < 4; k++) {
    cfg c = mla_cfg(k < 2 ? 16 : 128, MLA_PAGES[1 + k % 3], k % 2 ? FP : BF, 1);
    group(&c, 3, " mla long");
  }
  ck_assert_int_eq(total_fail - f0, 0);
}
END_TEST

/* The other modes, whose entries hold several queries: packed rows (a tile holds two queries
 * at 8 heads), per-row causal limits, verify's tree masks (and chains) with split-KV, draft
 * extend and prefill over prefixes; at 8, 16 and 128 heads, on pages 1, 16 and 64. */
START_TEST(mla_modes) {
  MLA_NEEDS_KERNEL();
  const int f0 = total_fail;
  static const struct { uint32_t mode; int tree; const char *tag; } M[5] = {
      {FATTN_MODE_DRAFT_DECODE, 0, " mla draft decode"}, {FATTN_MODE_TARGET_VERIFY, 1, " mla verify tree"},
      {FATTN_MODE_TARGET_VERIFY, 0, " mla verify chain"}, {FATTN_MODE_DRAFT_EXTEND, 0, " mla draft extend"},
      {FATTN_MODE_PREFILL, 0, " mla prefill"}};
  static const uint32_t heads[3] = {8, 16, 128}, pages[3] = {1, 16, 64};
  for (int k = 0; k < 5; k++)
    for (int h = 0; h < 3; h++) {
      cfg c = mla_cfg_mode(M[k].mode, heads[h], pages[(k + h) % 3], (k + h) % 2 ? FP : BF, 16);
      c.tree = M[k].tree;
      if (M[k].mode == FATTN_MODE_PREFILL) c.long_len = 300, c.max_bs = 4;
      group(&c, 2, M[k].tag);
    }
  ck_assert_int_eq(total_fail - f0, 0);
}
END_TEST

#ifndef FATTN_TEST_MLA90 /* the public API runs fa2 alone */
/* Through the public API: a DeepSeek-V3-like context (128 heads, 2 layers) runs every mode but
 * CROSS on FA2 (no MLA model has an encoder), and a graph replay of random decode steps (lengths up to 4097, so
 * split-KV and the combine) gives the eager step's O and LSE bit for bit, padding rows zero. */
enum { MLA_LAYERS = 2, MLA_HQ = 128, MLA_DK = 576, MLA_DV = 512, MLA_MAXB = 16 };

typedef struct mla_rig {
  fattn_ctx *ctx;
  void *q, *k, *out; /* [MLA_MAXB, heads, d] in bf16 */
  float *lse;
} mla_rig;

static void mla_layers(void *user, void *stream) {
  mla_rig *r = user;
  for (uint32_t l = 0; l < MLA_LAYERS; l++) {
    fattn_store_kv(r->ctx, l, r->k, NULL, stream); /* MLA: the latent row alone */
    fattn_attend(r->ctx, l, r->q, r->out, r->lse, stream);
  }
}

START_TEST(mla_graph_replay_equals_eager) {
  fattn_config c;
  fattn_model m;
  fattn_test_small(&c, &m);
  m.num_layers = MLA_LAYERS, m.num_q_heads = MLA_HQ, m.num_kv_heads = 1, m.head_dim = MLA_DK, m.head_dim_v = MLA_DV;
  m.mla_latent_dim = 512, m.mla_rope_dim = 64;
  c.device = 0;
  c.page_size = 64;
  c.kv_budget_pages = 1200;
  c.max_batch = MLA_MAXB;
  c.max_seqs = MLA_MAXB;
  c.max_seq_len = 4200;
  c.max_q_tokens = MLA_MAXB;
  c.graph_modes = 1u << FATTN_MODE_DECODE;
  c.prefill_backend = c.decode_backend = FATTN_BACKEND_FA2; /* the portable kernel's graphs (gpu_graph replays mla90's) */
  mla_rig r;
  char why[256];
  ck_assert_msg(fattn_create(&c, &m, &r.ctx, why, sizeof why) == FATTN_OK, "%s", why);
  for (uint32_t mode = FATTN_MODE_PREFILL; mode < FATTN_MODE_CROSS; mode++)
    ck_assert_int_eq(fattn_ctx_backend(r.ctx, (fattn_mode)mode), FATTN_BACKEND_FA2);
  ck_assert_int_eq(fattn_ctx_backend(r.ctx, FATTN_MODE_CROSS), FATTN_BACKEND_AUTO);
  uint32_t ids[MLA_MAXB];

  const size_t qn = (size_t)MLA_MAXB * MLA_HQ * MLA_DK, on = (size_t)MLA_MAXB * MLA_HQ * MLA_DV;
  const size_t ln = (size_t)MLA_MAXB * MLA_HQ;
  r.q = dalloc(qn * 2), r.k = dalloc((size_t)MLA_MAXB * MLA_DK * 2), r.out = dalloc(on * 2), r.lse = dalloc(ln * 4);
  for (uint32_t b = 1; b <= MLA_MAXB; b++)
    ck_assert_msg(fattn_graph_capture(r.ctx, FATTN_MODE_DECODE, b, mla_layers, &r) == FATTN_OK, "%s", fattn_detail(r.ctx));
  uint16_t *eager = fattn_test_xmalloc(on * 2), *graph = fattn_test_xmalloc(on * 2);
  float *eager_lse = fattn_test_xmalloc(ln * 4), *graph_lse = fattn_test_xmalloc(ln * 4);
  for (int rep = 0; rep < 12; rep++) {
    const uint32_t bs = 1 + rnd(MLA_MAXB);
    for (uint32_t i = 0; i < bs; i++) {
      ck_assert_ok(fattn_seq_open(r.ctx, &ids[i]));
      ck_assert_ok(fattn_seq_reserve(r.ctx, ids[i], rnd(3) ? 1 + rnd(4097) : 4097));
    }
    fattn_batch b = FATTN_BATCH_INIT;
    b.num_seqs = bs, b.seq_ids = ids;
    const uint64_t seed = rng_next();
    CK(fattn_test_gpu_randn(r.q, qn, BF, 1.5f, seed));
    CK(fattn_test_gpu_randn(r.k, (size_t)MLA_MAXB * MLA_DK, BF, 1.0f, seed + 1));
    CK(fattn_test_gpu_nan(r.out, on, BF));
    CK(fattn_test_gpu_nan(r.lse, ln, 0));
    CK(cudaDeviceSynchronize());
    ck_assert_msg(fattn_plan(r.ctx, &b, NULL) == FATTN_OK, "%s", fattn_detail(r.ctx));
    mla_layers(&r, NULL);
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(eager, r.out, on * 2, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(eager_lse, r.lse, ln * 4, cudaMemcpyDeviceToHost));
    CK(fattn_test_gpu_nan(r.out, on, BF));
    CK(fattn_test_gpu_nan(r.lse, ln, 0));
    CK(cudaDeviceSynchronize());
    ck_assert_msg(fattn_graph_launch(r.ctx, &b, NULL) == FATTN_OK, "%s", fattn_detail(r.ctx));
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(graph, r.out, on * 2, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(graph_lse, r.lse, ln * 4, cudaMemcpyDeviceToHost));
    uint32_t bucket = 0; /* the default buckets up to 16: 1, 2, 4, 8, 12, 16 */
    while (bucket < bs) bucket = bucket < 2 ? bucket + 1 : bucket < 8 ? bucket * 2 : bucket + 4;
    const size_t live = (size_t)bs * MLA_HQ;
    ck_assert_msg(memcmp(eager, graph, live * MLA_DV * 2) == 0, "rep %d (bs %u): O differs", rep, bs);
    ck_assert_msg(memcmp(eager_lse, graph_lse, live * 4) == 0, "rep %d (bs %u): LSE differs", rep, bs);
    ck_assert_uint_eq(fattn_test_count_nan(eager, live * MLA_DV, BF), 0);
    for (size_t i = 0; i < live; i++) ck_assert_msg(isfinite(eager_lse[i]), "rep %d: row %zu LSE %g", rep, i, (double)eager_lse[i]);
    for (size_t i = live * MLA_DV; i < (size_t)bucket * MLA_HQ * MLA_DV; i++)
      ck_assert_msg(graph[i] == 0, "rep %d: padding element %zu is 0x%04x", rep, i, graph[i]);
    for (uint32_t i = 0; i < bs; i++) ck_assert_ok(fattn_seq_close(r.ctx, ids[i]));
  }
  ck_assert_ok(fattn_check(r.ctx));
  ck_assert_ok(fattn_destroy(r.ctx, 1));
  cudaFree(r.q), cudaFree(r.k), cudaFree(r.out), cudaFree(r.lse);
  free(eager), free(graph), free(eager_lse), free(graph_lse);
}
END_TEST
#endif

#ifndef FATTN_TEST_MLA90 /* the public API's choice, asked once */
/* AUTO runs MLA on the Hopper kernel above 16 q heads where that kernel runs (sm_90a, a latent
 * in Q's type), and on the portable one otherwise: at 16 heads, and for an fp8 latent. */
START_TEST(mla_auto_backend) {
  /* hopper: 1 in every mode, 2 in the multi-token modes only (lib/context.c, auto_backend) */
  static const struct {
    uint32_t heads;
    fattn_dtype kv;
    int hopper;
  } cases[] = {{128, FATTN_DTYPE_BF16, 1}, {16, FATTN_DTYPE_BF16, 2}, {128, FATTN_DTYPE_FP8_E4M3, 0}};
  int sm90 = 0;
#ifdef FATTN_HAVE_SM90A
  sm90 = fattn__fa3_available();
#endif
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    fattn_config c;
    fattn_model m;
    fattn_test_small(&c, &m);
    m.num_layers = 1, m.num_q_heads = cases[i].heads, m.num_kv_heads = 1, m.head_dim = MLA_DK, m.head_dim_v = MLA_DV;
    m.mla_latent_dim = 512, m.mla_rope_dim = 64;
    c.device = 0, c.page_size = 64, c.kv_dtype = cases[i].kv;
    fattn_ctx *ctx;
    char why[256];
    ck_assert_msg(fattn_create(&c, &m, &ctx, why, sizeof why) == FATTN_OK, "heads %u: %s", cases[i].heads, why);
    for (uint32_t mode = FATTN_MODE_PREFILL; mode < FATTN_MODE_CROSS; mode++) {
      const int multi = mode == FATTN_MODE_PREFILL || mode == FATTN_MODE_TARGET_VERIFY || mode == FATTN_MODE_DRAFT_EXTEND;
      const int hopper = sm90 && (cases[i].hopper == 1 || (cases[i].hopper == 2 && multi));
      const fattn_backend want = hopper ? FATTN_BACKEND_FA3 : FATTN_BACKEND_FA2;
      ck_assert_msg(fattn_ctx_backend(ctx, (fattn_mode)mode) == want, "heads %u, kv dtype %d, mode %u: backend %d",
                    cases[i].heads, (int)cases[i].kv, mode, (int)fattn_ctx_backend(ctx, (fattn_mode)mode));
    }
    ck_assert_ok(fattn_destroy(ctx, 1));
  }
}
END_TEST
#endif

START_TEST(mla_totals) {
  printf("mla totals: %d groups, %d failed cases, %d split steps run again under wide caps (%d with four-warp "
         "rows)\n", total_groups, total_fail, wide_runs, wide_shared);
  ck_assert_int_eq(total_fail, 0);
  if (total_groups) /* the groups ran in this process */
    ck_assert_msg(wide_shared > 0, "%d split steps ran under wide caps, none with four-warp rows of more than 4 splits",
                  wide_runs);
}
END_TEST

#ifdef FATTN_TEST_MLA90 /* the kernel's cases alone: store_kv and the public API's graphs run fa2 */
FATTN_SUITE("gpu_mla90", FATTN_TEST_GPU, mla_decode, mla_decode_long, mla_modes, mla_totals)
#else
FATTN_SUITE("gpu_mla", FATTN_TEST_GPU, mla_store_kv, mla_decode, mla_decode_long, mla_modes, mla_fp8_latent,
            mla_graph_replay_equals_eager, mla_auto_backend, mla_totals)
#endif
