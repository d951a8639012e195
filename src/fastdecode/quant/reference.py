"""The pure-PyTorch twins of the native quantized kernels.

Same math as `kernels/quant.cpp`: activations are quantized per row to int8
blocks of 32 (scale amax/127, round half to even), then multiplied with the
dequantized weights. Used on CPUs without AVX2, without a compiler, on other
devices, and in tests as the kernels' reference.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .formats import BLOCK, dequantize


def quantize_activations(x: Tensor) -> tuple[Tensor, Tensor]:
    """x [M, K] -> (q [M, K/32, 32] integer-valued float32, d [M, K/32])."""
    xb = x.float().reshape(x.shape[0], -1, BLOCK)
    d = xb.abs().amax(-1) / 127
    inv = torch.where(d > 0, 1 / d, torch.zeros_like(d))
    return torch.round(xb * inv[..., None]), d


def qlinear(x: Tensor, qweight: Tensor, scales: Tensor, mins: Tensor | None = None) -> Tensor:
    """x [M, K] float -> [M, N] float32, for a q4 (mins given) or q8 weight."""
    q, d = quantize_activations(x)
    xq = (q * d[..., None]).reshape(x.shape)
    t = {"qweight": qweight, "scales": scales}
    if mins is not None:
        t["mins"] = mins
    return torch.nn.functional.linear(xq, dequantize(t))
