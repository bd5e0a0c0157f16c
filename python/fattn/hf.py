# hf.py: a Hugging Face transformers attention backend over fattn: every attention layer of a
# model stores its K/V in fattn's pages and attends there, one fattn sequence per batch row.
# MLA layers (DeepSeek-V3) keep their latent rows in the pages and attend in absorbed form.
# On a CUDA device, decode steps replay a CUDA graph of the model's decode forward.
import functools
import inspect
import math

import torch
from transformers import AttentionInterface
from transformers.cache_utils import Cache, CacheLayerMixin
from transformers.masking_utils import AttentionMaskInterface, flash_attention_mask

from ._lib import MAX_GRAPH_BUCKETS, Mode
from .context import Context

NAME = "fattn"


def use(model, device="cpu", page_size=16, max_batch=8, max_seq_len=2048, dtype="bf16",
        graphs=True):
    """Routes model's attention through a new fattn context; returns its Backend. Pass
    backend.cache() as the cache (past_key_values in older transformers) of model.generate or
    of the model's forward. Call it after the weights are loaded: the sinks (gpt-oss) are
    copied into the context here. graphs: on a CUDA device, decode steps of up to
    min(max_batch, 64) rows replay a CUDA graph of the model's decode forward, captured at the
    first step of each batch size (backend.graph_steps, eager_steps and eager_reason say how
    the decode steps ran)."""
    return Backend(model, device, page_size, max_batch, max_seq_len, dtype, graphs)


def _attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """The AttentionInterface entry: the module's backend attends (use() set it)."""
    return module.fattn_backend.attend(module, query, key, value, attention_mask, scaling,
                                       dropout, kwargs)


AttentionInterface.register(NAME, _attention)
# Masks are fattn's own (causal, window, chunk); of transformers' it takes the 2-D padding mask
# alone, as flash attention does: None where no row is padded.
AttentionMaskInterface.register(NAME, flash_attention_mask)


def _layer_options(config, layer):
    """(fattn layer options, the sliding_window transformers passes for it) of one layer."""
    types = getattr(config, "layer_types", None)
    kind = types[layer] if types else None
    window = config.sliding_window if getattr(config, "sliding_window", None) else None
    if kind is not None and kind != "sliding_attention":
        window = None
    opts = {}
    if window is not None:
        # transformers' mask keeps j > i - w, i.e. j in [i - w + 1, i]; fattn's window w' keeps
        # j in [i - w', i]: the same keys at w' = w - 1.
        opts["sliding_window"] = window - 1
    if kind == "chunked_attention":
        opts["chunk_size"] = config.attention_chunk_size
    return opts, window


def _mla_fields(m):
    """The fattn model fields of MLA layers like m: one latent head of latent + rope dims, the
    output the latent's width."""
    latent, rope = m.kv_lora_rank, m.qk_rope_head_dim
    return {"num_kv_heads": 1, "head_dim": latent + rope, "head_dim_v": latent,
            "mla_latent_dim": latent, "mla_rope_dim": rope}


def _absorbed(m):
    """MLA layer m's kv_b_proj [heads * (nope + v), latent] as its key part W_UK [heads, nope,
    latent], which q_nope goes through (q_nope . W_UK c = q_nope . k_nope), and its value part
    W_UV [heads, v, latent], which the latent output goes through; float32, on m's device."""
    w = m.kv_b_proj.weight.detach().float().view(m.num_heads, m.qk_nope_head_dim + m.v_head_dim,
                                                 m.kv_lora_rank)
    return w[:, :m.qk_nope_head_dim], w[:, m.qk_nope_head_dim:]


