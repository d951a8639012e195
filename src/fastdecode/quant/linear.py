"""Modules whose weights stay block-quantized: `QuantLinear`, `QuantEmbedding`, `SplitLinear`.

The first two hold the packed tensors of `formats.py` as buffers (the layout's
`LAYOUT_TENSORS`: qweight, scales and, for q4, mins; the other layouts' qweight,
qhigh, scales, sc, mn, d, dmin, e as they have them), so the state dict is the packed form.
`native` picks the C++ kernel or its PyTorch twin (`reference.qlinear`,
`reference.klinear`); the transform in `transform.py` sets it once, at load.
`SplitLinear` runs a fused group (wqkv, w13) whose parts have different
layouts: each part on its own kernel, outputs concatenated.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor, nn

from . import reference
from .formats import LAYOUT_TENSORS, dequantize_rows, packed_shapes, tensor_dtypes

# The op each layout's matmul calls (torch.ops.fastdecode.<op>).
LAYOUT_OPS = {"q4": "q4_linear", "q8": "q8_linear", "q4k": "q4k_linear", "q5k": "q5k_linear", "q6k": "q6k_linear",
              "q5": "q5_linear", "q5s": "q5s_linear", "q4s": "q4s_linear", "q4nl": "q4nl_linear",
              "q4xs": "q4xs_linear", "q4mx": "q4mx_linear"}


def qlinear(x: Tensor, qweight: Tensor, scales: Tensor, mins: Optional[Tensor], native: bool) -> Tensor:
    """x [..., K] -> [..., N] in x's dtype."""
    x2 = x.reshape(-1, x.shape[-1]).float()
    if native:
        if mins is None:
            y = torch.ops.fastdecode.q8_linear(x2, qweight, scales)
        else:
            y = torch.ops.fastdecode.q4_linear(x2, qweight, scales, mins)
    else:
        y = reference.qlinear(x2, qweight, scales, mins)
    return y.view(*x.shape[:-1], qweight.shape[0]).to(x.dtype)


def packed_linear(x: Tensor, layout: str, t: dict[str, Tensor], native: bool) -> Tensor:
    """x [..., K] -> [..., N] in x's dtype, for a packed group `t` of any layout."""
    if layout in ("q4", "q8"):
        return qlinear(x, t["qweight"], t["scales"], t.get("mins"), native)
    x2 = x.reshape(-1, x.shape[-1]).float()
    if native:
        y = getattr(torch.ops.fastdecode, LAYOUT_OPS[layout])(x2, *(t[name] for name in LAYOUT_TENSORS[layout]))
    else:
        y = reference.klinear(x2, t)
    return y.view(*x.shape[:-1], t["qweight"].shape[0]).to(x.dtype)


class _Packed(nn.Module):
    def __init__(self, layout: str, n: int, k: int, device=None):
        super().__init__()
        self.layout, self.n, self.k = layout, n, k
        self.native = False
        self.names = LAYOUT_TENSORS[layout]
        dtypes = tensor_dtypes(layout)
        for name, shape in packed_shapes(layout, n, k).items():
            self.register_buffer(name, torch.empty(shape, dtype=dtypes[name], device=device))
        if layout in ("q8", "q4s", "q4nl"):
            self.mins = None  # (tensor parallelism slices scales and mins alike)

    def packed(self) -> dict[str, Tensor]:
        return {name: getattr(self, name) for name in self.names}

    def extra_repr(self) -> str:
        return f"{self.layout}, in={self.k}, out={self.n}, native={self.native}"

    def matmul(self, x: Tensor) -> Tensor:
        if self.layout in ("q4", "q8"):
            return qlinear(x, self.qweight, self.scales, self.mins, self.native)
        return packed_linear(x, self.layout, self.packed(), self.native)


class QuantLinear(_Packed):
    """y = x W^T (+ b) with W [out_features, in_features] in one of the layouts of formats.py."""

    def __init__(self, in_features: int, out_features: int, layout: str, bias: bool = False, device=None):
        super().__init__(layout, out_features, in_features, device)
        self.in_features, self.out_features = in_features, out_features
        self.bias = nn.Parameter(torch.empty(out_features, device=device), requires_grad=False) if bias else None

    def forward(self, x: Tensor) -> Tensor:
        y = self.matmul(x)
        return y if self.bias is None else y + self.bias


class QuantEmbedding(_Packed):
    """A token table in a q4 or q8 layout. Lookups dequantize only the rows asked
    for; `as_linear` is the tied output head, run by the matmul kernel on the
    packed table itself."""

    def __init__(self, num_embeddings: int, embedding_dim: int, layout: str, dtype: torch.dtype = torch.float32,
                 device=None):
        super().__init__(layout, num_embeddings, embedding_dim, device)
        self.dtype = dtype  # of the rows returned

    def forward(self, tokens: Tensor) -> Tensor:
        return dequantize_rows(self.packed(), tokens, self.dtype)

    def as_linear(self, x: Tensor) -> Tensor:
        return self.matmul(x)


class SplitLinear(nn.Module):
    """A fused group (wqkv, w13) whose parts have different layouts: each part's
    QuantLinear on its own kernel, outputs concatenated along the last dimension,
    so the result is exactly that of running them separately."""

    def __init__(self, parts: list[QuantLinear], bias: bool = False, device=None):
        super().__init__()
        self.parts = nn.ModuleList(parts)
        self.in_features = parts[0].in_features
        self.out_features = sum(p.out_features for p in parts)
        self.bias = nn.Parameter(torch.empty(self.out_features, device=device), requires_grad=False) if bias else None

    def forward(self, x: Tensor) -> Tensor:
        y = torch.cat([p(x) for p in self.parts], dim=-1)
        return y if self.bias is None else y + self.bias

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}"
