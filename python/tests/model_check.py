# model_check.py: the model-level check of make gpu-test: small random-weight transformers models
# through fattn.hf (bf16) beside transformers' bf16 attention and FA3, against float32 eager.
# Batching: each run takes one left-padded batch with its 2-D attention mask and position_ids, the
# form fattn.hf serves (pad tokens stay out of fattn's sequences, as in test_hf.py), so that every
# step plans several sequences of different lengths at once; FA3's attention function drops each
# row's pad keys and queries and calls flash_attn_func on the row alone. After the prefill every
# run is fed the oracle's greedy tokens (teacher forcing): all runs see the same sequences, and one
# flipped token does not cascade. A position's logit error is its largest |logit - oracle| over
# the vocabulary; a run's max and mean are over every real position, prompt and decode. On CUDA,
# fattn runs twice: its decode steps eagerly, and replayed from CUDA graphs of the decode forward
# (fattn.hf's graphs); the two must give the same logits bit for bit.
# Usage: python3 python/tests/model_check.py [--device cuda|cpu] [--steps 64] [--models a,b]
# [--out DIR], or from python/ `python3 -m unittest tests.model_check` (FATTN_CHECK_DEVICE=cpu:
# fattn's CPU backend). Without torch, transformers or (on cuda) a device: one line, exit 0.
import argparse
import copy
import inspect
import json
import math
import os
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # python/
try:
    import torch
    import transformers
    MISSING = None
except ImportError as e:
    torch = transformers = None
    MISSING = f"{e.name or e} is not installed"
try:
    import fattn
    FATTN_ERROR = None
except ImportError as e:
    fattn, FATTN_ERROR = None, e

STEPS = 64
WINDOW = 32   # window and chunk: the first prompt is longer, decoding takes every row past it
PROMPTS = (45, 7, 26, 16)
PAGE = 16
TOLERANCE = 1.25  # fattn's error may reach the best bf16 peer's times this
FLOOR = 1e-3      # the error bound where the peers' error is about zero
COMMON = dict(vocab_size=1024, hidden_size=512, intermediate_size=1024, num_hidden_layers=4,
              num_attention_heads=8, num_key_value_heads=2, head_dim=64,
              max_position_embeddings=1024, pad_token_id=0, bos_token_id=None, eos_token_id=None,
              # Weights wider than the default 0.02 make attention peaked: leaving out a window,
              # chunk, softcap or the sinks moves the oracle's logits 6-20x further (mean error)
              # than bf16 rounding does. Wider still (0.1), bf16's error outgrows the logits'
              # top-2 margins, and few positions would be left to the argmax check.
              initializer_range=0.05)
# key -> (label, config class, the config's own fields, transformers' bf16 attention: sdpa, or
# eager where the model refuses sdpa (softcap, sinks), what keeps FA3 out (None: FA3 runs)).
MODELS = {
    "llama3": ("Llama 3 (GQA 4:1, head_dim 128)", "LlamaConfig",
               {"head_dim": 128, "rope_theta": 500000.0}, "sdpa", None),
    "qwen2": ("Qwen 2 (GQA 4:1, QKV bias)", "Qwen2Config", {}, "sdpa", None),
    "mistral": (f"Mistral (sliding window {WINDOW})", "MistralConfig",
                {"head_dim": 128, "sliding_window": WINDOW}, "sdpa", "sliding window"),
    "gemma2": (f"Gemma 2 (softcap, alternating window {WINDOW})", "Gemma2Config",
               {"num_key_value_heads": 4, "head_dim": 128, "sliding_window": WINDOW,
                "attn_logit_softcapping": 5.0, "query_pre_attn_scalar": 96,
                "final_logit_softcapping": None}, "eager", "sliding window"),
    "gpt-oss": (f"gpt-oss (sinks, alternating window {WINDOW})", "GptOssConfig",
                {"sliding_window": WINDOW, "num_local_experts": 2, "num_experts_per_tok": 2},
                "eager", "sinks and sliding window"),
    "llama4": (f"Llama 4 text (chunked attention {WINDOW})", "Llama4TextConfig",
               {"head_dim": 128, "attention_chunk_size": WINDOW, "intermediate_size_mlp": 1024,
                "num_local_experts": 1, "num_experts_per_tok": 1}, "sdpa", "chunked attention"),
    # fattn runs it absorbed (latent 512 + rope 64 a token); the peers attend over the K and V
    # the module expands (d 192, d_v 128). Dense layers only: MoE routing is not what is checked.
    "deepseek-v3": ("DeepSeek-V3 (MLA: latent 512 + rope 64, absorbed)", "DeepseekV3Config",
                    {"num_key_value_heads": 8, "kv_lora_rank": 512, "q_lora_rank": 256,
                     "qk_rope_head_dim": 64, "qk_nope_head_dim": 128, "v_head_dim": 128,
                     "first_k_dense_replace": 4, "n_routed_experts": 2, "num_experts_per_tok": 1,
                     "n_group": 1, "topk_group": 1, "moe_intermediate_size": 256}, "sdpa", None),
}


