"""Native CPU kernels, built on first use with torch.utils.cpp_extension.

One extension holds them all: the fp32 GEMV (`gemv.cpp`), the matmuls on
block-quantized weights (`quant.cpp`), a fused RMSNorm (`norm.cpp`) and
attention over the KV cache (`attention.cpp`). Why on first use rather than at
install: building against torch inside pip's isolated build environment makes
pip resolve torch again (on most indexes a multi-GB CUDA wheel). The build is
cached per torch version and source hash under the fastdecode cache directory,
so it costs one compile per machine.

Without a C++ compiler, on a CPU without AVX2/FMA, or with
FASTDECODE_NO_KERNELS=1, `load_kernels()` returns False, with one warning
saying why, and callers use the pure-PyTorch reference paths.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import shutil
from pathlib import Path
from typing import Optional

import torch

log = logging.getLogger(__name__)

_HERE = Path(__file__).parent
_SOURCES = ("gemv.cpp", "quant.cpp", "norm.cpp", "attention.cpp")
_HEADERS = ("quant_kernel.h", "simd.h")
_NAME = "fastdecode_kernels"
_loaded: Optional[bool] = None
_lib: Optional[ctypes.CDLL] = None
# Why the kernels are unavailable, for stats and messages; None when they load.
unavailable_reason: Optional[str] = None

ISAS = {"avx2": 1, "avx512-vnni": 2}


def build_dir() -> Path:
    from ..checkpoints.cache import cache_root

    h = hashlib.sha256()
    for name in _SOURCES + _HEADERS:
        h.update((_HERE / name).read_bytes())
    tag = torch.__version__.replace("+", "_")
    return cache_root() / "kernels" / f"torch-{tag}-{h.hexdigest()[:12]}"


def _unavailable(reason: str) -> bool:
    global unavailable_reason
    unavailable_reason = reason
    log.warning("native kernels unavailable, using the PyTorch reference path: %s", reason)
    return False


def load_kernels() -> bool:
    """Build (once per machine) and register the `torch.ops.fastdecode` kernels; True when usable."""
    global _loaded, _lib
    if _loaded is not None:
        return _loaded
    _loaded = False
    if os.environ.get("FASTDECODE_NO_KERNELS"):
        return _unavailable("FASTDECODE_NO_KERNELS is set")
    if torch.backends.cpu.get_cpu_capability() not in ("AVX2", "AVX512"):
        return _unavailable("this CPU lacks AVX2/FMA")
    if shutil.which(os.environ.get("CXX", "c++")) is None:
        return _unavailable("no C++ compiler found; install one (e.g. `apt-get install g++`) for the fast kernels")
    if _lib is not None:  # built and registered earlier in this process
        _loaded = True
        return True
    try:
        from torch.utils.cpp_extension import load

        d = build_dir()
        d.mkdir(parents=True, exist_ok=True)
        load(name=_NAME, sources=[str(_HERE / s) for s in _SOURCES], build_directory=str(d),
             extra_cflags=["-O3", "-mavx2", "-mfma", "-mf16c", "-fopenmp", "-ffp-contract=off"],
             extra_ldflags=["-fopenmp"], is_python_module=False, verbose=False)
        # Global symbols, so an AOTInductor package can call the kernels' C
        # entry points (aoti_torch_cpu_*) when it is loaded.
        _lib = ctypes.CDLL(str(d / f"{_NAME}.so"), mode=ctypes.RTLD_GLOBAL)
    except (OSError, RuntimeError, ImportError) as e:  # failed build
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        return _unavailable(f"build failed ({first}); install g++ and ninja for the fast kernels")
    _register_fakes()
    _loaded = True
    return True


def _register_fakes() -> None:
    """Shapes only, for tracing by torch.compile and torch.export."""

    @torch.library.register_fake("fastdecode::gemv")
    def _(x, w):
        return x.new_empty(x.shape[0], w.shape[0])

    @torch.library.register_fake("fastdecode::q4_linear")
    def _(x, qweight, scales, mins):
        return x.new_empty(x.shape[0], qweight.shape[0])

    @torch.library.register_fake("fastdecode::q8_linear")
    def _(x, qweight, scales):
        return x.new_empty(x.shape[0], qweight.shape[0])

    @torch.library.register_fake("fastdecode::attention")
    def _(q, k, v, input_pos, rows, window, scale):
        return q.new_empty(q.shape)

    @torch.library.register_fake("fastdecode::rms_norm")
    def _(x, weight, eps):
        return torch.empty_like(x, memory_format=torch.contiguous_format)


def set_isa(name: Optional[str]) -> str:
    """Force the quantized kernels' instruction set ("avx2", "avx512-vnni"), or None to detect.

    Returns the active one. Raises ValueError if this CPU lacks the requested one.
    """
    if not load_kernels():
        raise RuntimeError(f"native kernels unavailable: {unavailable_reason}")
    code = 0 if name is None else ISAS[name]
    got = _lib.fastdecode_set_isa(code)
    if got < 0:
        raise ValueError(f"this CPU does not support {name}")
    return active_isa()


def active_isa() -> str:
    if not load_kernels():
        return "reference"
    code = _lib.fastdecode_get_isa()
    return next(k for k, v in ISAS.items() if v == code)


def available_isas() -> list[str]:
    """The instruction sets the quantized kernels can run here (for tests)."""
    if not load_kernels():
        return []
    before = active_isa()
    out = [n for n, c in ISAS.items() if _lib.fastdecode_set_isa(c) > 0]
    set_isa(before)
    return out
