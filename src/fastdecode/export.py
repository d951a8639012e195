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
from typing import Optional

from .errors import FastDecodeError
from .settings import ModelKeys, describe_settings, load_settings, parse_config_args

USAGE = """usage: fastdecode export [--config FILE] [key=value ...]

Export the model's compiled prefill/decode step (torch.export + AOTInductor) to a
.pt2 package. Load it with `fastdecode generate compiled=PATH` or
fastdecode.load(model, compiled=PATH): no tracing or compiling in that process.
The package holds code, not weights: it serves any checkpoint of the same
architecture, dtype and device.

keys (defaults shown):
"""


@dataclass
class ExportSettings(ModelKeys):
    out: Optional[str] = field(default=None, metadata={"help": "path of the package to write; must end in .pt2"})
    weights: str = field(default="auto", metadata={
        "help": "auto (keep the checkpoint's quantization), float, int8 or int4; generate must load the "
                "model the same way to use the package"})

    def __post_init__(self) -> None:
        if not self.out:
            raise FastDecodeError("out is required: the package path, e.g. out=smollm2.pt2")
        if not self.out.endswith(".pt2"):
            raise FastDecodeError(f"out={self.out!r} must end in .pt2")
        folder = os.path.dirname(os.path.abspath(self.out))
        if not os.path.isdir(folder):
            raise FastDecodeError(f"out={self.out!r}: folder {folder!r} does not exist")


def main(argv: list[str]) -> int:
    """Run by `fastdecode export`; FastDecodeError reaches the CLI's one-line error."""
    config, overrides, wants_help = parse_config_args(argv)
    if wants_help:
        print(USAGE + describe_settings(ExportSettings))
        return 0
    s = load_settings(ExportSettings, overrides, config)
    from .aot import export_package
    from .llm import load

    llm = load(s.model, device=s.device, dtype=s.dtype, weights=s.weights, compiled=None)
    print(f"exporting {llm.source} to {s.out} (a minute or more on a small CPU)", file=sys.stderr)
    t0 = time.perf_counter()
    export_package(llm.model, s.out)
    print(f"wrote {s.out} in {time.perf_counter() - t0:.0f} s")
    return 0
