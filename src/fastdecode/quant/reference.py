"""The pure-PyTorch twin of the native quantized kernels, bit for bit.

It repeats `kernels/quant_kernel.h` operation by operation: activations are
quantized per row to int8 blocks of 32 (scale amax/127, round half to even);
each block's integer dot product is split into 8 lanes, lane j the exact sum
of values 4j..4j+3 (exact in float32 too); each lane is multiplied by the
block's (w_scale * x_scale) and added to that lane of a float accumulator,
blocks in order; the lanes are summed once, in the kernel's tree order, then
the q4 minimum term (summed the kernel's way) is added. So native and
reference give identical outputs, hence identical tokens.

Used on CPUs without AVX2, without a compiler, and in tests. It is slow: one
pair of tensor ops per block.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from .formats import BLOCK, unpack_q4

_MAX_ELEMENTS = 1 << 24  # bounds the [rows, N, K/32, 8] lane sums per chunk of rows
_LANES = 8


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


def _min_term(mn: Tensor, xs: Tensor) -> Tensor:
    """sum_b mn[n, b] * xs[m, b] -> [M, N], as the kernel orders it: 8 blocks per step
    in lanes, the lanes' tree sum, then the remaining blocks one by one."""
    nb = mn.shape[1]
    full = nb // 8 * 8
    lanes = torch.zeros(xs.shape[0], mn.shape[0], 8, device=xs.device)
    for j in range(0, full, 8):
        lanes = lanes + mn[None, :, j:j + 8] * xs[:, None, j:j + 8]
    t = _hsum8(lanes)
    for b in range(full, nb):
        t = t + mn[None, :, b] * xs[:, None, b]
    return t


def qlinear(x: Tensor, qweight: Tensor, scales: Tensor, mins: Optional[Tensor] = None) -> Tensor:
    """x [M, K] float -> [M, N] float32, for a q4 (mins given) or q8 weight."""
    M, K = x.shape
    N, nb = qweight.shape[0], K // BLOCK
    q, d = quantize_activations(x)
    w = (unpack_q4(qweight) if mins is not None else qweight).float().reshape(N, nb, BLOCK)
    ws = scales.float()
    xs = d * q.sum(-1)  # [M, nb]: the activation block's scale times its integer sum
    rows = max(1, _MAX_ELEMENTS // (N * nb * _LANES))
    w = w.reshape(N, nb, _LANES, BLOCK // _LANES)
    out = []
    for m0 in range(0, M, rows):
        qm = q[m0:m0 + rows].reshape(-1, nb, _LANES, BLOCK // _LANES)
        part = torch.einsum("cbli,nbli->cnbl", qm, w)  # [c, N, nb, 8] lane sums, exact integers
        scale = ws[None] * d[m0:m0 + rows, None, :]  # [c, N, nb]
        lanes = torch.zeros(qm.shape[0], N, _LANES, device=x.device)
        for b in range(nb):
            lanes = lanes + part[:, :, b] * scale[:, :, b, None]
        y = _hsum8(lanes)
        if mins is not None:
            y = y + _min_term(mins.float(), xs[m0:m0 + rows])
        out.append(y)
    return torch.cat(out)


def klinear(x: Tensor, t: dict[str, Tensor]) -> Tensor:
    """x [M, K] float -> [M, N] float32 for a q4k, q5k, q6k, q5 or q5s weight group `t`, as the kernels compute it.

    q5 is q4 with a fifth bit, q5s q8 with values q - 16 (the kernel's lane is
    sum q x - 16 sum x, the same exact integer).

    q4k/q5k are q4 with each block's float32 scale d * sc and minimum -(dmin * mn)
    formed from the stored bytes (exact products, the values an fp32 q4 repack
    would store), so the operations are `qlinear`'s. q6k: lane j of block b is
    sc * (sum q x - 32 sum x) over values 4j..4j+3 (sc: the 16-value sub-block's
    scale, exact in int32), times (d * x_scale) per block, added lane by lane.
    """
    from .formats import kquant_scales, kquant_values

    M, K = x.shape
    N, nb = t["qweight"].shape[0], K // BLOCK
    q, d = quantize_activations(x)
    vals = kquant_values(t).float()
    q6 = "sc" in t and "mn" not in t
    if "scales" in t:  # q5 (as qlinear's q4) and q5s (as q8, with q - 16)
        w = (vals - (0 if "mins" in t else 16)).reshape(N, nb, _LANES, BLOCK // _LANES)
        ws, mins = t["scales"].float(), (t["mins"].float() if "mins" in t else None)
    elif q6:
        w = (vals - 32).reshape(N, nb, _LANES, BLOCK // _LANES)
        sc = t["sc"].float().reshape(N, nb, 2, 1).expand(N, nb, 2, _LANES // 2).reshape(N, nb, _LANES)
        ws = t["d"].float().repeat_interleave(8, dim=-1)  # [N, nb]: the super-block scale of each block
        mins = None
    else:
        w = vals.reshape(N, nb, _LANES, BLOCK // _LANES)
        ws, mins = kquant_scales(t)
    xs = d * q.sum(-1)
    rows = max(1, _MAX_ELEMENTS // (N * nb * _LANES))
    out = []
    for m0 in range(0, M, rows):
        qm = q[m0:m0 + rows].reshape(-1, nb, _LANES, BLOCK // _LANES)
        part = torch.einsum("cbli,nbli->cnbl", qm, w)  # exact integers
        if q6:
            part = part * sc[None]  # still exact: |sc * lane| < 2^22
        scale = ws[None] * d[m0:m0 + rows, None, :]
        lanes = torch.zeros(qm.shape[0], N, _LANES, device=x.device)
        for b in range(nb):
            lanes = lanes + part[:, :, b] * scale[:, :, b, None]
        y = _hsum8(lanes)
        if mins is not None:
            y = y + _min_term(mins, xs[m0:m0 + rows])
        out.append(y)
    return torch.cat(out)
