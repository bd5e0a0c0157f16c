/* fa2_hd96.cu: instantiates the fa2 attention kernels for head_dim 96 (K, V and O).
 * Eight kernels: decode and prefill tiles, bf16 and fp16 Q, native or fp8 KV. */
#include "attn/fa2/fa2.h"

int fa2__launch_hd96(const fa2__args *a, int kind, dim3 grid, cudaStream_t st) {
  return fa2__launch<96, 96>(a, kind, grid, st);
}
