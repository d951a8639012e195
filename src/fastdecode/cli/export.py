"""`fastdecode export [--config FILE] [key=value ...]`: write an AOTInductor package.

The package holds the compiled model step for one architecture, dtype, device
and CPU instruction set; `fastdecode generate compiled=PATH` and
`load(..., compiled=PATH)` run it without tracing or compiling again.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from ..compile.background import ExportJob, run_child
from ..config import LoadOptions
from ..errors import FastDecodeError
from .command import run_command
from .keys import ModelKeys

USAGE = """usage: fastdecode export [--config FILE] [key=value ...]

Export the model's compiled prefill/decode step (torch.export + AOTInductor) to a
.pt2 package. Load it with `fastdecode generate compiled=PATH` or
fastdecode.load(model, compiled=PATH): no tracing or compiling in that process.
Without out=, it writes this machine's package into the cache, where the default
compiled=auto finds it (load() otherwise exports it in the background).
The package holds code, not weights: it serves any checkpoint of the same
architecture, dtype and device.

keys (defaults shown):
"""


@dataclass
class ExportSettings(ModelKeys):
    out: Optional[str] = field(default=None, metadata={
        "help": "path of the package to write; must end in .pt2; none writes this machine's package for the "
                "model into the cache, where load(compiled='auto') finds it"})
    weights: str = field(default=LoadOptions.weights, metadata={
        "help": "auto (keep the checkpoint's quantization), float, int8 or int4; generate must load the "
                "model the same way to use the package"})
    kv_dtype: str = field(default=LoadOptions.kv_dtype, metadata={
        "help": "KV cache dtype the package takes (auto, float32, float16, bfloat16, q8_0), as load(kv_dtype=...); "
                "generate must use the same to use the package"})

    def __post_init__(self) -> None:
        if self.out is None:
            return
        if not self.out:
            raise FastDecodeError("out must be a package path, e.g. out=smollm2.pt2, or left out for the cache")
        if not self.out.endswith(".pt2"):
            raise FastDecodeError(f"out={self.out!r} must end in .pt2")
        folder = os.path.dirname(os.path.abspath(self.out))
        if not os.path.isdir(folder):
            raise FastDecodeError(f"out={self.out!r}: folder {folder!r} does not exist")


def main(argv: list[str]) -> int:
    """Run by `fastdecode export`."""
    return run_command(argv, ExportSettings, USAGE, _export)


def _export(s: ExportSettings) -> int:
    from ..api.build import load
    from ..compile.aot import ensure_package, export_package, package_path

    llm = load(s.model, device=s.device, dtype=s.dtype, weights=s.weights, compiled=None, kv_dtype=s.kv_dtype)
    out = s.out or str(package_path(llm.model))
    if s.out is None and os.path.isfile(out):
        print(f"this machine's package for {llm.source} is already at {out}")
        return 0
    print(f"exporting {llm.source} to {out} (a minute or more on a small CPU)", file=sys.stderr)
    t0 = time.perf_counter()
    if s.out is None:
        ensure_package(llm.model)
    else:
        export_package(llm.model, out)
    print(f"wrote {out} in {time.perf_counter() - t0:.0f} s")
    return 0


def export_job(argv: list[str]) -> int:
    """The background export's child, which compile/background.py starts."""
    return run_child(argv, _export_as_the_parent_loaded)


def _export_as_the_parent_loaded(job: ExportJob) -> None:
    import torch

    from ..api.build import build
    from ..compile.aot import export_package, package_path
    from ..quant.transform import set_gemv

    path = Path(job.path)
    # Without the busy flag: held here, it would have the supervisor stop this very process.
    llm = build(LoadOptions.from_keywords(job.model, dict(dtype=job.dtype, weights=job.weights, compiled=None,
                                                         max_batch_size=1, max_seq_len=16, kv_dtype=job.kv_dtype)),
                busy=False)
    if llm.kernels.gemv != job.gemv:
        set_gemv(llm.model, job.gemv)
    if job.context:  # the parent's RoPE frequencies, which follow its context (LongRoPE), not this one's 16
        llm.model.init_rope(context=job.context)
    if package_path(llm.model) != path:
        raise RuntimeError("the model loaded here does not match the parent's package key")
    # Inductor plans its loops by torch's thread count when it compiles them: every loop runs
    # serial now (aot.export_package), but which ones it fuses still follows the count, so the
    # child compiles with the parent's, for the package the parent would have exported.
    torch.set_num_threads(job.threads)
    t0 = time.perf_counter()
    export_package(llm.model, path)
    print(f"exported {path} in {time.perf_counter() - t0:.0f} s", flush=True)
