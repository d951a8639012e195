"""`BenchSettings`: what one `fastdecode bench` run measures, and the names it knows."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from ..config import LoadOptions
from ..errors import FastDecodeError
from ..cli.keys import ModelKeys

# fastdecode modes -> keyword arguments of fastdecode.load()
MODES: dict[str, dict] = {
    "default": {},  # what a new user gets: load() with no options (the cached package where it applies)
    "dynamic": {"cache": "dynamic", "compiled": None},
    "static": {"cache": "static", "compile": "none", "compiled": None},
    "static-float": {"cache": "static", "compile": "none", "weights": "float", "compiled": None},  # dequantized
    "static+compile": {"cache": "static", "compile": "decode", "compiled": None},
    "compiled-generate": {"cache": "static", "compile": "generate", "compiled": None},
    # + compiled=<a package from `fastdecode export`>; see EngineContender
    "package": {"cache": "static", "compiled": None},
}
PEERS = ("hf-dynamic", "hf-static", "hf-static+compile", "llama.cpp")


@dataclass
class BenchSettings(ModelKeys):
    weights: str = field(default=LoadOptions.weights, metadata={
        "help": "load()'s weights= for every mode but static-float: auto (keep the file's quantization), "
                "float, int8 or int4"})
    modes: list[str] = field(default_factory=lambda: list(MODES), metadata={
        "help": "fastdecode modes: " + ", ".join(MODES)})
    peers: list[str] = field(default_factory=lambda: list(PEERS), metadata={
        "help": "peers measured in the same run when installed: " + ", ".join(PEERS) + "; peers= for none"})
    batch_sizes: list[int] = field(default_factory=lambda: [1, 4], metadata={"help": "batch sizes"})
    new_tokens: list[int] = field(default_factory=lambda: [16, 256], metadata={
        "help": "tokens generated per sequence (EOS is ignored, so exactly this many)"})
    prompt_lengths: list[int] = field(default_factory=lambda: [32], metadata={"help": "prompt lengths in tokens"})
    runs: int = field(default=5, metadata={"help": "timed runs per row; medians are over these"})
    warmup: int = field(default=1, metadata={
        "help": "untimed runs before the timed ones (the first call is always timed on its own)"})
    package: Optional[str] = field(default=None, metadata={
        "help": "for the package mode: a .pt2 from `fastdecode export` for this model; none exports one "
                "into the results folder first (its time is the row's load_compile_s)"})
    max_batch_size: int = field(default=8, metadata={"help": "max_batch_size given to load(); larger batches fail"})
    max_seq_len: Optional[int] = field(default=None, metadata={"help": "cache capacity; none takes the model's"})
    probe_mib: int = field(default=256, metadata={"help": "size of the memory-bandwidth probe buffer in MiB"})
    threads: Optional[int] = field(default=None, metadata={
        "help": "CPU threads for torch and llama.cpp; none keeps torch's default"})
    tp: int = field(default=1, metadata={
        "help": "tensor-parallel ranks for fastdecode's modes: launch under torchrun --nproc-per-node N -m "
                "fastdecode bench tp=N ...; rank 0 writes the results (peers are skipped: one process each)"})
    out: str = field(default="bench-results", metadata={"help": "results folder (JSON and PNG plots)"})
    plots: bool = field(default=True, metadata={"help": "write PNG plots (needs matplotlib)"})

    def __post_init__(self) -> None:
        for name in ("batch_sizes", "new_tokens", "prompt_lengths"):
            values = getattr(self, name)
            if not values:
                raise FastDecodeError(f"{name} is empty; accepted: one or more integers >= 1")
            bad = next((v for v in values if isinstance(v, bool) or not isinstance(v, int) or v < 1), None)
            if bad is not None:
                raise FastDecodeError(f"{name} has {bad!r}; accepted: integers >= 1")
        if self.runs < 1:
            raise FastDecodeError(f"runs={self.runs} is out of range; accepted: an integer >= 1")
        if self.warmup < 0:
            raise FastDecodeError(f"warmup={self.warmup} is out of range; accepted: an integer >= 0")
        if self.probe_mib < 1:
            raise FastDecodeError(f"probe_mib={self.probe_mib} is out of range; accepted: an integer >= 1")
        if self.threads is not None and self.threads < 1:
            raise FastDecodeError(f"threads={self.threads} is out of range; accepted: an integer >= 1 or none")
        from ..parallel.comm import check_tp
        from ..quant import check_weights

        check_weights(self.weights)
        check_tp(self.tp)
        if not self.modes and not self.peers:
            raise FastDecodeError("modes and peers are both empty; name at least one of: "
                                  + ", ".join(list(MODES) + list(PEERS)))
        # Unknown modes and peers are not rejected here: each gets its own error row
        # so the rest of the run still happens.
