/* fa2_hd256.cu: instantiates the fa2 attention kernels for head_dim 256 (K, V and O).
 * Eight kernels: decode and prefill tiles, bf16 and fp16 Q, native or fp8 KV. */
#include "attn/fa2/fa2.h"

int fa2__launch_hd256(const fa2__args *a, int kind, dim3 grid, cudaStream_t st) {
  return fa2__launch<256, 256>(a, kind, grid, st);
}
