/* shapes.h: the model shapes that the tests and fattn-bench share, so that the memory plan the
 * tests check by hand is the one `make run` prints. */
#ifndef FATTN_TESTS_SHAPES_H
#define FATTN_TESTS_SHAPES_H

#include "fattn.h"

/* Llama-3.1-8B: 32 layers, 32 q / 8 kv heads, d 128, bf16, page 16, 80 GiB of KV,
 * max_batch 256, max_seq_len 131072, max_q_tokens 8192. */
static inline void fattn_shape_llama8b(fattn_config *cfg, fattn_model *model, int device) {
  const fattn_config c = FATTN_CONFIG_INIT;
  const fattn_model m = FATTN_MODEL_INIT;
  *cfg = c;
  *model = m;
  model->num_layers = 32;
  model->num_q_heads = 32;
  model->num_kv_heads = 8;
  model->head_dim = 128;
  cfg->device = device;
  cfg->page_size = 16;
  cfg->kv_budget_bytes = 80ull << 30;
  cfg->max_batch = 256;
  cfg->max_seq_len = 131072;
  cfg->max_q_tokens = 8192;
}

#endif /* FATTN_TESTS_SHAPES_H */
