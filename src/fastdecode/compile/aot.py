"""Ahead-of-time compiled decode step: torch.export, then an AOTInductor package.

`export_package(model, path)` traces the model step once and compiles it into a
`.pt2` package: machine code for one architecture, not a copy of the weights.
`ExportedSteps` runs such a package with the weights of an already loaded
model (handed over by pointer, not copied), so a new process needs neither
Dynamo tracing nor Inductor: loading takes milliseconds.

The exported function is the model step with its KV caches as inputs:

    (tokens [B, T], input_pos [B, T], rows [B], logits_at [R, n], k_caches, v_caches) -> logits [R, n, V]

where k_caches and v_caches are lists of n_layers tensors [slots, S, H_kv, D]
of the model's KV dtype (`kv_cache.kv_storage`; q8_0: int8 [.., D / 32 * 34]), written in place at (rows[b], input_pos[b]). B, T, the number of slots and S
are dynamic (sizes of 1 included), so one package serves prefill chunks and
decode steps at every batch size, for any engine's cache. logits_at holds flat
indices into the B * T tokens (b * T + t), so R need not be B.

The package's metadata records what it was built for (architecture, dtype,
device, KV cache dtype, CPU instruction set, torch version, weight layouts and native
kernels);
loading it for anything else fails with a message that names the difference.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import tempfile
import time
import warnings
import zipfile
from pathlib import Path
from typing import Optional

import torch
from torch import Tensor, nn

from ..errors import FastDecodeError
from ..kernels import load_kernels
from ..kernels.select import cpu_model
from ..model.args import ModelArgs
from ..model.kv_cache import KVCache, kv_storage
from ..model.transformer import Transformer
from ..quant.linear import _Packed
from ..quant.transform import native_ops, set_gemv
from ..version import __version__
from .steps import Steps

# 9: RoPE's cos and sin come from the kernels' op, once a step, and SwiGLU's and GeGLU's products (new
#    C entry points); the generated loops run serial;
# 8: logits_at holds flat token indices, [R, n] of any R (a mixed step's rows of one token);
# 7: the attention kernel takes a logit soft-cap (Gemma 2; its C entry point changed);
# 6: background exports plan their loops for the parent's threads (5's ran them on one thread);
# 5: the caches' dtype (kv_dtype: float32, float16, bfloat16, q8_0) is in the metadata and checked;
# 4: the attention kernel takes a sliding window and a softmax scale (its C entry point changed);
# 3: per-row positions, cache slots, logits_at (2 took one shared position and left padding)
FORMAT = "9"
_ISA_ORDER = ("DEFAULT", "AVX2", "AVX512")
# The native kernels' C entry points, declared for AOTInductor's generated code
# (defined in kernels/*.cpp); without them each call goes through a boxed fallback.
_H = "AtenTensorHandle"
_SHIMS = {
    "gemv": f"AOTITorchError aoti_torch_cpu_gemv({_H} x, {_H} w, {_H}* ret0)",
    "q4_linear": f"AOTITorchError aoti_torch_cpu_q4_linear({_H} x, {_H} w, {_H} s, {_H} m, {_H}* ret0)",
    "q8_linear": f"AOTITorchError aoti_torch_cpu_q8_linear({_H} x, {_H} w, {_H} s, {_H}* ret0)",
    "q4k_linear": (f"AOTITorchError aoti_torch_cpu_q4k_linear({_H} x, {_H} w, {_H} sc, {_H} mn, {_H} d, {_H} dmin, "
                   f"{_H}* ret0)"),
    "q5k_linear": (f"AOTITorchError aoti_torch_cpu_q5k_linear({_H} x, {_H} w, {_H} sc, {_H} mn, {_H} d, {_H} dmin, "
                   f"{_H}* ret0)"),
    "q6k_linear": f"AOTITorchError aoti_torch_cpu_q6k_linear({_H} x, {_H} w, {_H} qh, {_H} sc, {_H} d, {_H}* ret0)",
    "q5_linear": f"AOTITorchError aoti_torch_cpu_q5_linear({_H} x, {_H} w, {_H} qh, {_H} s, {_H} m, {_H}* ret0)",
    "q5s_linear": f"AOTITorchError aoti_torch_cpu_q5s_linear({_H} x, {_H} w, {_H} qh, {_H} s, {_H}* ret0)",
    "q4s_linear": f"AOTITorchError aoti_torch_cpu_q4s_linear({_H} x, {_H} w, {_H} s, {_H}* ret0)",
    "q4nl_linear": f"AOTITorchError aoti_torch_cpu_q4nl_linear({_H} x, {_H} w, {_H} d, {_H}* ret0)",
    "q4xs_linear": f"AOTITorchError aoti_torch_cpu_q4xs_linear({_H} x, {_H} w, {_H} sc, {_H} d, {_H}* ret0)",
    "q4mx_linear": f"AOTITorchError aoti_torch_cpu_q4mx_linear({_H} x, {_H} w, {_H} e, {_H}* ret0)",
    "rms_norm": f"AOTITorchError aoti_torch_cpu_rms_norm({_H} x, {_H} w, double eps, {_H}* ret0)",
    "silu_mul": f"AOTITorchError aoti_torch_cpu_silu_mul({_H} h, {_H}* ret0)",
    "gelu_tanh_mul": f"AOTITorchError aoti_torch_cpu_gelu_tanh_mul({_H} h, {_H}* ret0)",
    "rope": f"AOTITorchError aoti_torch_cpu_rope({_H} pos, {_H} inv_freq, {_H}* ret0, {_H}* ret1)",
    "attention": (f"AOTITorchError aoti_torch_cpu_attention({_H} q, {_H} k, {_H} v, {_H} pos, {_H} rows, "
                  f"int64_t window, double scale, double softcap, {_H}* ret0)"),
}


class _StepWithCaches(nn.Module):
    """The model step with the caches as inputs instead of module state."""

    def __init__(self, model: Transformer):
        super().__init__()
        self.model = model

    def forward(self, tokens: Tensor, input_pos: Tensor, rows: Tensor, logits_at: Tensor,
                k_caches: list[Tensor], v_caches: list[Tensor]) -> Tensor:
        saved = [layer.attention.kv_cache for layer in self.model.layers]
        try:
            for layer, k, v in zip(self.model.layers, k_caches, v_caches):
                layer.attention.kv_cache = KVCache.from_tensors(k, v)
            return self.model(tokens, input_pos, rows=rows, logits_at=logits_at)
        finally:
            for layer, cache in zip(self.model.layers, saved):
                layer.attention.kv_cache = cache


_REQUIRED = ("fastdecode_format", "torch_version", "model_args", "dtype", "kv_dtype", "device", "cpu_capability",
             "kernels", "layouts", "rope")


def _layouts(model: Transformer) -> str:
    """The weight layouts the model's matmuls use, e.g. "float,q4,q8"."""
    kinds = {m.layout for m in model.modules() if isinstance(m, _Packed)}
    if any(isinstance(m, torch.nn.Linear) for m in model.modules()) or hasattr(model.tok_embeddings, "weight"):
        kinds.add("float")
    return ",".join(sorted(kinds))


