"""The pure-PyTorch twin of the native quantized kernels, bit for bit.

It repeats `kernels/quant_kernel.h` and `kernels/quant_panel.h` operation by
operation. Activations are quantized per row to int8 blocks of 32 (scale
amax/127, round half to even; for q4k, q5k and q6k one scale per 256 values, the amax
of the group of 8 blocks). For each (activation row m, weight row n) and block b,
I_b is the exact integer dot product of the block's weight values and int8
activations; then, in 8 float32 lanes, blocks in groups of 8 (lane j takes block
8 g + j; a last group of fewer blocks adds +0 in its empty lanes), groups in order:

    acc[j] = acc[j] + I_b * (w_scale_b * x_scale_b)
    macc[j] = macc[j] + w_min_b * (x_scale_b * sum(q_b))     (layouts with minima)

and y = hsum(acc) [+ hsum(macc)], hsum the kernels' tree order (q5, q5s, q4nl, q4xs, q4mx). q4, q8 and q4s,
whose rows the kernels read in panels of 16 (one row per lane), have no lanes
within a row: per output, blocks in order,

    acc = acc + I_b * (w_scale_b * x_scale_b);  macc = macc + w_min_b * (x_scale_b * sum(q_b))  (q4)
    y = acc [+ macc]

q4k, q5k and q6k, also in panels, scale in integers first: per output, groups g of 8
blocks in order, with exact int32 sums

    q4k, q5k: I_g = sum_b sc_b I_b, M_g = sum_b mn_b sum(q_b);
         acc = acc + float(I_g) * (d_g * x_scale_g);  acc = acc + float(M_g) * ((-dmin_g) * x_scale_g)
    q6k: I_g = sum_b I_b, I_b = sc_lo sum_lo (q - 32) x + sc_hi sum_hi (q - 32) x;
         acc = acc + float(I_g) * (d_g * x_scale_g)

float() rounding to nearest. The per-block integer sums are exact in float32
here (below 2^24), so their order does not matter.

Used on CPUs without AVX2, without a compiler, and in tests. It is slow.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from .formats import (BLOCK, GROUP, PANEL_LAYOUTS, TABLE_LAYOUTS, from_panels, kquant_values, layout_of,
                      nonlinear_scales, nonlinear_values, value_offset)

_MAX_ELEMENTS = 1 << 24  # bounds the [rows, N, K/32] products per chunk of rows
PER256 = ("q4k", "q5k", "q6k")  # the layouts whose activations take one scale per 256 values (kernels.h in_super)


def quantize_activations(x: Tensor, per256: bool = False) -> tuple[Tensor, Tensor]:
    """x [M, K] -> (q [M, K/32, 32] integer-valued float32, d [M, K/32]); per256 (K a multiple of
    256): each block's d is its group of 8 blocks' amax / 127."""
    xb = x.float().reshape(x.shape[0], -1, BLOCK)
    amax = xb.abs().amax(-1)
    if per256:
        amax = amax.reshape(x.shape[0], -1, GROUP).amax(-1).repeat_interleave(GROUP, dim=-1)
    d = amax / 127
    inv = torch.where(d > 0, 1 / d, torch.zeros_like(d))
    return torch.round(xb * inv[..., None]), d


def _hsum8(acc: Tensor) -> Tensor:
    """The kernel's horizontal sum of 8 lanes: ((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7))."""
    a = acc[..., :4] + acc[..., 4:]
    return (a[..., 0] + a[..., 2]) + (a[..., 1] + a[..., 3])


