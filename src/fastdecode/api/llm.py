"""The Python API: `load()` a model, then `generate`, `stream` or `chat` with it."""

from __future__ import annotations

import dataclasses
import inspect
import logging
import os
import shutil
import time
from dataclasses import dataclass
from typing import Any, Iterator, Optional, Sequence, Union

import torch

from ..compile import background as background_export
from ..compile.background import ExportJob, PackageWhenReady
from ..compile.steps import Steps
from ..compile.strategies import make_steps
from ..engine import DEFAULT_PREFILL_CHUNK, Completion, Engine, GenerationConfig
from ..engine.draft import DraftModel
from ..engine.speculative import check_speculative, draft_model_name
from ..errors import FastDecodeError
from ..kernels import prebuild as prebuild_kernels
from ..model.args import PRESETS, ModelArgs, get_preset
from ..model.kv_cache import KV_DTYPES, Q8_0, Q8_BLOCK, KvDtype, cache_bytes, kv_name
from ..model.transformer import Transformer, init_random_weights
from ..parallel import SharedSeeds, same_kernels, shard_model, tp_group
from ..quant import KernelChoice, apply_kernels, build_model, check_weights, quantize_state_dict
from ..sampling import SamplingParams
from ..text.tokenizer import BYTE_CHAT_TEMPLATE, ByteTokenizer, Tokenizer
from .generate import GenerationRun, run_generation

log = logging.getLogger("fastdecode")

DEFAULT_MODEL = "smollm2-135m-instruct"
DEFAULT_MAX_BATCH_SIZE = 8
# The default max_seq_len keeps the engine's KV cache (max_batch_size x
# max_seq_len positions, at the KV dtype's element size) within this many bytes:
# 8 x 2048 for the default model with a float32 cache, 8 x 4096 (its context cap
# is 8192) with float16.
DEFAULT_CACHE_BUDGET = 1 << 30
# kv_dtype="auto" on CPU when the native attention kernel runs the model: it reads
# float16 K/V (F16C) at least as fast as float32 (benchmarks in the commit adding it).
AUTO_CPU_KV_DTYPE = "float16"
KV_DTYPE_CHOICES = ("auto", *KV_DTYPES)

Prompts = Union[str, Sequence[str], Sequence[int], Sequence[Sequence[int]]]

_DTYPES = {
    "float32": torch.float32, "fp32": torch.float32, "float": torch.float32,
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
    "float16": torch.float16, "fp16": torch.float16, "half": torch.float16,
}


def resolve_dtype(dtype: Union[None, str, torch.dtype], device: torch.device) -> torch.dtype:
    """None picks float32 on CPU (bf16 matmuls are slow there) and bfloat16 elsewhere."""
    if dtype is None:
        return torch.float32 if device.type == "cpu" else torch.bfloat16
    if isinstance(dtype, torch.dtype) and dtype in _DTYPES.values():
        return dtype
    if isinstance(dtype, str) and dtype.lower() in _DTYPES:
        return _DTYPES[dtype.lower()]
    raise FastDecodeError(f"unsupported dtype {dtype!r}; accepted: float32, bfloat16, float16")


def resolve_device(device: Union[str, torch.device]) -> torch.device:
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


@dataclass
class _Loaded:
    model: Transformer
    tokenizer: Tokenizer
    source: str
    cache_path: Optional[str] = None  # converted copy of a GGUF file, read or written
    from_cache: bool = False
    weights_summary: str = "float"


