"""Megatron-style tensor parallelism as a transform of a built `Transformer`.

Per block, with tp ranks and rank r:
- attention `wqkv` and feed-forward `w13` keep r's slice of their output rows
  (column-parallel): q heads [r*H/tp, (r+1)*H/tp), the kv heads those heads
  read, [r*Hkv/tp, (r+1)*Hkv/tp) (contiguous q heads share kv heads, so the
  grouping is the same on each rank), and r's part of gate and of up;
- `wo` and `w2` keep the matching slice of their input columns (row-parallel)
  and sum the ranks' partial outputs with one all-reduce each: two per layer;
- the attention modules get the per-rank head counts, and `model.args` becomes
  the shard's shapes, so the engine's KV cache holds Hkv/tp heads per rank
  with no change to the model code. The full model's args stay in `model.tp`.
The output head is vocabulary-parallel where tp divides the vocabulary
(head.py); the token table and the norms are replicated.

Quantized matrices split too (slices.py): output rows freely, input columns
on 32-value block boundaries.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor, nn

from ..model.args import ModelArgs
from ..errors import FastDecodeError
from ..model.transformer import Transformer
from ..quant.formats import BLOCK
from ..quant.linear import QuantLinear
from . import comm
from .head import choose_head, shard_head
from .slices import Linear, take_columns, take_rows


@dataclass(frozen=True)
class ShardInfo:
    """What `shard_model` did: `model.tp` of a sharded model."""

    rank: int
    size: int
    full_args: ModelArgs  # the unsharded model's shapes (model.args are the shard's)
    group: dist.ProcessGroup
    head: str  # "vocab" (vocabulary-parallel) or "replicated"


class RowParallel(nn.Module):
    """A linear holding this rank's slice of the input features; the partial
    products of all ranks are summed by one all-reduce."""

    def __init__(self, linear: Linear, group: dist.ProcessGroup):
        super().__init__()
        self.linear, self.group = linear, group

    def forward(self, x: Tensor) -> Tensor:
        y = self.linear(x)  # [B, T, N]
        # Reduced as [B*T, N]: lowering the all-reduce of the [B, T, N] view of a native
        # kernel's [B*T, N] output failed Inductor's stride check (torch 2.13, GEMV on).
        return comm.all_reduce(y.view(-1, y.shape[-1]), self.group).view(y.shape)


def shard_model(model: Transformer, group: dist.ProcessGroup, *, head: str = "auto") -> Transformer:
    """Keep this rank's shard of every block and of the head, in place; returns `model`.

    Apply after loading and before the KV cache is allocated (load(tp=...) does).
    head: "auto", "vocab" or "replicated" (see head.py).
    """
    if getattr(model, "tp", None) is not None:
        raise FastDecodeError("this model is already sharded for tensor parallelism")
    rank, tp = dist.get_rank(group), dist.get_world_size(group)
    a = model.args
    check_divisible(model, tp)
    head = choose_head(a.vocab_size, tp, head)
    for i, layer in enumerate(model.layers):
        attn, ff = layer.attention, layer.feed_forward
        H, Hkv, D = attn.n_heads, attn.n_kv_heads, attn.head_dim
        h, hkv = H // tp, Hkv // tp
        q = torch.arange(rank * h * D, (rank + 1) * h * D)
        kv = torch.arange(rank * hkv * D, (rank + 1) * hkv * D)
        attn.wqkv = take_rows(attn.wqkv, torch.cat([q, H * D + kv, (H + Hkv) * D + kv]))
        attn.wo = RowParallel(take_columns(attn.wo, rank * h * D, h * D, rank, f"layers.{i}.attention.wo"), group)
        attn.n_heads, attn.n_kv_heads = h, hkv
        F = ff.w2.in_features
        f = F // tp
        part = torch.arange(rank * f, (rank + 1) * f)
        ff.w13 = take_rows(ff.w13, torch.cat([part, F + part]))  # gate rows, then up rows
        ff.w2 = RowParallel(take_columns(ff.w2, rank * f, f, rank, f"layers.{i}.feed_forward.w2"), group)
    model.args = a.replace(n_heads=a.n_heads // tp, n_kv_heads=a.n_kv_heads // tp, head_dim=a.head_dim,
                           hidden_dim=a.hidden_dim // tp)
    if head == "vocab":
        shard_head(model, group)
    model.tp = ShardInfo(rank, tp, a, group, head)
    return model


def check_divisible(model: Transformer, tp: int) -> None:
    """Raise a one-line FastDecodeError naming the first layer tp cannot split."""
    if tp > 1 and model.args.eager_only:
        raise FastDecodeError(f"tp={tp}: tensor parallelism does not split {model.args.eager_only}; accepted: 1")
    for i, layer in enumerate(model.layers):
        attn, ff = layer.attention, layer.feed_forward
        H, Hkv, D = attn.n_heads, attn.n_kv_heads, attn.head_dim
        if H % tp or Hkv % tp:
            raise FastDecodeError(
                f"tp={tp} cannot split layers.{i}.attention: n_heads={H} and n_kv_heads={Hkv} must both be "
                f"multiples of tp; accepted: {_tp_list(model)}")
        for name, linear, k in ((f"layers.{i}.attention.wo", attn.wo, H * D),
                                (f"layers.{i}.feed_forward.w2", ff.w2, ff.w2.in_features)):
            if k % tp:
                raise FastDecodeError(f"tp={tp} cannot split {name}: its {k} inputs are not a multiple of tp; "
                                      f"accepted: {_tp_list(model)}")
            if isinstance(linear, QuantLinear) and (k // tp) % BLOCK:
                raise FastDecodeError(
                    f"tp={tp} cannot split {name}: its {k} inputs give {k // tp} per rank, not a multiple of the "
                    f"{BLOCK}-value quantization block; accepted: {_tp_list(model)}, or weights=float")


def valid_tp(model: Transformer) -> list[int]:
    """The tp values this model splits into (1 always does)."""
    out = [1]
    if model.args.eager_only:
        return out
    layer = model.layers[0]
    attn, ff = layer.attention, layer.feed_forward
    for tp in range(2, attn.n_kv_heads + 1):
        splits = [(attn.wo, attn.n_heads * attn.head_dim), (ff.w2, ff.w2.in_features)]
        if attn.n_heads % tp or attn.n_kv_heads % tp or any(
                k % tp or (isinstance(m, QuantLinear) and (k // tp) % BLOCK) for m, k in splits):
            continue
        out.append(tp)
    return out


def _tp_list(model: Transformer) -> str:
    return "tp=" + " or ".join(map(str, valid_tp(model)))
