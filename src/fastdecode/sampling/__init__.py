"""Sampling: parameters (params.py), batched per-row sampling (ops.py), the
per-slot state the engine keeps for it (slots.py) and speculative sampling's
acceptance rule (acceptance.py)."""

from .ops import (SamplingBatch, adjust, apply_penalties, draw_from, first_max, greedy_or_drawn, logits_to_probs,
                  min_p_mask, sample, token_logprobs, top_k_mask, top_p_mask)
from .params import MAX_LOGPROBS, SamplingParams, make_generator

__all__ = ["SamplingParams", "SamplingBatch", "MAX_LOGPROBS", "make_generator", "sample",
           "logits_to_probs", "first_max", "greedy_or_drawn", "draw_from", "adjust", "apply_penalties", "top_k_mask", "top_p_mask", "min_p_mask", "token_logprobs"]