def _load_weights(name: str, device: torch.device, dtype: torch.dtype, weights: str) -> _Loaded:
    if name in PRESETS:
        args = get_preset(name)
        model = init_random_weights(Transformer(args), seed=0).to(device=device, dtype=dtype)
        summary = "float (random)"
        if weights in ("int8", "int4"):
            state_dict = model.state_dict()
            quantize_state_dict(state_dict, args, weights, f"preset:{name}")
            state_dict = {k: v.to(device) for k, v in state_dict.items()}
            model, _ = build_model(args, state_dict, dtype)
            summary = f"random, quantized to {weights}"
        model.init_rope(device)
        tokenizer = ByteTokenizer(args.vocab_size, chat_template=BYTE_CHAT_TEMPLATE)
        return _Loaded(model, tokenizer, f"preset:{name}", weights_summary=summary)
    from .. import checkpoints  # real checkpoint support lives apart from the core

    path = checkpoints.resolve_checkpoint_name(name)
    if path is None:
        path = name
        if not os.path.exists(path):
            raise FastDecodeError(
                f"model {name!r} is not a preset, a known checkpoint or an existing path{checkpoints.suggest(name)}; presets: "
                f"{', '.join(sorted(PRESETS))}; checkpoints: {', '.join(checkpoints.CHECKPOINTS)}")
    ckpt = checkpoints.load_checkpoint(path, dtype=dtype, device=device, weights=weights)
    model, notes = build_model(ckpt.args, ckpt.state_dict, dtype)
    cache_path = None if ckpt.cache_path is None else str(ckpt.cache_path)
    summary = "; ".join([ckpt.weights_summary, *notes])
    return _Loaded(model, ckpt.tokenizer, str(path), cache_path, ckpt.from_cache, summary)


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


def check_kv_dtype(kv_dtype: Union[str, torch.dtype]) -> str:
    """The kv_dtype name, or a one-line FastDecodeError listing the accepted values."""
    if isinstance(kv_dtype, torch.dtype) and kv_dtype in KV_DTYPES.values() and kv_dtype != torch.int8:
        return kv_name(kv_dtype)
    if isinstance(kv_dtype, str) and kv_dtype.strip().lower() in KV_DTYPE_CHOICES:
        return kv_dtype.strip().lower()
    raise FastDecodeError(f"unknown kv_dtype {kv_dtype!r}; accepted: {', '.join(KV_DTYPE_CHOICES)}")


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


def default_max_seq_len(args: ModelArgs, max_batch_size: int, dtype: KvDtype) -> int:
    """The model's context, or the largest power of two (>= 256) whose cache
    fits DEFAULT_CACHE_BUDGET at this batch size, whichever is smaller.
    dtype: the KV cache's (its element size sets the bytes per position)."""
    per_position = cache_bytes(args.n_layers, max_batch_size, args.n_kv_heads, 1, args.head_dim, dtype)
    fit = 256
    while fit * 2 * per_position <= DEFAULT_CACHE_BUDGET:
        fit *= 2
    return min(args.max_seq_len, fit)


