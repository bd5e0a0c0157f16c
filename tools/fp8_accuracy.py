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
#
#   python3 tools/fp8_accuracy.py --gpu-test
#
# emulates instead the policy of fattn_config.compute_dtype FP8_E4M3 on the data of gpu_fa3's
# fp8_compute cases (tests/gpu_fa2.c): the figures its tolerance is set from.
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


# ---- gpu_fa3's fp8_compute cases (tests/gpu_fa2.c, run_case): Q from N(0, 1.5^2) in q_dtype, K and
# V from N(0, 1) stored in e4m3 and read at k_scale 0.75 / v_scale 1.25, softmax scale 1/sqrt(d).
# Entries as the cases draw them (the longest of each mode, and short ones), under each option.
GPU_ENTRIES = {  # mode: (q_len, kv_len, causal) entries
    "prefill": [(1000, 1600, True), (129, 729, True), (17, 17, True), (2, 2, True), (1, 1, True)],
    "verify": [(8, 4224, True), (64, 100, True), (3, 4, True), (1, 2, True)],
    "draft_extend": [(8, 600, True), (3, 40, True), (2, 3, True)],
    "cross": [(300, 4224, False), (40, 17, False), (7, 2, False), (7, 1, False)],
}
GPU_OPTIONS = ["none", "window", "chunk", "softcap", "sinks"]


def q_round(x, qt):
    return x.to(torch.bfloat16 if qt == "bf16" else torch.float16).to(torch.float64)


def visible(q_len, kv_len, causal, option):
    """[q_len, kv_len] mask of the slots each query sees (window 100, chunk 128 as the cases draw)."""
    j = torch.arange(kv_len)[None, :]
    i = (torch.arange(q_len) + kv_len - q_len)[:, None]
    if not causal:
        return torch.ones(q_len, kv_len, dtype=torch.bool)
    m = j <= i
    if option == "window":
        m &= i - j <= 100
    if option == "chunk":
        m &= j // 128 == i // 128
    return m


def fp8_attend(q, k, v, mask, sm, cap, sink):
    """The policy in float32: Q in e4m3 with a scale a 64-row tile and head, K and V the cache's
    e4m3 values (scales applied after the GEMMs), P rounded to e4m3 unscaled against the row's
    final max (a kernel's running max is at most that: its P are no smaller, their rounding no
    coarser), the row sum from P before rounding; O in float32 (rounded to q_dtype by the caller)."""
    rows = q.shape[1]
    pad = (-rows) % 64
    qp = torch.nn.functional.pad(q.float(), (0, 0, 0, pad)).reshape(q.shape[0], -1, 64, q.shape[2])
    q8, sq = quant(qp, (-2, -1))
    qd = (q8 * sq).reshape(q.shape[0], -1, q.shape[2])[:, :rows]
    s = (qd @ (k.float() / 0.75).transpose(-1, -2)) * (0.75 * sm)
    if cap:
        s = cap * torch.tanh(s / cap)
    s = s.masked_fill(~mask, -math.inf)
    m = torch.maximum(s.amax(dim=-1, keepdim=True), sink[:, None, None].float())
    m = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    p = torch.exp(s - m)
    l = p.sum(dim=-1, keepdim=True) + torch.exp(sink[:, None, None].float() - m)
    o = (e4m3(p) @ (v.float() / 1.25)) * 1.25 / l
    return torch.where(l > 0, o, torch.zeros_like(o)), (m + torch.log(l)).squeeze(-1)


def ref_attend(q, k, v, mask, sm, cap, sink):
    s = (q @ k.transpose(-1, -2)) * sm
    if cap:
        s = cap * torch.tanh(s / cap)
    s = s.masked_fill(~mask, -math.inf)
    full = torch.cat([s, sink[:, None, None].expand(-1, s.shape[1], 1)], dim=-1)
    lse = torch.logsumexp(full, dim=-1)
    p = torch.exp(s - lse[..., None])
    return torch.nan_to_num(p @ v), lse


def gpu_test(seeds):
    """A case may hold one entry, so each figure is the worst over single entries (RMSE over the
    entry's O), the worst of any case's however many entries it holds."""
    print("fp8 compute on gpu_fa3's fp8_compute data (Q N(0, 1.5^2), K 0.75 e4m3(N(0,1)), V 1.25 e4m3(N(0,1)),"
          f" 2 q heads), {seeds} seeds; the worst entry of each mode")
    print(f"{'d':>4s} {'mode':>12s} {'option':>8s} {'qt':>4s} {'RMSE':>9s} {'max abs':>9s} {'LSE rel':>9s}")
    worst = [0.0, 0.0, 0.0]
    for d, dv in ((64, 64), (96, 96), (128, 128), (192, 128), (192, 192), (256, 256)):
        for mode, entries in GPU_ENTRIES.items():
            for option in GPU_OPTIONS:
                for qt in ("bf16", "fp16"):
                    rmse = mx = le = 0.0
                    for seed in range(seeds):
                        gen = torch.Generator().manual_seed(seed)
                        for q_len, kv_len, causal in entries:
                            h = 2
                            q = q_round(torch.randn(h, q_len, d, generator=gen, dtype=torch.float64) * 1.5, qt)
                            k = 0.75 * e4m3(torch.randn(h, kv_len, d, generator=gen)).double()
                            v = 1.25 * e4m3(torch.randn(h, kv_len, dv, generator=gen)).double()
                            sink = (torch.rand(h, generator=gen, dtype=torch.float64) * 4 - 1 if option == "sinks"
                                    else torch.full((h,), -math.inf, dtype=torch.float64))
                            cap = 3.0 if option == "softcap" else 0.0
                            mask = visible(q_len, kv_len, causal, option)
                            o_ref, l_ref = ref_attend(q, k, v, mask, 1 / math.sqrt(d), cap, sink)
                            o, lse = fp8_attend(q, k, v, mask, 1 / math.sqrt(d), cap, sink)
                            o = q_round(o, qt)
                            err = o - o_ref
                            rmse = max(rmse, (err ** 2).mean().sqrt().item())
                            mx = max(mx, err.abs().max().item())
                            fin = torch.isfinite(l_ref)
                            le = max(le, ((lse.double() - l_ref).abs() / (1 + l_ref.abs()))[fin].max().item())
                    worst = [max(worst[0], rmse), max(worst[1], mx), max(worst[2], le)]
                    print(f"{d:4d} {mode:>12s} {option:>8s} {qt:>4s} {rmse:9.2e} {mx:9.2e} {le:9.2e}")
    print(f"worst: RMSE {worst[0]:.2e}, max abs {worst[1]:.2e}, LSE |err| / (1 + |LSE|) {worst[2]:.2e}")


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--d", type=int, default=128)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--gpu-test", action="store_true", help="gpu_fa3's fp8_compute cases instead")
    args = ap.parse_args()
    if args.gpu_test:
        gpu_test(args.seeds)
        return
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