def missing(device):
    """Why the check cannot run here (one line), or None."""
    if MISSING:
        return MISSING
    if device.startswith("cuda") and not torch.cuda.is_available():
        return f"no CUDA device (torch {torch.__version__}, built for CUDA {torch.version.cuda})"
    return None


def load_fa3():
    """FA3's flash_attn_func (the fa3_fwd wheel), or the reason it is not there."""
    try:
        from fa3_fwd_interface import flash_attn_func
    except Exception as e:  # ImportError, or an OSError / RuntimeError of its extension
        return None, f"fa3_fwd_interface does not import ({type(e).__name__}: {e})"
    return flash_attn_func, None


def register_fa3(flash_attn_func):
    """FA3 as a transformers attention function under the name fa3_fwd, with flash attention's mask
    function (the 2-D padding mask, None where no row is padded). Its causal mask is aligned to the
    bottom right: the queries are the last of a row's keys."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, flash_attention_mask

    def attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
        if kwargs.get("sliding_window") or kwargs.get("softcap") or kwargs.get("s_aux") is not None:
            raise ValueError("fa3_fwd: local attention, softcap and sinks are not run here")
        q, k, v = (t.transpose(1, 2) for t in (query, key, value))  # [batch, tokens, heads, d]
        out = q.new_zeros(q.shape[0], q.shape[1], q.shape[2], v.shape[-1])
        for row in range(q.shape[0]):
            if attention_mask is None:
                qs, keys = slice(None), slice(None)
            else:
                qs = attention_mask[row, -q.shape[1]:].bool()
                keys = attention_mask[row, -k.shape[1]:].bool()
            o = flash_attn_func(q[row][qs][None].contiguous(), k[row][keys][None].contiguous(),
                                v[row][keys][None].contiguous(), softmax_scale=scaling,
                                causal=True)
            out[row, qs] = (o[0] if isinstance(o, tuple) else o)[0]
        return out, None

    AttentionInterface.register("fa3_fwd", attention)
    AttentionMaskInterface.register("fa3_fwd", flash_attention_mask)


def build(key, device):
    """The model's config and its float32 eager model (the oracle), weights from a fixed seed."""
    _, cls, extra, _, _ = MODELS[key]
    config = getattr(transformers, cls)(**{**COMMON, **extra})
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    return config, model.float().eval().to(device)


def prompts(config, device, lengths=PROMPTS):
    """A left-padded batch of prompts of these lengths: ids and the 2-D mask [batch, longest]."""
    longest = max(lengths)
    ids = torch.zeros(len(lengths), longest, dtype=torch.long)
    mask = torch.zeros_like(ids)
    g = torch.Generator().manual_seed(1)
    for row, n in enumerate(lengths):
        ids[row, longest - n:] = torch.randint(1, config.vocab_size, (n,), generator=g)
        mask[row, longest - n:] = 1
    return ids.to(device), mask.to(device)


