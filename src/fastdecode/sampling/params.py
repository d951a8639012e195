"""Sampling parameters, validated once when built, and per-request generators."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional

import torch

from ..errors import FastDecodeError
from ..structured.constraint import Constraint

MAX_LOGPROBS = 20
# Temperatures below this are greedy (vLLM's cut-off too): float32 logits divided by one
# under ~1e-37 overflow to inf, and a draw from the NaN probabilities is any token.
GREEDY_BELOW = 1e-5


@dataclass(frozen=True)
class SamplingParams:
    """How to pick each next token.

    temperature: >= 0; 0 (or anything below 1e-5) means greedy (argmax).
    top_k: keep the k most likely tokens; >= 1, or None for no limit.
    top_p: keep the smallest set of most likely tokens whose mass reaches p; in [0, 1]
        (0 keeps only the most likely token, as OpenAI's and llama.cpp's servers take it).
    min_p: drop tokens less likely than min_p times the most likely one; in [0, 1).
    repetition_penalty: > 0; tokens seen in prompt or output have positive
        logits divided by it and negative ones multiplied (1 disables).
    frequency_penalty: in [-2, 2]; subtracted once per earlier occurrence in the output.
    presence_penalty: in [-2, 2]; subtracted once if the token occurred in the output.
    seed: seeds this request's generator; None draws a fresh seed.
    logit_bias: {token id: bias in [-100, 100]} added to the logits before sampling
        (greedy too); stored as sorted (id, bias) pairs.
    logprobs: None, or return each generated token's logprob with this many
        most likely alternatives (0..20), from the model's raw distribution.
    prompt_logprobs: None, or return each prompt token's logprob (the first token's is
        None) with this many most likely alternatives (0..20), from the raw
        distribution (log_softmax before penalties). Such requests never reuse
        cached prompt prefixes.
    constraint: None, or what the output must match (a JSON schema, regex, choice or
        grammar; see fastdecode.structured): other tokens are masked out of each step.
    prompt_logprob_ranks: with prompt_logprobs, also each prompt token's rank
        (TokenLogprob.rank: 1 + the tokens strictly more likely), a pass over the
        vocabulary per position; False leaves rank None (echo's output has no rank).
    """

    temperature: float = 0.8
    top_k: Optional[int] = None
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    seed: Optional[int] = None
    logit_bias: Optional[tuple[tuple[int, float], ...]] = None
    logprobs: Optional[int] = None
    prompt_logprobs: Optional[int] = None
    constraint: Optional[Constraint] = None
    prompt_logprob_ranks: bool = True

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
        check("top_p", 0 <= number("top_p") <= 1, "0 <= top_p <= 1")
        check("min_p", 0 <= number("min_p") < 1, "0 <= min_p < 1")
        check("repetition_penalty", 0 < number("repetition_penalty") < math.inf, "a number > 0")
        check("frequency_penalty", -2 <= number("frequency_penalty") <= 2, "-2 <= frequency_penalty <= 2")
        check("presence_penalty", -2 <= number("presence_penalty") <= 2, "-2 <= presence_penalty <= 2")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)):
            raise FastDecodeError(f"seed must be an integer or None, got {self.seed!r}")
        if self.seed is not None:  # what torch.Generator.manual_seed takes
            check("seed", -2**63 <= self.seed < 2**64, "an integer in [-2**63, 2**64)")
        for name in ("logprobs", "prompt_logprobs"):
            v = getattr(self, name)
            if v is not None:
                if isinstance(v, bool) or not isinstance(v, int):
                    raise FastDecodeError(f"{name} must be an integer 0..{MAX_LOGPROBS} or None, got {v!r}")
                check(name, 0 <= v <= MAX_LOGPROBS, f"an integer 0..{MAX_LOGPROBS}, or None")
        if not isinstance(self.prompt_logprob_ranks, bool):
            raise FastDecodeError(f"prompt_logprob_ranks must be True or False, got {self.prompt_logprob_ranks!r}")
        if self.logit_bias is not None:
            object.__setattr__(self, "logit_bias", _bias_pairs(self.logit_bias) or None)
        if self.constraint is not None and not isinstance(self.constraint, Constraint):
            raise FastDecodeError(f"constraint must be a fastdecode.structured.Constraint, got "
                                  f"{type(self.constraint).__name__}")

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_BELOW

    @property
    def uses_penalties(self) -> bool:
        return (self.repetition_penalty != 1.0 or self.frequency_penalty != 0.0
                or self.presence_penalty != 0.0)


def _bias_pairs(bias: Any) -> tuple[tuple[int, float], ...]:
    items = bias.items() if isinstance(bias, dict) else bias
    try:
        pairs = [(k, v) for k, v in items]
    except (TypeError, ValueError):
        raise FastDecodeError(f"logit_bias must map token ids to numbers, got {bias!r}") from None
    out = {}
    for k, v in pairs:
        if isinstance(k, str) and k.strip().lstrip("-").isdigit():
            k = int(k)  # JSON object keys are strings
        if isinstance(k, bool) or not isinstance(k, int):
            raise FastDecodeError(f"logit_bias key {k!r} is not a token id; accepted: integer ids")
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not -100 <= v <= 100:
            raise FastDecodeError(f"logit_bias[{k}]={v!r} is out of range; accepted: a number in [-100, 100]")
        out[k] = float(v)
    return tuple(sorted(out.items()))


def make_generator(params: SamplingParams, device: torch.device | str) -> torch.Generator:
    """A generator for one request. The engine takes a request's random draws from its
    own generator only, so a seed gives the same tokens whatever shares the batch."""
    g = torch.Generator(device=device)
    if params.seed is None:
        g.seed()
    else:
        g.manual_seed(params.seed)
    return g
