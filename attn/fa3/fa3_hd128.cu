/* fa3_hd128.cu: the fa3 kernels for head dim 128 (bf16 and fp16, 3 KV stages); one file per head
 * dim so that the sm_90a builds run in parallel. */
#include "attn/fa3/fa3.h"

int fa3__launch_hd128(const fa3__args *a, const CUtensorMap *maps, int grid, cudaStream_t st) {
  return fa3__launch<128, 3>(a, maps, grid, st);
}
