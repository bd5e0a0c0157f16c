/* fa3_hd64.cu: the fa3 kernels for head dim 64 (the table's 64 x 64 row); one file per head
 * dim so that the sm_90a builds run in parallel. */
#include "attn/fa3/fa3.h"

int fa3__launch_hd64(const fa3__args *a, const CUtensorMap *maps, int grid, cudaStream_t st) {
  return fa3__launch<64, 64>(a, maps, grid, st);
}
