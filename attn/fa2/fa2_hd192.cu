/* fa2_hd192.cu: instantiates the fa2 attention kernels for head_dim 192 with head_dim_v
 * 192 or 128 (sixteen kernels: decode/prefill x bf16/fp16 Q x native/fp8 KV x two dv). */
#include "attn/fa2/fa2.h"

int fa2__launch_hd192(const fa2__args *a, int kind, dim3 grid, cudaStream_t st) {
  if (a->l.head_dim_v == 128u) return fa2__launch<192, 128>(a, kind, grid, st);
  return fa2__launch<192, 192>(a, kind, grid, st);
}
