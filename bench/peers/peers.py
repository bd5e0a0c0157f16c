# peers.py: times peer attention (PyTorch SDPA's cuDNN and FlashAttention-2 backends,
# FlexAttention, and FlashAttention-3 / -4 and FlashInfer's paged prefill where their wheels
# are installed) on the shapes of `fattn-bench decode` / `prefill`, on the GPU machine only.
# Usage: python3 bench/peers/peers.py [decode|prefill|serve|mla|all] [--timing gpu|host]  (reads build/*.csv
# for ratios); `peers.py one cudnn|fa2|FA3|FA4 D SEQ CAUSAL` runs one prefill shape (for ncu).
# `peers.py mla` times FlashInfer's absorbed-MLA decode (BatchMLAPagedAttentionWrapper, backend auto: fa3
# on SM90) on DeepSeek-V3 shapes (heads 128 / 16, latent 512 + rope 64, page 64, bf16, q_len 1 and 2)
# against build/mla.csv; not part of `all`. `peers.py fp8` times FlashAttention-3 in fp8 beside its bf16
# and cuDNN's fp8 SDPA (cudnn-frontend, installed from .gpu/fi) on the paper table, and measures
# FlashAttention-3's and fattn's RMSE on its accuracy setup (fattn's fp8 bars). Without network or JIT time, install FlashInfer 0.5.3 from
# .gpu/fi (INSTALL.sh: its wheels and the prebuilt sm_90a MLA modules) first.
# Timing as fattn-bench's: gpu (default) queues each timed call behind a ~200 us spin
# (torch.cuda._sleep), so that the events time the GPU's work and not PyTorch's host path;
# host times it from an idle GPU.
import csv
import os
import statistics
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

try:
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    FLEX = torch.compile(flex_attention, dynamic=False)
except Exception:  # flex attention is optional
    FLEX = None

BACKENDS = {"cudnn": SDPBackend.CUDNN_ATTENTION, "fa2": SDPBackend.FLASH_ATTENTION}
try:  # fa3-fwd: FlashAttention-3's Hopper forward kernels ([bs, seq, heads, d] tensors)
    from fa3_fwd_interface import flash_attn_func as FA3_FUNC
except Exception:
    FA3_FUNC = None
try:
    from fa3_fwd_interface import flash_attn_varlen_func as FA3_VARLEN
except Exception:
    FA3_VARLEN = None
try:  # flash-attn-4: FlashAttention-4's CuTe kernels, SM90 path
    from flash_attn.cute.interface import flash_attn_func as FA4_FUNC
except Exception:
    FA4_FUNC = None

try:  # flashinfer-python: its paged prefill (FA3-template kernels on SM90), at fattn's page sizes
    import flashinfer as FI
except Exception:
    FI = None

HOST_TIMING = "--timing" in sys.argv and sys.argv[sys.argv.index("--timing") + 1:][:1] == ["host"]
HOLD_CYCLES = 400_000  # ~200 us at the H200's clock: longer than PyTorch's host path of a call


def median_ms(fn, runs=21, warmup=3):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(runs):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        if not HOST_TIMING:
            torch.cuda._sleep(HOLD_CYCLES)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def sdpa(name, q, k, v, causal):
    def run():
        with sdpa_kernel(BACKENDS[name]):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=k.shape[1] != q.shape[1])
    return run


def flex(q, k, v, causal):
    if FLEX is None:
        return None
    mask = None
    if causal:
        mask = create_block_mask(lambda b, h, qi, ki: qi >= ki, None, None, q.shape[2], k.shape[2])
    return lambda: FLEX(q, k, v, block_mask=mask, enable_gqa=k.shape[1] != q.shape[1])


def flash(func, q, k, v, causal):
    """A FlashAttention-3 / -4 call on [bs, seq, heads, d] views of SDPA's [bs, heads, seq, d]."""
    if func is None:
        return None
    qt, kt, vt = (x.transpose(1, 2).contiguous() for x in (q, k, v))
    return lambda: func(qt, kt, vt, causal=causal)


def flashinfer_paged(q, k, v, causal, page):
    """FlashInfer's paged prefill on [bs, heads, seq, d] tensors laid into pages of page slots
    (q [bs, hq, q_len, d]; k, v [bs, hkv, kv_len, d]); queries aligned to the end of the KV."""
    if FI is None:
        return None
    try:
        return _flashinfer_paged(q, k, v, causal, page)
    except Exception as e:  # a wheel without the module for this shape reports n/a
        print(f"    (FlashInfer: {type(e).__name__}: {str(e).splitlines()[0][:80]})")
        return None


