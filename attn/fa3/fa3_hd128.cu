/* fa3_hd128.cu: the fa3 kernels for head dims 96 and 128 (tiles of 128 dims; bf16 and fp16 KV
 * with 3 stages, fp8 KV with 2); one file per head dim so that the sm_90a builds run in parallel. */
#include "attn/fa3/fa3.h"

int fa3__launch_hd128(const fa3__args *a, const CUtensorMap *maps, int grid, cudaStream_t st) {
  return fa3__launch<128, 128, 3, 2>(a, maps, grid, st);
}
