"""Compile strategies: functions that take the model and return the step callables.

Each strategy returns a `Steps` pair; nothing here rebinds globals or changes
the model (which kernels run is decided at load, by `quant.transform`).
Inductor and Dynamo settings are applied around each compiled call, never at
import time.

Shapes, and why the `decode` strategy is a single graph per model:
- prefill and decode run the same compiled function: a decode step is a
  prefill of one token;
- batch B, prompt length T and the cache's batch and length are all marked
  dynamic, sizes of 1 included (`backed_size_oblivious`), so one graph serves
  every batch size, prompt length and cache bucket. The model is written so
  that no view depends on whether B or T is 1 (see `model.Attention`);
- each `TransformerBlock` is a nested compile region, so Dynamo traces and
  Inductor compiles one block and calls it n_layers times.
`Steps.warmup()` compiles it; after that no request recompiles.
"""

from __future__ import annotations

import contextlib
import itertools
import types
from dataclasses import dataclass, field
from typing import Callable, Optional

import torch
from torch import Tensor

from .errors import FastDecodeError
from .generate import StepFn
from .kv_cache import KVCache
from .quant.transform import native_ops

STRATEGIES = ("none", "decode", "generate")


@dataclass
class Steps:
    """prefill: (tokens [B, T], input_pos [T], left_pad) -> logits [B, 1, V];
    decode: the same with T == 1. warmup() compiles every graph up front."""

    prefill: StepFn
    decode: StepFn
    warmup: Callable[[], None] = field(default=lambda: None)
    # Set by the `generate` strategy: decodes K tokens per call (see compiled_loop).
    chunk: Optional[object] = None


def eager_steps(model: torch.nn.Module) -> Steps:
    def step(tokens, input_pos, left_pad):
        return model(tokens, input_pos, left_pad=left_pad, last_only=True)

    return Steps(prefill=step, decode=step)


def inductor_options(device: torch.device, native_linears: bool) -> dict:
    """Inductor settings for CPU.

    Freezing folds the weights into the graph as constants so Inductor can
    prepack them for its BLAS linears; it needs inference mode, which
    generation uses. With native kernels (GEMV or quantized) the linears are
    opaque custom ops that prepacking cannot touch, so freezing would only add
    compile time.
    (Measured on a contended machine only; see benchmarks/compile.md.)
    """
    if device.type == "cpu":
        return {"freezing": not native_linears}
    return {}


@contextlib.contextmanager
def dynamic_shapes_context():
    """Let the KV cache buffers have dynamic sizes, keep their sizes apart from
    the batch and prompt sizes (no 'duck' unification of equal values), and
    keep sizes of 1 symbolic instead of specializing them."""
    with torch._dynamo.config.patch(force_parameter_static_shapes=False,
                                    force_nn_module_property_static_shapes=False,
                                    recompile_limit=64, accumulated_recompile_limit=1024), \
            torch.fx.experimental._config.patch(use_duck_shape=False, backed_size_oblivious=True):
        yield


def static_cache(model: torch.nn.Module) -> KVCache:
    """The model's first-layer cache, which compiled and exported steps need static."""
    cache = model.kv_cache
    if not isinstance(cache, KVCache):
        raise FastDecodeError("compiled steps need cache='static'; got a dynamic cache")
    return cache


def fit_cache(model: torch.nn.Module, batch_size: int, seq_len: int) -> None:
    """Give the model caches of exactly [batch_size, ..., seq_len, ...] (allocating
    them if it has none).

    Compiled and exported steps take cache rows == batch rows, while generate
    may hand them a cache with more rows. At the start of a request the cache
    holds no state, so reallocating is safe.
    """
    cache = None if model.kv_cache is None else static_cache(model)
    if cache is None or cache.batch_size != batch_size or cache.seq_len != seq_len:
        # Outside inference mode, like generate's own allocation: buffers made
        # inside would carry other dispatch keys and trigger a recompile.
        with torch.inference_mode(False):
            model.setup_caches(batch_size, seq_len)
    for layer in model.layers:
        layer.attention.kv_cache.whole_batch = True


_code_ids = itertools.count()


def own_code(fn: Callable) -> Callable:
    """`fn` with a code object of its own.

    Dynamo keeps its shape decisions (which sizes are dynamic, what was
    specialized) per code object, so a second model compiled through the same
    closure code inherits the first one's, which can break its trace (seen as
    an internal KeyError when a quantized and a float model were compiled in
    one process). A fresh code object per compiled step keeps models apart.
    """
    code = fn.__code__.replace(co_name=f"{fn.__code__.co_name}_{next(_code_ids)}")
    return types.FunctionType(code, fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)