def _flashinfer_paged(q, k, v, causal, page):
    bs, hq, ql, d = q.shape
    hkv, kvl = k.shape[1], k.shape[2]
    per = (kvl + page - 1) // page
    pad = per * page - kvl
    def pages(x):  # [bs * per, page, hkv, d]
        x = torch.nn.functional.pad(x.transpose(1, 2), (0, 0, 0, 0, 0, pad))
        return x.reshape(bs * per, page, hkv, d).contiguous()
    kp, vp = pages(k), pages(v)
    qf = q.transpose(1, 2).reshape(bs * ql, hq, d).contiguous()
    i32 = dict(device="cuda", dtype=torch.int32)
    qo_indptr = torch.arange(0, bs + 1, **i32) * ql
    kv_indptr = torch.arange(0, bs + 1, **i32) * per
    kv_indices = torch.arange(0, bs * per, **i32)
    last = torch.full((bs,), kvl - (per - 1) * page, **i32)
    ws = torch.empty(256 << 20, device="cuda", dtype=torch.uint8)
    w = FI.BatchPrefillWithPagedKVCacheWrapper(ws, "NHD")
    w.plan(qo_indptr, kv_indptr, kv_indices, last, hq, hkv, d, page, causal=causal,
           q_data_type=q.dtype, kv_data_type=k.dtype)
    return lambda: w.run(qf, (kp, vp))


def try_time(fn):
    if fn is None:
        return None
    try:
        return median_ms(fn)
    except Exception as e:  # a backend that rejects the shape reports n/a
        print(f"    ({type(e).__name__}: {str(e).splitlines()[0][:80]})")
        return None


def read_csv(path):
    if not os.path.exists(path):
        return {}
    with open(path) as f:
        return {(r["mode"], int(r["bs"]), int(r["kv"]), int(r["d"]), r["kv_dtype"], int(r["page"])): r
                for r in csv.DictReader(f)}


def fmt(x, scale=1.0):
    return f"{x * scale:8.1f}" if x else "     n/a"


