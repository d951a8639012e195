"""Modules whose weights stay block-quantized: `QuantLinear` and `QuantEmbedding`.

Both hold the packed tensors of `formats.py` as buffers (qweight, scales and,
for q4, mins), so the state dict is the packed form. `native` picks the C++
kernel or its PyTorch twin (`reference.qlinear`); the transform in
`transform.py` sets it once, at load.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor, nn

from . import reference
from .formats import dequantize, packed_shapes


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


class _Packed(nn.Module):
    def __init__(self, layout: str, n: int, k: int, scale_dtype: torch.dtype, device=None):
        super().__init__()
        self.layout, self.n, self.k = layout, n, k
        self.native = False
        dtypes = {"qweight": torch.uint8 if layout == "q4" else torch.int8, "scales": scale_dtype,
                  "mins": scale_dtype}
        for name, shape in packed_shapes(layout, n, k).items():
            self.register_buffer(name, torch.empty(shape, dtype=dtypes[name], device=device))
        if layout == "q8":
            self.mins = None

    def packed(self) -> dict[str, Tensor]:
        out = {"qweight": self.qweight, "scales": self.scales}
        if self.mins is not None:
            out["mins"] = self.mins
        return out

    def extra_repr(self) -> str:
        return f"{self.layout}, in={self.k}, out={self.n}, scales={self.scales.dtype}, native={self.native}"


class QuantLinear(_Packed):
    """y = x W^T (+ b) with W [out_features, in_features] in a q4 or q8 layout."""

    def __init__(self, in_features: int, out_features: int, layout: str, scale_dtype: torch.dtype,
                 bias: bool = False, device=None):
        super().__init__(layout, out_features, in_features, scale_dtype, device)
        self.in_features, self.out_features = in_features, out_features
        self.bias = nn.Parameter(torch.empty(out_features, device=device), requires_grad=False) if bias else None

    def forward(self, x: Tensor) -> Tensor:
        y = qlinear(x, self.qweight, self.scales, self.mins, self.native)
        return y if self.bias is None else y + self.bias


class QuantEmbedding(_Packed):
    """A token table in a q4 or q8 layout. Lookups dequantize only the rows asked
    for; `as_linear` is the tied output head, run by the matmul kernel on the
    packed table itself."""

    def __init__(self, num_embeddings: int, embedding_dim: int, layout: str, scale_dtype: torch.dtype,
                 dtype: torch.dtype = torch.float32, device=None):
        super().__init__(layout, num_embeddings, embedding_dim, scale_dtype, device)
        self.dtype = dtype  # of the rows returned

    def forward(self, tokens: Tensor) -> Tensor:
        return dequantize({name: t[tokens] for name, t in self.packed().items()}, self.dtype)

    def as_linear(self, x: Tensor) -> Tensor:
        return qlinear(x, self.qweight, self.scales, self.mins, self.native)
