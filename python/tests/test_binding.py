# test_binding.py: the fattn package over libfattn.so on the CPU backend: a prefill and a decode
# step agree bit for bit, bad tensors fail before the C call, bad ids and batches carry details.
import subprocess
import sys
import unittest
from unittest import mock

try:
    import torch
except ImportError:
    torch = None

import fattn
from fattn import _lib

LAYERS, HQ, HKV, D = 2, 4, 2, 64
MODEL = {"num_layers": LAYERS, "num_q_heads": HQ, "num_kv_heads": HKV, "head_dim": D}
CONFIG = {"device": "cpu", "page_size": 4, "kv_budget_pages": 64, "max_batch": 8,
          "max_seq_len": 64, "max_q_tokens": 256}


def tokens(seed, n, heads):
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(n, heads, D, generator=g) * 2 - 1).to(torch.bfloat16)


class WithoutTorch(unittest.TestCase):
    def test_context_lifetime(self):
        with fattn.Context(CONFIG, model=MODEL) as ctx:
            s = ctx.open_seq()
            ctx.reserve(s, 10)
            self.assertEqual(ctx.seq_length(s), 10)
            f = ctx.fork(s, 8)
            ctx.truncate(s, 5)
            self.assertEqual((ctx.seq_length(s), ctx.seq_length(f)), (5, 8))
            stats = ctx.stats()
            self.assertEqual((stats["pages_total"], stats["seqs_open"]), (64, 2))
            self.assertEqual(ctx.memory()["num_pages"], 64)
            self.assertEqual(ctx.backend("decode"), fattn.Backend.CPU)
            with self.assertRaises(fattn.FattnError) as e:
                ctx.close()  # live sequences
            self.assertEqual(e.exception.name, "FATTN_ERR_BUSY")
            ctx.close_seq(s)
            ctx.close_seq(f)
            ctx.check()
            ctx.close()
            with self.assertRaisesRegex(ValueError, "closed"):
                ctx.open_seq()

    def test_create_errors_name_the_field(self):
        with self.assertRaises(fattn.FattnError) as e:
            fattn.Context(CONFIG, model={**MODEL, "num_kv_heads": 3})
        self.assertEqual(e.exception.status, fattn.Status.ERR_INVALID)
        self.assertIn("num_kv_heads", e.exception.detail)
        with self.assertRaisesRegex(TypeError, "config: unknown field 'pagesize'"):
            fattn.Context(CONFIG, model=MODEL, pagesize=4)
        with self.assertRaisesRegex(ValueError, "config q_dtype: unknown DType 'fp32'"):
            fattn.Context(CONFIG, model=MODEL, q_dtype="fp32")

    def test_compute_dtype(self):
        FP8 = {"kv_dtype": "fp8_e4m3", "compute_dtype": "fp8_e4m3"}
        for fields, want in (({}, fattn.DType.BF16), ({"compute_dtype": 0}, fattn.DType.BF16),
                             ({"compute_dtype": None}, fattn.DType.BF16),
                             ({"q_dtype": "fp16", "kv_dtype": "fp16", "compute_dtype": "fp16"},
                              fattn.DType.FP16),
                             (FP8, fattn.DType.FP8_E4M3),
                             ({"kv_dtype": 3, "compute_dtype": fattn.DType.FP8_E4M3},
                              fattn.DType.FP8_E4M3)):
            with self.subTest(fields=fields), fattn.Context(CONFIG, model=MODEL, **fields) as ctx:
                self.assertEqual(ctx.compute_dtype, want)
                ctx.check()
        # fp8 GEMMs read the fp8 cache as it is: the plan is the fp8 cache's
        self.assertEqual(fattn.memory_plan(CONFIG, model=MODEL, **FP8),
                         fattn.memory_plan(CONFIG, model=MODEL, kv_dtype="fp8_e4m3"))
        # names and values fattn does not know fail before the C call
        for value, text in (("fp32", "^config compute_dtype: unknown DType 'fp32'"),
                            (7, "^config compute_dtype: unknown DType 7")):
            with self.subTest(value=value), \
                    mock.patch.object(_lib.lib, "fattn_create", side_effect=AssertionError("called")):
                with self.assertRaisesRegex(ValueError, text):
                    fattn.Context(CONFIG, model=MODEL, compute_dtype=value)
        mla = {**MODEL, "num_q_heads": 16, "num_kv_heads": 1, "head_dim": 576, "head_dim_v": 512,
               "mla_latent_dim": 512, "mla_rope_dim": 64}
        for model, fields, text in (
                (MODEL, {"compute_dtype": "fp16"}, "compute_dtype 2: a 16-bit compute_dtype must equal q_dtype 1"),
                (MODEL, {"compute_dtype": "fp8_e4m3"}, "compute_dtype FP8_E4M3 needs kv_dtype FP8_E4M3 (kv_dtype 1)"),
                (mla, FP8, "compute_dtype FP8_E4M3: not for MLA models")):
            with self.subTest(text=text), self.assertRaises(fattn.FattnError) as e:
                fattn.Context(CONFIG, model=model, **fields)
            self.assertEqual(e.exception.status, fattn.Status.ERR_INVALID)
            self.assertIn(text, e.exception.detail)

    def test_bad_sequence_ids_and_batches(self):
        with fattn.Context(CONFIG, model=MODEL) as ctx:
            s = ctx.open_seq()
            ctx.reserve(s, 4)
            for call in (lambda: ctx.reserve(999, 4), lambda: ctx.seq_length(999),
                         lambda: ctx.close_seq(999)):
                with self.assertRaises(fattn.FattnError) as e:
                    call()
                self.assertEqual(e.exception.name, "FATTN_ERR_NOT_FOUND")
                self.assertIn("sequence 999 is not open", e.exception.detail)
            with self.assertRaisesRegex(ValueError, "seq: -1 is not an unsigned 32-bit integer"):
                ctx.reserve(-1, 4)
            for args, status, text in (
                    (("decode", []), "FATTN_ERR_INVALID", "num_seqs 0"),
                    (("decode", [s, 999]), "FATTN_ERR_NOT_FOUND", "batch entry 1: sequence 999"),
                    (("decode", [s, s]), "FATTN_ERR_INVALID", "appears twice"),
                    (("decode", [s], [2]), "FATTN_ERR_INVALID", "q_len 2, decode takes 1"),
                    (("prefill", [s], [4], None, None, [1]), "FATTN_ERR_INVALID",
                     "tree_mask: only TARGET_VERIFY")):
                with self.assertRaises(fattn.FattnError) as e:
                    ctx.plan(*args)
                self.assertEqual(e.exception.name, status)
                self.assertIn(text, e.exception.detail)
                self.assertIn(text, str(e.exception))
            with self.assertRaisesRegex(ValueError, "mode: unknown Mode 'decoding'"):
                ctx.plan("decoding", [s])
            ctx.check()

    def test_graphs_need_a_device(self):
        with fattn.Context(CONFIG, model=MODEL) as ctx:
            with self.assertRaises(fattn.FattnError) as e:
                ctx.graph_capture("decode", 1, lambda stream: None)
            self.assertIn("fattn_graph_capture", str(e.exception))
            s = ctx.open_seq()
            ctx.reserve(s, 1)
            with self.assertRaises(fattn.FattnError):
                ctx.graph_launch("decode", [s])
            for call, name in ((lambda: ctx.graph_begin("decode", 1), "fattn_graph_begin"),
                               (ctx.graph_end, "fattn_graph_end"),
                               (lambda: ctx.graph_plan("decode", [s]), "fattn_graph_plan")):
                with self.assertRaises(fattn.FattnError) as e:
                    call()
                self.assertEqual(e.exception.name, "FATTN_ERR_UNSUPPORTED")
                self.assertIn(f"{name}: graphs need a CUDA device", e.exception.detail)
            ctx.check()

    def test_graph_arguments_fail_before_the_call(self):
        with fattn.Context(CONFIG, model=MODEL) as ctx:
            s = ctx.open_seq()
            ctx.reserve(s, 1)
            cases = [
                ("graph_begin", ("decoding", 1), ValueError, "^mode: unknown Mode 'decoding'"),
                ("graph_begin", ("decode", -1), ValueError,
                 "^batch_size: -1 is not an unsigned 32-bit integer"),
                ("graph_begin", ("decode", 1.5), ValueError, "^batch_size: 1.5 is not"),
                ("graph_plan", ("decode", [s, -2]), ValueError, r"^seq_ids\[1\]: -2 is not"),
                ("graph_plan", ("verify", [s]), ValueError, "^mode: unknown Mode 'verify'"),
                ("graph_plan", ("decode", [s], [1, "x"]), ValueError, r"^q_lens\[1\]: 'x'"),
            ]
            for method, args, error, text in cases:
                name = "fattn_" + method
                with self.subTest(text=text), \
                        mock.patch.object(_lib.lib, name, side_effect=AssertionError("called")):
                    with self.assertRaisesRegex(error, text):
                        getattr(ctx, method)(*args)
            ctx.check()