def decode():
    ours = read_csv("build/decode.csv")
    print("decode, Llama-3.1-8B heads (32 q / 8 kv, d 128), bf16, contiguous KV; GB/s of K+V read")
    print(f"{'bs':>4} {'kv':>6} {'cudnn':>8} {'fa2':>8} {'flex':>8} {'fattn16':>8} {'fattn128':>9} {'/cudnn':>7}")
    for bs, kv in [(64, 4096), (128, 8192), (1, 32768)]:
        q = torch.randn(bs, 32, 1, 128, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(bs, 8, kv, 128, device="cuda", dtype=torch.bfloat16)
        v = torch.randn_like(k)
        gb = bs * kv * 8 * 128 * 2 * 2 / 1e9
        t = {n: try_time(sdpa(n, q, k, v, False)) for n in BACKENDS}
        t["flex"] = try_time(flex(q, k, v, False))
        rate = {n: (gb / (ms / 1e3) if ms else None) for n, ms in t.items()}
        f16 = ours.get(("decode", bs, kv, 128, "bf16", 16))
        f128 = ours.get(("decode", bs, kv, 128, "bf16", 128))
        r16 = float(f16["gbps"]) if f16 else None
        r128 = float(f128["gbps"]) if f128 else None
        ratio = f"{r16 / rate['cudnn']:7.2f}" if r16 and rate["cudnn"] else "    n/a"
        print(f"{bs:4} {kv:6} {fmt(rate['cudnn'])} {fmt(rate['fa2'])} {fmt(rate['flex'])} {fmt(r16)} {fmt(r128):>9} {ratio}")
        del q, k, v
        torch.cuda.empty_cache()


def paper_rows():
    """The FA3 paper's prefill table (16k tokens a row, hidden 2048): (d, seq, bs, causal, flops,
    q, k, v) with bf16 [bs, heads, seq, d] inputs, causal then not, freed after each shape."""
    for d in (64, 128, 256):
        for seq in (512, 1024, 2048, 4096, 8192, 16384):
            bs, h = 16384 // seq, 2048 // d
            q = torch.randn(bs, h, seq, d, device="cuda", dtype=torch.bfloat16)
            k, v = torch.randn_like(q), torch.randn_like(q)
            for causal in (True, False):
                yield d, seq, bs, causal, 4 * bs * h * seq * seq * d / (2 if causal else 1), q, k, v
            del q, k, v
            torch.cuda.empty_cache()


def prefill():
    ours = read_csv("build/prefill.csv")          # fattn-bench prefill --backend fa2
    ours3 = read_csv("build/prefill_fa3.csv")     # fattn-bench prefill --backend fa3 --csv ...
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn_like(a)
    gemm = 2 * 8192**3 / (median_ms(lambda: a @ b) / 1e3) / 1e12
    del a, b
    print(f"prefill, FA3 paper setup (16k tokens, hidden 2048), bf16, TFLOP/s; cuBLAS bf16 GEMM 8192^3: {gemm:.0f}")
    print(f"{'d':>4} {'seq':>6} {'causal':>6} {'cudnn':>8} {'fa2':>8} {'FA3':>8} {'FA4':>8} {'FI128':>8} {'our fa2':>8} "
          f"{'our fa3':>8} {'/best':>6} {'/gemm':>6}")
    for d, seq, bs, causal, flops, q, k, v in paper_rows():
        t = {n: try_time(sdpa(n, q, k, v, causal)) for n in BACKENDS}
        t["FA3"] = try_time(flash(FA3_FUNC, q, k, v, causal))
        t["FA4"] = try_time(flash(FA4_FUNC, q, k, v, causal))
        t["FI"] = try_time(flashinfer_paged(q, k, v, causal, 128)) if FI is not None else None
        rate = {n: (flops / (ms / 1e3) / 1e12 if ms else None) for n, ms in t.items()}
        key = ("causal" if causal else "noncausal", bs, seq, d, "bf16", 128)
        f = float(ours[key]["tflops"]) if key in ours else None
        f3 = float(ours3[key]["tflops"]) if key in ours3 else None
        best = max((rate[n] for n in ("cudnn", "FA3", "FA4", "FI") if rate[n]), default=None)
        ratio = f"{f3 / best:6.2f}" if f3 and best else "   n/a"
        frac = f"{f3 / gemm:6.2f}" if f3 else "   n/a"
        print(f"{d:4} {seq:6} {str(causal):>6} {fmt(rate['cudnn'])} {fmt(rate['fa2'])} {fmt(rate['FA3'])} "
              f"{fmt(rate['FA4'])} {fmt(rate['FI'])} {fmt(f)} {fmt(f3)} {ratio} {frac}")


def fa3_fp8(q, k, v, causal, scales="one"):
    """FlashAttention-3's fp8 forward on [bs, heads, seq, d] tensors: each of q, k, v quantised to
    e4m3 with one scale a (batch, kv head) (its descale tensors' granularity). scales: "one" (for
    timing, on inputs within e4m3's range), "head" (amax / 448 of each (batch, kv head)), or
    "layer" (k and v at one amax / 448 over the whole tensor, as an fp8 cache's layer scale
    stores them; q still a head)."""
    bs, hkv = q.shape[0], k.shape[1]
    parts = []
    for i, x in enumerate((q, k, v)):
        if scales == "one":
            s = torch.ones(bs, hkv, device=x.device, dtype=torch.float32)
        elif scales == "layer" and i > 0:
            s = (x.abs().amax().float() / 448.0).clamp_min(1e-12).expand(bs, hkv)
        else:  # q's heads share their kv head's scale: the amax over the group
            g = x.reshape(bs, hkv, -1).abs().amax(dim=-1).float()
            s = (g / 448.0).clamp_min(1e-12)
        h = x.shape[1]
        xs = x.float() / s.repeat_interleave(h // hkv, dim=1)[:, :, None, None]
        parts.append((xs.transpose(1, 2).contiguous().to(torch.float8_e4m3fn), s.contiguous()))
    (q8, qs), (k8, ks), (v8, vs) = parts
    return lambda: FA3_FUNC(q8, k8, v8, causal=causal, q_descale=qs, k_descale=ks, v_descale=vs)


_CUDNN_FP8 = {}


def cudnn_fp8(q, k, v, causal):
    """cuDNN's fp8 SDPA (cudnn-frontend's sdpa_fp8 graph, over the cuDNN PyTorch loaded) on
    [bs, heads, seq, d] tensors cast to e4m3 at unit scales (timing only: on Hopper its O is
    e4m3 too). None, with the reason printed, where the frontend or the engine is missing."""
    try:
        import cudnn
    except Exception as e:
        print(f"    (cuDNN fp8: cudnn-frontend not importable: {type(e).__name__})")
        return None
    e4m3, f32 = cudnn.data_type.FP8_E4M3, cudnn.data_type.FLOAT
    q8, k8, v8 = (x.to(torch.float8_e4m3fn).contiguous() for x in (q, k, v))
    o8 = torch.empty_like(q8)
    one = torch.ones(1, 1, 1, 1, device="cuda", dtype=torch.float32)
    amax = [torch.empty(1, 1, 1, 1, device="cuda", dtype=torch.float32) for _ in range(2)]
    try:
        if "handle" not in _CUDNN_FP8:
            _CUDNN_FP8["handle"] = cudnn.create_handle()
        handle = _CUDNN_FP8["handle"]
        cudnn.set_stream(handle=handle, stream=torch.cuda.current_stream().cuda_stream)
        g = cudnn.pygraph(io_data_type=e4m3, intermediate_data_type=f32, compute_data_type=f32, handle=handle)
        tq, tk, tv = (g.tensor(dim=list(x.shape), stride=list(x.stride()), data_type=e4m3) for x in (q8, k8, v8))
        sc = [g.tensor(dim=[1, 1, 1, 1], stride=[1, 1, 1, 1], data_type=f32) for _ in range(6)]
        o, _, amax_s, amax_o = g.sdpa_fp8(q=tq, k=tk, v=tv, descale_q=sc[0], descale_k=sc[1], descale_v=sc[2],
                                          descale_s=sc[3], scale_s=sc[4], scale_o=sc[5], generate_stats=False,
                                          attn_scale=q.shape[-1] ** -0.5, use_causal_mask=causal)
        o.set_output(True).set_dim(list(o8.shape)).set_stride(list(o8.stride())).set_data_type(e4m3)
        for a in (amax_s, amax_o):
            a.set_output(True).set_dim([1, 1, 1, 1]).set_stride([1, 1, 1, 1]).set_data_type(f32)
        g.validate()
        g.build_operation_graph()
        g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
        g.check_support()
        g.build_plans()
        ws = torch.empty(max(g.get_workspace_size(), 1), device="cuda", dtype=torch.uint8)
    except Exception as e:
        print(f"    (cuDNN fp8: {type(e).__name__}: {str(e).splitlines()[0][:100] if str(e) else ''})")
        return None
    pack = {tq: q8, tk: k8, tv: v8, o: o8, amax_s: amax[0], amax_o: amax[1]}
    pack.update({t: one for t in sc})
    return lambda: g.execute(pack, ws, handle=handle)


def fattn_cross(q, k, v, fp8):
    """fattn on [1, heads, seq, d] float64 tensors, non-causal (a CROSS step: q attends to an
    encoder sequence holding k, v), bf16 in and out, page 128, the FA3 backend. fp8: the cache
    in e4m3 at the layer scales amax / 448 and compute_dtype fp8 (Q quantised in the kernel)."""
    import fattn
    _, h, seq, d = q.shape
    qb, kb, vb = (x[0].transpose(0, 1).contiguous().to(torch.bfloat16) for x in (q, k, v))
    layer = dict(k_scale=kb.abs().max().item() / 448.0, v_scale=vb.abs().max().item() / 448.0) if fp8 else {}
    cfg = dict(device=torch.cuda.current_device(), page_size=128, kv_budget_pages=seq // 128 + 4, max_batch=1,
               max_seq_len=seq, max_q_tokens=seq, max_encoder_len=seq, prefill_backend="fa3",
               kv_dtype="fp8_e4m3" if fp8 else "bf16")
    if fp8:
        cfg["compute_dtype"] = "fp8_e4m3"
    model = dict(num_layers=1, num_q_heads=h, num_kv_heads=h, head_dim=d, layers=[layer])
    out = torch.empty_like(qb)
    with fattn.Context(model=model, **cfg) as ctx:
        s = ctx.open_seq()
        ctx.reserve(s, seq)
        ctx.plan("cross", [s], q_lens=[seq], kv_lens=[seq], kv_new_lens=[seq])
        ctx.store_kv(0, kb, vb)
        ctx.attend(0, qb, out)
        torch.cuda.synchronize()
        ctx.close_seq(s)
    return out.transpose(0, 1)[None].double()


def fp8():
    """FlashAttention-3 in fp8 beside itself in bf16: the FA3 paper's table (TFLOP/s), and the RMSE
    of O against a float64 oracle on its accuracy setup (N(0, 1), plus N(0, 100) on a share of
    the entries), the bars of fattn's fp8 compute."""
    if FA3_FUNC is None:
        print("fp8: the fa3_fwd wheel is not importable: nothing to compare")
        return
    print("fp8, FA3 paper setup (16k tokens, hidden 2048), TFLOP/s: FlashAttention-3 bf16 and fp8 (e4m3 q, k, v),"
          " cuDNN fp8 (e4m3 in and out)")
    print(f"{'d':>4} {'seq':>6} {'causal':>6} {'FA3 bf16':>9} {'FA3 fp8':>9} {'fp8/bf16':>9} {'cuDNN fp8':>9}")
    for d, seq, bs, causal, flops, q, k, v in paper_rows():
        t16 = try_time(flash(FA3_FUNC, q, k, v, causal))
        t8 = try_time(fa3_fp8(q, k, v, causal))
        tc = try_time(cudnn_fp8(q, k, v, causal))
        r16, r8, rc = (flops / (ms / 1e3) / 1e12 if ms else None for ms in (t16, t8, tc))
        ratio = f"{r8 / r16:9.2f}" if r8 and r16 else "      n/a"
        print(f"{d:4} {seq:6} {str(causal):>6} {fmt(r16):>9} {fmt(r8):>9} {ratio} {fmt(rc):>9}")
    print("fp8 accuracy: bs 1, 16 heads, seq 2048, non-causal; RMSE of O against float64")
    print("FA3 fp8: q, k, v at a scale a head; FA3 fp8 layer: k and v at one scale a tensor, the bytes fattn's"
          " fp8 cache holds")
    print(f"{'d':>4} {'outliers':>9} {'FA3 bf16':>10} {'FA3 fp8':>10} {'FA3 fp8 layer':>13} {'fattn bf16':>10} "
          f"{'fattn fp8':>10}")
    gen = torch.Generator(device="cuda").manual_seed(0)
    for d in (128, 256):
        for share in (0.0, 0.001):
            shape = (1, 16, 2048, d)
            qkv = []
            for _ in range(3):
                x = torch.randn(shape, device="cuda", dtype=torch.float64, generator=gen)
                hit = torch.rand(shape, device="cuda", dtype=torch.float64, generator=gen) < share
                qkv.append(x + hit * torch.randn(shape, device="cuda", dtype=torch.float64, generator=gen) * 10.0)
            q, k, v = qkv
            ref = torch.softmax(q @ k.transpose(-1, -2) / d**0.5, dim=-1) @ v  # [bs, h, seq, d]
            rmse = {}
            for name in ("bf16", "fp8", "fp8 layer"):
                qb, kb, vb = (x.to(torch.bfloat16) for x in (q, k, v))
                try:
                    fn = (flash(FA3_FUNC, qb, kb, vb, False) if name == "bf16" else
                          fa3_fp8(qb, kb, vb, False, scales="head" if name == "fp8" else "layer"))
                    out = fn()
                    out = (out[0] if isinstance(out, tuple) else out).transpose(1, 2).double()
                    rmse[name] = ((out - ref) ** 2).mean().sqrt().item()
                except Exception as e:
                    print(f"    (FA3 {name}: {type(e).__name__}: {str(e).splitlines()[0][:80]})")
                    rmse[name] = None
            for name, f8 in (("fattn bf16", False), ("fattn fp8", True)):
                try:
                    rmse[name] = ((fattn_cross(q, k, v, f8) - ref) ** 2).mean().sqrt().item()
                except Exception as e:
                    print(f"    ({name}: {type(e).__name__}: {str(e).splitlines()[0][:100]})")
                    rmse[name] = None
            cols = " ".join(f"{x:{w}.2e}" if x is not None else f"{'n/a':>{w}}"
                            for x, w in ((rmse["bf16"], 10), (rmse["fp8"], 10), (rmse["fp8 layer"], 13),
                                         (rmse["fattn bf16"], 10), (rmse["fattn fp8"], 10)))
            print(f"{d:4} {share:9.3f} {cols}")


def serve():
    """The serving rows of `fattn-bench prefill` (Llama-3.1-8B heads): extend of q new tokens
    over a cached prefix (causal, queries aligned to the end of the KV), then the varlen batch."""
    ours = read_csv("build/prefill_fa3.csv")
    print("prefill, serving shapes (32 q / 8 kv heads, d 128, bf16), TFLOP/s; peers contiguous, fattn paged")
    print(f"{'bs':>3} {'q':>6} {'prefix':>6} {'cudnn':>8} {'FA3':>8} {'FI16':>8} {'fattn16':>8} {'fattn128':>8} {'/best':>6}")
    for bs in (1, 16):
        for ql in (512, 2048, 8192):
            for prefix in (0, 8192, 32768):
                kv = prefix + ql
                q = torch.randn(bs, 32, ql, 128, device="cuda", dtype=torch.bfloat16)
                k = torch.randn(bs, 8, kv, 128, device="cuda", dtype=torch.bfloat16)
                v = torch.randn_like(k)
                flops = 4 * bs * 32 * 128 * (ql * prefix + ql * (ql + 1) / 2)
                t = {"cudnn": None, "FA3": None, "FI": None}
                if prefix == 0:
                    t["cudnn"] = try_time(sdpa("cudnn", q, k, v, True))
                else:
                    from torch.nn.attention.bias import causal_lower_right
                    bias = causal_lower_right(ql, kv)
                    def run(q=q, k=k, v=v, bias=bias):
                        with sdpa_kernel(BACKENDS["cudnn"]):
                            return F.scaled_dot_product_attention(q, k, v, attn_mask=bias, enable_gqa=True)
                    t["cudnn"] = try_time(run)
                if FA3_FUNC is not None:
                    qt, kt, vt = (x.transpose(1, 2).contiguous() for x in (q, k, v))
                    t["FA3"] = try_time(lambda: FA3_FUNC(qt, kt, vt, causal=True))
                    del qt, kt, vt
                if FI is not None:
                    t["FI"] = try_time(flashinfer_paged(q, k, v, True, 16))
                rate = {n: (flops / (ms / 1e3) / 1e12 if ms else None) for n, ms in t.items()}
                f = {p: ours.get(("causal", bs, kv, 128, "bf16", p)) for p in (16, 128)}
                r = {p: float(f[p]["tflops"]) if f[p] else None for p in f}
                best = max((x for x in rate.values() if x), default=None)
                ratio = f"{r[16] / best:6.2f}" if r[16] and best else "   n/a"
                print(f"{bs:3} {ql:6} {prefix:6} {fmt(rate['cudnn'])} {fmt(rate['FA3'])} {fmt(rate['FI'])} {fmt(r[16])} "
                      f"{fmt(r[128])} {ratio}")
                del q, k, v
                torch.cuda.empty_cache()
    # the varlen batch: the same draw as fattn-bench's
    lens, seed = [], 12345
    for _ in range(16):
        seed = (seed * 1664525 + 1013904223) % (1 << 32)
        lens.append(int(64.0 * 2 ** ((seed >> 8) / (1 << 24) * 7.0)))
    total, longest = sum(lens), max(lens)
    flops = 4 * 32 * 128 * sum(n * (n + 1) / 2 for n in lens)
    q = torch.randn(total, 32, 128, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(total, 8, 128, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    cu = torch.tensor([0] + list(__import__("itertools").accumulate(lens)), device="cuda", dtype=torch.int32)
    fa3 = None
    if FA3_VARLEN is not None:
        fa3 = try_time(lambda: FA3_VARLEN(q, k, v, cu, cu, longest, longest, causal=True))
    rate = flops / (fa3 / 1e3) / 1e12 if fa3 else None
    f = {p: ours.get(("varlen", 16, longest, 128, "bf16", p)) for p in (16, 128)}
    r = {p: float(f[p]["tflops"]) if f[p] else None for p in f}
    ratio = f"{r[16] / rate:6.2f}" if r[16] and rate else "   n/a"
    print(f"varlen 16 prompts of 64..8k (longest {longest}, {total} tokens): FA3 {fmt(rate)} fattn16 {fmt(r[16])} "
          f"fattn128 {fmt(r[128])} {ratio}")


def read_mla_csv(path):
    if not os.path.exists(path):
        return {}
    with open(path) as f:
        return {(int(r["heads"]), int(r["bs"]), int(r["ctx"]), int(r["q_len"]), int(r["page"]), r["kv_dtype"]): r
                for r in csv.DictReader(f)}


def mla_check(w, q_nope, q_pe, ckv, kpe, kv_indices, ctx, ql, sm_scale):
    """Max |error| of FlashInfer's output for the first sequence against an fp32 reference
    (queries aligned to the end of the context, causal among the q_len queries)."""
    page = ckv.shape[1]
    idx = kv_indices[: ctx // page].long()
    k = torch.cat([ckv[idx], kpe[idx]], -1).reshape(ctx, 576).float()        # [ctx, 576]
    q = torch.cat([q_nope[:ql], q_pe[:ql]], -1).float()                       # [ql, heads, 576]
    s = torch.einsum("qhd,kd->qhk", q, k) * sm_scale
    pos = torch.arange(ctx, device="cuda")
    s = s.masked_fill(pos[None, None, :] > (ctx - ql + torch.arange(ql, device="cuda"))[:, None, None], float("-inf"))
    ref = torch.einsum("qhk,kd->qhd", s.softmax(-1), k[:, :512])
    return (w.run(q_nope, q_pe, ckv, kpe)[:ql].float() - ref).abs().max().item()


def mla():
    """FlashInfer's absorbed MLA (DeepSeek-V3: 128 or 16 local heads, latent 512 + rope 64 = 576 read per
    token, qk head dim 128 + 64 for the softmax scale) over a paged latent cache of page 64 in a random
    page order; q_len 2 is one MTP draft token (causal within the sequence). GB/s of latent read.
    MLA_ONLY=HEADS,BS,CTX,Q runs that row alone (for ncu)."""
    only = tuple(int(x) for x in os.environ["MLA_ONLY"].split(",")) if os.environ.get("MLA_ONLY") else None
    if FI is None:
        print("mla: flashinfer is not importable (install .gpu/fi, see INSTALL.sh); no FlashInfer MLA rows")
        return
    ours = read_mla_csv("build/mla.csv")
    print("mla: FlashInfer 0.5.3's BatchMLAPagedAttentionWrapper has no fp8 e4m3 KV (bf16 only on sm90): no fp8 rows")
    page, sm_scale, bf16 = 64, 1.0 / 192 ** 0.5, torch.bfloat16
    ws = torch.empty(128 << 20, device="cuda", dtype=torch.uint8)
    w = FI.mla.BatchMLAPagedAttentionWrapper(ws, backend="auto")
    print(f"mla, DeepSeek-V3 absorbed decode, bf16 latent cache (512 + 64), page {page}, FlashInfer backend "
          f"{w._backend}; ms, GB/s of latent read, TFLOP/s; fattn from build/mla.csv, /FI = FI ms / fattn ms; "
          f"fattn's fp8 latent: its ms and bf16 ms / fp8 ms")
    print(f"{'heads':>5} {'bs':>4} {'ctx':>6} {'q':>2} {'FI ms':>8} {'FI GB/s':>8} {'FI TF/s':>8} {'fattn ms':>8} "
          f"{'fattn GB/s':>10} {'fattn TF/s':>10} {'/FI':>6} {'roof GB/s':>9} {'fp8 ms':>8} {'bf16/fp8':>8}")
    checked = False
    for heads in (128, 16):
        for bs in (1, 16, 64, 128):
            for ctx in (1024, 4096, 16384, 65536):
                if only and (heads, bs, ctx) != only[:3]:
                    continue
                if bs * ctx * 576 * 2 > 40 * 2**30:  # the cache would exceed ~40 GiB
                    print(f"{heads:5} {bs:4} {ctx:6}    (skipped: cache over 40 GiB)")
                    continue
                per = ctx // page
                ckv = torch.randn(bs * per, page, 512, device="cuda", dtype=bf16)
                kpe = torch.randn(bs * per, page, 64, device="cuda", dtype=bf16)
                kv_indices = torch.randperm(bs * per, device="cuda").to(torch.int32)
                kv_indptr = torch.arange(0, bs + 1, dtype=torch.int32) * per
                kv_lens = torch.full((bs,), ctx, dtype=torch.int32)
                for ql in (1, 2):
                    if only and ql != only[3]:
                        continue
                    q_nope = torch.randn(bs * ql, heads, 512, device="cuda", dtype=bf16)
                    q_pe = torch.randn(bs * ql, heads, 64, device="cuda", dtype=bf16)
                    out = torch.empty_like(q_nope)
                    qo_indptr = torch.arange(0, bs + 1, dtype=torch.int32) * ql
                    t = None
                    try:
                        w.plan(qo_indptr, kv_indptr, kv_indices, kv_lens, heads, 512, 64, page, ql > 1, sm_scale,
                               bf16, bf16)
                        if not checked and ql == 2:
                            print(f"    (check vs fp32 torch, heads {heads} bs {bs} ctx {ctx} q 2: max |err| "
                                  f"{mla_check(w, q_nope, q_pe, ckv, kpe, kv_indices, ctx, ql, sm_scale):.4f})")
                            checked = True
                        t = try_time(lambda: w.run(q_nope, q_pe, ckv, kpe, out=out))
                    except Exception as e:  # a wheel without the module (and no JIT) reports n/a
                        print(f"    (FlashInfer: {type(e).__name__}: {str(e).splitlines()[0][:80]})")
                    gb = bs * ctx * 576 * 2 / 1e9
                    flop = 2 * (576 + 512) * heads * ql * bs * ctx
                    rate = gb / (t / 1e3) if t else None
                    tf = flop / (t / 1e3) / 1e12 if t else None
                    f = ours.get((heads, bs, ctx, ql, page, "bf16"))
                    f8 = ours.get((heads, bs, ctx, ql, page, "fp8"))
                    fms = float(f["ms"]) if f else None
                    f8ms = float(f8["ms"]) if f8 else None
                    ratio = f"{t / fms:6.2f}" if t and fms else "   n/a"
                    gain = f"{fms / f8ms:8.2f}" if fms and f8ms else "     n/a"
                    ms = lambda x: f"{x:8.4f}" if x else "     n/a"
                    print(f"{heads:5} {bs:4} {ctx:6} {ql:2} {ms(t)} {fmt(rate)} {fmt(tf)} {ms(fms)} "
                          f"{fmt(float(f['gbs']) if f else None):>10} {fmt(float(f['tflops']) if f else None):>10} "
                          f"{ratio} {fmt(float(f['roof_gbs']) if f else None):>9} {ms(f8ms)} {gain}")
                    del q_nope, q_pe, out
                del ckv, kpe, kv_indices
                torch.cuda.empty_cache()


def one(name, d, seq, causal):
    """Runs one peer on one prefill shape of the paper setup five times (for ncu); FA3fp8 is
    FlashAttention-3 on e4m3 q, k, v, cudnnfp8 cuDNN's fp8 SDPA graph."""
    bs, h = 16384 // seq, 2048 // d
    q = torch.randn(bs, h, seq, d, device="cuda", dtype=torch.bfloat16)
    k, v = torch.randn_like(q), torch.randn_like(q)
    fn = {"FA3": lambda: flash(FA3_FUNC, q, k, v, causal), "FA4": lambda: flash(FA4_FUNC, q, k, v, causal),
          "FA3fp8": lambda: fa3_fp8(q, k, v, causal),
          "cudnnfp8": lambda: cudnn_fp8(q, k, v, causal)}.get(name, lambda: sdpa(name, q, k, v, causal))()
    if fn is None:
        print(f"{name}: not available here")
        return
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    print(f"{name} d {d} seq {seq} causal {causal}: {median_ms(fn):.3f} ms")


if __name__ == "__main__":
    if len(sys.argv) == 6 and sys.argv[1] == "one":  # one NAME D SEQ CAUSAL(0|1)
        one(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5] == "1")
        sys.exit(0)
    what = sys.argv[1] if len(sys.argv) > 1 and not sys.argv[1].startswith("--") else "all"
    print(torch.cuda.get_device_name(), "torch", torch.__version__, "cudnn", torch.backends.cudnn.version(),
          "host timing" if HOST_TIMING else "GPU timing")
    if what in ("decode", "all"):
        decode()
    if what in ("prefill", "all"):
        prefill()
    if what in ("serve", "all"):
        serve()
    if what == "mla":
        mla()
    if what == "fp8":
        fp8()
