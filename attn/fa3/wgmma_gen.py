#!/usr/bin/env python3
# wgmma_gen.py: writes attn/fa3/wgmma.h, the wgmma.mma_async wrappers whose operand lists
# (one register per accumulator) are too long to spell by hand. Run: python3 wgmma_gen.py
SS_N = (64, 128)        # S = Q K^T: N is the KV tile
RS_N = (64, 128, 192, 256)   # O += P V: N is head_dim_v
SST_N = (64, 256)            # O += P V with P in shared memory: N is d_v (three consumers at d 64) or MLA's half of d_v
TYPES = (("bf16", "__nv_bfloat16"), ("f16", "__half"))
E4_SS_N = (64, 128)           # the e4m3 kernels' S = Q K^T (k32 steps)
E4_RS_N = (64, 128, 192, 256)  # their O += P V, V transposed to K-major (fp8 has no MN-major B)

def regs(n, first):
    return ",".join("%%%d" % (first + i) for i in range(n))

def outs(n):
    return ", ".join('"+f"(d[%d])' % i for i in range(n))

def ss(n, ptx, ctype, name="fa3__mma_ss", tnsp_b=0):
    """Both operands from shared memory; tnsp_b 1: B MN-major (fa3__mma_sst)."""
    r = n // 2
    return f"""template <> __device__ __forceinline__ void {name}<{n}, {ctype}>(float *d, uint64_t a, uint64_t b, int acc) {{
  asm volatile("{{\\n.reg .pred p;\\nsetp.ne.b32 p, %{r + 2}, 0;\\n"
               "wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{ptx}.{ptx} {{{regs(r, 0)}}}, %{r}, %{r + 1}, p, 1, 1, 0, {tnsp_b};\\n}}\\n"
               : {outs(r)}
               : "l"(a), "l"(b), "r"(acc));
}}
"""

def sst(n, ptx, ctype):
    return ss(n, ptx, ctype, "fa3__mma_sst", 1)

def rs(n, ptx, ctype):
    r = n // 2
    return f"""template <> __device__ __forceinline__ void fa3__mma_rs<{n}, {ctype}>(float *d, const uint32_t *a, uint64_t b) {{
  asm volatile("wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{ptx}.{ptx} {{{regs(r, 0)}}}, {{{regs(4, r)}}}, %{r + 4}, 1, 1, 1, 1;\\n"
               : {outs(r)}
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));
}}
"""

def ss8(n):
    r = n // 2
    return f"""template <> __device__ __forceinline__ void fa3__mma_ss<{n}, __nv_fp8_e4m3>(float *d, uint64_t a, uint64_t b, int acc) {{
  asm volatile("{{\\n.reg .pred p;\\nsetp.ne.b32 p, %{r + 2}, 0;\\n"
               "wgmma.mma_async.sync.aligned.m64n{n}k32.f32.e4m3.e4m3 {{{regs(r, 0)}}}, %{r}, %{r + 1}, p, 1, 1;\\n}}\\n"
               : {outs(r)}
               : "l"(a), "l"(b), "r"(acc));
}}
"""

def rs8(n):
    r = n // 2
    return f"""template <> __device__ __forceinline__ void fa3__mma_rs<{n}, __nv_fp8_e4m3>(float *d, const uint32_t *a, uint64_t b) {{
  asm volatile("wgmma.mma_async.sync.aligned.m64n{n}k32.f32.e4m3.e4m3 {{{regs(r, 0)}}}, {{{regs(4, r)}}}, %{r + 4}, 1, 1, 1;\\n"
               : {outs(r)}
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));
}}
"""

parts = ["""/* wgmma.h: wgmma.mma_async wrappers for the fa3 kernels, written by attn/fa3/wgmma_gen.py.
 * d holds the m64nN fp32 accumulator fragment (N/2 registers a thread of the warpgroup). */
#ifndef FATTN_ATTN_FA3_WGMMA_H
#define FATTN_ATTN_FA3_WGMMA_H

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <stdint.h>

/* d (+)= A B, A and B K-major in shared memory (descriptors); acc 0 overwrites d. */
template <int N, typename T> __device__ void fa3__mma_ss(float *d, uint64_t a, uint64_t b, int acc);
/* d (+)= A B, A K-major and B MN-major (transposed) in shared memory; acc 0 overwrites d. */
template <int N, typename T> __device__ void fa3__mma_sst(float *d, uint64_t a, uint64_t b, int acc);
/* d += A B, A from registers (the m64k16 fragment; m64k32 for e4m3), B in shared memory:
 * MN-major for 16-bit types, K-major for e4m3 (its wgmma has no transposed operands). */
template <int N, typename T> __device__ void fa3__mma_rs(float *d, const uint32_t *a, uint64_t b);

"""]
for ptx, ctype in TYPES:
    for n in SS_N:
        parts.append(ss(n, ptx, ctype))
    for n in SST_N:
        parts.append(sst(n, ptx, ctype))
    for n in RS_N:
        parts.append(rs(n, ptx, ctype))
for n in E4_SS_N:
    parts.append(ss8(n))
for n in E4_RS_N:
    parts.append(rs8(n))
parts.append("#endif /* FATTN_ATTN_FA3_WGMMA_H */\n")
with open(__file__.replace("wgmma_gen.py", "wgmma.h"), "w") as f:
    f.write("\n".join(parts))
