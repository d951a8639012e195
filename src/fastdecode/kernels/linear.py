"""Route the model's fp32 linears through the native GEMV kernel.

A transform on a built model, like quantization would be: it swaps each
`nn.Linear` for a `GemvLinear` that keeps the same Parameter (state dict
unchanged) and sets the output head's matmul. Only fp32 CPU models qualify;
anything else, or a failed kernel build, leaves the model as it was.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from . import load_gemv


def gemv_linear(x: Tensor, weight: Tensor, bias: Optional[Tensor] = None) -> Tensor:
    """F.linear for x [..., K] and weight [N, K], by the native kernel."""
    y = torch.ops.fastdecode.gemv(x.reshape(-1, x.shape[-1]), weight)  # [M, N]
    y = y.view(*x.shape[:-1], weight.shape[0])
    return y if bias is None else y + bias


class GemvLinear(nn.Linear):
    def forward(self, x: Tensor) -> Tensor:
        return gemv_linear(x, self.weight, self.bias)


def use_gemv(model: nn.Module) -> bool:
    """Swap the linears of an fp32 CPU model for the kernel; True if it did."""
    w = model.tok_embeddings.weight
    if w.device.type != "cpu" or w.dtype != torch.float32 or not load_gemv():
        return False
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if type(child) is nn.Linear:
                new = GemvLinear.__new__(GemvLinear)
                new.__dict__.update(child.__dict__)  # same Parameters, same hooks
                setattr(module, name, new)
    model.head_linear = gemv_linear
    return True


def use_stock_linear(model: nn.Module) -> None:
    """Undo use_gemv."""
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if type(child) is GemvLinear:
                new = nn.Linear.__new__(nn.Linear)
                new.__dict__.update(child.__dict__)
                setattr(module, name, new)
    model.head_linear = F.linear
