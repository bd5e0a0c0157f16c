/* fa3_hd256.cu: the fa3 kernels for head dim 256 (the table's 256 x 256 row); one file per
 * head dim so that the sm_90a builds run in parallel. */
#include "attn/fa3/fa3.h"

int fa3__launch_hd256(const fa3__args *a, const CUtensorMap *maps, int grid, cudaStream_t st) {
  return fa3__launch<256, 256>(a, maps, grid, st);
}