class Backend:
    """One fattn context serving one model's attention layers. One generation at a time: a new
    cache() closes the sequences of the one before."""

    def __init__(self, model, device, page_size, max_batch, max_seq_len, dtype, graphs):
        config = model.config.get_text_config()
        self.attn = sorted((m for m in model.modules()
                            if hasattr(m, "layer_idx") and hasattr(m, "scaling")),
                           key=lambda m: m.layer_idx)
        if [m.layer_idx for m in self.attn] != list(range(len(self.attn))):
            # fattn's layer i is the model's layer_idx i, and layer 0 plans each step.
            raise ValueError("model: attention modules with layer_idx 0, 1, .. (and scaling) "
                             f"expected, found {[m.layer_idx for m in self.attn]}")
        scales = {m.scaling for m in self.attn}
        if len(scales) != 1:
            raise ValueError(f"model: the layers' scaling differ ({sorted(scales)}); fattn "
                             "takes one softmax scale per model")
        self.scale = scales.pop()
        layers = [_layer_options(config, m.layer_idx) for m in self.attn]
        self.windows = [window for _, window in layers]
        self.softcap = getattr(config, "attn_logit_softcapping", None)
        model_desc = {"num_layers": len(self.attn), "num_q_heads": config.num_attention_heads,
                      "num_kv_heads": getattr(config, "num_key_value_heads", None)
                      or config.num_attention_heads,
                      "softmax_scale": self.scale, "logit_softcap": self.softcap or 0.0,
                      "layers": [opts for opts, _ in layers]}
        self.mla = hasattr(self.attn[0], "kv_b_proj")
        if self.mla:
            model_desc.update(_mla_fields(self.attn[0]))
        else:
            model_desc["head_dim"] = self.attn[0].head_dim
        # MLA: each layer's absorbed weights (_absorbed), taken here since use() comes after the
        # weights are loaded.
        self.absorbed = [_absorbed(m) for m in self.attn] if self.mla else None
        self.sinks = None
        if hasattr(self.attn[0], "sinks"):
            self.sinks = torch.stack([m.sinks.detach().float().cpu() for m in self.attn])
            model_desc["sinks"] = self.sinks.flatten().tolist()
        self.device = (torch.device("cuda", device) if isinstance(device, int)
                       else torch.device(device))
        if self.device.type == "cuda" and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        pages = max_batch * math.ceil(max_seq_len / page_size)
        # Decode graphs: a bucket for every batch size up to 64, so that a replay runs the
        # forward at the batch's own size (no padding rows) and gives its eager step's bits.
        self.max_graph_rows = min(max_batch, MAX_GRAPH_BUCKETS)
        self.graphs_off = None  # why no decode step replays, where none can
        if not graphs:
            self.graphs_off = "graphs are off (use(graphs=False))"
        elif self.device.type != "cuda":
            self.graphs_off = "graphs need a CUDA device (the context runs on the CPU)"
        buckets = {} if self.graphs_off else {
            "graph_modes": 1 << Mode.DECODE, "graph_buckets": range(1, self.max_graph_rows + 1)}
        self.ctx = Context(device="cpu" if self.device.type == "cpu" else self.device.index,
                           q_dtype=dtype, kv_dtype=dtype, page_size=page_size,
                           kv_budget_pages=pages, max_batch=max_batch, max_seq_len=max_seq_len,
                           max_q_tokens=max_batch * max_seq_len, model=model_desc, **buckets)
        self.torch_dtype = {"BF16": torch.bfloat16, "FP16": torch.float16}[self.ctx.dtype.name]
        self.model, self.previous = model, model.config._attn_implementation
        for m in self.attn:
            m.fattn_backend = self
        model.set_attn_implementation(NAME)
        self._cache = None    # the PagedCache handed out last
        self._stepping = None  # the cache whose update ran just before the next attention
        self._latent = None    # MLA: that update's latent rows and rope keys
        # transformers 5.25 names the forward's cache argument `cache`, earlier 5.x
        # `past_key_values`.
        self.cache_arg = ("cache" if "cache" in inspect.signature(model.forward).parameters
                          else "past_key_values")
        self.graph_steps = 0      # decode steps replayed from a graph
        self.eager_steps = 0      # decode steps run eagerly
        self.eager_reason = None  # why the last of those did not replay
        self._graphs = {}  # batch rows -> its _DecodeGraph, or why its capture failed
        self._forward = None  # the model's own forward while use() wraps it
        if graphs:
            self._forward = model.forward

            @functools.wraps(self._forward)  # its signature, which generate inspects
            def forward(*args, **kwargs):
                return self._decode_step(*args, **kwargs)

            model.forward = forward

    def cache(self):
        """A new PagedCache for one generation. The sinks are compared here, once a generation
        rather than once a layer and step (on a GPU each comparison waits for the device)."""
        if self.sinks is not None and not all(
                torch.equal(m.sinks.detach().float().cpu(), sinks)
                for m, sinks in zip(self.attn, self.sinks)):
            raise ValueError("model: its sinks are not those the context was created with "
                             "(call use() after loading the weights)")
        if self._cache is not None:
            self._cache.close()
        self._cache = PagedCache(self, [_Slots() for _ in self.attn])
        return self._cache

    def close(self):
        """Closes the context and gives the model its previous attention and forward back."""
        for m in self.attn:
            del m.fattn_backend
        self.model.set_attn_implementation(self.previous)
        if self._forward is not None:
            del self.model.forward  # the class's again
            self._graphs.clear()
        self.ctx.close(force=True)

    def _decode_step(self, *args, **kwargs):
        """The model's forward while use() wraps it: a decode step of backend.cache() (every row
        one token) replays the graph of its batch size where one can serve it (captured at the
        first such step); any other call runs the forward."""
        cache = kwargs.get("cache", kwargs.get("past_key_values"))  # either spelling
        ids = kwargs.get("input_ids")
        if (not isinstance(cache, PagedCache) or cache.seqs is None or ids is None
                or ids.dim() != 2 or ids.shape[1] != 1):
            return self._forward(*args, **kwargs)  # a prefill, or no cache of ours
        graph = self._why_eager(args, kwargs, cache) or self._graph(ids.shape[0])
        if isinstance(graph, str):
            self.eager_steps += 1
            self.eager_reason = graph
            return self._forward(*args, **kwargs)
        self.graph_steps += 1
        return graph.step(cache, kwargs)

    def _why_eager(self, args, kwargs, cache):
        """Why this decode step cannot replay a graph, or None."""
        if self.graphs_off:
            return self.graphs_off
        rows = kwargs["input_ids"].shape[0]
        if rows > self.max_graph_rows:
            return f"batch {rows}: the largest graph bucket is {self.max_graph_rows}"
        if len(cache.seqs) != rows:
            return f"batch {rows}: the cache holds {len(cache.seqs)} sequences"
        if args:
            return "positional arguments to the forward"
        for key, value in kwargs.items():
            if key not in _GRAPH_ARGS and value is not None and value is not False:
                return f"the forward's argument {key} is set (no decode graph replays it)"
        if kwargs.get("use_cache") is False or kwargs.get("return_dict") is False:
            return "use_cache=False or return_dict=False"
        if not isinstance(kwargs.get("logits_to_keep", 0), int):
            return "logits_to_keep as indices"
        position_ids = kwargs.get("position_ids")
        if position_ids is not None and position_ids.shape not in ((rows, 1), (1, 1)):
            return f"position_ids of shape {tuple(position_ids.shape)}"
        mask = kwargs.get("attention_mask")
        if mask is not None:
            if mask.dim() != 2 or mask.shape[0] != rows:
                return f"attention_mask of shape {tuple(mask.shape)} (a graph takes the 2-D one)"
            # The rows' new tokens must all be real (one query each). This reads one column
            # back: the host waits for the step before, as generate's own stopping checks do.
            if not bool(mask[:, -1].all()):
                return "a row's token is padding (it takes no query)"
        return None

    def _graph(self, rows):
        """The _DecodeGraph of rows, captured at its first use, or why it could not be."""
        graph = self._graphs.get(rows)
        if graph is None:
            try:
                graph = _DecodeGraph(self, rows)
            except Exception as e:  # a forward that syncs or allocates, a refused fattn call
                what = (str(e).splitlines() or [""])[0]
                graph = (f"the decode forward of {rows} rows does not capture: "
                         f"{type(e).__name__}: {what}")
            self._graphs[rows] = graph
        return graph

    def attend(self, module, query, key, value, attention_mask, scaling, dropout, kwargs):
        """query [B, Hq, T, D], key and value [B, Hkv, T, D] of this step's tokens alone (the
        PagedCache keeps none); returns ([B, T, Hq, D], None), zeros at padded positions."""
        layer, cache = module.layer_idx, self._stepping
        self._stepping = None
        if cache is None:
            raise ValueError("cache: fattn attends over its own pages; pass backend.cache() "
                             "to generate or forward")
        self._check(layer, scaling, dropout, kwargs)
        batch, _, tokens, _ = query.shape
        if cache.captured:
            real = None  # every row one real token, the step planned before the replay
        elif attention_mask is None:
            real = torch.ones(batch, tokens, dtype=torch.bool, device=query.device)
        elif attention_mask.dim() == 2:
            real = attention_mask[:, -tokens:].bool()  # the step's columns: pads are False
        else:
            raise ValueError(f"attention_mask: {attention_mask.dim()}-D; fattn takes the 2-D "
                             "padding mask [batch, tokens] (masks are fattn's own)")
        if layer == 0 and real is not None:
            cache.plan(real)
        if self.mla:
            return self._attend_mla(module, query, real, cache)
        q, k, v = (_rows(t, real).to(self.device, self.torch_dtype).contiguous()
                   for t in (query, key, value))
        out = torch.empty_like(q)
        self._store_attend(cache, layer, q, k, v, out)
        return _unrows(out.to(query.device, query.dtype), real, batch, tokens), None

    def _store_attend(self, cache, layer, q, k, v, out):
        """The layer's fattn calls; none in the warm-up before a capture, which plans no step
        (out comes back as zeros)."""
        if cache.captured and cache.warming:
            out.zero_()
            return
        self.ctx.store_kv(layer, k, v)
        self.ctx.attend(layer, q, out)

    def _attend_mla(self, module, query, real, cache):
        """Absorbed MLA: the step's latent rows [kv_nope, k_rope] (576 a token) go to the pages;
        q = [q_nope W_UK, q_rope] attends over them; the latent output goes through W_UV. The
        expanded K and V the module made for its own attention are not used."""
        if self._latent is None:
            raise ValueError(f"cache: layer {module.layer_idx} attends without its latent rows "
                             "(the module did not update the cache)")
        (kv_nope, k_rope), self._latent = self._latent, None
        w_uk, w_uv = self.absorbed[module.layer_idx]
        nope = module.qk_nope_head_dim
        latent = _rows(torch.cat((kv_nope, k_rope), dim=-1), real)  # [n, 1, 576]
        q_latent = torch.einsum("bhtd,hdc->bhtc", query[..., :nope].float(), w_uk)
        q = _rows(torch.cat((q_latent, query[..., nope:].float()), dim=-1), real)
        q = q.to(self.device, self.torch_dtype).contiguous()
        out = q.new_empty(q.shape[0], q.shape[1], w_uk.shape[-1])
        self._store_attend(cache, module.layer_idx, q,
                           latent.to(self.device, self.torch_dtype).contiguous(), None, out)
        o = torch.einsum("nhc,hvc->nhv", out.to(query.device).float(), w_uv)
        return _unrows(o.to(query.dtype), real, query.shape[0], query.shape[2]), None

    def _check(self, layer, scaling, dropout, kwargs):
        """The call's options must be those the context was created with."""
        if dropout:
            raise ValueError(f"dropout: {dropout}; fattn attends for inference only")
        if scaling is not None and not math.isclose(scaling, self.scale, rel_tol=1e-6):
            raise ValueError(f"scaling: layer {layer} asks {scaling}, the context has "
                             f"{self.scale}")
        if kwargs.get("sliding_window") != self.windows[layer]:
            raise ValueError(f"sliding_window: layer {layer} asks {kwargs.get('sliding_window')}, "
                             f"the context has {self.windows[layer]}")
        if kwargs.get("softcap") not in (None, self.softcap):
            raise ValueError(f"softcap: layer {layer} asks {kwargs['softcap']}, the context has "
                             f"{self.softcap}")
        if (kwargs.get("s_aux") is None) != (self.sinks is None):
            raise ValueError(f"s_aux: layer {layer} passes {'no ' if self.sinks is not None else ''}"
                             "sinks, unlike the model use() read")


