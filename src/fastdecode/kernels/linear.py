"""Float32 linears run by the native GEMV kernel (`torch.ops.fastdecode.gemv`, math.cpp).

`GemvLinear` and `GemvEmbedding` keep the same Parameters as the modules they
replace (state dict unchanged); `quant.transform.apply_kernels` swaps them in
on CPUs where the kernel measures faster than `F.linear`.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor, nn

from ..model.transformer import Embedding


def gemv_linear(x: Tensor, weight: Tensor, bias: Optional[Tensor] = None) -> Tensor:
    """F.linear for x [..., K] and weight [N, K], by the native kernel."""
    y = torch.ops.fastdecode.gemv(x.reshape(-1, x.shape[-1]), weight)  # [M, N]
    y = y.view(*x.shape[:-1], weight.shape[0])
    return y if bias is None else y + bias


class GemvLinear(nn.Linear):
    def forward(self, x: Tensor) -> Tensor:
        return gemv_linear(x, self.weight, self.bias)


class GemvEmbedding(Embedding):
    def as_linear(self, x: Tensor) -> Tensor:
        return gemv_linear(x, self.weight)


def swap_class(module: nn.Module, cls: type) -> nn.Module:
    """A `cls` instance sharing `module`'s state (Parameters, buffers, hooks)."""
    new = cls.__new__(cls)
    new.__dict__.update(module.__dict__)
    return new