def _metadata(model: Transformer) -> dict[str, str]:
    w = model.norm.weight
    return {
        "fastdecode_format": FORMAT,
        "fastdecode_version": __version__,
        "torch_version": torch.__version__,
        "model_args": json.dumps(dataclasses.asdict(model.args), sort_keys=True),
        "dtype": str(w.dtype).removeprefix("torch."),
        "kv_dtype": model.kv_dtype_name,  # the caches the package takes as inputs
        "device": w.device.type,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "kernels": ",".join(native_ops(model)),
        "layouts": _layouts(model),
        "rope": _rope_hash(model),
    }


def _rope_hash(model: Transformer) -> str:
    """A hash of RoPE's inverse frequencies, which the package's code holds as constants: they
    follow the context for LongRoPE (its long or short factors; Transformer.init_rope)."""
    h = hashlib.sha256()
    for t in (model.rope_inv_freq, model.rope_local_inv_freq):
        if t.numel():  # a model without a second RoPE base keeps an empty (maybe meta) placeholder
            h.update(t.detach().to("cpu", torch.float32).contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def export_package(model: Transformer, path: str | os.PathLike) -> dict[str, str]:
    """Export `model`'s step to an AOTInductor package at `path` (a .pt2 file).

    The file appears only when complete. Returns the package's metadata.
    """
    path = Path(path)
    if path.suffix != ".pt2":
        raise FastDecodeError(f"package path {str(path)!r} must end in .pt2")
    if not path.parent.is_dir():
        raise FastDecodeError(f"folder {str(path.parent)!r} for the package does not exist")
    if model.args.eager_only:
        raise FastDecodeError(f"{model.args.eager_only} cannot be exported (they run eagerly)")
    device = model.device
    meta = _metadata(model)
    a = model.args
    # Distinct example sizes of at least 2: export would specialize sizes of 1
    # and could tie equal ones together.
    B, T, slots, S = 2, 5, 4, min(16, a.max_seq_len)  # and logits at [R, n] = [3, 6] tokens
    storage, last = kv_storage(model.kv_dtype or model.dtype, a.head_dim)
    cache = [torch.zeros(slots, S, a.n_kv_heads, last, dtype=storage, device=device)
             for _ in range(2 * a.n_layers)]
    example = (torch.zeros(B, T, dtype=torch.long, device=device),
               torch.arange(T, device=device)[None].repeat(B, 1), torch.tensor([3, 1], device=device),
               torch.arange(18, device=device).view(3, 6) % (B * T), cache[:a.n_layers], cache[a.n_layers:])
    dyn = torch.export.Dim.DYNAMIC
    per_cache = [{0: dyn, 1: dyn}] * a.n_layers
    shapes = ({0: dyn, 1: dyn}, {0: dyn, 1: dyn}, {0: dyn}, {0: dyn, 1: dyn}, per_cache, per_cache)
    # The generated elementwise loops run on the calling thread (a chunk too large to fork for):
    # each would fork and join its own parallel region at any size, one size planned for decode
    # and prefill alike; at a few rows the region costs more than the loop (the default model runs
    # ~120 of them a step). The heavy ones are our ops, which split by size: RoPE's cos and sin,
    # SwiGLU and GeGLU (benchmarks/serial_loops.md).
    configs: dict = {"aot_inductor.package_constants_in_so": False, "aot_inductor.metadata": meta,
                     "cpp.min_chunk_size": 1 << 40}
    ops = native_ops(model)
    if ops:
        configs["aot_inductor.custom_ops_to_c_shims"] = {
            getattr(torch.ops.fastdecode, op).default: [_SHIMS[op]] for op in ops}

    from torch._inductor import aoti_compile_and_package  # Inductor is imported only to export

    fd, tmp = tempfile.mkstemp(suffix=".pt2", prefix=f".{path.stem}-", dir=path.parent)
    os.close(fd)
    try:
        with torch.inference_mode(False), torch.no_grad(), warnings.catch_warnings():
            warnings.filterwarnings("ignore", category=FutureWarning, module="copyreg")  # a torch-internal notice
            program = torch.export.export(_StepWithCaches(model), example, dynamic_shapes=shapes, strict=False)
            aoti_compile_and_package(program, package_path=tmp, inductor_configs=configs)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return meta


def _traced_code_hash() -> str:
    """A hash of the sources a package's graph is traced from, so a changed model,
    cache or layer never runs from a package exported by an older copy."""
    root = Path(__file__).parent.parent
    h = hashlib.sha256()
    for name in ("model/transformer.py", "model/args.py", "model/kv_cache.py", "compile/aot.py", "quant/linear.py",
                 "quant/reference.py", "kernels/linear.py"):
        h.update((root / name).read_bytes())
    return h.hexdigest()[:16]


def _weights_hash(model: Transformer) -> str:
    """A hash of every weight's name, dtype and shape: two quantizations of one model
    (another layout for some tensors) never share a package."""
    h = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):  # not the KV caches, which the engine sizes
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)};".encode("utf-8"))
    return h.hexdigest()[:16]


