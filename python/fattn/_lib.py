# _lib.py: loading libfattn.so and its ctypes view: the structs of include/fattn.h field for
# field, the *_INIT defaults, the enums and the prototypes of the functions the package calls.
import ctypes
import os
from ctypes import (POINTER, c_char_p, c_float, c_int, c_int32, c_size_t, c_uint32, c_uint64,
                    c_void_p)
from enum import IntEnum


class Status(IntEnum):
    OK = 0
    ERR_INVALID = -1
    ERR_NOMEM = -2
    ERR_CAPACITY = -3
    ERR_BUSY = -4
    ERR_UNSUPPORTED = -5
    ERR_CUDA = -6
    ERR_NOT_FOUND = -7
    ERR_STATE = -8
    ERR_NO_DEVICE = -9
    ERR_OVERFLOW = -10
    ERR_CORRUPT = -11


class DType(IntEnum):
    BF16 = 1
    FP16 = 2
    FP8_E4M3 = 3


class Backend(IntEnum):
    AUTO = 0
    FA2 = 1
    FA3 = 2
    CPU = 4


class Mode(IntEnum):
    PREFILL = 1
    DECODE = 2
    TARGET_VERIFY = 3
    DRAFT_DECODE = 4
    DRAFT_EXTEND = 5
    CROSS = 6


DEVICE_CPU = -1
NO_WINDOW = -1
FLAG_CALLER_PAGES = 0x1
MAX_GRAPH_BUCKETS = 64
REGION_NAMES = ("k_pool", "v_pool", "page_table", "metadata", "split_workspace", "graph_static",
                "model", "pinned_staging")


class Versioned(ctypes.Structure):
    """A struct opening with struct_size: built with its *_INIT defaults, struct_size included."""

    _defaults = {}

    def __init__(self, **fields):
        super().__init__(struct_size=ctypes.sizeof(self), **{**self._defaults, **fields})


class LayerOpts(ctypes.Structure):
    _fields_ = [("sliding_window", c_int32), ("chunk_size", c_uint32), ("k_scale", c_float),
                ("v_scale", c_float)]

    def __init__(self, **fields):
        super().__init__(**{"sliding_window": NO_WINDOW, "k_scale": 1.0, "v_scale": 1.0, **fields})


class Model(Versioned):
    _fields_ = [("struct_size", c_uint32), ("num_layers", c_uint32), ("num_q_heads", c_uint32),
                ("num_kv_heads", c_uint32), ("head_dim", c_uint32), ("head_dim_v", c_uint32),
                ("mla_latent_dim", c_uint32), ("mla_rope_dim", c_uint32),
                ("softmax_scale", c_float), ("logit_softcap", c_float),
                ("layers", POINTER(LayerOpts)), ("sinks", POINTER(c_float))]


class Config(Versioned):
    _fields_ = [("struct_size", c_uint32), ("device", c_int32), ("q_dtype", c_int),
                ("kv_dtype", c_int), ("page_size", c_uint32), ("kv_budget_bytes", c_uint64),
                ("kv_budget_pages", c_uint32), ("max_seqs", c_uint32), ("max_batch", c_uint32),
                ("max_seq_len", c_uint32), ("max_q_tokens", c_uint32), ("spec_topk", c_uint32),
                ("spec_steps", c_uint32), ("spec_draft_tokens", c_uint32),
                ("max_encoder_len", c_uint32), ("prefill_backend", c_int),
                ("decode_backend", c_int), ("max_splits", c_uint32), ("staging_slots", c_uint32),
                ("num_graph_buckets", c_uint32), ("graph_buckets", POINTER(c_uint32)),
                ("graph_modes", c_uint32), ("flags", c_uint32), ("compute_dtype", c_int)]
    _defaults = {"q_dtype": DType.BF16, "kv_dtype": DType.BF16, "page_size": 16, "max_batch": 1,
                 "max_seq_len": 4096, "max_q_tokens": 4096}


class MemoryReport(Versioned):
    _fields_ = [("struct_size", c_uint32), ("region_bytes", c_uint64 * len(REGION_NAMES)),
                ("device_bytes", c_uint64), ("pinned_bytes", c_uint64), ("num_pages", c_uint32),
                ("pages_per_seq", c_uint32), ("page_bytes", c_uint64),
                ("graph_bytes_per_mode", c_uint64 * (len(Mode) + 1))]


class Stats(Versioned):
    _fields_ = [("struct_size", c_uint32), ("pages_total", c_uint32), ("pages_free", c_uint32),
                ("seqs_open", c_uint32), ("page_allocs", c_uint64), ("page_frees", c_uint64),
                ("steps_planned", c_uint64), ("staging_waits", c_uint64),
                ("cow_copies", c_uint64)]


