"""`LoadOptions`: what `load()` takes, checked once, with the one set of defaults
and help texts that `load()`, the CLI's keys, YAML configs and `--help` read.

A value is checked here against what any model accepts; what depends on the
model (max_seq_len against its context, the KV cache against free memory,
q8_0 against its head_dim) is checked when it is loaded (api/build.py).
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any, Optional

import torch

from .compile.strategies import STRATEGIES
from .engine import DEFAULT_PREFILL_CHUNK
from .engine.speculative import check_speculative, draft_model_name
from .errors import FastDecodeError
from .model.args import PRESETS
from .model.kv_cache import KV_DTYPES, kv_name
from .parallel.comm import check_tp
from .quant import check_weights

DEFAULT_MODEL = "smollm2-135m-instruct"
DEFAULT_MAX_BATCH_SIZE = 8
CACHES = ("static", "dynamic")
KV_DTYPE_CHOICES = ("auto", *KV_DTYPES)
# compile strategies an exported package can stand in for (it is one decode step)
PACKAGE_STRATEGIES = ("none", "decode")

_DTYPES = {
    "float32": torch.float32, "fp32": torch.float32, "float": torch.float32,
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
    "float16": torch.float16, "fp16": torch.float16, "half": torch.float16,
}


def _help(text: str) -> dict[str, str]:
    return {"help": text}


@dataclass(frozen=True)
class LoadOptions:
    """load()'s options. Values are normalized on construction: a torch.device or
    torch.dtype becomes its name, a path-like `model` or `compiled` a str, and
    `model=None` the default model. A bad value raises a one-line FastDecodeError naming it and
    what is accepted."""

    model: Optional[str] = field(default=DEFAULT_MODEL, metadata=_help(
        f"preset name ({', '.join(sorted(PRESETS))}), known checkpoint name, or path to a .gguf "
        "file or Hugging Face directory; none is the default model."))
    device: str = field(default="cpu", metadata=_help("cpu, cuda, cuda:N or mps."))
    dtype: Optional[str] = field(default=None, metadata=_help(
        "float32, bfloat16 or float16; none picks float32 on CPU and bfloat16 elsewhere."))
    compile: str = field(default="none", metadata=_help(
        f"compile strategy for the model steps: {', '.join(STRATEGIES)} (none runs eagerly)."))
    compiled: Optional[str] = field(default="auto", metadata=_help(
        "a .pt2 package from `fastdecode export` for this model's architecture: runs the steps "
        "without tracing or compiling (compile must stay none or decode); auto uses this machine's "
        "cached package for the model, and without one generates at once while a background process "
        "exports it for later runs."))
    max_seq_len: Optional[int] = field(default=None, metadata=_help(
        "longest prompt + completion (the KV cache's positions per slot); none takes the model's "
        "limit, capped so the cache (max_batch_size slots) stays within 1 GiB."))
    max_batch_size: Optional[int] = field(default=None, metadata=_help(
        "engine slots: requests decoding at once (more wait in a queue); none is load()'s default, "
        f"{DEFAULT_MAX_BATCH_SIZE}."))
    cache: str = field(default="static", metadata=_help("KV cache kind: static or dynamic."))
    kv_dtype: str = field(default="auto", metadata=_help(
        "KV cache dtype: auto, float32, float16, bfloat16 or q8_0 (8-bit blocks of 32 with a float16 "
        "scale, as llama.cpp's); auto is float16 on CPU with the native attention kernel, the model's "
        "dtype elsewhere."))
    weights: str = field(default="auto", metadata=_help(
        "auto keeps the checkpoint's quantized weights and runs them on the quantized kernels; float "
        "dequantizes them; int8 or int4 quantize a float checkpoint at load."))
    prefill_chunk: int = field(default=DEFAULT_PREFILL_CHUNK, metadata=_help(
        "most prompt tokens prefilled per engine step, so a long prompt stalls running streams by one "
        "chunk per step, not by its whole length."))
    speculative: str = field(default="none", metadata=_help(
        "none, prompt-lookup (drafts from n-grams of each request's prompt and output) or draft:MODEL "
        "(drafts from a smaller model with the same vocabulary); drafts are verified by the model, so "
        "the output is its own, with fewer forwards when drafts are good."))
    tp: int = field(default=1, metadata=_help(
        "tensor-parallel ranks (generate and serve): launch under torchrun --nproc-per-node N -m "
        "fastdecode generate|serve tp=N ...; rank 0 prints and serves, the other ranks run the same steps."))
    prefix_cache: bool = field(default=True, metadata=_help(
        "reuse the KV cache rows of the longest prompt prefix a slot already holds (an earlier turn "
        "of the chat, a shared system prompt), so only the rest is prefilled; false prefills all."))

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        set_(self, "model", _model(self.model))
        set_(self, "device", str(resolve_device(self.device)))
        check_tp(self.tp)
        if self.dtype is not None:
            set_(self, "dtype", str(resolve_dtype(self.dtype, self.torch_device)).removeprefix("torch."))
        check_weights(self.weights)
        set_(self, "kv_dtype", _kv_dtype(self.kv_dtype))
        if self.cache not in CACHES:
            raise FastDecodeError(f"unknown cache {self.cache!r}; accepted: {', '.join(CACHES)}")
        if self.compile not in STRATEGIES:
            raise FastDecodeError(f"unknown compile strategy {self.compile!r}; accepted: {', '.join(STRATEGIES)}")
        if self.cache == "dynamic" and self.compile != "none":
            raise FastDecodeError(f"compile={self.compile!r} needs cache='static' (a dynamic cache changes shape "
                                  "every step); use compile=none with cache=dynamic")
        if self.speculative is None:  # as in GenerationConfig: no choice is "none" here
            set_(self, "speculative", "none")
        check_speculative(self.speculative, 1, 1)
        if self.draft_model is not None and self.tp != 1:
            raise FastDecodeError(f"speculative={self.speculative!r} cannot be combined with tp={self.tp}; with "
                                  "tensor parallelism use none or prompt-lookup")
        if not isinstance(self.prefix_cache, bool):
            raise FastDecodeError(f"prefix_cache={self.prefix_cache!r} is not a boolean; accepted: true or false")
        _positive("prefill_chunk", self.prefill_chunk)
        if self.max_batch_size is not None:
            _positive("max_batch_size", self.max_batch_size)
        if self.max_seq_len is not None:
            _positive("max_seq_len", self.max_seq_len)
        if isinstance(self.compiled, os.PathLike):
            set_(self, "compiled", os.fspath(self.compiled))
        if isinstance(self.compiled, str) and self.compiled.lower() == "none":  # as the CLI's compiled=none
            set_(self, "compiled", None)
        if self.compiled is not None and not isinstance(self.compiled, str):
            raise FastDecodeError(f"compiled={self.compiled!r} is not valid; accepted: a .pt2 path, auto or none")
        package = self.package
        if package is not None and self.tp != 1:
            raise FastDecodeError(f"compiled={package!r}: exported packages hold no collectives; with "
                                  f"tp={self.tp} use compile=none or decode")
        if package is not None and self.compile not in PACKAGE_STRATEGIES:
            raise FastDecodeError(f"compiled={package!r} runs an exported decode step; it cannot be combined with "
                                  f"compile={self.compile!r} (accepted with a package: "
                                  f"{', '.join(PACKAGE_STRATEGIES)})")
        if package is not None and self.cache != "static":
            raise FastDecodeError("a compiled package needs cache='static'")
        if package not in (None, "auto") and not os.path.isfile(package):
            raise FastDecodeError(f"compiled package {package!r} does not exist; create one with `fastdecode export`")

    # -- what the options resolve to ----------------------------------------------------

    @property
    def torch_device(self) -> torch.device:
        return torch.device(self.device)

    @property
    def torch_dtype(self) -> torch.dtype:
        return resolve_dtype(self.dtype, self.torch_device)

    @property
    def draft_model(self) -> Optional[str]:
        """The model of speculative="draft:<model>", else None."""
        return draft_model_name(self.speculative)

    @property
    def package(self) -> Optional[str]:
        """`compiled` where a package applies; "auto" elsewhere (not on CPU, another
        strategy or cache, FASTDECODE_NO_PACKAGE, tensor parallelism) is None."""
        if self.compiled == "auto" and (self.compile not in PACKAGE_STRATEGIES or self.cache != "static"
                                        or self.torch_device.type != "cpu" or self.tp != 1
                                        or os.environ.get("FASTDECODE_NO_PACKAGE")):
            return None
        return self.compiled

    @classmethod
    def from_keywords(cls, model: Optional[str], options: dict[str, Any]) -> "LoadOptions":
        """LoadOptions(model=model, **options), with an unknown option a one-line error."""
        names = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(options) - set(names))
        if unknown:
            raise FastDecodeError(f"unknown option(s) {', '.join(unknown)} for load(); accepted: "
                                  f"{', '.join(names[1:])}")
        return cls(model=model, **options)

    @classmethod
    def from_settings(cls, settings: Any, **changes: Any) -> "LoadOptions":
        """The options a command's settings hold (its keys named as these fields), with `changes`."""
        values = {f.name: getattr(settings, f.name) for f in dataclasses.fields(cls) if hasattr(settings, f.name)}
        return cls(**{**values, **changes})


