"""The output head under tensor parallelism: vocabulary-parallel, or replicated.

Vocabulary-parallel: rank r keeps head rows [r*V/tp, (r+1)*V/tp) and computes
those logits; one all-gather per step gives every rank the full [.., V]
logits, so every rank samples the same token with no broadcast. Replicated:
every rank reads the whole head and computes all logits, with no collective.

`auto` picks vocabulary-parallel whenever tp divides the vocabulary. On the
2-core development CPU (benchmarks/tp_bench.py, docs/scale-out.md), SmolLM2's
49152 x 576 float32 head vocab-parallel, all-gather included, took 0.56-0.89
of the replicated time at batch 8 and 0.48-1.05 at batch 1 (12 measurements):
the half read saves about what the collective costs or more. Real vocabularies
are that large; a toy head (`tiny`'s 260 rows) would be faster replicated, by
one collective. The token table stays whole on every rank: a lookup reads one
row, and splitting it would add an all-reduce per step.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor, nn

from ..errors import FastDecodeError
from ..model.transformer import Transformer
from . import comm
from .slices import Linear, take_rows

HEADS = ("auto", "vocab", "replicated")


class VocabParallelHead(nn.Module):
    """This rank's rows of the output head; one all-gather joins the ranks' logits."""

    def __init__(self, linear: Linear, group: dist.ProcessGroup, tp: int):
        super().__init__()
        self.linear, self.group, self.tp = linear, group, tp

    def forward(self, x: Tensor) -> Tensor:
        y = self.linear(x)  # [B, n, V/tp]
        lead, v = y.shape[:-1], y.shape[-1]
        g = comm.all_gather(y.view(-1, v), self.group)  # [tp * B*n, V/tp], rank-major
        # An explicit copy: reshape would copy or not depending on whether B*n is 1,
        # and compiled graphs would specialize on it.
        g = g.view(self.tp, -1, v).transpose(0, 1).clone(memory_format=torch.contiguous_format)
        return g.view(*lead, self.tp * v)  # [B, n, V]


def choose_head(vocab_size: int, tp: int, head: str = "auto") -> str:
    """"vocab" or "replicated" for `head` ("auto", "vocab" or "replicated"); checked before any change."""
    if head not in HEADS:
        raise FastDecodeError(f"unknown head={head!r}; accepted: {', '.join(HEADS)}")
    if head == "auto":
        return "vocab" if vocab_size % tp == 0 else "replicated"
    if head == "vocab" and vocab_size % tp:
        raise FastDecodeError(f"a vocabulary-parallel head needs the vocabulary ({vocab_size}) to be a multiple of "
                              f"tp={tp}; use head='replicated'")
    return head


def shard_head(model: Transformer, group: dist.ProcessGroup) -> None:
    """Replace the head by this rank's rows of it (a VocabParallelHead)."""
    rank, tp = dist.get_rank(group), dist.get_world_size(group)
    V = model.args.vocab_size
    source = model.output if model.output is not None else model.tok_embeddings  # tied: the token table
    rows = torch.arange(rank * V // tp, (rank + 1) * V // tp)
    # Setting `output` on a tied model makes forward use it instead of the table.
    model.output = VocabParallelHead(take_rows(source, rows), group, tp)