def generate(model, ids, mask, cache, steps, tokens=None):
    """Logits [batch, prompt + steps, vocab] float32 (on the CPU) of a prefill and steps decode
    steps, each fed tokens[:, step] (None: the argmax of the step before), and the tokens fed."""
    # transformers 5.25 names the cache argument and output `cache`, earlier 5.x `past_key_values`.
    name = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    positions = (mask.cumsum(1) - 1).clamp(min=0)  # left padding: real tokens count from 0
    logits, fed = [], []
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True,
                    **{name: cache})
        for step in range(steps + 1):
            logits.append(out.logits.float().cpu())
            if step == steps:
                break
            nxt = (logits[-1][:, -1:].argmax(-1) if tokens is None
                   else tokens[:, step:step + 1]).to(ids.device)
            fed.append(nxt.cpu())
            mask = torch.cat([mask, torch.ones_like(nxt)], dim=1)
            positions = positions[:, -1:] + 1
            out = model(input_ids=nxt, attention_mask=mask, position_ids=positions,
                        use_cache=True, **{name: getattr(out, name)})
    return torch.cat(logits, dim=1), torch.cat(fed, dim=1)


def check_model(key, device, steps, fa3):
    """The runs of one model: {model, runs: [{run, max, mean, argmax %, decided, ..}], notes,
    failures}."""
    label, _, _, peer_attn, no_fa3 = MODELS[key]
    config, oracle = build(key, device)
    ids, mask = prompts(config, device)
    cache = lambda: transformers.DynamicCache(config=config)
    want, tokens = generate(oracle, ids, mask, cache(), steps)
    runs, notes = {}, []

    peer = copy.deepcopy(oracle).to(torch.bfloat16)
    peer.set_attn_implementation(peer_attn)
    peer_name = f"transformers {peer_attn} bf16"
    runs[peer_name], _ = generate(peer, ids, mask, cache(), steps, tokens)
    if peer_attn != "sdpa":
        notes.append(f"{peer_name}: the model refuses sdpa (softcap or sinks)")
    del peer

    fa3_func, fa3_why = fa3
    if fa3_func is not None and no_fa3 is None and device.startswith("cuda"):
        other = copy.deepcopy(oracle).to(torch.bfloat16)
        other.set_attn_implementation("fa3_fwd")
        try:
            runs["FA3 bf16"], _ = generate(other, ids, mask, cache(), steps, tokens)
        except Exception as e:  # a head-dim pair the wheel was not built for
            notes.append(f"FA3 omitted: {type(e).__name__}: {str(e).splitlines()[0][:120]}")
        del other
    elif fa3_func is not None and no_fa3 is None:
        notes.append("FA3 omitted: it runs on CUDA alone")
    elif no_fa3 is not None:
        notes.append(f"FA3 omitted: the fa3_fwd wheel is built without local attention and sinks "
                     f"({no_fa3} here)")
    else:
        notes.append(f"FA3 omitted: {fa3_why}")

    ours = copy.deepcopy(oracle).to(torch.bfloat16)
    sizes = dict(device=device, page_size=PAGE, max_batch=len(PROMPTS),
                 max_seq_len=PAGE * math.ceil((max(PROMPTS) + steps + 1) / PAGE))
    backend = fattn.hf.use(ours, graphs=False, **sizes)
    try:
        runs["fattn bf16"], _ = generate(ours, ids, mask, backend.cache(), steps, tokens)
        backend.ctx.check()
    finally:
        backend.close()
    graphs = run_graphs(ours, ids, mask, steps, tokens, sizes, runs["fattn bf16"])
    notes.append(graphs["note"])
    del ours, oracle

    longest = max(PROMPTS)
    real = torch.cat([mask.cpu(), torch.ones_like(tokens)], dim=1).bool()
    err = {name: (got - want).abs().amax(-1) for name, got in runs.items()}
    top2 = want.topk(2, dim=-1).values
    margin = top2[..., 0] - top2[..., 1]
    peer_max = err[peer_name][real].max().item()
    decided = real & (margin > 2 * peer_max)
    rows = [{"run": "oracle: transformers eager float32", "max": 0.0, "mean": 0.0,
             "argmax": 100.0, "positions": int(real.sum()), "decided": int(decided.sum()),
             "decided_match": int(decided.sum())}]
    for name, e in err.items():
        match = runs[name].argmax(-1) == want.argmax(-1)
        rows.append({"run": name, "max": e[real].max().item(), "mean": e[real].mean().item(),
                     "prefill_max": e[:, :longest][real[:, :longest]].max().item(),
                     "decode_max": e[:, longest:].max().item(),
                     "argmax": 100.0 * match[real].float().mean().item(),
                     "positions": int(real.sum()), "decided": int(decided.sum()),
                     "decided_match": int(match[decided].sum())})

    failures = [f"{key}: {f}" for f in graphs["failures"]]
    mine = rows[-1]
    peers = [r for r in rows[1:-1] if math.isfinite(r["max"]) and math.isfinite(r["mean"])]
    for r in rows[1:-1]:
        if r not in peers:
            notes.append(f"{r['run']}: non-finite logits, left out of the best peer")
    for stat in ("max", "mean"):
        if not peers:
            failures.append(f"{key}: no peer ran to a finite error")
            break
        best = min(peers, key=lambda r: r[stat])
        bound = max(TOLERANCE * best[stat], FLOOR)
        if not mine[stat] <= bound:  # a NaN fails too
            failures.append(f"{key}: fattn's {stat} logit error {mine[stat]:.4f} > {TOLERANCE} x "
                            f"{best['run']}'s {best[stat]:.4f}")
    if not decided[:, longest:].any():
        failures.append(f"{key}: no decode position's top-2 margin exceeds 2 x {peer_max:.4f}")
    if mine["decided_match"] != mine["decided"]:
        failures.append(f"{key}: fattn's argmax differs from the oracle's at "
                        f"{mine['decided'] - mine['decided_match']} of {mine['decided']} positions "
                        f"whose top-2 margin exceeds 2 x {peer_max:.4f}")
    return {"model": key, "label": label, "config": config.__class__.__name__, "runs": rows,
            "graph_steps": graphs["graph_steps"], "notes": notes, "failures": failures}


