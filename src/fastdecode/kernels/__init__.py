"""Optional native kernels, built on first use with torch.utils.cpp_extension.

Why on first use rather than at install: building against torch inside pip's
isolated build environment makes pip resolve torch again (on most indexes a
multi-GB CUDA wheel). The build is cached per torch version under the
fastdecode cache directory, so it costs one compile per machine. Without a C++
compiler, or on a CPU without AVX2/FMA, `load_gemv()` returns False and callers
keep stock `F.linear`.
"""

from __future__ import annotations

import ctypes
import logging
import os
from pathlib import Path
from typing import Optional

import torch

log = logging.getLogger(__name__)

_SOURCE = Path(__file__).with_name("gemv.cpp")
_loaded: Optional[bool] = None


def build_dir() -> Path:
    from ..checkpoints.cache import cache_root

    tag = torch.__version__.replace("+", "_")
    return cache_root() / "kernels" / f"torch-{tag}"


def load_gemv() -> bool:
    """Build (once) and register `torch.ops.fastdecode.gemv`; True when usable."""
    global _loaded
    if _loaded is not None:
        return _loaded
    _loaded = False
    if os.environ.get("FASTDECODE_NO_KERNELS"):
        return False
    if torch.backends.cpu.get_cpu_capability() not in ("AVX2", "AVX512"):
        log.info("gemv kernel skipped: CPU lacks AVX2/FMA")
        return False
    try:
        from torch.utils.cpp_extension import load

        d = build_dir()
        d.mkdir(parents=True, exist_ok=True)
        load(name="fastdecode_gemv", sources=[str(_SOURCE)], build_directory=str(d),
             extra_cflags=["-O3", "-mavx2", "-mfma", "-fopenmp"], extra_ldflags=["-fopenmp"],
             is_python_module=False, verbose=False)
        # Global symbols, so an AOTInductor package can call the kernel's C
        # entry point (aoti_torch_cpu_gemv) when it is loaded.
        ctypes.CDLL(str(d / "fastdecode_gemv.so"), mode=ctypes.RTLD_GLOBAL)
    except (OSError, RuntimeError, ImportError) as e:  # no compiler, failed build
        log.warning("gemv kernel unavailable, using F.linear: %s", str(e).splitlines()[0] if str(e) else e)
        return False

    @torch.library.register_fake("fastdecode::gemv")
    def _(x, w):  # shapes only, for tracing
        return x.new_empty(x.shape[0], w.shape[0])

    _loaded = True
    return True