def _lanes(terms: Tensor) -> Tensor:
    """Per-block float terms [m, N, nb] -> the kernels' lane sum: 8 lanes, groups in order, hsum."""
    m, n, nb = terms.shape
    groups = -(-nb // GROUP)
    padded = torch.zeros(m, n, groups * GROUP, device=terms.device)
    padded[..., :nb] = terms
    padded = padded.reshape(m, n, groups, GROUP)
    acc = torch.zeros(m, n, GROUP, device=terms.device)
    for g in range(groups):
        acc = acc + padded[:, :, g]
    return _hsum8(acc)


def _isums(q: Tensor, w: Tensor, sc: Optional[Tensor]) -> Tensor:
    """I_b [m, N, nb], exact integers: q [m, nb, 32] activations, w [N, nb, 32] signed weights,
    sc [N, nb, 2] (q6k: the halves' integer scales) or None."""
    if sc is None:
        return torch.einsum("cbi,nbi->cnb", q, w)
    N, nb = sc.shape[:2]
    halves = torch.einsum("cbhi,nbhi->cnbh", q.reshape(*q.shape[:2], 2, 16), w.reshape(N, nb, 2, 16))
    return (halves * sc[None]).sum(-1)  # two exact products below 2^24, an exact sum


def _matmul(x: Tensor, w: Tensor, ws: Tensor, mins: Optional[Tensor], sc: Optional[Tensor]) -> Tensor:
    """The lane layouts' sums (module docstring): x [M, K]; w [N, nb, 32] signed integer weights
    (float32); ws [N, nb] float32 block scales; mins [N, nb] or None; sc as _isums'."""
    M = x.shape[0]
    N, nb = ws.shape
    q, d = quantize_activations(x)
    xs = d * q.sum(-1)  # [M, nb]: the activation block's scale times its integer sum
    rows = max(1, _MAX_ELEMENTS // (N * nb))
    out = []
    for m0 in range(0, M, rows):
        y = _lanes(_isums(q[m0:m0 + rows], w, sc) * (ws[None] * d[m0:m0 + rows, None, :]))
        if mins is not None:
            y = y + _lanes(mins[None] * xs[m0:m0 + rows, None, :])
        out.append(y)
    return torch.cat(out)


def qlinear(x: Tensor, qweight: Tensor, scales: Tensor, mins: Optional[Tensor] = None) -> Tensor:
    """x [M, K] float -> [M, N] float32, for a q4 (mins given) or q8 weight."""
    t = {"qweight": qweight, "scales": scales} | ({} if mins is None else {"mins": mins})
    return _panel_linear(x, "q8" if mins is None else "q4", t)


def _panel_linear(x: Tensor, layout: str, t: dict[str, Tensor]) -> Tensor:
    """A panel layout's matmul: its values and fields in row order, blocks (q4k, q5k, q6k: groups) in
    order (module docstring); q4s' values are q - 8, q6k's q - 32."""
    N, nb = t["qweight"].shape[0], x.shape[1] // BLOCK
    vals, f = from_panels(layout, t)
    w = vals.float().reshape(N, nb, BLOCK)
    if layout in PER256:
        return _groups_in_order(x, w - 32 if layout == "q6k" else w, f)
    mins = f["mins"].float() if "mins" in f else None
    return _blocks_in_order(x, w - 8 if layout == "q4s" else w, f["scales"].float(), mins)


def _blocks_in_order(x: Tensor, w: Tensor, ws: Tensor, mins: Optional[Tensor], sc: Optional[Tensor] = None) -> Tensor:
    """The panel layouts' sums (module docstring): x [M, K]; w [N, nb, 32] signed values; ws, mins
    [N, nb]; sc as _isums'."""
    M = x.shape[0]
    N, nb = ws.shape
    q, d = quantize_activations(x)
    xs = d * q.sum(-1)  # [M, nb]
    rows = max(1, _MAX_ELEMENTS // (N * nb))
    out = []
    for m0 in range(0, M, rows):
        terms = _isums(q[m0:m0 + rows], w, sc) * (ws[None] * d[m0:m0 + rows, None, :])
        acc = torch.zeros(terms.shape[:2], device=x.device)
        for b in range(nb):
            acc = acc + terms[..., b]
        if mins is not None:
            mterms = mins[None] * xs[m0:m0 + rows, None, :]
            macc = torch.zeros_like(acc)
            for b in range(nb):
                macc = macc + mterms[..., b]
            acc = acc + macc
        out.append(acc)
    return torch.cat(out)


def _groups_in_order(x: Tensor, w: Tensor, f: dict[str, Tensor]) -> Tensor:
    """q4k's, q5k's and q6k's sums (module docstring): x [M, K]; w [N, nb, 32] signed values; f their
    fields in row order (sc, d; q4k's and q5k's mn, dmin)."""
    M = x.shape[0]
    N, nb = w.shape[:2]
    q, d = quantize_activations(x, per256=True)
    xd = d[:, ::GROUP]  # [M, G]
    q6 = "mn" not in f
    sc = f["sc"].reshape(N, nb, 2).float() if q6 else None
    rows = max(1, _MAX_ELEMENTS // (N * nb))
    out = []
    for m0 in range(0, M, rows):
        qm, xm = q[m0:m0 + rows], xd[m0:m0 + rows, None, :]
        I = _isums(qm, w, sc).long()  # [m, N, nb]
        if not q6:
            I = I * f["sc"].long()[None]
            sums = (f["mn"].long()[None] * qm.sum(-1).long()[:, None, :]).reshape(*I.shape[:2], -1, GROUP).sum(-1)
            mins = sums.float() * (-f["dmin"].float()[None] * xm)
        terms = I.reshape(*I.shape[:2], -1, GROUP).sum(-1).float() * (f["d"].float()[None] * xm)
        acc = torch.zeros(terms.shape[:2], device=x.device)
        for g in range(terms.shape[-1]):
            acc = acc + terms[..., g]
            if not q6:
                acc = acc + mins[..., g]
        out.append(acc)
    return torch.cat(out)


def klinear(x: Tensor, t: dict[str, Tensor]) -> Tensor:
    """x [M, K] float -> [M, N] float32 for a q4k, q5k, q6k, q5, q5s, q4s, q4nl, q4xs or q4mx weight
    group `t`, as the kernels compute it.

    q5, q5s, q4nl, q4xs and q4mx sum in lanes (module docstring); the others, in panels, sum their
    blocks (the K-quants: groups of 8 blocks) in order (_panel_linear). q5 has 5-bit values, a
    scale and a minimum per block; q5s has values q - 16; q4nl values NONLINEAR[q] and its scales
    named d, q4xs the same with block scales d * sc, q4mx values MXFP4_VALUES[q] and block scales
    2^(e - 128).
    """
    N, K = t["qweight"].shape[0], x.shape[1]
    nb = K // BLOCK
    layout = layout_of(t)
    if layout in PANEL_LAYOUTS:
        return _panel_linear(x, layout, t)
    if layout in TABLE_LAYOUTS:
        return _matmul(x, nonlinear_values(t).float().reshape(N, nb, BLOCK), nonlinear_scales(t), None, None)
    vals = kquant_values(t).float().reshape(N, nb, BLOCK)  # q5 (with minima), q5s (values q - 16)
    mins = t["mins"].float() if "mins" in t else None
    return _matmul(x, vals - value_offset(t), t["scales"].float(), mins, None)
