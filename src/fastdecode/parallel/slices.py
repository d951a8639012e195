"""Slicing one matrix for tensor parallelism: float (`nn.Linear` and subclasses)
or block-quantized (`QuantLinear`), by output rows or by input columns.

Rows of a block-quantized matrix are independent, so row slices are free (the layouts
stored in panels of 16 rows go through their row order); a column slice must
fall on 32-value block boundaries, and its values are regrouped into the lane order
of the narrower row, or into panels (formats.py), which is exact.
"""

from __future__ import annotations

from typing import Optional, Union

import torch
from torch import Tensor, nn

from ..errors import FastDecodeError
from ..quant.formats import BLOCK, PANEL_LAYOUTS, from_panels, pack_nibbles, to_panels, unpack_q4
from ..quant.linear import QuantLinear, _Packed

Linear = Union[nn.Linear, QuantLinear]


def take_rows(linear: Union[Linear, nn.Embedding, _Packed], rows: Tensor) -> Linear:
    """A linear computing only output features `rows` (weights copied, so the full matrix can be
    freed). An embedding table gives the linear of its tied head (logits = x E^T)."""
    rows = rows.to(_device(linear))
    bias = getattr(linear, "bias", None)
    bias = None if bias is None else bias[rows].clone()
    if isinstance(linear, _Packed) and linear.layout in PANEL_LAYOUTS:
        vals, fields = from_panels(linear.layout, linear.packed())
        packed = to_panels(linear.layout, vals[rows], {name: f[rows] for name, f in fields.items()})
        return new_quant(linear, linear.k, packed, bias)
    if isinstance(linear, _Packed):
        return new_quant(linear, linear.k, {n: t[rows].clone() for n, t in linear.packed().items()}, bias)
    return new_float(linear, linear.weight[rows].clone(), bias)


def take_columns(linear: Linear, start: int, n: int, rank: int, name: str) -> Linear:
    """A linear over input features [start, start + n); the bias, added once after the
    all-reduce's sum, stays on rank 0 only."""
    bias = linear.bias.clone() if linear.bias is not None and rank == 0 else None
    if isinstance(linear, QuantLinear):
        return new_quant(linear, n, _packed_columns(linear, start, n, name), bias)
    return new_float(linear, linear.weight[:, start:start + n].clone(), bias)


def _packed_columns(linear: QuantLinear, start: int, n: int, name: str) -> dict[str, Tensor]:
    if start % BLOCK or n % BLOCK:  # check_divisible refuses these first
        raise FastDecodeError(f"{name}: inputs [{start}, {start + n}) do not fall on {BLOCK}-value blocks")
    if linear.layout not in ("q4", "q4s", "q4nl", "q4mx", "q8"):
        raise FastDecodeError(f"{name}: tensor parallelism splits the inputs of q4, q4s, q4nl, q4mx and q8 matrices, "
                              f"not {linear.layout}; run this model with tp=1")
    b0, nb = start // BLOCK, n // BLOCK
    if linear.layout in PANEL_LAYOUTS:
        vals, fields = from_panels(linear.layout, linear.packed())
        return to_panels(linear.layout, vals[:, start:start + n], {k: f[:, b0:b0 + nb] for k, f in fields.items()})
    scale = "d" if linear.layout == "q4nl" else "e"  # q4nl's and q4mx's per-block scales
    out = {scale: getattr(linear, scale)[:, b0:b0 + nb].clone()}
    # A row's blocks are stored in groups of 8 (formats.py): unpack, slice, regroup.
    out["qweight"] = pack_nibbles(unpack_q4(linear.qweight.cpu())[:, start:start + n]).to(_device(linear))
    return out


def new_float(old: nn.Module, weight: Tensor, bias: Optional[Tensor]) -> nn.Linear:
    """A linear of `old`'s class (nn.Linear for anything else, e.g. an embedding) over `weight` [N, K]."""
    cls = type(old) if isinstance(old, nn.Linear) else nn.Linear
    new = cls(weight.shape[1], weight.shape[0], bias=bias is not None, device="meta")
    new.weight = nn.Parameter(weight, requires_grad=False)
    if bias is not None:
        new.bias = nn.Parameter(bias, requires_grad=False)
    return new


def new_quant(old: _Packed, k: int, packed: dict[str, Tensor], bias: Optional[Tensor]) -> QuantLinear:
    """A QuantLinear over `packed` rows, in `old`'s layout (a QuantLinear or a QuantEmbedding)."""
    n = packed["qweight"].shape[0]
    new = QuantLinear(k, n, old.layout, bias=bias is not None, device="meta")
    for name, t in packed.items():
        setattr(new, name, t)  # registered buffers: assignment replaces them
    if bias is not None:
        new.bias = nn.Parameter(bias, requires_grad=False)
    new.native = old.native
    return new


def _device(linear: nn.Module) -> torch.device:
    return linear.qweight.device if isinstance(linear, _Packed) else linear.weight.device
