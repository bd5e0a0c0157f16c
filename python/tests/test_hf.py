# test_hf.py: fattn.hf against transformers on the CPU backend: small random models prefill a
# left-padded batch and decode teacher-forced steps; fattn errs no more than transformers, in bf16.
import copy
import unittest
from unittest import mock

try:
    import torch
    import transformers
except ImportError:
    torch = transformers = None

if transformers is not None:
    import fattn.hf
    from tests.model_check import generate, prompts

STEPS = 16
PROMPTS = (21, 6, 13)  # the first is longer than WINDOW, and all rows pass it while decoding
WINDOW = 8
COMMON = dict(vocab_size=256, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, head_dim=64,
              max_position_embeddings=256, pad_token_id=0, bos_token_id=None, eos_token_id=None,
              # Weights wider than the default 0.02 make attention peaked: a key seen or missed
              # through a window or chunk moves the logits well past bf16 rounding.
              initializer_range=0.2)
FLOOR = 1e-3  # the error bound where transformers' bf16 error is about zero


def configs():
    """name -> (config, the bf16 transformers attention to compare with) of each model the
    installed transformers knows; sdpa, or eager where the model refuses sdpa (softcap, sinks)."""
    found = {"llama (GQA)": ("LlamaConfig", "sdpa", {}),
             "mistral (window 8)": ("MistralConfig", "sdpa", {"sliding_window": WINDOW}),
             "gemma2 (softcap, alternating window)": (
                 "Gemma2Config", "eager", {"sliding_window": WINDOW, "attn_logit_softcapping": 2.0,
                                           "query_pre_attn_scalar": 48,
                                           "final_logit_softcapping": None}),
             "gpt-oss (sinks, alternating window)": (
                 "GptOssConfig", "eager", {"sliding_window": WINDOW, "num_local_experts": 2,
                                           "num_experts_per_tok": 2}),
             "llama4 (chunked attention 8)": (
                 "Llama4TextConfig", "sdpa", {"attention_chunk_size": WINDOW,
                                              "intermediate_size_mlp": 256,
                                              "num_local_experts": 1, "num_experts_per_tok": 1,
                                              "layer_types": ["chunked_attention",
                                                              "full_attention"]}),
             # MLA: fattn keeps the latent rows (512 + rope 64) and attends absorbed.
             "deepseek-v3 (MLA, absorbed)": (
                 "DeepseekV3Config", "sdpa", {"num_key_value_heads": 4, "kv_lora_rank": 512,
                                              "q_lora_rank": None, "qk_rope_head_dim": 64,
                                              "qk_nope_head_dim": 32, "v_head_dim": 32,
                                              "first_k_dense_replace": 2, "n_routed_experts": 2,
                                              "num_experts_per_tok": 1, "n_group": 1,
                                              "topk_group": 1, "moe_intermediate_size": 64})}
    return {name: (getattr(transformers, cls)(**{**COMMON, **extra}), baseline)
            for name, (cls, baseline, extra) in found.items() if hasattr(transformers, cls)}


def run(model, ids, mask, cache, tokens=None):
    """Logits [batch, prompt + STEPS, vocab] float32 of a prefill and STEPS decode steps, each
    fed tokens[:, step] (None: the argmax of the step before), and the tokens fed: the model
    check's loop (either spelling of transformers' cache argument)."""
    return generate(model, ids, mask, cache, STEPS, tokens)


def errors(logits, ref, real):
    """(max, mean) |logits - ref| over the real positions."""
    err = (logits - ref).abs().amax(-1)[real]
    return err.max().item(), err.mean().item()


@unittest.skipIf(transformers is None, "torch or transformers is not installed: the Hugging "
                 "Face backend tests skip")