# -- checks ------------------------------------------------------------------------------

def _positive(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise FastDecodeError(f"{name}={value!r} is not an integer; accepted: an integer >= 1")
    if value < 1:
        raise FastDecodeError(f"{name}={value!r} is out of range; accepted: an integer >= 1")


def _model(model: Any) -> str:
    if model is None:
        return DEFAULT_MODEL
    if isinstance(model, os.PathLike):
        return os.fspath(model)
    if not isinstance(model, str) or not model:
        raise FastDecodeError(f"model={model!r} is not valid; accepted: a preset name, a known checkpoint "
                              "name or a path")
    return model


def resolve_device(device: Any) -> torch.device:
    """`device` as a torch.device this machine has, or a one-line FastDecodeError."""
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise FastDecodeError(f"unknown device {device!r}; accepted: cpu, cuda, cuda:N, mps") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise FastDecodeError(f"device {device!r} requested but CUDA is not available here; use device=cpu")
    if dev.type == "mps" and not torch.backends.mps.is_available():
        raise FastDecodeError(f"device {device!r} requested but MPS is not available here; use device=cpu")
    if dev.type not in ("cpu", "cuda", "mps"):
        raise FastDecodeError(f"unsupported device {device!r}; accepted: cpu, cuda, cuda:N, mps")
    return dev


def resolve_dtype(dtype: Any, device: torch.device) -> torch.dtype:
    """None picks float32 on CPU (bf16 matmuls are slow there) and bfloat16 elsewhere."""
    if dtype is None:
        return torch.float32 if device.type == "cpu" else torch.bfloat16
    if isinstance(dtype, torch.dtype) and dtype in _DTYPES.values():
        return dtype
    if isinstance(dtype, str) and dtype.lower() in _DTYPES:
        return _DTYPES[dtype.lower()]
    raise FastDecodeError(f"unsupported dtype {dtype!r}; accepted: float32, bfloat16, float16")


def _kv_dtype(kv_dtype: Any) -> str:
    if isinstance(kv_dtype, torch.dtype) and kv_dtype in KV_DTYPES.values() and kv_dtype != torch.int8:
        return kv_name(kv_dtype)
    if isinstance(kv_dtype, str) and kv_dtype.strip().lower() in KV_DTYPE_CHOICES:
        return kv_dtype.strip().lower()
    raise FastDecodeError(f"unknown kv_dtype {kv_dtype!r}; accepted: {', '.join(KV_DTYPE_CHOICES)}")
