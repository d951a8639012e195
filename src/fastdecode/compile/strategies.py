"""Compile strategies: functions that take the model and return the step callables.

Each strategy returns a `Steps` (steps.py): `none` runs the model eagerly,
`decode` compiles one step for prefill and decode (compiled.py), `generate`
adds K decode steps per compiled call (loop.py). Nothing here rebinds globals
or changes the model (which kernels run is decided at load, by `quant.transform`).
"""

from __future__ import annotations

import torch

from ..errors import FastDecodeError
from .compiled import CompiledSteps
from .loop import make_generate_steps
from .steps import Steps

STRATEGIES = ("none", "decode", "generate")


def eager_steps(model: torch.nn.Module) -> Steps:
    def step(tokens, input_pos, rows, logits_at):
        return model(tokens, input_pos, rows=rows, logits_at=logits_at)

    return Steps(step=step)


def make_steps(model: torch.nn.Module, strategy: str) -> Steps:
    """Return the step callables for `strategy` (one of STRATEGIES)."""
    if strategy == "none":
        return eager_steps(model)
    if strategy == "decode":
        c = CompiledSteps(model)
        return Steps(step=c.step, warmup=c.warmup)
    if strategy == "generate":
        return make_generate_steps(model)
    raise FastDecodeError(f"unknown compile strategy {strategy!r}; valid: {', '.join(STRATEGIES)}")
