"""`load()`: LoadOptions -> weights -> kernels -> steps -> draft -> engine -> LLM.

Each part is built once from the options and the parts before it, and the
engine takes them all at construction: nothing is swapped in afterwards.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import logging
import os
import shutil
import time
from dataclasses import dataclass
from typing import Any, Optional

import torch

from ..compile import background as background_export
from ..compile.background import ExportJob, PackageWhenReady
from ..compile.steps import Steps
from ..compile.strategies import make_steps
from ..config import DEFAULT_MAX_BATCH_SIZE, LoadOptions
from ..engine import Engine
from ..engine.draft import DraftModel
from ..kernels.malloc import release_free_memory
from ..errors import FastDecodeError
from ..paths import BusyFlag
from ..kernels import prebuild as prebuild_kernels
from ..model.args import PRESETS, ModelArgs, get_preset
from ..model.kv_cache import KV_DTYPES, Q8_0, Q8_BLOCK, KvDtype, cache_bytes, kv_name
from ..model.transformer import Transformer, init_random_weights
from ..parallel import SharedSeeds, same_kernels, shard_model, tp_group
from ..quant import KernelChoice, apply_kernels, build_model, quantize_state_dict
from ..text.tokenizer import BYTE_CHAT_TEMPLATE, ByteTokenizer, Tokenizer
from .llm import LLM, LoadReport

log = logging.getLogger("fastdecode")

# The default max_seq_len keeps the engine's KV cache (max_batch_size x
# max_seq_len positions, at the KV dtype's element size) within this many bytes:
# 8 x 2048 for the default model with a float32 cache, 8 x 4096 (its context cap
# is 8192) with float16.
DEFAULT_CACHE_BUDGET = 1 << 30
# kv_dtype="auto" on CPU when the native attention kernel runs the model: it reads
# float16 K/V (F16C) at least as fast as float32 (benchmarks in the commit adding it).
AUTO_CPU_KV_DTYPE = "float16"


def load(model: Optional[str] = None, **options: Any) -> LLM:
    """Load a model by preset name, known checkpoint name or path (.gguf file or
    Hugging Face directory). None loads the default, SmolLM2-135M-Instruct.
    The options are LoadOptions' fields (config.py), with their defaults and meanings.

    max_batch_size: the engine's slots, requests decoding at once (more wait
    in a queue). max_seq_len: positions per slot (prompt plus new tokens);
    default: the model's context, capped so the KV cache, allocated once,
    stays within 1 GiB (DEFAULT_CACHE_BUDGET, at the KV dtype's size).

    speculative="draft:<model>" loads that draft model here with the same
    settings; it must share the target's vocabulary. Drafts are verified, so
    the output is the target's own (greedy: the same tokens).

    compiled="auto" with no package for this model yet: generation starts at
    once on the `compile` strategy's steps while a background process exports
    the package (compile/background.py); the engine switches to it between
    requests. Where the machine cannot run what compile= or compiled= asks (no
    C++ compiler, no native kernels), one warning says what runs instead.

    tp > 1 runs inside an initialized torch.distributed process group of tp
    processes (gloo on CPU, NCCL on CUDA, e.g. under torchrun): each rank keeps
    its shard of every block (parallel.shard_model) and must submit the same
    requests in the same order; all ranks pick the same tokens."""
    return build(LoadOptions.from_keywords(model, options))


load.__signature__ = inspect.Signature(  # help() and IDEs show LoadOptions' fields and defaults
    [inspect.Parameter(f.name, inspect.Parameter.POSITIONAL_OR_KEYWORD if f.name == "model" else
                       inspect.Parameter.KEYWORD_ONLY, default=f.default, annotation=f.type)
     for f in dataclasses.fields(LoadOptions)], return_annotation="LLM")


def build(opts: LoadOptions, *, sync: Optional[Any] = None, busy: bool = True) -> LLM:
    """The LLM `opts` describe. sync: a parallel.lockstep.StepSync for tensor-parallel
    ranks serving in lockstep (the server's), handed to the engine. busy: hold the
    machine's busy flag (paths.BusyFlag) while loading, so that background exports pause;
    False for the export's own load, which its supervisor would otherwise stop."""
    with BusyFlag() if busy else contextlib.nullcontext():
        return _build(opts, sync)


def _build(opts: LoadOptions, sync: Optional[Any]) -> LLM:
    t0 = time.perf_counter()
    dev = opts.torch_device
    if dev.type == "cpu":
        prebuild_kernels()  # a first run's kernel build overlaps the checkpoint's conversion
    group = tp_group(opts.tp, dev)
    part = _model(opts, group)
    max_batch_size = opts.max_batch_size or DEFAULT_MAX_BATCH_SIZE
    max_seq_len = opts.max_seq_len or default_max_seq_len(part.model.args, max_batch_size, part.kv)
    part.model.init_rope(context=max_seq_len)  # LongRoPE's factors follow the context; packages are keyed by them
    need = _cache_need(part, max_batch_size, max_seq_len)
    _check_memory(opts, part, need, max_batch_size, max_seq_len)
    compile = _runnable_compile(opts.compile, dev, part.model)
    steps = _steps(opts, part, compile, opts.package, max_seq_len)
    draft = None
    if opts.draft_model is not None:
        draft = _draft(opts, compile, max_batch_size, max_seq_len, need)
    engine = Engine(part.model, part.tokenizer, steps, max_batch_size=max_batch_size, max_seq_len=max_seq_len,
                    cache=opts.cache, prefill_chunk=opts.prefill_chunk, speculative=opts.speculative,
                    prefix_cache=opts.prefix_cache, draft=draft,
                    seed_policy=SharedSeeds.broadcast(group) if group is not None else None, sync=sync)
    summary = part.weights_summary
    if group is not None:
        summary += f"; tensor parallel: rank {part.model.tp.rank}'s shard of {opts.tp} (sizes below are per rank)"
    report = LoadReport(source=part.source, compile="none" if steps.compiled else compile, cache=opts.cache,
                        weights=part.weights, weights_summary=summary, kernels=part.kernels,
                        cache_path=part.cache_path, from_cache=part.from_cache,
                        load_seconds=time.perf_counter() - t0)
    return LLM(engine, report)


# -- the model -----------------------------------------------------------------------------

@dataclass
class _Part:
    """A loaded model with what loading it decided."""

    model: Transformer
    tokenizer: Tokenizer
    source: str
    weights: str  # the weights= it was loaded with ("auto" is "float" off CPU)
    kv: KvDtype
    kernels: KernelChoice
    cache_path: Optional[str] = None  # converted copy of a GGUF file, read or written
    from_cache: bool = False
    weights_summary: str = "float"


def _model(opts: LoadOptions, group: Any) -> _Part:
    """Weights, tensor-parallel shards, kernels and the KV dtype, checked against the options."""
    dev = opts.torch_device
    # The quantized kernels are CPU kernels; elsewhere the reference path would be slow.
    weights = "float" if opts.weights == "auto" and dev.type != "cpu" else opts.weights
    part = _load_weights(opts.model, dev, opts.torch_dtype, weights)
    m = part.model.eval().requires_grad_(False)
    if part.tokenizer.vocab_size > m.args.vocab_size:
        raise FastDecodeError(f"{part.source}: tokenizer has {part.tokenizer.vocab_size} ids but the model's "
                              f"vocabulary is {m.args.vocab_size}")
    if group is not None:
        shard_model(m, group)  # before the engine sizes the KV cache from m.args
    part.kernels = apply_kernels(m)
    if group is not None:
        part.kernels = same_kernels(m, part.kernels, group)
    m.kv_dtype = part.kv = resolve_kv_dtype(opts.kv_dtype, m)  # after apply_kernels: auto follows the attention kernel
    limit = m.args.max_seq_len
    if opts.max_seq_len is not None and opts.max_seq_len > limit:
        raise FastDecodeError(f"max_seq_len={opts.max_seq_len!r} is out of range; accepted: 1..{limit} for this model")
    return part


def check_model_name(name: str) -> None:
    """A one-line error unless `name` is a preset, a known (installed) checkpoint or an existing path, as
    `_load_weights` takes it; `fastdecode serve` asks before it listens, as it loads the model after."""
    from .. import checkpoints

    if name in PRESETS or checkpoints.resolve_checkpoint_name(name) is not None or os.path.exists(name):
        return
    raise FastDecodeError(
        f"model {name!r} is not a preset, a known checkpoint or an existing path{checkpoints.suggest(name)}; presets: "
        f"{', '.join(sorted(PRESETS))}; checkpoints: {', '.join(checkpoints.CHECKPOINTS)}")


def _unfused(state_dict: dict, args: ModelArgs) -> dict:
    """A built model's state_dict with its fused q/k/v and gate/up split into the checkpoint
    names (wq, wk, wv; w1, w3) that quantize_state_dict and build_model take: keyed by the
    fused names, a preset's q/k/v and gate/up were left float32 by weights=int8/int4."""
    q, kv = args.n_heads * args.head_dim, args.n_kv_heads * args.head_dim
    for key in [k for k in state_dict if k.rsplit(".", 2)[-2] in ("wqkv", "w13")]:
        prefix, name, suffix = key.rsplit(".", 2)
        t = state_dict.pop(key)
        parts = zip(("wq", "wk", "wv"), t.split([q, kv, kv])) if name == "wqkv" else zip(("w1", "w3"), t.chunk(2))
        for part, x in parts:
            state_dict[f"{prefix}.{part}.{suffix}"] = x
    return state_dict


def _load_weights(name: str, device: torch.device, dtype: torch.dtype, weights: str) -> _Part:
    if name in PRESETS:
        args = get_preset(name)
        model = init_random_weights(Transformer(args), seed=0).to(device=device, dtype=dtype)
        summary = "float (random)"
        if weights in ("int8", "int4"):
            state_dict = _unfused(model.state_dict(), args)
            quantize_state_dict(state_dict, args, weights, f"preset:{name}")
            state_dict = {k: v.to(device) for k, v in state_dict.items()}
            model, _ = build_model(args, state_dict, dtype)
            summary = f"random, quantized to {weights}"
        model.init_rope(device)
        tokenizer = ByteTokenizer(args.vocab_size, chat_template=BYTE_CHAT_TEMPLATE)
        return _Part(model, tokenizer, f"preset:{name}", weights, model.dtype, KernelChoice(),
                     weights_summary=summary)
    from .. import checkpoints  # real checkpoint support lives apart from the core

    path = checkpoints.resolve_checkpoint_name(name)
    if path is None:
        check_model_name(name)
        path = name
    ckpt = checkpoints.load_checkpoint(path, dtype=dtype, device=device, weights=weights)
    # The freed working memory of a conversion (1B Q4_K_M: RSS 1.6 GB, not 1.0) or of building
    # the tokenizer (Gemma 3's 262,144 tokens: 280 MB, against the 93 MB the tokenizer keeps).
    release_free_memory()
    model, notes = build_model(ckpt.args, ckpt.state_dict, dtype)
    cache_path = None if ckpt.cache_path is None else str(ckpt.cache_path)
    summary = "; ".join([ckpt.weights_summary, *notes])
    return _Part(model, ckpt.tokenizer, str(path), weights, model.dtype, KernelChoice(), cache_path,
                 ckpt.from_cache, summary)


def resolve_kv_dtype(kv_dtype: str, model: Transformer) -> KvDtype:
    """The KV caches' dtype for `model`: "auto" is AUTO_CPU_KV_DTYPE on CPU where the
    native attention kernel reads the cache, the model's dtype elsewhere."""
    if kv_dtype == "auto":
        native = model.device.type == "cpu" and any(layer.attention.native for layer in model.layers)
        return KV_DTYPES[AUTO_CPU_KV_DTYPE] if native else model.dtype
    if kv_dtype == Q8_0:
        if model.args.head_dim % Q8_BLOCK:
            raise FastDecodeError(f"kv_dtype=q8_0 needs head_dim a multiple of {Q8_BLOCK}; this model's is "
                                  f"{model.args.head_dim} (use float16)")
        return Q8_0
    return KV_DTYPES[kv_dtype]


# -- the KV cache's size ----------------------------------------------------------------------

def default_max_seq_len(args: ModelArgs, max_batch_size: int, dtype: KvDtype) -> int:
    """The model's context, or the largest power of two (>= 256) whose cache
    fits DEFAULT_CACHE_BUDGET at this batch size, whichever is smaller.
    dtype: the KV cache's (its element size sets the bytes per position)."""
    per_position = cache_bytes(args.attention_layers, max_batch_size, args.n_kv_heads, 1, args.head_dim, dtype)
    fit = 256
    while fit * 2 * per_position <= DEFAULT_CACHE_BUDGET:
        fit *= 2
    return min(args.max_seq_len, fit)


def available_memory(device: torch.device) -> Optional[int]:
    """Bytes free for new tensors on `device`, where the platform says (else None)."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    if device.type == "cpu":
        try:
            with open("/proc/meminfo", encoding="ascii") as f:
                for line in f:
                    if line.startswith("MemAvailable:"):
                        return int(line.split()[1]) * 1024
        except OSError:
            pass
    return None


def _cache_need(part: _Part, max_batch_size: int, max_seq_len: int) -> int:
    a = part.model.args
    return cache_bytes(a.attention_layers, max_batch_size, a.n_kv_heads, max_seq_len, a.head_dim, part.kv)


def _check_memory(opts: LoadOptions, part: _Part, need: int, max_batch_size: int, max_seq_len: int,
                  also: int = 0) -> None:
    """The KV cache fits the free memory (with `also` bytes of caches not yet allocated)."""
    free = available_memory(opts.torch_device)
    if opts.cache == "static" and free is not None and need + also > free:
        raise FastDecodeError(
            f"a {kv_name(part.kv)} KV cache of max_batch_size={max_batch_size} x max_seq_len={max_seq_len} needs "
            f"{need:,} bytes, "
            f"but {free - also:,} are available; lower max_batch_size or max_seq_len")


# -- the steps and the draft ----------------------------------------------------------------

def _runnable_compile(compile: str, device: torch.device, model: Transformer) -> str:
    """`compile`, or "none" (with one line saying why) where Inductor cannot build code here
    or the model cannot be traced."""
    if compile != "none" and model.args.eager_only:
        log.warning("compile=%s: the model runs eagerly (%s do): running the eager steps instead", compile,
                    model.args.eager_only)
        return "none"
    if compile != "none" and device.type == "cpu" and shutil.which(os.environ.get("CXX", "c++")) is None:
        log.warning("compile=%s needs a C++ compiler for Inductor and none was found (apt-get install g++): "
                    "running the eager steps instead", compile)
        return "none"
    return compile


def _steps(opts: LoadOptions, part: _Part, compile: str, compiled: Optional[str], max_seq_len: int) -> Steps:
    """The steps the engine runs: an exported package's, or the `compile` strategy's.

    compiled="auto": this machine's package when it exists; else the strategy's
    steps now, and the package exported by a child process for later (the
    steps switch to it between requests once it is written)."""
    from .. import kernels as native
    from ..compile.aot import ExportedSteps, package_path

    model, kernels = part.model, part.kernels
    if model.args.eager_only:  # no package to use or export
        if compiled not in (None, "auto"):
            raise FastDecodeError(f"compiled={compiled!r}: {model.args.eager_only} are not exported (they run "
                                  "eagerly); use compiled=none")
        return make_steps(model, compile)
    missing = native.unavailable_reason if not kernels.ops else None
    if compiled not in (None, "auto") and missing:
        log.warning("compiled=%s calls the native kernels, which are unavailable here (%s): running compile=%s "
                    "instead", compiled, missing, compile)
        compiled = None
    if compiled is None:
        return make_steps(model, compile)
    if compiled != "auto":
        return ExportedSteps(model, compiled).steps()
    if not kernels.ops:  # the package is made for the native kernels
        log.info("no compiled package without the native kernels (%s)", missing)
        return make_steps(model, compile)
    path = package_path(model)
    if path.is_file():
        try:
            return ExportedSteps(model, path).steps()
        except FastDecodeError as e:  # a package this model cannot use is rebuilt, never an error
            log.warning("%s; exporting it again", e)
            path.unlink(missing_ok=True)
    fallback = make_steps(model, compile)
    job = ExportJob(opts.model, str(opts.torch_dtype).removeprefix("torch."), part.weights, str(path),
                    kernels.gemv, kv_name(part.kv), torch.get_num_threads(), max_seq_len)
    pid = background_export.start(job)
    if pid is None:
        return fallback
    log.warning("no compiled package for this model on this machine yet: generating on the %s steps now while "
                "a background process (pid %d) exports it; later runs load %s",
                "eager" if compile == "none" else f"compile={compile}", pid, path)
    return PackageWhenReady(fallback, path, lambda p: ExportedSteps(model, p).steps(), pid)


def _draft(opts: LoadOptions, compile: str, max_batch_size: int, max_seq_len: int, target_need: int) -> DraftModel:
    """The draft model of speculative="draft:<name>", loaded with the target's settings."""
    name = opts.draft_model
    try:
        draft_opts = dataclasses.replace(opts, model=name, speculative="none", compile=compile,
                                         max_batch_size=max_batch_size, max_seq_len=max_seq_len)
        part = _model(draft_opts, None)
        if part.model.args.conv_layers:  # its drafts' state could not be taken back (model/short_conv.py)
            raise FastDecodeError("LFM2's convolution layers cannot draft; use a model without them")
        _check_memory(draft_opts, part, _cache_need(part, max_batch_size, max_seq_len), max_batch_size,
                      max_seq_len, also=target_need)
        part.model.init_rope(context=max_seq_len)
        return DraftModel(name, part.model, _steps(draft_opts, part, compile, draft_opts.package, max_seq_len))
    except FastDecodeError as e:
        raise FastDecodeError(f"draft model {name!r}: {e}") from None
