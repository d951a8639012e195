"""The pure-PyTorch twin of the native quantized kernels, bit for bit.

It repeats `kernels/quant_kernel.h` operation by operation: activations are
quantized per row to int8 blocks of 32 (scale amax/127, round half to even);
each block's integer dot product is kept as 8 lanes of 4 products (exact in
float32); lanes accumulate block by block as acc + isum * (w_scale * x_scale),
are summed in the kernel's tree order, and the q4 minimum term is added last.
So native and reference give identical outputs, hence identical tokens.

Used on CPUs without AVX2, without a compiler, and in tests. It is slow: one
pair of tensor ops per block of K.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from .formats import BLOCK, unpack_q4

_MAX_ELEMENTS = 1 << 24  # bounds the [rows, N, K/32, 8] lane sums per chunk of rows


def quantize_activations(x: Tensor) -> tuple[Tensor, Tensor]:
    """x [M, K] -> (q [M, K/32, 32] integer-valued float32, d [M, K/32])."""
    xb = x.float().reshape(x.shape[0], -1, BLOCK)
    d = xb.abs().amax(-1) / 127
    inv = torch.where(d > 0, 1 / d, torch.zeros_like(d))
    return torch.round(xb * inv[..., None]), d


def _hsum8(acc: Tensor) -> Tensor:
    """The kernel's horizontal sum of 8 lanes: ((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7))."""
    a = acc[..., :4] + acc[..., 4:]
    return (a[..., 0] + a[..., 2]) + (a[..., 1] + a[..., 3])


def qlinear(x: Tensor, qweight: Tensor, scales: Tensor, mins: Optional[Tensor] = None) -> Tensor:
    """x [M, K] float -> [M, N] float32, for a q4 (mins given) or q8 weight."""
    M, K = x.shape
    N, nb = qweight.shape[0], K // BLOCK
    q, d = quantize_activations(x)
    w = (unpack_q4(qweight) if mins is not None else qweight).float().reshape(N, nb, 8, 4)
    ws = scales.float()
    xs = d * q.sum(-1)  # [M, nb]: the activation block's scale times its integer sum
    rows = max(1, _MAX_ELEMENTS // (N * nb * 8))
    out = []
    for m0 in range(0, M, rows):
        qm = q[m0:m0 + rows].reshape(-1, nb, 8, 4)
        isum = torch.einsum("cbli,nbli->cnbl", qm, w)  # [c, N, nb, 8], exact integers
        scale = ws[None] * d[m0:m0 + rows, None, :]  # [c, N, nb]
        acc = torch.zeros(qm.shape[0], N, 8, device=x.device)
        for b in range(nb):
            acc = acc + isum[:, :, b] * scale[:, :, b, None]
        y = _hsum8(acc)
        if mins is not None:
            t = torch.zeros_like(y)
            mn = mins.float()
            for b in range(nb):
                t = t + mn[None, :, b] * xs[m0:m0 + rows, None, b]
            y = y + t
        out.append(y)
    return torch.cat(out)