def package_path(model: Transformer) -> Path:
    """Where this machine's package for `model` lives (whether or not it exists yet).

    Under the fastdecode cache directory, keyed by what the package is compiled
    for: architecture, dtype, every weight's layout and shape, kernels, torch and
    fastdecode versions, CPU instruction set and model, and the traced sources.
    """
    from ..paths import cache_root

    ident = json.dumps({**_metadata(model), "cpu_model": cpu_model(), "code": _traced_code_hash(),
                        "weights": _weights_hash(model)}, sort_keys=True)
    key = hashlib.sha256(ident.encode("utf-8")).hexdigest()[:16]
    return cache_root() / "packages" / f"step-{key}.pt2"


def ensure_package(model: Transformer) -> tuple[str, Optional[float]]:
    """This machine's package for `model`, exported now in this process if missing:
    (path, seconds spent exporting, or None when it was already there)."""
    path = package_path(model)
    if path.is_file():
        return str(path), None
    path.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    export_package(model, path)
    path.with_suffix(".failed").unlink(missing_ok=True)
    return str(path), time.perf_counter() - t0


def read_metadata(path: str | os.PathLike) -> tuple[object, dict[str, str]]:
    """Load the package at `path`: (loader, metadata). Fails clearly on a
    missing, corrupt or foreign file."""
    path = str(path)
    if not os.path.isfile(path):
        raise FastDecodeError(f"compiled package {path!r} does not exist; create one with `fastdecode export`")
    try:
        with zipfile.ZipFile(path) as z:
            bad = z.testzip()
    except (zipfile.BadZipFile, OSError) as e:
        raise FastDecodeError(f"{path}: not a compiled package (.pt2 from `fastdecode export`): {e}") from None
    if bad is not None:
        raise FastDecodeError(f"{path}: corrupt compiled package (member {bad!r} fails its checksum)")
    try:
        # The loader itself rather than torch._inductor.aoti_load_package:
        # importing Inductor would add ~1 s to every start.
        runner = torch._C._aoti.AOTIModelPackageLoader(path, "model", False, 1, -1)
        meta = runner.get_metadata()
    except Exception as e:  # noqa: BLE001 - AOTInductor raises RuntimeError and others for bad packages
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise FastDecodeError(f"{path}: cannot load the compiled package: {first}") from None
    if meta.get("fastdecode_format") is None:
        raise FastDecodeError(f"{path}: an AOTInductor package not made by `fastdecode export`")
    missing = [k for k in _REQUIRED if k not in meta]
    if missing and meta["fastdecode_format"] == FORMAT:
        raise FastDecodeError(f"{path}: package metadata lacks {', '.join(missing)}; export it again")
    return runner, meta


