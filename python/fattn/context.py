# context.py: fattn.Context, one fattn_ctx over ctypes: its sequences, steps and graphs; the
# checks of every tensor argument before the C call, and FattnError for every failing status.
import ctypes
from ctypes import byref, c_uint32, c_uint64, c_void_p

from . import _lib
from ._lib import DType, Mode, lib

_DETAIL_LEN = 512


class FattnError(RuntimeError):
    """A failing fattn status: status (a Status), name ("FATTN_ERR_INVALID") and detail (the
    context's fattn_detail text: which argument and why)."""

    def __init__(self, call, status, detail):
        self.status = _lib.Status(status)
        self.name = _lib.status_name(status)
        self.detail = detail
        super().__init__(f"{call}: {self.name}: {detail}")


def _enum(kind, name, value):
    """An enum field given as a member, its int, or its name in any case ("bf16", "decode")."""
    if isinstance(value, str):
        try:
            return kind[value.upper()]
        except KeyError:
            raise ValueError(f"{name}: unknown {kind.__name__} {value!r} "
                             f"(one of {', '.join(m.name.lower() for m in kind)})") from None
    try:
        return kind(value)
    except ValueError:
        raise ValueError(f"{name}: unknown {kind.__name__} {value!r}") from None


def _u32(name, value):
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 1 << 32:
        raise ValueError(f"{name}: {value!r} is not an unsigned 32-bit integer")
    return value


def _u32_array(name, values):
    if values is None:
        return None
    values = [_u32(f"{name}[{i}]", v) for i, v in enumerate(values)]
    return (c_uint32 * max(1, len(values)))(*values)


def _struct(kind, name, fields):
    """kind(**fields) from a dict, an unknown key a TypeError naming it."""
    known = {f for f, _ in kind._fields_} - {"struct_size"}
    for key in fields:
        if key not in known:
            raise TypeError(f"{name}: unknown field {key!r}")
    return kind(**fields)


def _build(config, model):
    """The C config and model, and the arrays they point to (alive until fattn_create copies)."""
    config = dict(config)
    if config.get("device") == "cpu":
        config["device"] = _lib.DEVICE_CPU
    if "compute_dtype" in config and config["compute_dtype"] in (None, 0):
        del config["compute_dtype"]  # 0 or None: q_dtype's 16-bit MMAs (FATTN_CONFIG_INIT), no DType
    for key, kind in (("q_dtype", DType), ("kv_dtype", DType), ("compute_dtype", DType),
                      ("prefill_backend", _lib.Backend), ("decode_backend", _lib.Backend)):
        if key in config:
            config[key] = _enum(kind, f"config {key}", config[key])
    keep = []
    if config.get("graph_buckets") is not None:
        config["num_graph_buckets"] = len(config["graph_buckets"])
        buckets = _u32_array("config graph_buckets", config["graph_buckets"])
        keep.append(buckets)
        config["graph_buckets"] = buckets
    model = dict(model)
    if model.get("layers") is not None:
        layers = (_lib.LayerOpts * len(model["layers"]))(
            *[_struct(_lib.LayerOpts, f"model layers[{i}]", opts)
              for i, opts in enumerate(model["layers"])])
        keep.append(layers)
        model["layers"] = ctypes.cast(layers, ctypes.POINTER(_lib.LayerOpts))
    if model.get("sinks") is not None:
        sinks = (ctypes.c_float * len(model["sinks"]))(*model["sinks"])
        keep.append(sinks)
        model["sinks"] = ctypes.cast(sinks, ctypes.POINTER(ctypes.c_float))
    return _struct(_lib.Config, "config", config), _struct(_lib.Model, "model", model), keep


def _report(r):
    d = {f: getattr(r, f) for f, _ in r._fields_ if f != "struct_size"}
    d["region_bytes"] = dict(zip(_lib.REGION_NAMES, r.region_bytes))
    d["graph_bytes_per_mode"] = {m.name.lower(): r.graph_bytes_per_mode[m] for m in Mode}
    return d