def _rows(t, real):
    """t [batch, heads, tokens, d] as token-major rows [n, heads, d] of its real tokens (real
    [batch, tokens], or None: all), row after row: the order of the planned batch's entries."""
    t = t.transpose(1, 2)
    return t.reshape(-1, *t.shape[2:]) if real is None else t[real]


def _unrows(rows, real, batch, tokens):
    """_rows undone: [batch, tokens, heads, d], zeros at the positions real leaves out."""
    if real is None:
        return rows.view(batch, tokens, *rows.shape[1:])
    result = rows.new_zeros(batch, tokens, *rows.shape[1:])
    result[real] = rows
    return result


# The forward's arguments a replayed decode step takes (the others must be unset): its tensors
# go into the graph's static buffers; the mask only says that every row's token is real.
_GRAPH_ARGS = {"input_ids", "attention_mask", "position_ids", "cache", "past_key_values",
               "use_cache", "logits_to_keep", "return_dict"}


class _DecodeGraph:
    """The decode forward of a batch of `rows` captured as one CUDA graph: its inputs are static
    buffers, its fattn calls hold fattn's DECODE bucket of rows (planned by fattn_graph_plan
    before each replay) and the cache it sees counts the step's columns on the device."""

    def __init__(self, backend, rows):
        self.backend, self.rows = backend, rows
        device = backend.device
        self.input_ids = torch.zeros(rows, 1, dtype=torch.long, device=device)
        self.position_ids = torch.zeros(rows, 1, dtype=torch.long, device=device)
        self.cache = _CapturedCache(backend, device)
        inputs = {"input_ids": self.input_ids, "position_ids": self.position_ids,
                  "use_cache": True, backend.cache_arg: self.cache}
        with torch.no_grad():
            self.replay, out = _capture(backend, rows, lambda: backend._forward(**inputs),
                                        self.cache)
        self.kind, self.logits = type(out), out.logits
        self.cache_key = next((k for k, v in out.items() if v is self.cache), None)
        if self.cache_key is None:
            raise ValueError("the forward's output holds no cache")

    def step(self, cache, kwargs):
        """One decode step of cache's sequences: inputs into the static buffers, the step
        planned into the bucket, the graph replayed; the output as the forward's."""
        self.input_ids.copy_(kwargs["input_ids"])
        seen = cache.get_seq_length()
        if kwargs.get("position_ids") is None:
            self.position_ids.fill_(seen)  # the forward's own: the columns seen so far
        else:
            self.position_ids.copy_(kwargs["position_ids"])
        self.cache.columns.fill_(seen)
        seqs, _ = cache.grow([1] * self.rows)
        self.backend.ctx.graph_plan("decode", seqs)
        self.replay()
        cache.count(1)
        return self.kind(logits=self.logits.clone(), **{self.cache_key: cache})


