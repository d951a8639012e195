"""Per-slot sampling state, kept on the device by the engine.

Each cache slot has its row of penalty statistics, logit bias and EOS ids; a
step gathers the rows it runs. What stays constant while a request lives
(its settings) is gathered once per batch composition, not per step.
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch
from torch import Tensor

from .ops import SamplingBatch
from .params import SamplingParams


class SlotSampling:
    """counts: [S, V] output occurrences; seen: [S, V] tokens in prompt or output;
    bias: [S, V] logit bias; eos: [S, V] the EOS ids of the request in each slot."""

    def __init__(self, n_slots: int, vocab_size: int, device: torch.device):
        self.V, self.device = vocab_size, device
        self.counts = torch.zeros(n_slots, vocab_size, dtype=torch.float32, device=device)
        self.seen = torch.zeros(n_slots, vocab_size, dtype=torch.bool, device=device)
        self.bias = torch.zeros(n_slots, vocab_size, dtype=torch.float32, device=device)
        self.eos = torch.zeros(n_slots, vocab_size, dtype=torch.bool, device=device)
        self.params: list[Optional[SamplingParams]] = [None] * n_slots
        self.version = [0] * n_slots  # bumped per new occupant: keys the cached batch
        self._batch_key: Optional[tuple] = None
        self._batch: Optional[SamplingBatch] = None

    def assign(self, slot: int, params: SamplingParams, prompt: Sequence[int], eos_ids: frozenset[int]) -> None:
        """Set up `slot` for a new request."""
        self.params[slot] = params
        self.version[slot] += 1
        self.eos[slot].zero_()
        ids = [i for i in eos_ids if 0 <= i < self.V]
        if ids:
            self.eos[slot, ids] = True
        self.bias[slot].zero_()
        if params.logit_bias:
            ids, values = zip(*params.logit_bias)
            self.bias[slot, list(ids)] = torch.tensor(values, device=self.device)
        if params.uses_penalties:
            self.counts[slot].zero_()
            self.seen[slot].zero_()
            self.seen[slot, torch.as_tensor(list(prompt), device=self.device)] = True

    def batch(self, slots: Sequence[int], full: bool = False) -> SamplingBatch:
        """The settings of `slots`, in order (cached while the same requests run)."""
        key = (tuple(slots), tuple(self.version[s] for s in slots), full)
        if key != self._batch_key:
            self._batch = SamplingBatch.from_params([self.params[s] for s in slots], self.V, self.device, full)
            self._batch_key = key
        return self._batch

    def uses_bias(self, slots: Sequence[int]) -> bool:
        return any(self.params[s].logit_bias for s in slots)

    def record(self, rows: Tensor, tokens: Tensor) -> None:
        """Count the tokens [B] just picked for slots `rows` [B] (for the penalties)."""
        self.counts.index_put_((rows, tokens), torch.ones_like(tokens, dtype=self.counts.dtype), accumulate=True)
        self.seen[rows, tokens] = True