def memory_plan(config=None, *, model, **fields):
    """fattn_memory_plan: the layout a context of config and model would take, as a dict."""
    cfg, mdl, _keep = _build({**(config or {}), **fields}, model)
    report, detail = _lib.MemoryReport(), ctypes.create_string_buffer(_DETAIL_LEN)
    status = lib.fattn_memory_plan(byref(cfg), byref(mdl), byref(report), detail, _DETAIL_LEN)
    if status:
        raise FattnError("fattn_memory_plan", status, detail.value.decode())
    return _report(report)


class Context:
    """A fattn context: Context(config dict and/or config fields as keywords, model=dict).
    Config and model keys are the C field names; dtypes, backends and modes may be given by
    name ("bf16", "fa2"), device as an ordinal or "cpu"."""

    def __init__(self, config=None, *, model, **fields):
        self._ctx = None
        cfg, mdl, _keep = _build({**(config or {}), **fields}, model)
        ctx, detail = c_void_p(), ctypes.create_string_buffer(_DETAIL_LEN)
        status = lib.fattn_create(byref(cfg), byref(mdl), byref(ctx), detail, _DETAIL_LEN)
        if status:
            raise FattnError("fattn_create", status, detail.value.decode())
        self._ctx = ctx
        self.device = cfg.device
        self.dtype = DType(cfg.q_dtype)
        self.compute_dtype = DType(cfg.compute_dtype or cfg.q_dtype)  # the prefill-side GEMMs' type
        self.spec_topk, self.spec_draft_tokens = cfg.spec_topk, cfg.spec_draft_tokens
        self.q_heads, self.kv_heads = mdl.num_q_heads, mdl.num_kv_heads
        self.head_dim, self.head_dim_v = mdl.head_dim, mdl.head_dim_v or mdl.head_dim
        self._tokens = None  # (query tokens, new KV tokens) of the planned step
        self._before_capture = None  # (_tokens,) from graph_begin to graph_end

    # ---- lifetime

    def close(self, force=False):
        """fattn_destroy; with live sequences FATTN_ERR_BUSY unless force. Idempotent."""
        if self._ctx is not None:
            self._call("fattn_destroy", int(force))
            self._ctx = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close(force=True)

    def __del__(self):
        if getattr(self, "_ctx", None) is not None:
            lib.fattn_destroy(self._ctx, 1)

    def _live(self, name):
        if self._ctx is None:
            raise ValueError(f"{name}: the context is closed")
        return self._ctx

    def _call(self, name, *args):
        status = getattr(lib, name)(self._live(name), *args)
        if status:
            raise FattnError(name, status, lib.fattn_detail(self._ctx).decode())

    # ---- state

    def check(self):
        self._call("fattn_check")

    def stats(self):
        s = _lib.Stats()
        self._call("fattn_get_stats", byref(s))
        return {f: getattr(s, f) for f, _ in s._fields_ if f != "struct_size"}

    def memory(self):
        return _report(lib.fattn_ctx_memory(self._live("fattn_ctx_memory")).contents)

    def backend(self, mode):
        ctx = self._live("fattn_ctx_backend")
        return _lib.Backend(lib.fattn_ctx_backend(ctx, _enum(Mode, "mode", mode)))

    # ---- sequences

    def open_seq(self):
        seq = c_uint32()
        self._call("fattn_seq_open", byref(seq))
        return seq.value

    def reserve(self, seq, num_tokens):
        self._call("fattn_seq_reserve", _u32("seq", seq), _u32("num_tokens", num_tokens))

    def fork(self, src, num_tokens):
        dst = c_uint32()
        self._call("fattn_seq_fork", _u32("src", src), _u32("num_tokens", num_tokens), byref(dst))
        return dst.value

    def truncate(self, seq, num_tokens):
        self._call("fattn_seq_truncate", _u32("seq", seq), _u32("num_tokens", num_tokens))

    def close_seq(self, seq):
        self._call("fattn_seq_close", _u32("seq", seq))

    def seq_length(self, seq):
        n = c_uint32()
        self._call("fattn_seq_length", _u32("seq", seq), byref(n))
        return n.value

    def map_pages(self, seq, first, pages):
        """fattn_seq_map (FATTN_FLAG_CALLER_PAGES): entries first.. of seq's table become pages."""
        arr = _u32_array("pages", pages)
        self._call("fattn_seq_map", _u32("seq", seq), _u32("first", first), len(pages), arr)

    # ---- steps

    def _batch(self, mode, seq_ids, q_lens, kv_lens, kv_new_lens, tree_mask):
        """The C batch, the arrays it points to, and the step's (query, new KV) token counts
        (None where the batch is malformed: fattn_plan then says why)."""
        mode = _enum(Mode, "mode", mode)
        seq_ids = list(seq_ids)
        per_request = self.spec_topk if mode == Mode.DRAFT_DECODE else 1
        if per_request > 1 and len(seq_ids) % per_request:
            raise ValueError(f"seq_ids: {len(seq_ids)} branch sequences, not a multiple of "
                             f"spec_topk {per_request}")
        arrays = [_u32_array("seq_ids", seq_ids), _u32_array("q_lens", q_lens),
                  _u32_array("kv_lens", kv_lens), _u32_array("kv_new_lens", kv_new_lens)]
        mask = None
        if tree_mask is not None:
            mask = (c_uint64 * max(1, len(tree_mask)))(*tree_mask)
        b = _lib.Batch(mode=mode, num_seqs=len(seq_ids) // max(1, per_request), tree_mask=mask,
                       **{f: a for f, a in zip(("seq_ids", "q_lens", "kv_lens", "kv_new_lens"),
                                               arrays) if a is not None})
        default = {Mode.DECODE: 1, Mode.DRAFT_DECODE: 1,
                   Mode.TARGET_VERIFY: self.spec_draft_tokens}.get(mode)
        if q_lens is None:
            q = default * len(seq_ids) if default is not None else None
        else:
            q = sum(q_lens)
        new = (sum(kv_new_lens) if kv_new_lens else 0) if mode == Mode.CROSS else q
        return b, (arrays, mask), (q, new)

    def plan(self, mode, seq_ids, q_lens=None, kv_lens=None, kv_new_lens=None, tree_mask=None,
             stream=None):
        """fattn_plan of one step: entry i attends with q_lens[i] tokens to sequence
        seq_ids[i] (DRAFT_DECODE: spec_topk branch sequences per request, one after another)."""
        b, _keep, tokens = self._batch(mode, seq_ids, q_lens, kv_lens, kv_new_lens, tree_mask)
        self._call("fattn_plan", byref(b), self._stream(stream))
        self._tokens = tokens

    def store_kv(self, layer, k, v, stream=None):
        """fattn_store_kv: k [new_tokens, kv_heads, head_dim], v [.., head_dim_v]."""
        new = self._tokens[1] if self._tokens else None
        kp = self._tensor("k", k, self.dtype, (new, self.kv_heads, self.head_dim), optional=True)
        vp = self._tensor("v", v, self.dtype, (new, self.kv_heads, self.head_dim_v), optional=True)
        self._call("fattn_store_kv", _u32("layer", layer), kp, vp, self._stream(stream))

    def attend(self, layer, q, out, lse=None, stream=None):
        """fattn_attend: q [q_tokens, q_heads, head_dim] into out [.., head_dim_v]; lse
        [q_tokens, q_heads] float32 or None."""
        n = self._tokens[0] if self._tokens else None
        qp = self._tensor("q", q, self.dtype, (n, self.q_heads, self.head_dim))
        op = self._tensor("out", out, self.dtype, (n, self.q_heads, self.head_dim_v))
        lp = self._tensor("lse", lse, None, (n, self.q_heads), optional=True)
        self._call("fattn_attend", _u32("layer", layer), qp, op, lp, self._stream(stream))

    # ---- graphs (a CUDA device only)

    def graph_capture(self, mode, batch_size, fn):
        """fattn_graph_capture: fn(stream) makes the bucket's store_kv / attend calls, passing
        stream= on to them (its buffers hold the bucket's tokens)."""
        body = _lib.GRAPH_FN(lambda _user, stream: fn(stream))
        saved, self._tokens = self._tokens, None  # the bucket's token counts are fattn's own
        try:
            self._call("fattn_graph_capture", _enum(Mode, "mode", mode),
                       _u32("batch_size", batch_size), body, None)
        finally:
            self._tokens = saved

    def graph_launch(self, mode, seq_ids, q_lens=None, kv_lens=None, tree_mask=None,
                     stream=None):
        b, _keep, tokens = self._batch(mode, seq_ids, q_lens, kv_lens, None, tree_mask)
        self._call("fattn_graph_launch", byref(b), self._stream(stream))
        self._tokens = tokens

    def graph_begin(self, mode, batch_size, stream=None):
        """fattn_graph_begin: stream (torch's current one by default) is capturing a graph of
        yours (torch.cuda.graph); the store_kv / attend calls until graph_end record against
        the bucket of batch_size (their buffers hold the bucket's tokens)."""
        self._call("fattn_graph_begin", _enum(Mode, "mode", mode), _u32("batch_size", batch_size),
                   self._stream(stream))
        self._before_capture, self._tokens = (self._tokens,), None  # the bucket's are fattn's

    def graph_end(self):
        """fattn_graph_end: closes the capture graph_begin opened; FattnError where the capture
        ended early (a captured call synchronised or allocated). Either way it is closed."""
        try:
            self._call("fattn_graph_end")
        finally:
            if self._before_capture is not None:
                (self._tokens,), self._before_capture = self._before_capture, None

    def graph_plan(self, mode, seq_ids, q_lens=None, kv_lens=None, tree_mask=None,
                   stream=None):
        """fattn_graph_plan: plans the step into its bucket for the graph you replay next, on
        stream (torch's current one by default). Each plan must be followed by exactly one
        replay of that bucket's graph before the next plan."""
        b, _keep, tokens = self._batch(mode, seq_ids, q_lens, kv_lens, None, tree_mask)
        self._call("fattn_graph_plan", byref(b), self._stream(stream))
        self._tokens = tokens

    # ---- tensors

    def _tensor(self, name, t, dtype, shape, optional=False):
        """The data pointer of t after checking its type, device, dtype, shape and layout;
        None (NULL) where optional and not given. dtype None means float32; a None extent of
        shape is not checked (no step planned)."""
        if t is None and optional:
            return None
        import torch
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
        if self.device == _lib.DEVICE_CPU:
            if t.device.type != "cpu":
                raise ValueError(f"{name}: on {t.device}, but the context runs on the CPU")
        elif t.device.type != "cuda" or t.device.index != self.device:
            raise ValueError(f"{name}: on {t.device}, but the context runs on cuda:{self.device}")
        want = {DType.BF16: torch.bfloat16, DType.FP16: torch.float16, None: torch.float32}[dtype]
        if t.dtype != want:
            raise TypeError(f"{name}: dtype {t.dtype}, expected {want}")
        if t.dim() != len(shape) or any(w is not None and w != g for w, g in zip(shape, t.shape)):
            want_shape = ", ".join("?" if w is None else str(w) for w in shape)
            raise ValueError(f"{name}: shape {tuple(t.shape)}, expected ({want_shape})")
        if not t.is_contiguous():
            raise ValueError(f"{name}: not contiguous (call .contiguous())")
        return t.data_ptr()

    def _stream(self, stream):
        """The cudaStream_t: the one given, else torch's current stream on the context's device
        (where its tensors are); NULL on the CPU backend."""
        if stream is not None:
            return stream
        if self.device == _lib.DEVICE_CPU:
            return None
        import torch
        return torch.cuda.current_stream(self.device).cuda_stream
