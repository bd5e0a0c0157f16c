/* minimal.c: the smallest complete fattn program. One sequence on the CPU backend: a prefill,
 * a few decode steps, every call checked (fattn_detail says why one failed), fattn_check last. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fattn.h"

enum { LAYERS = 2, HQ = 4, HKV = 2, D = 64, PROMPT = 12, STEPS = 4 };

/* Every call returns a status; on failure the context's detail names the argument and why. */
static void check(const fattn_ctx *ctx, fattn_status st, const char *call) {
  if (st == FATTN_OK) return;
  fprintf(stderr, "minimal: %s: %s: %s\n", call, fattn_status_name(st), fattn_detail(ctx));
  exit(1);
}
#define CHECK(ctx, call) check((ctx), (call), #call)

/* float to bfloat16, rounding to nearest even (finite inputs). */
static uint16_t bf16(float x) {
  uint32_t u;
  memcpy(&u, &x, sizeof u);
  return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

static void fill(uint16_t *x, size_t n, uint32_t seed) {
  for (size_t i = 0; i < n; i++) {
    seed = seed * 1664525u + 1013904223u;
    x[i] = bf16((float)(seed >> 8) / (float)(1u << 24) - 0.5f);
  }
}

int main(void) {
  fattn_model model = FATTN_MODEL_INIT;
  model.num_layers = LAYERS;
  model.num_q_heads = HQ;
  model.num_kv_heads = HKV;
  model.head_dim = D;
  fattn_config cfg = FATTN_CONFIG_INIT;
  cfg.device = FATTN_DEVICE_CPU; /* a CUDA ordinal runs the same program on a GPU */
  cfg.page_size = 16;
  cfg.kv_budget_pages = 8;
  cfg.max_batch = 1;
  cfg.max_seq_len = 64;
  cfg.max_q_tokens = PROMPT;

  char detail[256];
  fattn_ctx *ctx = NULL;
  fattn_status st = fattn_create(&cfg, &model, &ctx, detail, sizeof detail);
  if (st != FATTN_OK) {
    fprintf(stderr, "minimal: fattn_create: %s: %s\n", fattn_status_name(st), detail);
    return 1;
  }

  /* Packed tokens: q and out [tokens, HQ, D], k and v [tokens, HKV, D], bf16; lse [tokens, HQ]. */
  static uint16_t q[PROMPT * HQ * D], k[PROMPT * HKV * D], v[PROMPT * HKV * D], out[PROMPT * HQ * D];
  static float lse[PROMPT * HQ];
  uint32_t seq, len = PROMPT;
  CHECK(ctx, fattn_seq_open(ctx, &seq));

  /* Prefill: the sequence grows to the prompt, whose tokens are the step's queries and new KV. */
  CHECK(ctx, fattn_seq_reserve(ctx, seq, len));
  fattn_batch prefill = FATTN_BATCH_INIT;
  prefill.mode = FATTN_MODE_PREFILL;
  prefill.num_seqs = 1;
  prefill.seq_ids = &seq;
  prefill.q_lens = &len;
  CHECK(ctx, fattn_plan(ctx, &prefill, NULL));
  for (uint32_t l = 0; l < LAYERS; l++) {
    fill(q, sizeof q / 2, 1 + l), fill(k, sizeof k / 2, 2 + l), fill(v, sizeof v / 2, 3 + l);
    CHECK(ctx, fattn_store_kv(ctx, l, k, v, NULL));
    CHECK(ctx, fattn_attend(ctx, l, q, out, lse, NULL));
  }

  /* Decode: one token a step; the plan reads each sequence's length, so only reserve changes. */
  for (int s = 0; s < STEPS; s++) {
    CHECK(ctx, fattn_seq_reserve(ctx, seq, ++len));
    fattn_batch decode = FATTN_BATCH_INIT; /* DECODE, q_lens and kv_lens NULL: 1 and the length */
    decode.num_seqs = 1;
    decode.seq_ids = &seq;
    CHECK(ctx, fattn_plan(ctx, &decode, NULL));
    for (uint32_t l = 0; l < LAYERS; l++) {
      fill(q, HQ * D, 10u * len + l), fill(k, HKV * D, 20u * len + l), fill(v, HKV * D, 30u * len + l);
      CHECK(ctx, fattn_store_kv(ctx, l, k, v, NULL));
      CHECK(ctx, fattn_attend(ctx, l, q, out, lse, NULL));
    }
    printf("minimal: decode step %d over %u tokens: lse[head 0] %.4f\n", s, len, lse[0]);
  }

  uint32_t got;
  CHECK(ctx, fattn_seq_length(ctx, seq, &got));
  CHECK(ctx, fattn_check(ctx));
  CHECK(ctx, fattn_seq_close(ctx, seq));
  CHECK(ctx, fattn_destroy(ctx, 0));
  printf("minimal: fattn %s, %u tokens, fattn_check OK\n", fattn_version(), got);
  return 0;
}
