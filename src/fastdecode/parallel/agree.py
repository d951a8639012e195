"""What every rank must agree on beyond the weights, decided once at load.

Ranks compute the replicated parts (embedding, norms, head) and sample on
their own, so all must run the same kernels and take the same random draws, or a
near-tie could pick different tokens and the ranks would drift apart.
"""

from __future__ import annotations

import random
from typing import Any

import torch.distributed as dist
from torch import nn

from ..quant.transform import KernelChoice, native_ops, set_gemv


def rank0_value(value: Any, group: dist.ProcessGroup) -> Any:
    """Rank 0's `value` on every rank (one broadcast of a picklable object)."""
    box = [value]
    dist.broadcast_object_list(box, src=dist.get_global_rank(group, 0), group=group)
    return box[0]


def same_kernels(model: nn.Module, choice: KernelChoice, group: dist.ProcessGroup) -> KernelChoice:
    """Make every rank run rank 0's float kernels. The GEMV is chosen by timing
    it (kernels.select.gemv_is_faster), which can come out differently on two
    ranks, and it rounds differently from F.linear."""
    gemv = rank0_value(choice.gemv, group)
    if gemv != choice.gemv:
        set_gemv(model, gemv)
        choice.ops = native_ops(model)
        choice.gemv = "gemv" in choice.ops
    return choice


class SharedSeeds:
    """Seeds for requests that bring none, the same sequence on every rank.

    Ranks sample their own copy of the logits and must take the same random draws,
    so an unseeded request cannot draw a fresh seed on each rank. Rank 0
    draws one base seed at load and broadcasts it (one collective per model,
    none per request); the n-th unseeded request then gets the n-th number of
    a generator seeded with it on every rank, because every rank submits the
    same requests in the same order. A broadcast per request would add a
    collective to every submission, and for a server rank 0 will have to
    broadcast the requests themselves anyway (the seed can then ride along).
    """

    def __init__(self, base: int):
        self.base = base
        self._rng = random.Random(base)

    def __call__(self) -> int:
        return self._rng.getrandbits(63)

    @classmethod
    def broadcast(cls, group: dist.ProcessGroup) -> "SharedSeeds":
        first = random.SystemRandom().getrandbits(63) if dist.get_rank(group) == 0 else None
        return cls(rank0_value(first, group))
