"""Everything that turns logits into the next token.

Parameters are validated once, when `SamplingParams` is built. The functions
below are pure tensor code with no host syncs, so they run unchanged inside a
compiled graph: randomness comes in as a precomputed `noise` tensor drawn from
a per-request `torch.Generator`.

Order of operations (as in Hugging Face and vLLM): penalties, temperature,
top-k, softmax, top-p, min-p, then the draw.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence

import torch
from torch import Tensor

from .errors import FastDecodeError


@dataclass(frozen=True)
class SamplingParams:
    """How to pick each next token.

    temperature: >= 0; 0 means greedy (argmax).
    top_k: keep the k most likely tokens; >= 1, or None for no limit.
    top_p: keep the smallest set of most likely tokens whose mass reaches p; in (0, 1].
    min_p: drop tokens less likely than min_p times the most likely one; in [0, 1).
    repetition_penalty: > 0; tokens seen in prompt or output have positive
        logits divided by it and negative ones multiplied (1 disables).
    frequency_penalty: in [-2, 2]; subtracted once per earlier occurrence in the output.
    presence_penalty: in [-2, 2]; subtracted once if the token occurred in the output.
    seed: seeds this request's generator; None draws a fresh seed.
    """

    temperature: float = 0.8
    top_k: Optional[int] = None
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    seed: Optional[int] = None

    def __post_init__(self) -> None:
        def number(name: str) -> float:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
                raise FastDecodeError(f"{name} must be a number, got {value!r}")
            return float(value)

        def check(name: str, ok: bool, accepted: str) -> None:
            if not ok:
                raise FastDecodeError(f"{name}={getattr(self, name)!r} is out of range; accepted: {accepted}")

        t = number("temperature")
        check("temperature", 0 <= t < math.inf, "a number >= 0 (0 means greedy)")
        if self.top_k is not None:
            if isinstance(self.top_k, bool) or not isinstance(self.top_k, int):
                raise FastDecodeError(f"top_k must be an integer >= 1 or None, got {self.top_k!r}")
            check("top_k", self.top_k >= 1, "an integer >= 1, or None")
        check("top_p", 0 < number("top_p") <= 1, "0 < top_p <= 1")
        check("min_p", 0 <= number("min_p") < 1, "0 <= min_p < 1")
        check("repetition_penalty", 0 < number("repetition_penalty") < math.inf, "a number > 0")
        check("frequency_penalty", -2 <= number("frequency_penalty") <= 2, "-2 <= frequency_penalty <= 2")
        check("presence_penalty", -2 <= number("presence_penalty") <= 2, "-2 <= presence_penalty <= 2")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)):
            raise FastDecodeError(f"seed must be an integer or None, got {self.seed!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def uses_penalties(self) -> bool:
        return (self.repetition_penalty != 1.0 or self.frequency_penalty != 0.0
                or self.presence_penalty != 0.0)


def make_generator(params: SamplingParams, device: torch.device | str) -> torch.Generator:
    """A per-request generator, so a seed reproduces its output whatever else runs."""
    g = torch.Generator(device=device)
    if params.seed is None:
        g.seed()
    else:
        g.manual_seed(params.seed)
    return g


def draw_noise(generator: torch.Generator, shape: Sequence[int], device: torch.device | str) -> Tensor:
    """Exponential(1) noise; argmax(probs / noise) is a draw from probs."""
    return torch.empty(shape, device=device, dtype=torch.float32).exponential_(1.0, generator=generator)


# -- masks, each written to match its definition ------------------------------

def top_k_mask(logits: Tensor, k: int) -> Tensor:
    """True where a token is NOT among the k largest logits (ties with the k-th are kept)."""
    k = min(k, logits.shape[-1])
    kth = torch.topk(logits, k, dim=-1).values[..., -1:]
    return logits < kth


def top_p_mask(probs: Tensor, p: float) -> Tensor:
    """True where a token is outside the nucleus: the smallest set of most likely
    tokens whose total probability reaches p. The most likely token is always kept."""
    sorted_probs, order = torch.sort(probs, dim=-1, descending=True)
    mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
    # The top token is always kept; a mask, not an in-place write, keeps
    # compiled graphs free of a batch-size-1 specialization.
    first = torch.arange(probs.shape[-1], device=probs.device) == 0
    drop_sorted = (mass_before >= p) & ~first
    return torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)


def min_p_mask(probs: Tensor, min_p: float) -> Tensor:
    """True where a token's probability is below min_p times the largest one."""
    return probs < min_p * probs.amax(dim=-1, keepdim=True)