def load(model: Optional[str] = None, *, device: Union[str, torch.device] = "cpu",
         dtype: Union[None, str, torch.dtype] = None, compile: str = "none",
         max_seq_len: Optional[int] = None, max_batch_size: Optional[int] = None,
         cache: str = "static", compiled: Optional[str] = "auto", weights: str = "auto",
         prefill_chunk: int = DEFAULT_PREFILL_CHUNK, speculative: str = "none", tp: int = 1,
         prefix_cache: bool = True, kv_dtype: str = "auto") -> "LLM":
    """Load a model by preset name, known checkpoint name or path (.gguf file or
    Hugging Face directory). None loads the default, SmolLM2-135M-Instruct.

    max_batch_size: the engine's slots, requests decoding at once (more wait
    in a queue); default 8. max_seq_len: positions per slot (prompt plus new
    tokens); default: the model's context, capped so the KV cache, allocated
    once, stays within 1 GiB (DEFAULT_CACHE_BUDGET, at the KV dtype's size).
    prefill_chunk: the most prompt tokens prefilled per engine step, so new
    prompts do not stall running streams. prefix_cache: a new prompt reuses the
    KV rows of the longest prefix it shares with what a slot already holds (a
    finished request's prompt and reply, or a running one's), and only the rest
    is prefilled (engine/prefix_cache.py).
    speculative: "none", "prompt-lookup" or "draft:<model>", for requests that
    do not choose (generate's `speculative=`). A draft model is loaded here with
    the same settings and must share the target's vocabulary; drafts are
    verified, so the output is the target's own (greedy: the same tokens).

    weights: "auto" keeps the checkpoint's quantized matrices in their packed
    form and runs them on the quantized CPU kernels (float checkpoints stay
    float; on other devices it means "float");
    "float" dequantizes everything to `dtype`; "int8"/"int4" quantize a float
    checkpoint at load.

    compiled: a package from `fastdecode export` (or `aot.export_package`) for
    this model's architecture; its steps replace the `compile` strategy's,
    with no tracing or compiling in this process. "auto" (the default) uses
    this machine's cached package for the model (`aot.package_path`) where a
    package applies: on CPU with the native kernels, compile "none" or
    "decode", a static cache, and FASTDECODE_NO_PACKAGE unset; elsewhere it
    means None. With no package yet, generation starts at once on the
    `compile` strategy's steps while a background process exports the
    package (`background_export`); the engine switches to it between requests.
    None runs the `compile` strategy's steps. Where the machine cannot run
    what compile= or compiled= asks (no C++ compiler, no native kernels), one
    warning says what runs instead.

    kv_dtype: the KV cache's dtype: "float32", "float16", "bfloat16" or "q8_0"
    (llama.cpp's 8-bit blocks of 32 with a float16 scale); "auto" (the default) is
    float16 on CPU where the native attention kernel runs the model (it reads
    float16 at no loss of speed), the model's dtype elsewhere. Writes round (or
    quantize); attention reads every format, natively or converted.

    tp: tensor-parallel ranks. tp > 1 runs inside an initialized torch.distributed
    process group of tp processes (gloo on CPU, NCCL on CUDA, e.g. under torchrun):
    each rank keeps its shard of every block (parallel.shard_model) and must
    submit the same requests in the same order; all ranks pick the same tokens."""
    dev = resolve_device(device)
    if dev.type == "cpu":
        prebuild_kernels()  # a first run's kernel build overlaps the checkpoint's conversion
    group = tp_group(tp, dev)
    dt = resolve_dtype(dtype, dev)
    check_weights(weights)
    kv_choice = check_kv_dtype(kv_dtype)
    if cache not in ("static", "dynamic"):
        raise FastDecodeError(f"unknown cache {cache!r}; accepted: static, dynamic")
    if cache == "dynamic" and compile != "none":
        raise FastDecodeError(f"compile={compile!r} needs cache='static' (a dynamic cache changes shape every "
                              "step); use compile=none with cache=dynamic")
    check_speculative(speculative, 1, 1)
    draft_name = draft_model_name(speculative)
    if draft_name is not None and group is not None:
        raise FastDecodeError(f"speculative={speculative!r} cannot be combined with tp={tp}; with tensor "
                              "parallelism use none or prompt-lookup")
    draft_compiled = compiled
    if not isinstance(prefix_cache, bool):
        raise FastDecodeError(f"prefix_cache={prefix_cache!r} is not a boolean; accepted: true or false")
    if isinstance(prefill_chunk, bool) or not isinstance(prefill_chunk, int) or prefill_chunk < 1:
        raise FastDecodeError(f"prefill_chunk={prefill_chunk!r} is out of range; accepted: an integer >= 1")
    if compiled == "auto" and (compile not in ("none", "decode") or cache != "static" or dev.type != "cpu"
                               or os.environ.get("FASTDECODE_NO_PACKAGE") or group is not None):
        compiled = None
    if compiled is not None and group is not None:
        raise FastDecodeError(f"compiled={compiled!r}: exported packages hold no collectives; with tp={tp} use "
                              "compile=none or decode")
    if compiled is not None and compile not in ("none", "decode"):
        raise FastDecodeError(f"compiled={compiled!r} runs an exported decode step; it cannot be combined with "
                              f"compile={compile!r} (accepted with a package: none, decode)")
    if compiled is not None and cache != "static":
        raise FastDecodeError("a compiled package needs cache='static'")
    t0 = time.perf_counter()
    if weights == "auto" and dev.type != "cpu":
        weights = "float"  # the quantized kernels are CPU kernels; elsewhere the reference path would be slow
    loaded = _load_weights(model or DEFAULT_MODEL, dev, dt, weights)
    m = loaded.model.eval().requires_grad_(False)
    if group is not None:
        shard_model(m, group)  # before the engine sizes the KV cache from m.args
    kernels = apply_kernels(m)
    if group is not None:
        kernels = same_kernels(m, kernels, group)
    m.kv_dtype = kv = resolve_kv_dtype(kv_choice, m)  # after apply_kernels: auto follows the attention kernel
    limit = m.args.max_seq_len
    if max_batch_size is None:
        max_batch_size = DEFAULT_MAX_BATCH_SIZE
    elif isinstance(max_batch_size, bool) or not isinstance(max_batch_size, int) or max_batch_size < 1:
        raise FastDecodeError(f"max_batch_size={max_batch_size!r} is out of range; accepted: an integer >= 1")
    if max_seq_len is None:
        max_seq_len = default_max_seq_len(m.args, max_batch_size, kv)
    elif isinstance(max_seq_len, bool) or not isinstance(max_seq_len, int) or not 1 <= max_seq_len <= limit:
        raise FastDecodeError(f"max_seq_len={max_seq_len!r} is out of range; accepted: 1..{limit} for this model")
    a = m.args
    need = cache_bytes(a.n_layers, max_batch_size, a.n_kv_heads, max_seq_len, a.head_dim, kv)
    free = available_memory(dev)
    if cache == "static" and free is not None and need > free:
        raise FastDecodeError(
            f"a {kv_name(kv)} KV cache of max_batch_size={max_batch_size} x max_seq_len={max_seq_len} needs "
            f"{need:,} bytes, "
            f"but {free:,} are available; lower max_batch_size or max_seq_len")
    compile = _runnable_compile(compile, dev)
    job = ExportJob(model or DEFAULT_MODEL, str(dt).removeprefix("torch."), weights, "", kernels.gemv, kv_name(kv))
    steps = _choose_steps(m, compile, compiled, kernels, job)
    llm = LLM(m, loaded.tokenizer, steps=steps, compile="none" if steps.compiled else compile,
              max_seq_len=max_seq_len, max_batch_size=max_batch_size, cache=cache, source=loaded.source,
              prefill_chunk=prefill_chunk, speculative=speculative, prefix_cache=prefix_cache)
    if group is not None:
        llm.engine.seed_unseeded = SharedSeeds.broadcast(group)
    if draft_name is not None:
        try:
            llm.draft = load(draft_name, device=dev, dtype=dt, compile=compile, max_seq_len=max_seq_len,
                             max_batch_size=max_batch_size, cache=cache, compiled=draft_compiled, weights=weights,
                             prefill_chunk=prefill_chunk, kv_dtype=kv_choice)
            llm.engine.runner.draft = DraftModel(draft_name, llm.draft.engine.runner, m.args.vocab_size)
        except FastDecodeError as e:
            raise FastDecodeError(f"draft model {draft_name!r}: {e}") from None
    llm.load_seconds = time.perf_counter() - t0
    llm.cache_path, llm.from_cache = loaded.cache_path, loaded.from_cache
    llm.weights, llm.weights_summary, llm.kernels = weights, loaded.weights_summary, kernels
    if group is not None:
        llm.weights_summary += f"; tensor parallel: rank {m.tp.rank}'s shard of {tp} (sizes below are per rank)"
    return llm


