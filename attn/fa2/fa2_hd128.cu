/* fa2_hd128.cu: instantiates the fa2 attention kernels for head_dim 128 (K, V and O).
 * Eight kernels: decode and prefill tiles, bf16 and fp16 Q, native or fp8 KV. */
#include "attn/fa2/fa2.h"

int fa2__launch_hd128(const fa2__args *a, int kind, dim3 grid, cudaStream_t st) {
  return fa2__launch<128, 128>(a, kind, grid, st);
}