# -- penalties ------------------------------------------------------------------

@dataclass
class PenaltyState:
    """Per-row token statistics for the penalties. counts: [B, V] occurrences in
    the output so far; seen: [B, V] tokens present in prompt or output."""

    counts: Tensor
    seen: Tensor

    @classmethod
    def from_prompts(cls, prompts: Sequence[Sequence[int]], vocab_size: int,
                     device: torch.device | str) -> "PenaltyState":
        B = len(prompts)
        seen = torch.zeros(B, vocab_size, dtype=torch.bool, device=device)
        for row, ids in enumerate(prompts):
            seen[row, torch.as_tensor(list(ids), dtype=torch.long, device=device)] = True
        return cls(torch.zeros(B, vocab_size, dtype=torch.float32, device=device), seen)

    def update(self, tokens: Tensor) -> None:
        """Record the tokens [B] just emitted (finished rows are harmless: their output is dropped)."""
        self.counts.scatter_add_(1, tokens[:, None], torch.ones_like(tokens[:, None], dtype=self.counts.dtype))
        self.seen.scatter_(1, tokens[:, None], True)


def apply_penalties(logits: Tensor, params: SamplingParams, state: PenaltyState) -> Tensor:
    if params.repetition_penalty != 1.0:
        r = params.repetition_penalty
        penalized = torch.where(logits > 0, logits / r, logits * r)
        logits = torch.where(state.seen, penalized, logits)
    if params.frequency_penalty != 0.0 or params.presence_penalty != 0.0:
        logits = (logits - params.frequency_penalty * state.counts
                  - params.presence_penalty * (state.counts > 0).to(logits.dtype))
    return logits


# -- the draw -------------------------------------------------------------------

def logits_to_probs(logits: Tensor, params: SamplingParams) -> Tensor:
    """[B, V] logits (penalties already applied) -> [B, V] filtered, normalized probabilities."""
    logits = logits.float() / params.temperature
    if params.top_k is not None:
        logits = logits.masked_fill(top_k_mask(logits, params.top_k), -math.inf)
    probs = torch.softmax(logits, dim=-1)
    if params.top_p < 1.0:
        probs = probs.masked_fill(top_p_mask(probs, params.top_p), 0.0)
    if params.min_p > 0.0:
        probs = probs.masked_fill(min_p_mask(probs, params.min_p), 0.0)
    return probs / probs.sum(dim=-1, keepdim=True)


def sample(logits: Tensor, params: SamplingParams, noise: Optional[Tensor] = None,
           penalties: Optional[PenaltyState] = None, banned: Optional[Tensor] = None) -> Tensor:
    """Pick one token per row. logits: [B, V]; noise: [B, V] Exponential(1)
    (required unless greedy); banned: [B, V] or [V] bool, tokens that may not be
    picked now (e.g. EOS before min_new_tokens). Returns [B] int64."""
    logits = logits.float()
    if penalties is not None:
        logits = apply_penalties(logits, params, penalties)
    if banned is not None:
        logits = logits.masked_fill(banned, -math.inf)
    if params.greedy:
        return logits.argmax(dim=-1)
    probs = logits_to_probs(logits, params)
    return torch.argmax(probs / noise, dim=-1)