def _runnable_compile(compile: str, device: torch.device) -> str:
    """`compile`, or "none" (with one line saying why) where Inductor cannot build code here."""
    if compile != "none" and device.type == "cpu" and shutil.which(os.environ.get("CXX", "c++")) is None:
        log.warning("compile=%s needs a C++ compiler for Inductor and none was found (apt-get install g++): "
                    "running the eager steps instead", compile)
        return "none"
    return compile


def _choose_steps(model: Transformer, compile: str, compiled: Optional[str], kernels: KernelChoice,
                  job: ExportJob) -> Steps:
    """The steps the engine runs: an exported package's, or the `compile` strategy's.

    compiled="auto": this machine's package when it exists; else the strategy's
    steps now, and the package exported by a child process for later (the
    steps switch to it between requests once it is written)."""
    from .. import kernels as native
    from ..compile.aot import ExportedSteps, package_path

    missing = native.unavailable_reason if not kernels.ops else None
    if compiled not in (None, "auto") and not os.path.isfile(compiled):
        raise FastDecodeError(f"compiled package {compiled!r} does not exist; create one with `fastdecode export`")
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
    pid = background_export.start(dataclasses.replace(job, path=str(path)))
    if pid is None:
        return fallback
    log.warning("no compiled package for this model on this machine yet: generating on the %s steps now while "
                "a background process (pid %d) exports it; later runs load %s", 
                "eager" if compile == "none" else f"compile={compile}", pid, path)
    return PackageWhenReady(fallback, path, lambda p: ExportedSteps(model, p).steps(), pid)


