# fattn: Python bindings of libfattn.so over ctypes (paged-KV attention; CPU or CUDA backend).
# The public names; the struct mirrors live in _lib, the context and its checks in context.
from ._lib import DEVICE_CPU, FLAG_CALLER_PAGES, NO_WINDOW, Backend, DType, Mode, Status, version
from .context import Context, FattnError, memory_plan

__all__ = ["Context", "FattnError", "memory_plan", "version", "Status", "DType", "Backend",
           "Mode", "DEVICE_CPU", "NO_WINDOW", "FLAG_CALLER_PAGES"]
