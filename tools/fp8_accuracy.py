# fp8_accuracy.py: the accuracy of candidate fp8 attention policies, emulated on the CPU against
# a float64 oracle, on FlashAttention-3's accuracy setup (docs/performance.md, fp8 compute).
#
#   python3 tools/fp8_accuracy.py [--seq 2048] [--heads 4] [--d 128] [--seeds 3]
#
# Q, K and V are drawn from N(0, 1), plus N(0, 100) on a share of 0.001 of their entries in the
# "outliers" rows (FlashAttention-3's paper, section 4.3). Each policy rounds the operands as a
# kernel would (e4m3 through torch's float8_e4m3fn, bf16 likewise), multiplies in float32 and
# takes the softmax over whole rows (an online softmax differs from it by float32 rounding
# alone). RMSE is over every element of O against the float64 oracle; it needs torch (CPU).
import argparse
import math

import torch

E4M3_MAX = 448.0


def e4m3(x):
    """x rounded to e4m3 (saturating at +-448), back in float32."""
    return x.clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).to(torch.float32)


def bf16(x):
    return x.to(torch.bfloat16).to(torch.float32)


def quant(x, dims):
    """x over its amax along dims, scaled into e4m3's range: (rounded x / scale, scale)."""
    amax = x.abs().amax(dim=dims, keepdim=True).clamp_min(1e-12)
    scale = amax / E4M3_MAX
    return e4m3(x / scale), scale


def blocks(x, rows):
    """[heads, seq, d] as [heads, seq / rows, rows, d], for scales a block of rows."""
    h, s, d = x.shape
    return x.reshape(h, s // rows, rows, d)


def hadamard(d, gen):
    """A d x d orthonormal Walsh-Hadamard matrix with random signs on its rows (d a power of 2)."""
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < d:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    signs = torch.randint(0, 2, (d,), generator=gen, dtype=torch.float64) * 2 - 1
    return (h * signs[:, None]) / math.sqrt(d)


def softmax_out(s, v, p_round, p_mul=1.0):
    """O = softmax(s) v with P rounded by p_round after scaling by p_mul (descaled after)."""
    p = torch.exp(s - s.amax(dim=-1, keepdim=True))
    l = p.sum(dim=-1, keepdim=True)
    return (p_round(p * p_mul) @ v) / (p_mul * l)


def run(q, k, v, policy, gen):
    d = q.shape[-1]
    sm = 1.0 / math.sqrt(d)
    if policy == "bf16":
        s = bf16(q.float()) @ bf16(k.float()).transpose(-1, -2) * sm
        return softmax_out(s, bf16(v.float()), bf16)
    if policy in ("fp8 per-tensor, P unscaled", "fp8 per-tensor, P x 448"):
        q8, sq = quant(q.float(), (-3, -2, -1))
        k8, sk = quant(k.float(), (-3, -2, -1))
        v8, sv = quant(v.float(), (-3, -2, -1))
        s = (q8 @ k8.transpose(-1, -2)) * (sq * sk * sm)
        return softmax_out(s, v8, e4m3, E4M3_MAX if "448" in policy else 1.0) * sv
    # The fattn plan: K and V from an fp8 cache with a scale a layer (per tensor); Q quantised in
    # the kernel with a scale a 128-row tile and head; P x 448 in e4m3. "+ Hadamard": Q and K
    # rotated by the same random-signed Hadamard first (Q K^T unchanged in exact arithmetic).
    hm = None
    if "Hadamard" in policy:
        hm = hadamard(d, gen)
        q, k = q @ hm, k @ hm
        if "V too" in policy:  # O = (P (V H)) H^T: the epilogue rotates O back
            v = v @ hm
    k8, sk = quant(k.float(), (-3, -2, -1))
    v8, sv = quant(v.float(), (-3, -2, -1))
    if "K/V blocks" in policy:  # FlashAttention-3's block quantisation of K and V (128 rows)
        kb, skb = quant(blocks(k.float(), 128), (-2, -1))
        vb, svb = quant(blocks(v.float(), 128), (-2, -1))
        k8 = (kb * skb).reshape(k.shape)  # exact e4m3 values times their block scale
        v8 = (vb * svb).reshape(v.shape)
        sk = sv = torch.ones(1, dtype=torch.float32)
    qb, sqb = quant(blocks(q.float(), 128), (-2, -1))
    qd = (qb * sqb).reshape(q.shape)
    s = (qd @ k8.transpose(-1, -2)) * (sk * sm)
    o = softmax_out(s, v8, e4m3, E4M3_MAX) * sv
    return o if hm is None or "V too" not in policy else (o.double() @ hm.T).float()


POLICIES = ["bf16", "fp8 per-tensor, P unscaled", "fp8 per-tensor, P x 448", "fp8 Q tiles, K/V per layer",
            "fp8 Q tiles, K/V per layer + Hadamard", "fp8 Q tiles, K/V blocks + Hadamard",
            "fp8 Q tiles, K/V per layer + Hadamard, V too"]


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--d", type=int, default=128)
    ap.add_argument("--seeds", type=int, default=3)
    args = ap.parse_args()
    print(f"fp8 attention policies on the CPU: seq {args.seq}, heads {args.heads}, d {args.d}, non-causal, "
          f"{args.seeds} seeds; RMSE of O against float64")
    print(f"{'policy':42s} {'no outliers':>12s} {'outliers 0.001':>15s}")
    for policy in POLICIES:
        cols = []
        for share in (0.0, 0.001):
            err = []
            for seed in range(args.seeds):
                gen = torch.Generator().manual_seed(seed)
                shape = (args.heads, args.seq, args.d)
                qkv = []
                for _ in range(3):
                    x = torch.randn(shape, generator=gen, dtype=torch.float64)
                    hit = torch.rand(shape, generator=gen, dtype=torch.float64) < share
                    x = x + hit * torch.randn(shape, generator=gen, dtype=torch.float64) * 10.0
                    qkv.append(x)
                q, k, v = qkv
                ref = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(args.d), dim=-1) @ v
                o = run(q, k, v, policy, gen).double()
                err.append(((o - ref) ** 2).mean().sqrt().item())
            cols.append(sum(err) / len(err))
        print(f"{policy:42s} {cols[0]:12.2e} {cols[1]:15.2e}")


if __name__ == "__main__":
    main()