class LLM:
    """A loaded model with its tokenizer, ready to generate."""

    def __init__(self, model: Transformer, tokenizer: Tokenizer, *, compile: str = "none",
                 max_seq_len: int, max_batch_size: int, cache: str = "static", source: str = "",
                 prefill_chunk: int = DEFAULT_PREFILL_CHUNK, speculative: str = "none",
                 steps: Optional[Steps] = None, prefix_cache: bool = True):
        self.model, self.tokenizer = model, tokenizer
        self.args: ModelArgs = model.args
        self.max_seq_len, self.max_batch_size = max_seq_len, max_batch_size
        self.cache, self.source, self.compile = cache, source, compile
        # The engine owns the model's KV cache and runs every request.
        self.engine = Engine(model, tokenizer, steps or make_steps(model, compile), max_batch_size=max_batch_size,
                             max_seq_len=max_seq_len, cache=cache, prefill_chunk=prefill_chunk,
                             speculative=speculative, prefix_cache=prefix_cache)
        self.draft: Optional[LLM] = None  # the draft model of speculative="draft:<model>"
        self.load_seconds = 0.0
        # Where a converted GGUF copy lives (fastdecode.checkpoints.clear_cache() removes it).
        self.cache_path: Optional[str] = None
        self.from_cache = False
        self.weights = "float"  # the `weights=` load() was given
        self.weights_summary = "float"  # what became of the checkpoint's tensor types
        self.kernels = KernelChoice()  # which kernels run the matmuls
        if tokenizer.vocab_size > self.args.vocab_size:
            raise FastDecodeError(
                f"{source}: tokenizer has {tokenizer.vocab_size} ids but the model's vocabulary is "
                f"{self.args.vocab_size}")

    def use_package(self, path: str) -> None:
        """Run the steps from a `fastdecode export` package (checked against this model)."""
        from ..compile.aot import ExportedSteps

        self.engine.runner.steps = ExportedSteps(self.model, path).steps()

    @property
    def compiled(self) -> Optional[str]:
        """Path of the exported package running the steps, if any."""
        return self.engine.runner.steps.compiled

    @property
    def exporting_package(self) -> Optional[int]:
        """The pid of the background process exporting this machine's package for the model, if one runs."""
        steps = self.engine.runner.steps
        return steps.pid if isinstance(steps, PackageWhenReady) and steps.exporting else None

    @property
    def steps(self):
        """The step callables the engine runs (a compile strategy's or a package's)."""
        return self.engine.runner.steps

    @property
    def device(self) -> torch.device:
        return self.model.device

    @property
    def dtype(self) -> torch.dtype:
        return self.model.dtype

    @property
    def weight_bytes_per_token(self) -> int:
        """Bytes of weights one decode step reads: all tensors except the embedding
        table, of which one row is read (tied models read it whole as the output head)."""
        def nbytes(tensors) -> int:
            return sum(t.numel() * t.element_size() for t in tensors)

        total = nbytes(self.model.state_dict().values())
        if self.model.output is not None:
            total -= nbytes(self.model.tok_embeddings.state_dict().values())
        return total

    # -- requests ------------------------------------------------------------

    def encode_prompts(self, prompts: Prompts) -> list[list[int]]:
        """Normalize str / list[str] / list[int] / list[list[int]] into lists of ids."""
        if isinstance(prompts, torch.Tensor):
            prompts = prompts.tolist()
        if isinstance(prompts, str):
            prompts = [prompts]
        if not isinstance(prompts, (list, tuple)) or len(prompts) == 0:
            raise FastDecodeError("prompts must be a non-empty str, list of str, list of ids or list of id lists")
        if all(_is_id(p) for p in prompts):
            prompts = [list(prompts)]
        out = []
        for i, p in enumerate(prompts):
            if isinstance(p, str):
                if not p:
                    raise FastDecodeError(f"prompt {i} is empty")
                ids = self.tokenizer.encode(p)
            elif isinstance(p, (list, tuple)) and all(_is_id(t) for t in p):
                ids = [int(t) for t in p]
            else:
                raise FastDecodeError(
                    f"prompt {i} has type {type(p).__name__}; accepted: str or a list of int token ids")
            if not ids:
                raise FastDecodeError(f"prompt {i} is empty")
            bad = next((t for t in ids if not 0 <= t < self.args.vocab_size), None)
            if bad is not None:
                raise FastDecodeError(
                    f"prompt {i} has token id {bad}, outside the vocabulary [0, {self.args.vocab_size})")
            out.append(ids)
        return out

    def start(self, prompts: Prompts, params: SamplingParams, config: GenerationConfig) -> GenerationRun:
        """Validate and submit one request per prompt, each with its own
        generator (seeded alike); iterate the result to run them. More prompts
        than max_batch_size wait for free slots."""
        ids = self.encode_prompts(prompts)
        for i, p in enumerate(ids):
            if len(p) + config.max_new_tokens > self.max_seq_len:
                raise FastDecodeError(
                    f"prompt {i} has {len(p)} tokens; with max_new_tokens={config.max_new_tokens} it needs "
                    f"{len(p) + config.max_new_tokens} > max_seq_len={self.max_seq_len}")
        return run_generation(self.engine, ids, params, config)

    def generate(self, prompts: Prompts, **options: Any) -> list[Completion]:
        """One Completion per prompt, in order. Options: the fields of
        SamplingParams and GenerationConfig (max_new_tokens, temperature, top_k,
        top_p, min_p, repetition_penalty, seed, stop, ignore_eos, ...)."""
        run = self.start(prompts, *split_options(options))
        for _ in run:
            pass
        return run.completions

    def stream(self, prompt: Union[str, Sequence[int]], **options: Any) -> Iterator[str]:
        """Yield the completion of one prompt as text pieces, each valid UTF-8."""
        if not isinstance(prompt, str) and not (isinstance(prompt, (list, tuple)) and all(_is_id(t) for t in prompt)):
            raise FastDecodeError("stream takes one prompt: a str or a list of int token ids")
        run = self.start(prompt, *split_options(options))
        for step in run:
            if step.pieces[0]:
                yield step.pieces[0]

    def chat(self, messages: list[dict], **options: Any) -> Completion:
        """Render `messages` with the checkpoint's chat template and return the assistant's reply."""
        return self.generate([self.chat_prompt(messages)], **options)[0]

    def chat_prompt(self, messages: list[dict]) -> list[int]:
        """Token ids of `messages` rendered with the chat template, ready for the reply."""
        text = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
        return self.tokenizer.encode(text, add_special_tokens=False)


