/* fa3_hd192.cu: the fa3 kernels for head dim 192 with d_v 128 or 192 (the table's two 192
 * rows); one file per head dim so that the sm_90a builds run in parallel. */
#include "attn/fa3/fa3.h"

int fa3__launch_hd192(const fa3__args *a, const CUtensorMap *maps, int grid, cudaStream_t st) {
  if (a->k.l.head_dim_v == 128u) return fa3__launch<192, 128>(a, maps, grid, st);
  return fa3__launch<192, 192>(a, maps, grid, st);
}