class CompiledSteps:
    """The `decode` strategy: one fullgraph-compiled model step, for prefill and decode."""

    def __init__(self, model: torch.nn.Module, *, backend: str = "inductor", options: Optional[dict] = None):
        self.model = model
        device = model.device
        native = bool(native_ops(model))
        kwargs: dict = {"fullgraph": True, "backend": backend}
        if backend == "inductor":
            if device.type == "cuda":
                kwargs["mode"] = "reduce-overhead"  # CUDA graphs
            else:
                kwargs["options"] = inductor_options(device, native) if options is None else options
        self.compile_kwargs = kwargs

        def step_fn(tokens, input_pos, left_pad):
            return model(tokens, input_pos, left_pad=left_pad, last_only=True)

        self._step = torch.compile(own_code(step_fn), **kwargs)
        self._marked: Optional[Tensor] = None
        self.warmed_up = False
        self.extra_warmups: list[Callable[[], None]] = []  # e.g. the chunk graphs

    # -- the step callables ----------------------------------------------------

    def prefill(self, tokens: Tensor, input_pos: Tensor, left_pad: Optional[Tensor]) -> Tensor:
        seq_len = static_cache(self.model).seq_len
        if not self.warmed_up:
            self.warmup()  # leaves a cache of its own shape
        fit_cache(self.model, tokens.shape[0], seq_len)
        return self.decode(tokens, input_pos, left_pad)

    def decode(self, tokens: Tensor, input_pos: Tensor, left_pad: Optional[Tensor]) -> Tensor:
        B = tokens.shape[0]
        with torch.inference_mode():
            # Fresh inference tensors: inputs made inside and outside inference
            # mode carry different dispatch keys, which Dynamo guards on.
            tokens, input_pos = tokens.clone(), input_pos.clone()
            left_pad = (torch.zeros(B, dtype=torch.long, device=tokens.device) if left_pad is None
                        else left_pad.clone())
            return self.call(self._step, tokens, input_pos, left_pad, dynamic={0: (0, 1), 1: (0,), 2: (0,)})

    def call(self, fn, *args, dynamic: dict[int, tuple[int, ...]], **kwargs):
        """Run compiled `fn` with dims `dynamic[i]` of args[i] marked dynamic."""
        for i, dims in dynamic.items():
            for d in dims:
                if args[i] is not None:
                    torch._dynamo.mark_dynamic(args[i], d)
        self._mark_cache()
        with torch.inference_mode(), dynamic_shapes_context():
            return fn(*args, **kwargs)

    def _mark_cache(self) -> None:
        cache = static_cache(self.model)
        if cache.k_cache is self._marked:
            return
        for layer in self.model.layers:
            c = layer.attention.kv_cache
            for buf in (c.k_cache, c.v_cache):
                torch._dynamo.mark_dynamic(buf, 0)
                torch._dynamo.mark_dynamic(buf, 2)
        self._marked = cache.k_cache

    # -- warm-up -----------------------------------------------------------------

    def warmup(self) -> None:
        """Compile the step graph (and any extra graphs, such as the chunk decoder's).

        Leaves the model with a fresh cache of the warm-up shape.
        """
        self.warmed_up = True
        model = self.model
        device = model.device
        S = min(256, model.args.max_seq_len)
        T = min(4, S - 1)
        fit_cache(model, 1, S)
        with torch.inference_mode():
            tokens = torch.zeros(1, T, dtype=torch.long, device=device)
            self.prefill(tokens, torch.arange(T, device=device), None)
        for extra in self.extra_warmups:
            extra()
        model.reset_caches()


def make_steps(model: torch.nn.Module, strategy: str) -> Steps:
    """Return the step callables for `strategy` (one of STRATEGIES)."""
    if strategy == "none":
        return eager_steps(model)
    if strategy == "decode":
        c = CompiledSteps(model)
        return Steps(prefill=c.prefill, decode=c.decode, warmup=c.warmup)
    if strategy == "generate":
        from .compiled_loop import make_generate_steps

        return make_generate_steps(model)
    raise FastDecodeError(f"unknown compile strategy {strategy!r}; valid: {', '.join(STRATEGIES)}")
