"""The `decode` strategy: one fullgraph-compiled model step, for prefill and decode.

Shapes, and why it is a single graph per model:
- prefill and decode run the same compiled function: a decode step is a
  prefill of one token;
- batch B and chunk length T are marked dynamic, sizes of 1 included
  (`backed_size_oblivious`), so one graph serves every batch size and prompt
  chunk; positions and cache slots are tensors ([B, T] and [B]), and the cache
  is the engine's, allocated once. The model is written so that no view
  depends on whether B or T is 1 (see `model.transformer.Attention`);
- each `TransformerBlock` is a nested compile region, so Dynamo traces and
  Inductor compiles one block and calls it n_layers times.
`Steps.warmup()` compiles it; after that no request recompiles. Inductor and
Dynamo settings are applied around each compiled call, never at import time.
"""

from __future__ import annotations

import contextlib
import itertools
import types
from typing import Callable, Optional

import torch
from torch import Tensor

from ..errors import FastDecodeError
from ..model.kv_cache import KVCache
from ..quant.transform import native_ops


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
    """Keep the batch and prompt sizes apart from each other and from the
    cache's (no 'duck' unification of equal values), and keep sizes of 1
    symbolic instead of specializing them."""
    with torch._dynamo.config.patch(recompile_limit=64, accumulated_recompile_limit=1024), \
            torch.fx.experimental._config.patch(use_duck_shape=False, backed_size_oblivious=True):
        yield


def require_cache(model: torch.nn.Module) -> KVCache:
    """The model's first-layer cache, which compiled and exported steps need static."""
    cache = model.kv_cache
    if not isinstance(cache, KVCache):
        raise FastDecodeError("compiled steps need the engine's static cache (cache='static')")
    return cache


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

        def step_fn(tokens, input_pos, rows, logits_at):
            return model(tokens, input_pos, rows=rows, logits_at=logits_at)

        self._step = torch.compile(own_code(step_fn), **kwargs)
        self.warmed_up = False
        self.extra_warmups: list[Callable[[], None]] = []  # e.g. the chunk graphs

    def step(self, tokens: Tensor, input_pos: Tensor, rows: Tensor, logits_at: Tensor) -> Tensor:
        if not self.warmed_up:
            self.warmup()
        with torch.inference_mode():
            # Fresh inference tensors: inputs made inside and outside inference
            # mode carry different dispatch keys, which Dynamo guards on.
            tokens, input_pos, rows, logits_at = tokens.clone(), input_pos.clone(), rows.clone(), logits_at.clone()
            return self.call(self._step, tokens, input_pos, rows, logits_at,
                             dynamic={0: (0, 1), 1: (0, 1), 2: (0,), 3: (0, 1)})

    def call(self, fn, *args, dynamic: dict[int, tuple[int, ...]], **kwargs):
        """Run compiled `fn` with dims `dynamic[i]` of args[i] marked dynamic."""
        require_cache(self.model)
        for i, dims in dynamic.items():
            for d in dims:
                if args[i] is not None:
                    torch._dynamo.mark_dynamic(args[i], d)
        with torch.inference_mode(), dynamic_shapes_context():
            return fn(*args, **kwargs)

    def warmup(self) -> None:
        """Compile the step graph (and any extra graphs, such as the chunk decoder's).

        Writes a few positions of cache slot 0, which no request can see: a
        request reads only positions it wrote itself.
        """
        self.warmed_up = True
        device = self.model.device
        T = min(4, require_cache(self.model).seq_len)
        with torch.inference_mode():
            tokens = torch.zeros(1, T, dtype=torch.long, device=device)
            zero = torch.zeros(1, 1, dtype=torch.long, device=device)
            self.step(tokens, torch.arange(T, device=device)[None], zero[0], zero + T - 1)
        for extra in self.extra_warmups:
            extra()