def _capture(backend, rows, forward, cache):
    """forward() captured as a CUDA graph whose fattn calls hold the DECODE bucket of rows,
    after a warm-up on the capture's side stream as torch asks (fattn left out: no step is
    planned for it): (the graph's replay, forward's output, which each replay rewrites)."""
    device = backend.device
    stream = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        cache.warming = True
        try:
            forward()
        finally:
            cache.warming = False
    torch.cuda.current_stream(device).wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    failure = None  # the forward's error: the capture's own end then fails after it
    try:
        with torch.cuda.graph(graph, stream=stream):
            backend.ctx.graph_begin("decode", rows)
            try:
                out = forward()
            except Exception as e:
                failure = e
            backend.ctx.graph_end()
    except Exception:
        if failure is None:
            raise
    if failure is not None:
        raise failure
    return graph.replay, out


class _Slots(CacheLayerMixin):
    """One layer's view for transformers: the count of token columns seen; no K/V."""

    is_sliding = False

    def __init__(self):
        super().__init__()
        self.length = 0

    def lazy_initialization(self, key_states, value_states):
        self.is_initialized = True

    def update(self, key_states, value_states, *args, **kwargs):
        self.is_initialized = True
        self.length += key_states.shape[-2]
        return key_states, value_states

    def get_mask_sizes(self, query_length):
        return self.length + query_length, 0

    def get_seq_length(self):
        return self.length

    def get_max_length(self):
        return -1