_SAMPLING_FIELDS = set(SamplingParams.__dataclass_fields__)
_CONFIG_FIELDS = set(GenerationConfig.__dataclass_fields__)


def _option_parameters() -> list[inspect.Parameter]:
    """The keyword-only options of generate/stream/chat, with the dataclasses' defaults."""
    return [inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=f.default, annotation=f.type)
            for cls in (GenerationConfig, SamplingParams) for f in dataclasses.fields(cls)]


def _document_options(method) -> None:
    """Show the real option names and defaults in help() and IDEs; the dataclasses stay the one source."""
    sig = inspect.signature(method)
    params = [p for p in sig.parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
    method.__signature__ = sig.replace(parameters=params + _option_parameters())


for _method in (LLM.generate, LLM.stream, LLM.chat):
    _document_options(_method)


def split_options(options: dict[str, Any]) -> tuple[SamplingParams, GenerationConfig]:
    """Build (SamplingParams, GenerationConfig) from keyword options; unknown keys fail."""
    unknown = set(options) - _SAMPLING_FIELDS - _CONFIG_FIELDS
    if unknown:
        raise FastDecodeError(
            f"unknown option(s) {', '.join(sorted(unknown))}; accepted: "
            f"{', '.join(sorted(_SAMPLING_FIELDS | _CONFIG_FIELDS))}")
    params = SamplingParams(**{k: v for k, v in options.items() if k in _SAMPLING_FIELDS})
    config = GenerationConfig(**{k: v for k, v in options.items() if k in _CONFIG_FIELDS})
    return params, config


def _is_id(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)
