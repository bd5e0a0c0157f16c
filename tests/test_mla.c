/* test_mla.c: what the GPU backends say of MLA, checked on the CPU: the details create and plan
 * give for the modes and options the MLA kernel lacks, create's latent check against the
 * portable kernel's contract, and the split unit of MLA decode steps. */
#include <math.h>
#include <stdlib.h>

#include "attn/backend.h" /* fattn__fa2_supports */
#include "lib/internal.h"
#include "tests/support.h"

static char detail[256];

static const char *const MODE_NAMES[FATTN_MODE_COUNT + 1] = {"?", "PREFILL", "DECODE", "TARGET_VERIFY",
                                                             "DRAFT_DECODE", "DRAFT_EXTEND", "CROSS"};

/* DeepSeek-V3's absorbed attention with `heads` q heads, on the CPU backend. */
static void mla_model(fattn_config *c, fattn_model *m, uint32_t heads) {
  fattn_test_small(c, m);
  m->num_q_heads = heads;
  m->num_kv_heads = 1;
  m->head_dim = 576;
  m->head_dim_v = 512;
  m->mla_latent_dim = 512;
  m->mla_rope_dim = 64;
}

/* FA2, and FA3 where its MLA kernel was built, run every mode but CROSS (MLA models have no
 * encoder); CROSS, and every mode on an FA3 built without sm_90a, is refused with its name. */
START_TEST(mode_details_name_the_mode) {
  for (uint32_t mode = FATTN_MODE_PREFILL; mode <= FATTN_MODE_COUNT; mode++) {
    ck_assert_ok(fattn__mla_mode_check(FATTN_BACKEND_CPU, mode, detail, sizeof detail));
    detail[0] = '\0';
    fattn_status st = fattn__mla_mode_check(FATTN_BACKEND_FA2, mode, detail, sizeof detail);
    if (mode != FATTN_MODE_CROSS) {
      ck_assert_int_eq(st, FATTN_OK);
    } else {
      ck_assert_int_eq(st, FATTN_ERR_UNSUPPORTED);
      ck_assert_msg(strstr(detail, MODE_NAMES[mode]) && strstr(detail, "MLA"), "FA2 mode %u: detail '%s'", mode,
                    detail);
    }
    detail[0] = '\0';
    st = fattn__mla_mode_check(FATTN_BACKEND_FA3, mode, detail, sizeof detail);
#ifdef FATTN_HAVE_SM90A
    if (mode != FATTN_MODE_CROSS) {
      ck_assert_int_eq(st, FATTN_OK);
      continue;
    }
    ck_assert_msg(st == FATTN_ERR_UNSUPPORTED && strstr(detail, MODE_NAMES[mode]), "FA3 mode %u: detail '%s'", mode,
                  detail);
#else
    ck_assert_int_eq(st, FATTN_ERR_UNSUPPORTED);
    ck_assert_msg(strstr(detail, MODE_NAMES[mode]) && strstr(detail, "FA3"), "FA3 mode %u: detail '%s'", mode, detail);
#endif
  }
  /* A NULL buffer (create's probe of a side) still gets the status. */
  ck_assert_int_eq(fattn__mla_mode_check(FATTN_BACKEND_FA2, FATTN_MODE_CROSS, NULL, 0), FATTN_ERR_UNSUPPORTED);
}
END_TEST

/* Each option the MLA kernel lacks is named; a plain MLA model passes. */
START_TEST(option_details_name_the_option) {
  fattn_config c;
  fattn_model m;
  fattn__norm n;
  fattn_layer_opts layers[2] = {FATTN_LAYER_OPTS_INIT, FATTN_LAYER_OPTS_INIT};
  mla_model(&c, &m, 16);
  ck_assert_ok(fattn__normalize(&c, &m, &n, detail, sizeof detail));
  ck_assert_ok(fattn__mla_options_check(&n, layers, 0, detail, sizeof detail));
  ck_assert_ok(fattn__mla_options_check(&n, NULL, 0, detail, sizeof detail));

  ck_assert_int_eq(fattn__mla_options_check(&n, layers, 1, detail, sizeof detail), FATTN_ERR_UNSUPPORTED);
  ck_assert_msg(strstr(detail, "sinks"), "detail '%s'", detail);
  layers[1].sliding_window = 128;
  ck_assert_int_eq(fattn__mla_options_check(&n, layers, 0, detail, sizeof detail), FATTN_ERR_UNSUPPORTED);
  ck_assert_msg(strstr(detail, "layers[1].sliding_window 128"), "detail '%s'", detail);
  layers[1].sliding_window = FATTN_NO_WINDOW;
  layers[0].chunk_size = 256;
  ck_assert_int_eq(fattn__mla_options_check(&n, layers, 0, detail, sizeof detail), FATTN_ERR_UNSUPPORTED);
  ck_assert_msg(strstr(detail, "layers[0].chunk_size 256"), "detail '%s'", detail);
  layers[0].chunk_size = 0;

  m.logit_softcap = 30.0f;
  ck_assert_ok(fattn__normalize(&c, &m, &n, detail, sizeof detail));
  ck_assert_int_eq(fattn__mla_options_check(&n, layers, 0, detail, sizeof detail), FATTN_ERR_UNSUPPORTED);
  ck_assert_msg(strstr(detail, "logit_softcap 30"), "detail '%s'", detail);
  m.logit_softcap = 0.0f;
  c.kv_dtype = FATTN_DTYPE_FP8_E4M3; /* fp8 latents: FA2 widens them */
  ck_assert_ok(fattn__normalize(&c, &m, &n, detail, sizeof detail));
  ck_assert_ok(fattn__mla_options_check(&n, layers, 0, detail, sizeof detail));
  c.q_dtype = FATTN_DTYPE_BF16, c.kv_dtype = FATTN_DTYPE_FP16; /* a 16-bit latent of another type */
  ck_assert_ok(fattn__normalize(&c, &m, &n, detail, sizeof detail));
  ck_assert_int_eq(fattn__mla_options_check(&n, layers, 0, detail, sizeof detail), FATTN_ERR_UNSUPPORTED);
  ck_assert_msg(strstr(detail, "kv_dtype"), "detail '%s'", detail);
}
END_TEST

