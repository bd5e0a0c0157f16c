// minimal.cpp: minimal.c in C++, so that a C++ compiler (-Wall -Wextra -Werror) checks fattn.h:
// its extern "C", the *_INIT macros as aggregate initialisers, and the const getters.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "fattn.h"

namespace {

constexpr uint32_t kLayers = 2, kHq = 4, kHkv = 2, kD = 64, kPrompt = 12, kSteps = 4;

// Every call returns a status; on failure the context's detail names the argument and why.
void check(const fattn_ctx *ctx, fattn_status st, const char *call) {
  if (st == FATTN_OK) return;
  std::fprintf(stderr, "minimal-cpp: %s: %s: %s\n", call, fattn_status_name(st), fattn_detail(ctx));
  std::exit(1);
}
#define CHECK(ctx, call) check((ctx), (call), #call)

uint16_t bf16(float x) {  // round to nearest even (finite inputs)
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

void fill(std::vector<uint16_t> &x, size_t n, uint32_t seed) {
  for (size_t i = 0; i < n; i++) {
    seed = seed * 1664525u + 1013904223u;
    x[i] = bf16(static_cast<float>(seed >> 8) / static_cast<float>(1u << 24) - 0.5f);
  }
}

}  // namespace

int main() {
  fattn_model model = FATTN_MODEL_INIT;
  model.num_layers = kLayers;
  model.num_q_heads = kHq;
  model.num_kv_heads = kHkv;
  model.head_dim = kD;
  fattn_config cfg = FATTN_CONFIG_INIT;
  cfg.device = FATTN_DEVICE_CPU;
  cfg.page_size = 16;
  cfg.kv_budget_pages = 8;
  cfg.max_batch = 1;
  cfg.max_seq_len = 64;
  cfg.max_q_tokens = kPrompt;

  fattn_memory_report plan = FATTN_MEMORY_REPORT_INIT;
  char detail[256];
  fattn_status st = fattn_memory_plan(&cfg, &model, &plan, detail, sizeof detail);
  fattn_ctx *ctx = nullptr;
  if (st == FATTN_OK) st = fattn_create(&cfg, &model, &ctx, detail, sizeof detail);
  if (st != FATTN_OK) {
    std::fprintf(stderr, "minimal-cpp: %s: %s\n", fattn_status_name(st), detail);
    return 1;
  }
  const fattn_ctx *view = ctx;  // the getters take a const context

  std::vector<uint16_t> q(kPrompt * kHq * kD), k(kPrompt * kHkv * kD), v(kPrompt * kHkv * kD),
      out(kPrompt * kHq * kD);
  std::vector<float> lse(kPrompt * kHq);
  uint32_t seq = 0, len = kPrompt;
  CHECK(view, fattn_seq_open(ctx, &seq));

  CHECK(view, fattn_seq_reserve(ctx, seq, len));
  fattn_batch prefill = FATTN_BATCH_INIT;
  prefill.mode = FATTN_MODE_PREFILL;
  prefill.num_seqs = 1;
  prefill.seq_ids = &seq;
  prefill.q_lens = &len;
  CHECK(view, fattn_plan(ctx, &prefill, nullptr));
  for (uint32_t l = 0; l < kLayers; l++) {
    fill(q, q.size(), 1 + l), fill(k, k.size(), 2 + l), fill(v, v.size(), 3 + l);
    CHECK(view, fattn_store_kv(ctx, l, k.data(), v.data(), nullptr));
    CHECK(view, fattn_attend(ctx, l, q.data(), out.data(), lse.data(), nullptr));
  }

  for (uint32_t s = 0; s < kSteps; s++) {
    CHECK(view, fattn_seq_reserve(ctx, seq, ++len));
    fattn_batch decode = FATTN_BATCH_INIT;
    decode.num_seqs = 1;
    decode.seq_ids = &seq;
    CHECK(view, fattn_plan(ctx, &decode, nullptr));
    for (uint32_t l = 0; l < kLayers; l++) {
      fill(q, kHq * kD, 10u * len + l), fill(k, kHkv * kD, 20u * len + l), fill(v, kHkv * kD, 30u * len + l);
      CHECK(view, fattn_store_kv(ctx, l, k.data(), v.data(), nullptr));
      CHECK(view, fattn_attend(ctx, l, q.data(), out.data(), lse.data(), nullptr));
    }
    std::printf("minimal-cpp: decode step %u over %u tokens: lse[head 0] %.4f\n", s, len, lse[0]);
  }

  uint32_t got = 0;
  fattn_stats stats = FATTN_STATS_INIT;
  CHECK(view, fattn_seq_length(view, seq, &got));
  CHECK(view, fattn_get_stats(view, &stats));
  CHECK(view, fattn_check(ctx));
  CHECK(view, fattn_seq_close(ctx, seq));
  const fattn_memory_report *mem = fattn_ctx_memory(view);
  std::printf("minimal-cpp: fattn %s (%d), %u tokens, %u of %u pages free, %llu bytes, backend %d, "
              "fattn_check OK\n",
              fattn_version(), fattn_version_number(), got, stats.pages_free, stats.pages_total,
              static_cast<unsigned long long>(mem->device_bytes), fattn_ctx_backend(view, FATTN_MODE_DECODE));
  CHECK(view, fattn_destroy(ctx, 0));
  return 0;
}