@unittest.skipIf(torch is None, "torch is not installed: the tensor tests need it")
class WithTorch(unittest.TestCase):
    def setUp(self):
        self.ctx = fattn.Context(CONFIG, model=MODEL)
        self.k, self.v, self.q = tokens(1, 14, HKV), tokens(2, 14, HKV), tokens(3, 14, HQ)

    def tearDown(self):
        self.ctx.check()
        self.ctx.close(force=True)

    def step(self, mode, seq, first, n):
        """Stores positions [first, first + n) of the K/V streams into seq's last n slots and
        attends with Q's rows there: every layer's (out, lse)."""
        self.ctx.plan(mode, [seq], [n])
        results = []
        for layer in range(LAYERS):
            out = torch.empty(n, HQ, D, dtype=torch.bfloat16)
            lse = torch.empty(n, HQ, dtype=torch.float32)
            self.ctx.store_kv(layer, self.k[first:first + n], self.v[first:first + n])
            self.ctx.attend(layer, self.q[first:first + n], out, lse)
            results.append((out, lse))
        return results

    def test_refused_graph_calls_keep_the_step(self):
        s = self.ctx.open_seq()
        self.ctx.reserve(s, 1)
        self.ctx.plan("decode", [s])
        for call in (lambda: self.ctx.graph_begin("decode", 1), self.ctx.graph_end,
                     lambda: self.ctx.graph_plan("decode", [s])):
            with self.assertRaises(fattn.FattnError):
                call()
        out = torch.empty(1, HQ, D, dtype=torch.bfloat16)
        with self.assertRaisesRegex(ValueError, r"^q: shape \(2, 4, 64\), expected \(1, 4, 64\)"):
            self.ctx.attend(0, self.q[:2], out)
        self.ctx.store_kv(0, self.k[:1], self.v[:1])
        self.ctx.attend(0, self.q[:1], out)
        self.ctx.close_seq(s)

    def test_fattn_imported_before_torch(self):
        # libfattn.so's own dlopen group must not give libstdc++ jemalloc's operator new and
        # delete (glibc's free would abort on torch's first strings: _lib._load).
        done = subprocess.run([sys.executable, "-c", "import fattn, torch; print('ok')"],
                              capture_output=True, text=True, timeout=120)
        self.assertEqual((done.returncode, done.stdout.strip()), (0, "ok"), done.stderr[-2000:])

    def test_decode_equals_prefill_row(self):
        a, b = self.ctx.open_seq(), self.ctx.open_seq()
        self.ctx.reserve(a, 13)
        self.step("prefill", a, 0, 13)
        self.ctx.reserve(a, 14)
        decode = self.step("decode", a, 13, 1)
        self.ctx.reserve(b, 14)
        prefill = self.step("prefill", b, 0, 14)
        for (out_d, lse_d), (out_p, lse_p) in zip(decode, prefill):
            self.assertTrue(torch.equal(out_d[0].view(torch.int16), out_p[13].view(torch.int16)))
            self.assertTrue(torch.equal(lse_d[0].view(torch.int32), lse_p[13].view(torch.int32)))
            self.assertTrue(torch.isfinite(lse_d).all() and (lse_d != 0).all())
            self.assertTrue(out_d.abs().sum() > 0)

    def test_fp8_compute_on_the_cpu_computes_as_before(self):
        # the reference has no fp8 GEMMs: over the same fp8 cache, compute_dtype changes no bit
        results = []
        for compute in (0, "fp8_e4m3"):
            self.ctx.close(force=True)
            self.ctx = fattn.Context(CONFIG, model=MODEL, kv_dtype="fp8_e4m3", compute_dtype=compute)
            s = self.ctx.open_seq()
            self.ctx.reserve(s, 14)
            results.append(self.step("prefill", s, 0, 14))
        for (out_a, lse_a), (out_b, lse_b) in zip(*results):
            self.assertTrue(torch.equal(out_a.view(torch.int16), out_b.view(torch.int16)))
            self.assertTrue(torch.equal(lse_a.view(torch.int32), lse_b.view(torch.int32)))
            self.assertTrue(out_a.abs().sum() > 0)

    def test_bad_tensors_fail_before_the_call(self):
        s = self.ctx.open_seq()
        self.ctx.reserve(s, 1)
        self.ctx.plan("decode", [s])
        q, k, v = self.q[:1], self.k[:1], self.v[:1]
        out = torch.empty(1, HQ, D, dtype=torch.bfloat16)
        lse = torch.empty(1, HQ)
        loose = torch.empty(D, HQ, 1, dtype=torch.bfloat16).permute(2, 1, 0)
        cases = [
            ("attend", (0, q.float(), out), TypeError, r"^q: dtype torch.float32, expected torch.bfloat16"),
            ("attend", (0, q.half(), out), TypeError, r"^q: dtype torch.float16"),
            ("attend", (0, q, out, lse.double()), TypeError, r"^lse: dtype torch.float64, expected torch.float32"),
            ("attend", (0, self.q[:2], out), ValueError, r"^q: shape \(2, 4, 64\), expected \(1, 4, 64\)"),
            ("attend", (0, q, out.view(1, HQ * D)), ValueError, r"^out: shape \(1, 256\), expected \(1, 4, 64\)"),
            ("attend", (0, q, out, lse[:, :2]), ValueError, r"^lse: shape \(1, 2\)"),
            ("attend", (0, q, loose), ValueError, r"^out: not contiguous"),
            ("attend", (0, q.to("meta"), out), ValueError, r"^q: on meta, but the context runs on the CPU"),
            ("attend", (0, q.tolist(), out), TypeError, r"^q: expected a torch.Tensor, got list"),
            ("store_kv", (0, k, self.q[:1]), ValueError, r"^v: shape \(1, 4, 64\), expected \(1, 2, 64\)"),
            ("store_kv", (0, k.to(torch.float16), v), TypeError, r"^k: dtype torch.float16"),
            ("store_kv", (0, k, loose[:, :2]), ValueError, r"^v: not contiguous"),
            ("store_kv", (0, k.to("meta"), v), ValueError, r"^k: on meta"),
        ]
        for method, args, error, text in cases:
            with self.subTest(text=text), \
                    mock.patch.object(_lib.lib, "fattn_" + method, side_effect=AssertionError("called")):
                with self.assertRaisesRegex(error, text):
                    getattr(self.ctx, method)(*args)
        with self.assertRaises(fattn.FattnError) as e:  # in range for Python, not for the model
            self.ctx.store_kv(LAYERS, k, v)
        self.assertIn("layer", e.exception.detail)
        self.ctx.store_kv(0, k, v)
        self.ctx.attend(0, q, out, lse)
        self.ctx.close_seq(s)


if __name__ == "__main__":
    unittest.main()