def check_compatible(meta: dict[str, str], model: Transformer, path: str) -> None:
    """Raise FastDecodeError naming the first way `model` (or this process) differs from the package."""
    if meta["fastdecode_format"] != FORMAT:
        raise FastDecodeError(f"{path}: package format {meta['fastdecode_format']}, this fastdecode reads "
                              f"format {FORMAT}; export it again")
    mine = _metadata(model)  # the same description of this model and process
    if meta["torch_version"] != mine["torch_version"]:
        raise FastDecodeError(f"{path}: exported with torch {meta['torch_version']}, this is torch "
                              f"{mine['torch_version']}; export it again")
    try:
        want = ModelArgs(**json.loads(meta["model_args"]))
    except (ValueError, TypeError) as e:
        raise FastDecodeError(f"{path}: unreadable model description in the package ({e}); export it again") from None
    if want != model.args:
        diffs = [f"{f.name}={getattr(want, f.name)!r} (this model: {getattr(model.args, f.name)!r})"
                 for f in dataclasses.fields(ModelArgs) if getattr(want, f.name) != getattr(model.args, f.name)]
        raise FastDecodeError(f"{path}: exported for a different model: " + ", ".join(diffs))
    for key in ("dtype", "kv_dtype", "device", "layouts"):
        if meta[key] != mine[key]:
            raise FastDecodeError(f"{path}: exported for {key}={meta[key]}, this model has {key}={mine[key]}")
    if meta["rope"] != mine["rope"]:
        raise FastDecodeError(f"{path}: exported for other RoPE frequencies (LongRoPE's factors follow max_seq_len)")
    cap, built = mine["cpu_capability"], meta["cpu_capability"]
    if meta["device"] == "cpu" and built != cap and not (
            built in _ISA_ORDER and cap in _ISA_ORDER and _ISA_ORDER.index(built) < _ISA_ORDER.index(cap)):
        raise FastDecodeError(f"{path}: compiled for {meta['cpu_capability']} CPUs, this CPU has {cap}; "
                              "export it on this machine")


