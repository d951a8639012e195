"""Which kernels run a model, and what this machine is.

The choices `quant.transform.apply_kernels` applies to a built model: whether the
native kernels run it at all, which float32 layers they take, and whether the GEMV
beats F.linear here (measured once per machine). Also the CPU model and that
once-per-machine store, which exported packages' keys include.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import time
from typing import Callable, Optional

import torch
import torch.nn.functional as F

log = logging.getLogger("fastdecode")


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
    except OSError:
        return ""


def measured_once(name: str, measure: Callable[[], bool]) -> bool:
    """A yes/no choice measured once per machine and torch version, then read back.

    Stored in `<cache>/machine.json`, so a noisy timing cannot flip it between
    processes (it is part of exported packages' keys). Without a writable cache
    it is measured in each process.
    """
    from ..paths import cache_root

    path = cache_root() / "machine.json"
    key = f"{name}|{cpu_model()}|{torch.backends.cpu.get_cpu_capability()}|torch {torch.__version__}"
    try:
        stored = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(stored, dict):
            stored = {}
    except (OSError, ValueError):
        stored = {}
    if isinstance(stored.get(key), bool):
        return stored[key]
    value = bool(measure())
    stored[key] = value
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".machine-", dir=path.parent)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(stored, f, indent=1, sort_keys=True)
        os.replace(tmp, path)
    except OSError as e:
        log.debug("not storing %s in %s: %s", name, path, e)
    return value


def use_native(device: torch.device, dtype: torch.dtype, quantized: bool) -> bool:
    """Whether the native kernels run a model: on CPU, for quantized weights or a float32
    model, when they build and load here (`kernels.load_kernels`)."""
    from . import load_kernels

    return device.type == "cpu" and (quantized or dtype == torch.float32) and load_kernels()


def native_float_layers(dtype: torch.dtype) -> bool:
    """Whether RMSNorm, attention and (where faster) the linears take the native kernels:
    float32 models only (the kernels compute in float32)."""
    return dtype == torch.float32


def attention_kernel_fits(head_dim: int) -> bool:
    """The attention kernel's head sizes: multiples of 8, at most 256."""
    return head_dim % 8 == 0 and head_dim <= 256


_gemv_faster: Optional[bool] = None


def gemv_is_faster() -> bool:
    """Whether the native GEMV beats F.linear at batch 1 on this machine: measured
    once per machine (`measured_once`), since the choice is part of an
    exported package's key and a noisy timing must not flip it between runs.

    On some CPUs (an Intel Xeon here) MKL's GEMV already uses every core and
    wins; on others (AMD EPYC) it runs on one core and the kernel wins.
    """
    global _gemv_faster
    if _gemv_faster is None:
        _gemv_faster = measured_once("native GEMV faster than F.linear", _time_gemv)
    return _gemv_faster


def _time_gemv() -> bool:
    w, x = torch.randn(1536, 576), torch.randn(1, 576)

    def best(f) -> float:
        f()
        times = []
        for _ in range(5):
            t = time.perf_counter()
            for _ in range(10):
                f()
            times.append(time.perf_counter() - t)
        return min(times)

    with torch.inference_mode():
        return best(lambda: torch.ops.fastdecode.gemv(x, w)) < best(lambda: F.linear(x, w))