class HuggingFace(unittest.TestCase):
    rows = []

    @classmethod
    def setUpClass(cls):
        # gpt-oss's default YaRN parameters assume a longer context than these models': the
        # warning says so and changes nothing the comparison depends on.
        transformers.logging.set_verbosity_error()

    @classmethod
    def tearDownClass(cls):
        print("\nlogit error against float32 eager (CPU backend; prefill | decode, max / mean)")
        print(f"{'model [transformers bf16 attention]':46} {'transformers bf16':>31} "
              f"{'fattn bf16':>31}")
        for name, other, ours in cls.rows:
            cells = [f"{p[0]:.4f}/{p[1]:.4f} | {d[0]:.4f}/{d[1]:.4f}" for p, d in (other, ours)]
            print(f"{name:46} {cells[0]:>31} {cells[1]:>31}")

    def test_needs_its_cache(self):
        config, _ = configs()["llama (GQA)"]
        model = transformers.AutoModelForCausalLM.from_config(config).to(torch.bfloat16)
        backend = fattn.hf.use(model, device="cpu", page_size=4, max_batch=4, max_seq_len=64)
        try:
            with self.assertRaisesRegex(ValueError, "^cache: fattn attends over its own pages"):
                model(input_ids=torch.ones(1, 3, dtype=torch.long),
                      cache=transformers.DynamicCache(config=config))
        finally:
            backend.close()
        self.assertEqual(model.config._attn_implementation, "sdpa")

    def test_models(self):
        for name, (config, baseline) in configs().items():
            with self.subTest(model=name):
                self.check(name, config, baseline)

    def check(self, name, config, baseline):
        torch.manual_seed(0)
        ref = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager")
        ref = ref.float().eval()
        other = copy.deepcopy(ref).to(torch.bfloat16)
        other.set_attn_implementation(baseline)
        ours = copy.deepcopy(ref).to(torch.bfloat16)
        backend = fattn.hf.use(ours, device="cpu", page_size=4, max_batch=4, max_seq_len=64)
        try:
            ids, mask = prompts(config, "cpu", PROMPTS)
            longest = ids.shape[1]
            want, tokens = run(ref, ids, mask, transformers.DynamicCache(config=config))
            got_other, _ = run(other, ids, mask, transformers.DynamicCache(config=config), tokens)
            got, _ = run(ours, ids, mask, backend.cache(), tokens)
            self.assertEqual((backend.graph_steps, backend.eager_steps), (0, STEPS))
            self.assertIn("the context runs on the CPU", backend.eager_reason)
            real = torch.cat([mask, torch.ones_like(tokens)], dim=1).bool()
            prefill = real.clone()
            prefill[:, longest:] = False
            decode = real & ~prefill
            err_other = [errors(got_other, want, part) for part in (prefill, decode)]
            err = [errors(got, want, part) for part in (prefill, decode)]
            self.rows.append((f"{name} [{baseline}]", err_other, err))
            bound = max(1.25 * max(e[0] for e in err_other), FLOOR)
            self.assertLessEqual(max(e[0] for e in err), bound)
            # The argmax must agree wherever the reference's top-2 margin clears the bf16 noise.
            top2 = want.topk(2, dim=-1).values
            sure = real & (top2[..., 0] - top2[..., 1] > 2 * max(e[0] for e in err_other))
            self.assertTrue(sure[:, longest:].any(), "no decode position is decided")
            self.assertTrue(torch.equal(got.argmax(-1)[sure], want.argmax(-1)[sure]))
            # generate runs the same steps: its tokens are the reference's up to the first step
            # the reference does not decide.
            out = ours.generate(input_ids=ids, attention_mask=mask,
                                cache=backend.cache(), max_new_tokens=STEPS,
                                do_sample=False)
            for row in range(len(PROMPTS)):
                undecided = (~sure[row, longest - 1:-1]).nonzero()
                upto = undecided[0].item() if len(undecided) else STEPS
                self.assertTrue(torch.equal(out[row, longest:longest + upto],
                                            tokens[row, :upto]), f"row {row}")
            backend.ctx.check()
        finally:
            backend.close()

    def test_decode_graph_path(self):
        """A replayed decode step's path on the CPU, its CUDA parts stood in for: the capture
        runs the forward once as its warm-up (no fattn call) and each replay runs it again, in
        its captured form (static inputs, the column count a tensor, no planning inside),
        after fattn_plan in place of fattn_graph_plan. Every decode step takes the path and
        gives the eager decode's logits bit for bit; generate runs through it; a call the
        graph cannot take runs eagerly, saying why."""
        def capture_eagerly(backend, rows, forward, cache):
            cache.warming = True
            out = forward()
            cache.warming = False
            return lambda: out.logits.copy_(forward().logits), out

        for name, (config, _) in configs().items():
            with self.subTest(model=name):
                torch.manual_seed(0)
                model = transformers.AutoModelForCausalLM.from_config(config)
                model = model.to(torch.bfloat16).eval()
                ids, mask = prompts(config, "cpu", PROMPTS)
                sizes = dict(device="cpu", page_size=4, max_batch=4, max_seq_len=64)
                eager = fattn.hf.use(model, graphs=False, **sizes)
                try:
                    want, tokens = run(model, ids, mask, eager.cache())
                finally:
                    eager.close()
                backend = fattn.hf.use(model, **sizes)
                backend.graphs_off = None
                try:
                    with mock.patch.object(fattn.hf, "_capture", capture_eagerly), \
                            mock.patch.object(backend.ctx, "graph_plan", backend.ctx.plan):
                        got, _ = run(model, ids, mask, backend.cache())
                        self.assertEqual((backend.graph_steps, backend.eager_steps), (STEPS, 0))
                        self.assertTrue(torch.equal(got, want))
                        cache = backend.cache()
                        out = model.generate(input_ids=ids, attention_mask=mask, cache=cache,
                                             max_new_tokens=4, do_sample=False)
                        self.assertEqual(backend.graph_steps, STEPS + 3)
                        self.assertTrue(torch.equal(out[:, ids.shape[1]:], tokens[:, :4]))
                        with torch.no_grad():
                            model(input_ids=out[:, -1:], cache=cache, output_hidden_states=True)
                        self.assertEqual(backend.eager_steps, 1)
                        self.assertIn("output_hidden_states", backend.eager_reason)
                    backend.ctx.check()
                finally:
                    backend.close()
                self.assertNotIn("forward", vars(model))  # the class's forward again


if __name__ == "__main__":
    unittest.main()