def run_graphs(model, ids, mask, steps, tokens, sizes, eager):
    """fattn's decode steps replayed from CUDA graphs (fattn.hf's), on CUDA: every one must
    replay, and the logits must equal eager's (fattn's decode steps run eagerly) bit for bit,
    prefill and decode. {graph_steps, note, failures}."""
    if not sizes["device"].startswith("cuda"):
        return {"graph_steps": 0, "failures": [],
                "note": "fattn graphs: not run (CUDA graphs need a CUDA device)"}
    backend = fattn.hf.use(model, **sizes)
    try:
        got, _ = generate(model, ids, mask, backend.cache(), steps, tokens)
        backend.ctx.check()
        done, eager_steps, why = backend.graph_steps, backend.eager_steps, backend.eager_reason
    finally:
        backend.close()
    failures = []
    if done != steps or eager_steps:
        failures.append(f"{done} of {steps} decode steps replayed from graphs, {eager_steps} "
                        f"eager ({why})")
    differ = (got.view(torch.int32) != eager.view(torch.int32)).any(-1)
    if differ.any():
        failures.append(f"the graph run's logits differ from the eager run's at "
                        f"{int(differ.sum())} positions (max |difference| "
                        f"{(got - eager).abs().max().item():.3g})")
    note = (f"fattn graphs: {done} of {steps} decode steps replayed; logits "
            f"{'differ from' if differ.any() else 'equal'} fattn bf16's (eager) bit for bit")
    return {"graph_steps": done, "note": note, "failures": failures}