class _CapturedSlots(_Slots):
    """A captured decode forward's layer view: its length is the step's columns before its
    token, a device tensor set before each replay, so that what the forward derives from it
    (Llama 4's attention temperature, say) follows the step rather than the capture."""

    def __init__(self, columns):
        super().__init__()
        self.length = columns

    def update(self, key_states, value_states, *args, **kwargs):
        self.is_initialized = True
        return key_states, value_states


class PagedCache(Cache):
    """The cache of a model served by a Backend: batch row b is fattn sequence seqs[b],
    opened at the first step; its K/V live in the context's pages."""

    captured = False  # a captured decode forward's cache (_CapturedCache)

    def __init__(self, backend, layers):
        super().__init__(layers=layers)
        self.backend = backend
        self.seqs, self.lengths = None, None

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        # The attention call that follows in the same module reads the step's sequences here
        # (and, for MLA, the step's latent rows: the module passes kv_nope and k_rope).
        self.backend._stepping = self
        if self.backend.mla:
            self.backend._latent = (key_states, value_states)
        return super().update(key_states, value_states, layer_idx, *args, **kwargs)

    def plan(self, real):
        """Plans the step whose tokens are real's True entries [batch, tokens]: row b appends
        its count to sequence seqs[b]; rows with none stay out of the step."""
        seqs, q_lens = self.grow(real.sum(dim=1).tolist())
        self.backend.ctx.plan("decode" if real.shape[1] == 1 else "prefill", seqs, q_lens)

    def grow(self, counts):
        """Reserves counts[b] more tokens in row b's sequence (opened at the first step):
        (sequences, counts) of the rows that have any, the step's entries."""
        ctx = self.backend.ctx
        if self.seqs is None:
            self.seqs = [ctx.open_seq() for _ in counts]
            self.lengths = [0] * len(counts)
        elif len(self.seqs) != len(counts):
            raise ValueError(f"input_ids: batch {len(counts)}, the cache holds "
                             f"{len(self.seqs)} sequences")
        seqs, q_lens = [], []
        for b, n in enumerate(counts):
            if n:
                ctx.reserve(self.seqs[b], self.lengths[b] + n)
                self.lengths[b] += n
                seqs.append(self.seqs[b])
                q_lens.append(n)
        return seqs, q_lens

    def count(self, columns):
        """A step of columns that no layer's update saw (a replayed graph's)."""
        for layer in self.layers:
            layer.length += columns

    def close(self):
        """Releases the sequences' pages."""
        for seq in self.seqs or []:
            self.backend.ctx.close_seq(seq)
        self.seqs = None


class _CapturedCache(PagedCache):
    """The cache a captured decode forward sees: no sequences (the step's are planned outside
    the graph), its column count a device tensor (_CapturedSlots); while warming (the eager
    run before the capture) the layers make no fattn call."""

    captured = True

    def __init__(self, backend, device):
        self.columns = torch.zeros((), dtype=torch.long, device=device)
        super().__init__(backend, [_CapturedSlots(self.columns) for _ in backend.attn])
        self.warming = False
