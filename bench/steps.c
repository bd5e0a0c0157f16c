/* steps.c: a few real attention steps through the public API on the CPU backend (a small
 * Llama-like shape), checked against a second, independent dense evaluation kept here. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench.h"
#include "lib/dtype.h"

enum { L = 2, HQ = 8, HKV = 2, D = 64, SEQS = 4, MAXLEN = 160, DECODE_STEPS = 8 };

typedef struct history {
  float k[L][SEQS][MAXLEN][HKV][D]; /* every token stored so far, unpaged, as bf16 values */
  float v[L][SEQS][MAXLEN][HKV][D];
  uint32_t len[SEQS];
} history;

static float rnd_bf16(uint64_t *s) {
  *s = *s * 6364136223846793005ull + 1442695040888963407ull;
  float x = (float)((double)(*s >> 11) * 0x1.0p-53 * 2.0 - 1.0);
  return fattn__bf16_to_f32(fattn__f32_to_bf16(x));
}

/* Causal softmax attention of one query row over the first len tokens, in double. */
static void dense_row(const history *h, uint32_t l, uint32_t s, uint32_t len, const float *q, uint32_t hq,
                      double *o) {
  uint32_t g = hq / (HQ / HKV);
  double scale = 1.0 / sqrt((double)D), mx = -INFINITY, sum = 0;
  double *w = malloc(len * sizeof *w);
  for (uint32_t j = 0; j < len; j++) {
    double x = 0;
    for (int c = 0; c < D; c++) x += (double)q[c] * h->k[l][s][j][g][c];
    w[j] = x * scale;
    if (w[j] > mx) mx = w[j];
  }
  for (int c = 0; c < D; c++) o[c] = 0;
  for (uint32_t j = 0; j < len; j++) {
    double p = exp(w[j] - mx);
    sum += p;
    for (int c = 0; c < D; c++) o[c] += p * h->v[l][s][j][g][c];
  }
  for (int c = 0; c < D; c++) o[c] /= sum;
  free(w);
}

/* One step: q_len[s] new tokens per sequence; returns the largest |fattn - dense|. */
static double one_step(fattn_ctx *ctx, history *h, const uint32_t *ids, const uint32_t *q_len, fattn_mode mode,
                       uint64_t *seed) {
  uint32_t tokens = 0;
  for (int s = 0; s < SEQS; s++) tokens += q_len[s];
  uint16_t *k = malloc((size_t)tokens * HKV * D * 2), *v = malloc((size_t)tokens * HKV * D * 2);
  uint16_t *q = malloc((size_t)tokens * HQ * D * 2), *out = malloc((size_t)tokens * HQ * D * 2);
  float *qf = malloc((size_t)tokens * HQ * D * sizeof *qf);
  fattn_batch b = FATTN_BATCH_INIT;
  b.mode = mode;
  b.num_seqs = SEQS;
  b.seq_ids = ids;
  b.q_lens = q_len;
  for (int s = 0; s < SEQS; s++) fattn_seq_reserve(ctx, ids[s], h->len[s] + q_len[s]);
  if (fattn_plan(ctx, &b, NULL)) {
    fprintf(stderr, "fattn_plan: %s\n", fattn_detail(ctx));
    exit(1);
  }
  double worst = 0;
  for (uint32_t l = 0; l < L; l++) {
    for (uint32_t s = 0, row = 0; s < SEQS; s++)
      for (uint32_t t = 0; t < q_len[s]; t++, row++)
        for (int hh = 0; hh < HKV; hh++)
          for (int c = 0; c < D; c++) {
            size_t i = ((size_t)row * HKV + hh) * D + c;
            h->k[l][s][h->len[s] + t][hh][c] = rnd_bf16(seed);
            h->v[l][s][h->len[s] + t][hh][c] = rnd_bf16(seed);
            k[i] = fattn__f32_to_bf16(h->k[l][s][h->len[s] + t][hh][c]);
            v[i] = fattn__f32_to_bf16(h->v[l][s][h->len[s] + t][hh][c]);
          }
    for (size_t i = 0; i < (size_t)tokens * HQ * D; i++) q[i] = fattn__f32_to_bf16(qf[i] = rnd_bf16(seed));
    if (fattn_store_kv(ctx, l, k, v, NULL) || fattn_attend(ctx, l, q, out, NULL, NULL)) {
      fprintf(stderr, "step: %s\n", fattn_detail(ctx));
      exit(1);
    }
    for (uint32_t s = 0, row = 0; s < SEQS; s++)
      for (uint32_t t = 0; t < q_len[s]; t++, row++)
        for (uint32_t hq = 0; hq < HQ; hq++) {
          double o[D];
          dense_row(h, l, s, h->len[s] + t + 1, qf + ((size_t)row * HQ + hq) * D, hq, o);
          for (int c = 0; c < D; c++) {
            double e = fabs(fattn__bf16_to_f32(out[((size_t)row * HQ + hq) * D + c]) - o[c]);
            if (e > worst) worst = e;
          }
        }
  }
  for (int s = 0; s < SEQS; s++) h->len[s] += q_len[s];
  free(k), free(v), free(q), free(out), free(qf);
  return worst;
}

int fattn_bench_steps(void) {
  fattn_config cfg = FATTN_CONFIG_INIT;
  fattn_model model = FATTN_MODEL_INIT;
  model.num_layers = L;
  model.num_q_heads = HQ;
  model.num_kv_heads = HKV;
  model.head_dim = D;
  cfg.device = FATTN_DEVICE_CPU;
  cfg.kv_budget_pages = 64;
  cfg.max_batch = SEQS;
  cfg.max_seq_len = MAXLEN;
  cfg.max_q_tokens = SEQS * 128;
  char detail[256];
  fattn_ctx *ctx;
  if (fattn_create(&cfg, &model, &ctx, detail, sizeof detail)) {
    fprintf(stderr, "fattn_create: %s\n", detail);
    return 1;
  }
  history *h = calloc(1, sizeof *h);
  uint32_t ids[SEQS], prompt[SEQS], one[SEQS];
  uint64_t seed = 2026;
  for (int s = 0; s < SEQS; s++) {
    fattn_seq_open(ctx, &ids[s]);
    prompt[s] = 17 + 29 * (uint32_t)s;
    one[s] = 1;
  }
  printf("\nAttention steps on the CPU backend: %d layers, %d q / %d kv heads, d %d, page 16\n", L, HQ, HKV, D);
  double e = one_step(ctx, h, ids, prompt, FATTN_MODE_PREFILL, &seed);
  printf("prefill (%u, %u, %u, %u tokens): max |fattn - dense| = %.2e\n", prompt[0], prompt[1], prompt[2],
         prompt[3], e);
  double worst = e;
  for (int step = 0; step < DECODE_STEPS; step++) {
    e = one_step(ctx, h, ids, one, FATTN_MODE_DECODE, &seed);
    worst = e > worst ? e : worst;
  }
  printf("%d decode steps: max |fattn - dense| = %.2e (bf16 output rounding is up to 2^-9 relative)\n",
         DECODE_STEPS, worst);
  fattn_status chk = fattn_check(ctx);
  fattn_destroy(ctx, 1);
  free(h);
  return worst < 1e-2 && chk == FATTN_OK ? 0 : 1;
}