def table(results):
    lines = ["| model | run | max err | mean err | argmax = oracle | positions | "
             "decided (argmax = oracle) |", "|---|---|---|---|---|---|---|"]
    for res in results:
        for r in res["runs"]:
            lines.append(f"| {res['label']} | {r['run']} | {r['max']:.4f} | {r['mean']:.4f} | "
                         f"{r['argmax']:.1f}% | {r['positions']} | "
                         f"{r['decided_match']}/{r['decided']} |")
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description="The model-level check of fattn.hf (make gpu-test).")
    p.add_argument("--device", default="cuda", help="cuda (default), cuda:N or cpu (fattn's CPU "
                   "backend)")
    p.add_argument("--steps", type=int, default=STEPS, help=f"decode steps (default {STEPS})")
    p.add_argument("--models", default=",".join(MODELS),
                   help=f"comma-separated, of {', '.join(MODELS)} (default all)")
    p.add_argument("--out", help="a directory for model_check.md and model_check.json")
    args = p.parse_args(argv)
    why = missing(args.device)
    if why:
        print(f"model_check: skipped: {why}")
        return 0
    if FATTN_ERROR is not None:
        print(f"model_check: {FATTN_ERROR}")
        return 1
    keys = args.models.split(",")
    unknown = [k for k in keys if k not in MODELS]
    if unknown:
        p.error(f"--models: unknown {', '.join(unknown)} (known: {', '.join(MODELS)})")
    # gpt-oss's default YaRN parameters assume a longer context than these models': the warning
    # says so and changes nothing the comparison depends on.
    transformers.logging.set_verbosity_error()
    torch.set_float32_matmul_precision("highest")  # the oracle: no TF32
    fa3 = load_fa3() if args.device.startswith("cuda") else (None, "it runs on CUDA alone")
    if fa3[0] is not None:
        register_fa3(fa3[0])
    import fattn.hf  # noqa: F401 (registers the fattn attention)

    device = args.device
    if device.startswith("cuda"):
        name = torch.cuda.get_device_name(device)
        where = f"{name}, torch {torch.__version__}, transformers {transformers.__version__}"
    else:
        where = (f"fattn's CPU backend, torch {torch.__version__}, transformers "
                 f"{transformers.__version__}")
    print(f"model_check: {len(keys)} models on {where}; prompts {list(PROMPTS)}, window / chunk "
          f"{WINDOW}, {args.steps} teacher-forced decode steps", flush=True)
    results = []
    for key in keys:
        t0 = time.time()
        res = check_model(key, device, args.steps, fa3)
        res["seconds"] = round(time.time() - t0, 1)
        print(f"model_check: {key}: {res['seconds']} s, {res['graph_steps']} of {args.steps} "
              f"decode steps from graphs, {'FAILED' if res['failures'] else 'passed'}",
              flush=True)
        results.append(res)
    text = table(results)
    notes = [f"- {r['label']}: {n}" for r in results for n in r["notes"]]
    failures = [f for r in results for f in r["failures"]]
    print()
    print(text)
    if notes:
        print("\n" + "\n".join(notes))
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "model_check.md"), "w") as f:
            f.write(f"{where}\n\n{text}\n" + ("\n" + "\n".join(notes) + "\n" if notes else ""))
        with open(os.path.join(args.out, "model_check.json"), "w") as f:
            json.dump({"where": where, "prompts": list(PROMPTS), "window": WINDOW,
                       "steps": args.steps, "results": results}, f, indent=1)
    print()
    for f in failures:
        print(f"model_check: FAIL: {f}")
    print(f"model_check: {len(results) - len({f.split(':')[0] for f in failures})} of "
          f"{len(results)} models passed")
    return 1 if failures else 0


class ModelCheck(unittest.TestCase):
    """The check as a test: FATTN_CHECK_DEVICE (cuda by default), FATTN_CHECK_STEPS."""

    def test_models(self):
        device = os.environ.get("FATTN_CHECK_DEVICE", "cuda")
        why = missing(device)
        if why:
            self.skipTest(why)
        if FATTN_ERROR is not None:
            raise FATTN_ERROR
        transformers.logging.set_verbosity_error()
        torch.set_float32_matmul_precision("highest")
        fa3 = load_fa3() if device.startswith("cuda") else (None, "it runs on CUDA alone")
        if fa3[0] is not None:
            register_fa3(fa3[0])
        import fattn.hf  # noqa: F401
        steps = int(os.environ.get("FATTN_CHECK_STEPS", STEPS))
        for key in MODELS:
            with self.subTest(model=key):
                self.assertEqual(check_model(key, device, steps, fa3)["failures"], [])


if __name__ == "__main__":
    sys.exit(main())