class Batch(Versioned):
    _fields_ = [("struct_size", c_uint32), ("mode", c_int), ("num_seqs", c_uint32),
                ("seq_ids", POINTER(c_uint32)), ("q_lens", POINTER(c_uint32)),
                ("kv_lens", POINTER(c_uint32)), ("kv_new_lens", POINTER(c_uint32)),
                ("tree_mask", POINTER(c_uint64))]
    _defaults = {"mode": Mode.DECODE}


GRAPH_FN = ctypes.CFUNCTYPE(None, c_void_p, c_void_p)

_ctx = c_void_p
_PROTOTYPES = {
    "fattn_status_name": (c_char_p, [c_int]),
    "fattn_version": (c_char_p, []),
    "fattn_memory_plan": (c_int, [POINTER(Config), POINTER(Model), POINTER(MemoryReport),
                                  c_char_p, c_size_t]),
    "fattn_create": (c_int, [POINTER(Config), POINTER(Model), POINTER(_ctx), c_char_p, c_size_t]),
    "fattn_destroy": (c_int, [_ctx, c_int]),
    "fattn_detail": (c_char_p, [_ctx]),
    "fattn_ctx_memory": (POINTER(MemoryReport), [_ctx]),
    "fattn_ctx_backend": (c_int, [_ctx, c_int]),
    "fattn_check": (c_int, [_ctx]),
    "fattn_get_stats": (c_int, [_ctx, POINTER(Stats)]),
    "fattn_seq_open": (c_int, [_ctx, POINTER(c_uint32)]),
    "fattn_seq_reserve": (c_int, [_ctx, c_uint32, c_uint32]),
    "fattn_seq_fork": (c_int, [_ctx, c_uint32, c_uint32, POINTER(c_uint32)]),
    "fattn_seq_truncate": (c_int, [_ctx, c_uint32, c_uint32]),
    "fattn_seq_close": (c_int, [_ctx, c_uint32]),
    "fattn_seq_length": (c_int, [_ctx, c_uint32, POINTER(c_uint32)]),
    "fattn_seq_map": (c_int, [_ctx, c_uint32, c_uint32, c_uint32, POINTER(c_uint32)]),
    "fattn_plan": (c_int, [_ctx, POINTER(Batch), c_void_p]),
    "fattn_store_kv": (c_int, [_ctx, c_uint32, c_void_p, c_void_p, c_void_p]),
    "fattn_attend": (c_int, [_ctx, c_uint32, c_void_p, c_void_p, c_void_p, c_void_p]),
    "fattn_graph_capture": (c_int, [_ctx, c_int, c_uint32, GRAPH_FN, c_void_p]),
    "fattn_graph_launch": (c_int, [_ctx, POINTER(Batch), c_void_p]),
    "fattn_graph_begin": (c_int, [_ctx, c_int, c_uint32, c_void_p]),
    "fattn_graph_end": (c_int, [_ctx]),
    "fattn_graph_plan": (c_int, [_ctx, POINTER(Batch), c_void_p]),
}


def _path():
    """$FATTN_LIB, else build/libfattn.so of the checkout the package sits in, else the
    system loader's libfattn.so."""
    if os.environ.get("FATTN_LIB"):
        return os.environ["FATTN_LIB"]
    here = os.path.dirname(os.path.abspath(__file__))
    in_tree = os.path.normpath(os.path.join(here, os.pardir, os.pardir, "build", "libfattn.so"))
    return in_tree if os.path.exists(in_tree) else "libfattn.so"


def _load():
    path = _path()
    # The libraries that libfattn.so needs load in its own dlopen group, libjemalloc.so.2 ahead of
    # libstdc++.so.6: a libstdc++ loaded there would bind its operator new and delete to
    # jemalloc's, and a C++ library loaded later (import torch after fattn) would free with
    # glibc's free what jemalloc allocated. Loaded first, alone and global, libstdc++ keeps its
    # own (and the binding is unchanged where torch loaded it already).
    try:
        ctypes.CDLL("libstdc++.so.6", mode=ctypes.RTLD_GLOBAL)
    except OSError:
        pass  # not there: then libfattn.so, which needs it, will not load either and says so
    try:
        lib = ctypes.CDLL(path)
    except OSError as e:
        if "static TLS" in str(e):
            # Debian's jemalloc keeps its thread state in initial-exec TLS; the surplus that a
            # dlopen may use is fixed when the process starts.
            raise ImportError(f"fattn: {e}; start Python with "
                              "GLIBC_TUNABLES=glibc.rtld.optional_static_tls=16384") from e
        raise ImportError(f"fattn: cannot load {path} ({e}); build it with `make shared` "
                          "or name it in FATTN_LIB") from e
    for name, (restype, argtypes) in _PROTOTYPES.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = restype, argtypes
    return lib


lib = _load()


def status_name(status):
    return lib.fattn_status_name(status).decode()


def version():
    return lib.fattn_version().decode()