/* Create's latent check and the portable kernel's own contract agree on every Q / latent type
 * pair: a latent create admits that fattn__fa2_supports refused failed only on a GPU. */
START_TEST(latent_types_agree_with_the_kernel) {
  static const fattn_dtype Q[2] = {FATTN_DTYPE_BF16, FATTN_DTYPE_FP16};
  static const fattn_dtype KV[3] = {FATTN_DTYPE_BF16, FATTN_DTYPE_FP16, FATTN_DTYPE_FP8_E4M3};
  for (int qi = 0; qi < 2; qi++)
    for (int ki = 0; ki < 3; ki++) {
      fattn_config c;
      fattn_model m;
      fattn__norm n;
      mla_model(&c, &m, 16);
      c.q_dtype = Q[qi], c.kv_dtype = KV[ki];
      ck_assert_ok(fattn__normalize(&c, &m, &n, detail, sizeof detail));
      const int admitted = fattn__mla_options_check(&n, NULL, 0, detail, sizeof detail) == FATTN_OK;
      fattn__layer_params l;
      memset(&l, 0, sizeof l);
      l.num_q_heads = 16, l.num_kv_heads = 1, l.head_dim = 576, l.head_dim_v = 512, l.mla = 1;
      l.page_size = 64, l.window = FATTN_NO_WINDOW, l.q_dtype = Q[qi], l.kv_dtype = KV[ki];
      l.compute_dtype = Q[qi];
      ck_assert_msg(admitted == !!fattn__fa2_supports(&l), "q dtype %d, latent %d: create %s, fa2 %s", (int)Q[qi],
                    (int)KV[ki], admitted ? "admits" : "refuses", fattn__fa2_supports(&l) ? "runs" : "does not");
    }
}
END_TEST

/* An MLA decode entry takes a block per group of q heads a split (16 up to 16 heads, else 32),
 * and the planner's header carries that unit to the split policy. */
START_TEST(decode_groups_are_head_tiles) {
  ck_assert_uint_eq(fattn__mla_rows(8), 16u);
  ck_assert_uint_eq(fattn__mla_rows(16), 16u);
  ck_assert_uint_eq(fattn__mla_rows(17), 32u);
  ck_assert_uint_eq(fattn__decode_groups(1, 8, 1), 1u);
  ck_assert_uint_eq(fattn__decode_groups(1, 16, 1), 1u);
  ck_assert_uint_eq(fattn__decode_groups(1, 32, 1), 1u);
  ck_assert_uint_eq(fattn__decode_groups(1, 64, 1), 2u);
  ck_assert_uint_eq(fattn__decode_groups(1, 128, 1), 4u);
  ck_assert_uint_eq(fattn__decode_groups(0, 32, 8), 8u); /* other models: a block a kv head */

  static const uint32_t HEADS[3] = {16, 64, 128};
  for (int k = 0; k < 3; k++) {
    fattn_config c;
    fattn_model m;
    mla_model(&c, &m, HEADS[k]);
    c.page_size = 16;
    c.kv_budget_pages = 600;
    c.max_seq_len = 4200;
    c.max_batch = 4;
    fattn_ctx *ctx = NULL;
    ck_assert_msg(fattn_create(&c, &m, &ctx, detail, sizeof detail) == FATTN_OK, "%s", detail);
    for (uint32_t mode = FATTN_MODE_PREFILL; mode <= FATTN_MODE_COUNT; mode++)
      ck_assert_int_eq(fattn_ctx_backend(ctx, (fattn_mode)mode), FATTN_BACKEND_CPU); /* the CPU runs every mode */
    uint32_t s;
    ck_assert_ok(fattn_seq_open(ctx, &s));
    ck_assert_ok(fattn_seq_reserve(ctx, s, 4097));
    fattn_batch b = FATTN_BATCH_INIT;
    b.num_seqs = 1;
    b.seq_ids = &s;
    ck_assert_ok(fattn_plan(ctx, &b, NULL));
    const fattn__step_hdr *h = ctx->step.hdr;
    ck_assert_uint_eq(h->decode_groups, fattn__decode_groups(1, HEADS[k], 1));
    ck_assert_uint_eq(h->decode_resident, FATTN__DECODE_RESIDENT_MLA);
    /* the policy's own answer for this header, and a split for every SM's worth of blocks */
    fattn__entry x = {.q_len = 1, .kv_len = 4097};
    fattn__split_of(h, &x);
    ck_assert_uint_eq(ctx->step.entries[0].num_splits, x.num_splits);
    ck_assert_uint_gt(x.num_splits, 1u);
    ck_assert_ok(fattn_destroy(ctx, 1));
  }
}
END_TEST

FATTN_SUITE("mla", FATTN_TEST_CPU, mode_details_name_the_mode, option_details_name_the_option,
            latent_types_agree_with_the_kernel,
            decode_groups_are_head_tiles)
