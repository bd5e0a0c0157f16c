/* fa3_hd128.cu: the fa3 kernels for head dims 96 and 128 (the table's 128 x 128 row); one
 * file per head dim so that the sm_90a builds run in parallel. */
#include "attn/fa3/fa3.h"

int fa3__launch_hd128(const fa3__args *a, const CUtensorMap *maps, int grid, cudaStream_t st) {
  return fa3__launch<128, 128>(a, maps, grid, st);
}