class ExportedSteps:
    """Prefill and decode steps run by a loaded AOTInductor package."""

    def __init__(self, model: Transformer, path: str | os.PathLike):
        path = str(path)
        runner, meta = read_metadata(path)
        check_compatible(meta, model, path)
        wants_gemv = "gemv" in meta["kernels"].split(",")
        if wants_gemv != ("gemv" in native_ops(model)) and (not wants_gemv or load_kernels()):
            set_gemv(model, wants_gemv)  # the choice is measured per process; follow the package
        if meta["kernels"] != ",".join(native_ops(model)):
            raise FastDecodeError(
                f"{path}: the package calls the kernels [{meta['kernels']}], this model runs "
                f"[{','.join(native_ops(model))}] (kernels unavailable here, FASTDECODE_NO_KERNELS, or another "
                "weights= setting); export it again")
        self.model, self.path, self.metadata = model, path, meta
        # The weights, by pointer: the package holds code only.
        wrapper = _StepWithCaches(model)  # the names the package was exported with
        named = {**dict(wrapper.named_parameters()), **dict(wrapper.named_buffers())}
        names = runner.get_constant_fqns()
        missing = [n for n in names if n not in named]
        if missing:
            raise FastDecodeError(f"{path}: package expects weights this model lacks: {', '.join(missing[:3])}")
        # (map, use_inactive, check_full_update, user_managed, allow_h2d_copy)
        runner.load_constants({n: named[n] for n in names}, False, True, True, False)
        self._runner = runner
        # The caches' tensors in the exported order, gathered again only when setup_caches has
        # given the layers new caches: walking the modules took 120-160 us a step (30 layers;
        # benchmarks/batch_tiles/step_overheads.py).
        self._attention0 = model.layers[0].attention
        self._caches: tuple[object, list[Tensor]] = (None, [])

    def steps(self) -> Steps:
        return Steps(step=self.step, compiled=self.path)

    def _cache_tensors(self) -> list[Tensor]:
        first = self._attention0.kv_cache
        if self._caches[0] is not first:
            caches = [layer.attention.kv_cache for layer in self.model.layers]
            self._caches = (first, [c.k_cache for c in caches] + [c.v_cache for c in caches])
        return self._caches[1]

    def step(self, tokens: Tensor, input_pos: Tensor, rows: Tensor, logits_at: Tensor) -> Tensor:
        # The inputs in the exported order, flat: the loader's own __call__
        # would re-parse its input spec on every step.
        flat = [tokens.contiguous(), input_pos.contiguous(), rows.contiguous(), logits_at.contiguous(),
                *self._cache_tensors()]
        return self._runner.boxed_run(flat)[0]
