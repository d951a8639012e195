"""Compile strategies: functions that take the model and return the step callables.

Each strategy returns a `Steps` pair; nothing here rebinds globals or mutates
the model's forward. Inductor settings are applied inside the strategy.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .errors import FastDecodeError
from .generate import StepFn

STRATEGIES = ("none",)


@dataclass
class Steps:
    """prefill: (tokens [B, T], input_pos [T], left_pad) -> logits [B, 1, V];
    decode: the same with T == 1."""

    prefill: StepFn
    decode: StepFn


def eager_steps(model: torch.nn.Module) -> Steps:
    def step(tokens, input_pos, left_pad):
        return model(tokens, input_pos, left_pad=left_pad, last_only=True)

    return Steps(prefill=step, decode=step)


def make_steps(model: torch.nn.Module, strategy: str) -> Steps:
    """Return the step callables for `strategy` (one of STRATEGIES)."""
    if strategy == "none":
        return eager_steps(model)
    raise FastDecodeError(f"unknown compile strategy {strategy!r}; valid: {', '.join(STRATEGIES)}")
