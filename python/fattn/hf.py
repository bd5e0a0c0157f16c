# hf.py: a Hugging Face transformers attention backend over fattn: every attention layer of a
# model stores its K/V in fattn's pages and attends there, one fattn sequence per batch row.
# MLA layers (DeepSeek-V3) keep their latent rows in the pages and attend in absorbed form.
import math

import torch
from transformers import AttentionInterface
from transformers.cache_utils import Cache, CacheLayerMixin
from transformers.masking_utils import AttentionMaskInterface, flash_attention_mask

from .context import Context

NAME = "fattn"


def use(model, device="cpu", page_size=16, max_batch=8, max_seq_len=2048, dtype="bf16"):
    """Routes model's attention through a new fattn context; returns its Backend. Pass
    backend.cache() as the cache (past_key_values in older transformers) of model.generate or
    of the model's forward. Call it after the weights are loaded: the sinks (gpt-oss) are
    copied into the context here."""
    return Backend(model, device, page_size, max_batch, max_seq_len, dtype)


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

    def __init__(self, model, device, page_size, max_batch, max_seq_len, dtype):
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
        self.ctx = Context(device="cpu" if self.device.type == "cpu" else self.device.index,
                           q_dtype=dtype, kv_dtype=dtype, page_size=page_size,
                           kv_budget_pages=pages, max_batch=max_batch, max_seq_len=max_seq_len,
                           max_q_tokens=max_batch * max_seq_len, model=model_desc)
        self.torch_dtype = {"BF16": torch.bfloat16, "FP16": torch.float16}[self.ctx.dtype.name]
        self.model, self.previous = model, model.config._attn_implementation
        for m in self.attn:
            m.fattn_backend = self
        model.set_attn_implementation(NAME)
        self._cache = None    # the PagedCache handed out last
        self._stepping = None  # the cache whose update ran just before the next attention
        self._latent = None    # MLA: that update's latent rows and rope keys

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
        self._cache = PagedCache(self, len(self.attn))
        return self._cache

    def close(self):
        """Closes the context and gives the model its previous attention back."""
        for m in self.attn:
            del m.fattn_backend
        self.model.set_attn_implementation(self.previous)
        self.ctx.close(force=True)

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
        if attention_mask is None:
            real = torch.ones(batch, tokens, dtype=torch.bool, device=query.device)
        elif attention_mask.dim() == 2:
            real = attention_mask[:, -tokens:].bool()  # the step's columns: pads are False
        else:
            raise ValueError(f"attention_mask: {attention_mask.dim()}-D; fattn takes the 2-D "
                             "padding mask [batch, tokens] (masks are fattn's own)")
        if layer == 0:
            cache.plan(real)
        if self.mla:
            return self._attend_mla(module, query, real)
        # Token-major rows, row after row: the order of the planned batch's entries.
        q, k, v = (t.transpose(1, 2)[real].to(self.device, self.torch_dtype).contiguous()
                   for t in (query, key, value))
        out = torch.empty_like(q)
        self.ctx.store_kv(layer, k, v)
        self.ctx.attend(layer, q, out)
        result = query.new_zeros(batch, tokens, *out.shape[1:])
        result[real] = out.to(query.device, query.dtype)
        return result, None

    def _attend_mla(self, module, query, real):
        """Absorbed MLA: the step's latent rows [kv_nope, k_rope] (576 a token) go to the pages;
        q = [q_nope W_UK, q_rope] attends over them; the latent output goes through W_UV. The
        expanded K and V the module made for its own attention are not used."""
        if self._latent is None:
            raise ValueError(f"cache: layer {module.layer_idx} attends without its latent rows "
                             "(the module did not update the cache)")
        (kv_nope, k_rope), self._latent = self._latent, None
        w_uk, w_uv = self.absorbed[module.layer_idx]
        nope = module.qk_nope_head_dim
        latent = torch.cat((kv_nope, k_rope), dim=-1).transpose(1, 2)[real]  # [n, 1, 576]
        q_latent = torch.einsum("bhtd,hdc->bhtc", query[..., :nope].float(), w_uk)
        q = torch.cat((q_latent, query[..., nope:].float()), dim=-1).transpose(1, 2)[real]
        q = q.to(self.device, self.torch_dtype).contiguous()
        out = q.new_empty(q.shape[0], q.shape[1], w_uk.shape[-1])
        self.ctx.store_kv(module.layer_idx, latent.to(self.device, self.torch_dtype).contiguous(),
                          None)
        self.ctx.attend(module.layer_idx, q, out)
        o = torch.einsum("nhc,hvc->nhv", out.to(query.device).float(), w_uv)
        result = query.new_zeros(*real.shape, o.shape[1], o.shape[2])
        result[real] = o.to(query.dtype)
        return result, None

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


class PagedCache(Cache):
    """The cache of a model served by a Backend: batch row b is fattn sequence seqs[b],
    opened at the first step; its K/V live in the context's pages."""

    def __init__(self, backend, num_layers):
        super().__init__(layers=[_Slots() for _ in range(num_layers)])
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
        ctx = self.backend.ctx
        if self.seqs is None:
            self.seqs = [ctx.open_seq() for _ in range(real.shape[0])]
            self.lengths = [0] * real.shape[0]
        elif len(self.seqs) != real.shape[0]:
            raise ValueError(f"input_ids: batch {real.shape[0]}, the cache holds "
                             f"{len(self.seqs)} sequences")
        counts = real.sum(dim=1).tolist()
        seqs, q_lens = [], []
        for b, n in enumerate(counts):
            if n:
                ctx.reserve(self.seqs[b], self.lengths[b] + n)
                self.lengths[b] += n
                seqs.append(self.seqs[b])
                q_lens.append(n)
        ctx.plan("decode" if real.shape[1] == 1 else "prefill", seqs, q_lens)

    def close(self):
        """Releases the sequences' pages."""
        for seq in self.seqs or []:
            self.backend.ctx.close_seq(seq)
        self.seqs = None
