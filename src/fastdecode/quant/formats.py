"""fastdecode's quantized weight layouts, and how GGUF types and float weights map onto them.

Every layout but q4, q8, q4s, q4k, q5k and q6k is row-major, one row per output feature, K (the
input dimension) in blocks of 32 values; those six keep their rows in panels of 16 (below).
The kernels (`kernels/quant_kernel.h`, `kernels/quant_panel.h`) read them as is.

**Panels (q4, q8, q4s, q4k, q5k, q6k).** Rows 16 p .. 16 p + r - 1 (r = 16, or N mod 16 for a last,
short panel) are stored together, block by block, so that one 64-byte unit holds 4
values of each of 16 rows and a 16-lane dot product leaves each row's block sum in
its own lane. The tensors keep their shapes; only the order within them changes.
Panel p starts where row 16 p would:

    qweight  [nb][U units u][r rows][4 bytes j]
             q4, q4s, q4k, q5k, q6k (units 0-3): the low nibble of byte j holds value 4u + j
             of the block, the high nibble value 16 + 4u + j (q5k, q6k: their low 4 bits);
             q5k's unit 4 (U = 5): bit 4h + s of byte j is the fifth bit of value 16h + 4s + j,
             so a block's bits lie in one run of 5 units and the kernel reads one stream;
             q8 (U = 8): byte j is value 4u + j
    qhigh    q6k: [nb][2 units h][r rows][4 bytes j]; bits 2s, 2s + 1 of byte j hold the
             top two bits of value 16 h + 4s + j
    each field [w][r], for a field of w per row: scales (and q4's mins), q4k's and q5k's sc
             and mn (w = nb), q6k's sc (w = K/16, in row order), the K-quants' d and q4k's
             and q5k's dmin (w = K/256)

A slice of whole panels (rows a multiple of 16 apart) is the same slice of rows, so
tensor-parallel row shards and fused matrices whose parts are multiples of 16 rows
concatenate as they are; anything else goes through `from_panels`.

**Lane order** (the other layouts: q5, q5s, q4nl, q4xs, q4mx). Within a row, the blocks go in
groups of 8 (the last group may hold g < 8), one block per 32-bit lane of the kernels' 8-lane
registers. A group's values are stored by sub-step: sub-step i (0..7) holds values
4i..4i+3 of each of the group's blocks, block after block (4 g bytes of 8-bit
values), so one 32-byte load gives the 8 lanes' next 4 values, and an integer
dot product summed over the 8 sub-steps leaves each block's full sum in its
own lane (`to_lanes` makes that order, `from_lanes` undoes it). Per-block scales stay in block order
(8 contiguous per group). The packings of that value sequence, per group of g
blocks (every group before the last is full, g = 8):

    nibbles:  4 chunks x 4g bytes; chunk c holds sub-step c in its low nibbles
              and sub-step c + 4 in its high ones (q4nl, q4mx, q5, q5s), so
              sub-steps 0-3 are each block's values 0..15
    plane5:   4g bytes; bit i of byte l is the fifth bit of sub-step i's byte l

Bits per weight count every byte stored:

    q4  (5 bpw; in panels, above)
        qweight uint8 [N, K/2]   nibbles
        scales, mins [N, K/32]   float16;  w = scale * q + min, q in 0..15
    q8  (8.5 bpw; in panels, above)
        qweight int8 [N, K]      bytes
        scales [N, K/32]         float16;  w = scale * q
    q4k (4.625 bpw; Q4_K's fields unpacked to bytes; K a multiple of 256; in panels)
        qweight uint8 [N, K/2]   nibbles
        sc, mn uint8 [N, K/32]   the 6-bit scale and min of each block of 32
        d, dmin float16 [N, K/256]    w = (d * sc) * q - (dmin * mn)
    q5k (5.625 bpw; Q5_K; K a multiple of 256; in panels) q4k's fields, and
        qweight uint8 [N, 5K/8]  nibbles and fifth bits (5 units a block); q in 0..31
    q6k (6.5625 bpw; Q6_K; K a multiple of 256; in panels)
        qweight uint8 [N, K/2]   the low 4 bits
        qhigh uint8 [N, K/4]     the top 2 bits
        sc int8 [N, K/16]        one scale per 16 values
        d float16 [N, K/256]     w = (d * sc) * (q - 32), q in 0..63
    q5  (6 bpw; Q5_1) nibbles [N, K/2] (row-major), float16 scales and mins [N, K/32], and
        qhigh uint8 [N, K/8]     plane5; w = scale * q + min, q in 0..31
    q5s (5.5 bpw; Q5_0) q5 without mins; w = scale * (q - 16)
    q4s (4.5 bpw; Q4_0; in panels) nibbles [N, K/2], float16 scales [N, K/32]; w = scale * (q - 8)
    q4nl (4.5 bpw; IQ4_NL) nibbles [N, K/2] (row-major) as indices, and
        d float16 [N, K/32]      w = d * NONLINEAR[q], q in 0..15
    q4xs (4.3125 bpw; IQ4_XS, 4.25; K a multiple of 256) q4nl's qweight, and
        sc int8 [N, K/32]        each block's 6-bit scale minus 32
        d float16 [N, K/256]     w = (d * sc) * NONLINEAR[q]
    q4mx (4.25 bpw; MXFP4) q4nl's qweight, and
        e uint8 [N, K/32]        each block's E8M0 exponent byte; w = 2^(e - 128) * MXFP4_VALUES[q]

GGUF types and what they become (`GGUF_LAYOUTS`); "exact" means dequantizing
the packed form gives bit-identical float32 values to dequantizing the file
(every packing is a permutation of the file's values plus its scales):

    Q4_0  -> q4s                                       exact (the kernels take the -8 through
                                                       the activations' block sums, as for q5s)
    Q4_1  -> q4, float16 scales and mins               exact
    Q4_K  -> q4k                                       exact (scales unpacked)
    Q5_K  -> q5k                                       exact
    Q6_K  -> q6k                                       exact
    Q8_0  -> q8, float16 scales                        exact
    Q5_0  -> q5s                                       exact
    Q5_1  -> q5                                        exact
    IQ4_NL -> q4nl                                     exact (the kernels look the indices up
                                                       in NONLINEAR)
    IQ4_XS -> q4xs                                     exact (scales unpacked; d * sc is exact)
    MXFP4 -> q4mx                                      exact (the exponent bytes as they are; the
                                                       kernels look the indices up in MXFP4_VALUES)
    F32, F16, BF16                                     float (or int8/int4 on request)
    Q2_K, Q3_K, IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S,  q8, not exact: decoded by the `gguf`
    IQ3_XXS, IQ3_S, TQ1_0, TQ2_0 (REQUANTIZED)         package, then each block of 32 rounded
                                                       to 8 bits (weights=int8's q8); no kernel
                                                       of ours runs their own blocks

`weights=int8` / `int4` quantize float weights to q8 (absmax per block, scale
rounded to float16 first) and q4 (min/max per block).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as T
from torch import Tensor

# Bump when a layout changes; cached conversions are rebuilt (5: lane order; 6: Q4_0 as q4s;
# 7: q4 in panels; 8: q8 in panels; 9: q4s in panels; 10: q4k and q6k in panels; 11: q5k in panels;
# 12: MXFP4 as q4mx, where it was requantized to q8).
LAYOUT_VERSION = 12
BLOCK = 32
GROUP = 8  # blocks per lane group (the kernels' 8 lanes)
PANEL = 16  # rows per panel (PANEL_LAYOUTS)
SUPER = 256  # the K-quants' super-blocks
# Every packed tensor's suffix, in the order the ops take them.
SUFFIXES = ("qweight", "qhigh", "scales", "mins", "sc", "mn", "d", "dmin", "e")
# Each layout's tensors in its op's argument order.
LAYOUT_TENSORS: dict[str, tuple[str, ...]] = {
    "q4": ("qweight", "scales", "mins"),
    "q8": ("qweight", "scales"),
    "q4k": ("qweight", "sc", "mn", "d", "dmin"),
    "q5k": ("qweight", "sc", "mn", "d", "dmin"),  # q4k's names; qweight holds 5 units a block
    "q6k": ("qweight", "qhigh", "sc", "d"),
    "q5": ("qweight", "qhigh", "scales", "mins"),
    "q5s": ("qweight", "qhigh", "scales"),
    "q4s": ("qweight", "scales"),
    "q4nl": ("qweight", "d"),  # d: IQ4_NL's per-block scale, by the file's name (a set no other layout has)
    "q4xs": ("qweight", "sc", "d"),
    "q4mx": ("qweight", "e"),  # e: MXFP4's exponent byte per block, by ggml's name (a set no other layout has)
}
# IQ4_NL's 16 values (ggml's kvalues_iq4nl): w = d * NONLINEAR[q].
NONLINEAR = (-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113)
# MXFP4's 16 values, E2M1's doubled (the gguf package's MXFP4.kvalues), so that they are integers;
# the block scale is halved to match: w = 2^(e - 128) * MXFP4_VALUES[q].
MXFP4_VALUES = (0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12)
TABLE_LAYOUTS = ("q4nl", "q4xs", "q4mx")  # whose nibbles index a table of 16 values
# Every layout's tensors have fixed dtypes.
_DTYPES = {"qhigh": torch.uint8, "scales": torch.float16, "mins": torch.float16, "sc": torch.uint8, "mn": torch.uint8,
           "d": torch.float16, "dmin": torch.float16, "e": torch.uint8}


@dataclass(frozen=True)
class Mapping:
    layout: Optional[str]  # a LAYOUT_TENSORS key, or None (dequantized to float)
    exact: bool


# MXFP4's type; None with a gguf package older than it (which cannot read such files either).
GGUF_MXFP4: Optional[T] = getattr(T, "MXFP4", None)
GGUF_LAYOUTS: dict[T, Mapping] = {
    T.Q4_0: Mapping("q4s", True), T.Q4_1: Mapping("q4", True), T.Q4_K: Mapping("q4k", True),
    T.Q8_0: Mapping("q8", True), T.Q5_0: Mapping("q5s", True),
    T.Q5_1: Mapping("q5", True), T.Q5_K: Mapping("q5k", True), T.Q6_K: Mapping("q6k", True),
    T.IQ4_NL: Mapping("q4nl", True), T.IQ4_XS: Mapping("q4xs", True),
    **({GGUF_MXFP4: Mapping("q4mx", True)} if GGUF_MXFP4 is not None else {}),
}


# Types loaded as q8 (requantize_gguf): the error of 8-bit rounding is small against theirs, and
# q8's kernels are fast everywhere; the cost is memory, 8.5 bits a weight against their 1.6-3.4.
REQUANTIZED: tuple[T, ...] = tuple(
    t for t in (getattr(T, name, None) for name in ("Q2_K", "Q3_K", "IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S",
                                                    "IQ3_XXS", "IQ3_S", "TQ1_0", "TQ2_0"))
    if t is not None)


def layout_of(tensors: dict[str, Tensor]) -> str:
    """The layout of a packed tensor group, from which tensors it has (and qweight's dtype, or for
    q4k and q5k, its bytes a block: 16 and 20)."""
    for layout in ("q4k", "q6k", "q5", "q5s", "q4", "q4nl", "q4xs", "q4mx"):
        if set(LAYOUT_TENSORS[layout]) == set(tensors):
            if layout == "q4k" and tensors["qweight"].shape[-1] == 20 * tensors["sc"].shape[-1]:
                return "q5k"
            return layout
    return "q4s" if tensors["qweight"].dtype == torch.uint8 else "q8"


def tensor_dtypes(layout: str) -> dict[str, torch.dtype]:
    """Each tensor's dtype in `layout`."""
    out = {}
    for name in LAYOUT_TENSORS[layout]:
        if name == "qweight":
            out[name] = torch.int8 if layout == "q8" else torch.uint8
        else:
            out[name] = torch.int8 if (layout, name) in (("q6k", "sc"), ("q4xs", "sc")) else _DTYPES[name]
    return out


def packed_k(layout: str, tensors: dict[str, Tensor]) -> int:
    """The inner dimension K of a packed group."""
    return tensors["qweight"].shape[-1] * BLOCK // (4 * _UNITS.get(layout, 4))


def packed_shapes(layout: str, n: int, k: int) -> dict[str, tuple[int, ...]]:
    nb = k // BLOCK
    if layout == "q4":
        return {"qweight": (n, k // 2), "scales": (n, nb), "mins": (n, nb)}
    if layout == "q8":
        return {"qweight": (n, k), "scales": (n, nb)}
    if layout == "q4s":
        return {"qweight": (n, k // 2), "scales": (n, nb)}
    if layout == "q4nl":
        return {"qweight": (n, k // 2), "d": (n, nb)}
    if layout == "q4mx":
        return {"qweight": (n, k // 2), "e": (n, nb)}
    if layout in ("q5", "q5s"):
        out = {"qweight": (n, k // 2), "qhigh": (n, k // 8), "scales": (n, nb), "mins": (n, nb)}
        if layout == "q5s":
            del out["mins"]
        return out
    ns = k // SUPER
    if layout == "q4xs":
        return {"qweight": (n, k // 2), "sc": (n, nb), "d": (n, ns)}
    if layout == "q6k":
        return {"qweight": (n, k // 2), "qhigh": (n, k // 4), "sc": (n, k // 16), "d": (n, ns)}
    return {"qweight": (n, 5 * k // 8 if layout == "q5k" else k // 2), "sc": (n, nb), "mn": (n, nb), "d": (n, ns),
            "dmin": (n, ns)}


def bits_per_weight(layout: str, k: int = 4096) -> float:
    """Bytes stored per row, times 8, over K."""
    shapes = packed_shapes(layout, 1, k)
    dtypes = tensor_dtypes(layout)
    nbytes = sum(int(np.prod(s)) * dtypes[name].itemsize for name, s in shapes.items())
    return 8 * nbytes / k


# -- the lane order ---------------------------------------------------------------------------

def _positions(nb: int, device) -> Tensor:
    """Entry r: where the lane order stores row value r (value v of block b), from tensor
    arithmetic rather than a cached tensor, so that traced and exported graphs hold no constant."""
    r = torch.arange(nb * BLOCK, device=device)
    b, v = r // BLOCK, r % BLOCK
    G, j = b // GROUP, b % GROUP
    g = torch.clamp(nb - GROUP * G, max=GROUP)
    return GROUP * BLOCK * G + 4 * g * (v // 4) + 4 * j + v % 4


def _by_group(seq: Tensor, fn) -> Tensor:
    """fn over each group of a lane-ordered row [..., K], viewed as [..., groups, 8 sub-steps, 4 g],
    returning [..., groups, parts, 4 g] bytes; the groups' bytes concatenated [..., bytes]."""
    lead, nb = seq.shape[:-1], seq.shape[-1] // BLOCK
    full, g = nb // GROUP, nb % GROUP
    out = []
    if full:
        out.append(fn(seq[..., :full * GROUP * BLOCK].reshape(*lead, full, 8, 4 * GROUP)).reshape(*lead, -1))
    if g:
        out.append(fn(seq[..., full * GROUP * BLOCK:].reshape(*lead, 1, 8, 4 * g)).reshape(*lead, -1))
    return torch.cat(out, -1) if len(out) > 1 else out[0]


def _from_groups(packed: Tensor, nb: int, parts: int, fn) -> Tensor:
    """The inverse of _by_group: packed [..., bytes] with `parts` x 4 g bytes per group;
    fn([..., groups, parts, 4 g]) -> [..., groups, 8, 4 g]; the lane-ordered row [..., K]."""
    lead = packed.shape[:-1]
    full, g = nb // GROUP, nb % GROUP
    out = []
    split = full * parts * 4 * GROUP
    if full:
        out.append(fn(packed[..., :split].reshape(*lead, full, parts, 4 * GROUP)).reshape(*lead, -1))
    if g:
        out.append(fn(packed[..., split:].reshape(*lead, 1, parts, 4 * g)).reshape(*lead, -1))
    return torch.cat(out, -1) if len(out) > 1 else out[0]


def to_lanes(values: Tensor) -> Tensor:
    """Values [..., K] in row order -> the lane order (module docstring): within each group of
    g blocks, [g blocks, 8, 4 values] becomes [8, g blocks, 4 values]. A transposed copy:
    gathering every value through an index tensor took 2.3 s of a 1B model's conversion."""
    lead, nb = values.shape[:-1], values.shape[-1] // BLOCK
    full, g = nb // GROUP, nb % GROUP
    # Bytes move as int32 words of 4 values: a copy of 4-byte runs is ~4x slower per byte.
    word = (values.element_size() == 1 and values.is_contiguous() and values.shape[-1] == nb * BLOCK
            and values.storage_offset() % 4 == 0)
    # [..., K / 4, 1 word of 4 values] or [..., K / 4, 4 values]
    x = values.view(torch.int32).unsqueeze(-1) if word else values[..., :nb * BLOCK].unflatten(-1, (-1, 4))
    out = []
    if full:
        y = x[..., :full * GROUP * 8, :].reshape(*lead, full, GROUP, 8, -1)
        out.append(y.transpose(-3, -2).reshape(*lead, -1))
    if g:
        y = x[..., full * GROUP * 8:nb * 8, :].reshape(*lead, g, 8, -1)
        out.append(y.transpose(-3, -2).reshape(*lead, -1))
    seq = torch.cat(out, -1) if len(out) > 1 else out[0]
    return seq.view(values.dtype) if word else seq


def from_lanes(seq: Tensor) -> Tensor:
    return seq[..., _positions(seq.shape[-1] // BLOCK, seq.device)]


def _shifts(n: int, step: int, device) -> Tensor:
    return (step * torch.arange(n, dtype=torch.uint8, device=device)).reshape(n, 1)


def pack_nibbles(values: Tensor) -> Tensor:
    """Values 0..15 [..., K] (row order) -> nibbles uint8 [..., K/2]."""
    seq = to_lanes(values.to(torch.uint8))
    return _by_group(seq, lambda s: s[..., :4, :] | (s[..., 4:, :] << 4))


def unpack_q4(qweight: Tensor) -> Tensor:
    """Nibbles [..., K/2] -> values 0..15 [..., K] (uint8, row order)."""
    nb = qweight.shape[-1] * 2 // BLOCK
    return from_lanes(_from_groups(qweight, nb, 4, lambda b: torch.cat([b & 0x0F, b >> 4], dim=-2)))


def pack_plane5(bits: Tensor) -> Tensor:
    """Fifth bits 0/1 [..., K] (row order) -> plane5 [..., K/8]."""
    seq = to_lanes(bits.to(torch.uint8))
    return _by_group(seq, lambda s: (s << _shifts(8, 1, s.device)).sum(-2, keepdim=True).to(torch.uint8))


def unpack_high(qhigh: Tensor, nb: int) -> Tensor:
    """plane5 [..., K/8] -> the fifth bits [..., K] (uint8 0/1, row order)."""
    return from_lanes(_from_groups(qhigh, nb, 1, lambda b: (b >> _shifts(8, 1, b.device)) & 1))


# -- panels (q4, q8, q4s, q4k, q5k, q6k) -------------------------------------------------------

PANEL_LAYOUTS = ("q4", "q8", "q4s", "q4k", "q5k", "q6k")
_UNITS = {"q4": 4, "q8": 8, "q4s": 4, "q4k": 4, "q5k": 5, "q6k": 4}  # qweight's 4-byte units per row and block
_UNIT_TENSORS = ("qweight", "qhigh")  # stored by units; the other tensors are fields


def _panel_runs(n: int) -> list[tuple[int, int, int]]:
    """(first row, panels, rows per panel) of the full panels of n rows, and of a short last one."""
    full, r = divmod(n, PANEL)
    return ([(0, full, PANEL)] if full else []) + ([(full * PANEL, 1, r)] if r else [])


def _units(layout: str, values: Tensor) -> dict[str, Tensor]:
    """Values [N, K] in row order -> each row's blocks as 4-byte units [N, nb, U, 4] of qweight (and
    q6k's qhigh); the module docstring says which value each byte holds."""
    n, k = values.shape
    if layout == "q8":
        return {"qweight": values.to(torch.int8).reshape(n, k // BLOCK, 8, 4)}
    v = values.to(torch.uint8).reshape(n, k // BLOCK, 2, 4, 4)  # [.., half h, s, j]: value 16 h + 4 s + j
    out = {"qweight": (v[:, :, 0] & 0x0F) | ((v[:, :, 1] & 0x0F) << 4)}
    if layout == "q6k":  # the top bits of values 16 h + 4 s + j at bits 2 s of unit h's byte j
        top = v >> 4
        out["qhigh"] = top[:, :, :, 0] | (top[:, :, :, 1] << 2) | (top[:, :, :, 2] << 4) | (top[:, :, :, 3] << 6)
    if layout == "q5k":  # unit 4: the fifth bit of value 16 h + 4 s + j at bit 4 h + s of byte j
        shifts = torch.arange(8, dtype=torch.uint8, device=v.device)[:, None]
        top = ((v >> 4).reshape(n, k // BLOCK, 8, 4) << shifts).sum(-2, dtype=torch.uint8)
        out["qweight"] = torch.cat([out["qweight"], top[:, :, None]], dim=2)
    return out


def _values(layout: str, units: dict[str, Tensor]) -> Tensor:
    """The inverse of _units: units [..., nb, U, 4] -> values [..., K] in row order."""
    q = units["qweight"]
    lead = q.shape[:-3]
    if layout == "q8":
        return q.reshape(*lead, -1)
    top = None
    if layout == "q5k":
        q, top = q[..., :4, :], q[..., 4, :]  # top [..., nb, j]
    v = torch.stack([q & 0x0F, q >> 4], dim=-3)  # [..., nb, half, s, j]
    if top is not None:
        bits = torch.stack([(top >> (4 * half + s)) & 1 for half in range(2) for s in range(4)], dim=-2)
        v = v | (bits.reshape(v.shape) << 4)
    if layout == "q6k":
        h = units["qhigh"]  # [..., nb, half, j]
        v = v | (torch.stack([(h >> (2 * s)) & 3 for s in range(4)], dim=-2) << 4)
    return v.reshape(*lead, -1)


def to_panels(layout: str, values: Tensor, fields: dict[str, Tensor]) -> dict[str, Tensor]:
    """A panel layout's tensors from values [N, K] and fields [N, w], all in row order (q4: scales
    and mins; q8, q4s: scales; q4k, q5k: sc, mn per block, d, dmin per 256 values; q6k: sc per 16
    values, d per 256)."""
    units = _units(layout, values)
    n, nb = values.shape[0], values.shape[1] // BLOCK
    out: dict[str, list[Tensor]] = {name: [] for name in (*units, *fields)}
    for r0, count, r in _panel_runs(n):
        rows = slice(r0, r0 + count * r)
        for name, u in units.items():
            out[name].append(u[rows].reshape(count, r, nb, -1, 4).permute(0, 2, 3, 1, 4).reshape(-1))
        for name, f in fields.items():
            out[name].append(f[rows].reshape(count, r, -1).transpose(1, 2).reshape(-1))
    shapes = {name: (n, u[0].numel()) for name, u in units.items()} | {name: tuple(f.shape) for name, f in fields.items()}
    return {name: torch.cat(parts).reshape(shapes[name]) for name, parts in out.items()}


def _blocks(layout: str, t: dict[str, Tensor]) -> int:
    return t["qweight"].shape[1] // (4 * _UNITS[layout])


def from_panels(layout: str, t: dict[str, Tensor]) -> tuple[Tensor, dict[str, Tensor]]:
    """The inverse of to_panels: (values [N, K], fields [N, w]) in row order."""
    n, nb = t["qweight"].shape[0], _blocks(layout, t)
    out: dict[str, list[Tensor]] = {name: [] for name in t}
    for r0, count, r in _panel_runs(n):
        for name, x in t.items():
            w = x.shape[1]
            part = x.reshape(-1)[r0 * w:(r0 + count * r) * w]
            if name in _UNIT_TENSORS:  # [count, nb, U, r, 4] -> [count r, nb, U, 4]
                out[name].append(part.reshape(count, nb, -1, r, 4).permute(0, 3, 1, 2, 4).reshape(count * r, nb, -1, 4))
            else:
                out[name].append(part.reshape(count, w, r).transpose(1, 2).reshape(count * r, w))
    cat = {name: torch.cat(parts) for name, parts in out.items()}
    values = _values(layout, {name: cat.pop(name) for name in _UNIT_TENSORS if name in cat})
    return values, cat


def panel_rows(layout: str, t: dict[str, Tensor], rows: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
    """Rows `rows` [...] of a matrix in panels, gathered by tensor arithmetic (an embedding
    lookup in traced graphs): (values [..., K], fields [..., w])."""
    n, nb = t["qweight"].shape[0], _blocks(layout, t)
    rows = rows.long()
    i = rows % PANEL
    first = rows - i  # the panel's first row
    r = torch.clamp(n - first, max=PANEL)  # its rows
    ar = lambda m: torch.arange(m, device=rows.device)  # noqa: E731
    e = lambda x: x[..., None, None, None]  # noqa: E731  [...] -> [..., block, unit, byte]
    units, fields = {}, {}
    for name, x in t.items():
        w = x.shape[1]
        if name in _UNIT_TENSORS:  # byte j of unit u of block b: first * w + b * 4 U r + u * 4 r + 4 i + j
            U = w // (4 * nb)
            at = e(first * w + 4 * i) + e(r) * (4 * U * ar(nb)[:, None, None] + 4 * ar(U)[:, None]) + ar(4)
            units[name] = x.reshape(-1)[at]
        else:  # entry c: first * w + c r + i
            fields[name] = x.reshape(-1)[(first * w + i)[..., None] + r[..., None] * ar(w)]
    return _values(layout, units), fields


# -- GGUF blocks -> layouts -------------------------------------------------------------------

def _f16(b: np.ndarray, at: int) -> np.ndarray:
    return np.ascontiguousarray(b[:, at:at + 2]).view(np.float16)  # [blocks, 1]


def _nibble_values(qs: np.ndarray) -> np.ndarray:
    """GGUF's 16 bytes per block of 32 (low nibbles: values 0..15, high: 16..31) -> [blocks, 32]."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=-1)


def _fifth_bits(qh: np.ndarray) -> np.ndarray:
    """Q5_0/Q5_1's qh, a little-endian uint32 per block, bit l for value l -> [blocks, 32]."""
    return ((qh[:, :, None] >> np.arange(8, dtype=np.uint8)) & 1).reshape(-1, BLOCK)


def _q4_k_fields(b: np.ndarray) -> dict[str, np.ndarray]:
    """Q4_K/Q5_K super-blocks (with Q5_K's qh cut out): the 6-bit scales and mins of
    the 8 blocks unpacked to a byte each, d, dmin, and the values' low 4 bits [S, 256]
    (chunk c of 32 bytes holds block 2c in its low nibbles and 2c + 1 in its high ones)."""
    s = b[:, 4:16]
    lo, mid, hi = s[:, 0:4], s[:, 4:8], s[:, 8:12]
    sc = np.concatenate([lo & 63, (hi & 0x0F) | ((lo >> 6) << 4)], axis=-1)
    mn = np.concatenate([mid & 63, (hi >> 4) | ((mid >> 6) << 4)], axis=-1)
    qs = b[:, 16:144].reshape(-1, 4, 1, BLOCK)
    low = np.concatenate([qs & 0x0F, qs >> 4], axis=2).reshape(-1, SUPER)
    return {"low": low, "sc": sc, "mn": mn, "d": _f16(b, 0), "dmin": _f16(b, 2)}


def _q6_k_values(b: np.ndarray) -> np.ndarray:
    """Q6_K's values 0..63 [S, 256]: value 128 h + 32 g + l has its low 4 bits in ql byte
    64 h + 32 (g % 2) + l (nibble g // 2), its top two in bits 2 g of qh byte 32 h + l."""
    ql = b[:, 0:128].reshape(-1, 2, 2, BLOCK)
    qh = b[:, 128:192].reshape(-1, 2, 1, BLOCK)
    low = np.concatenate([ql & 0x0F, ql >> 4], axis=2)  # [S, h, g, l]
    top = (qh >> (2 * np.arange(4, dtype=np.uint8)).reshape(4, 1)) & 3
    return (low | (top << 4)).reshape(-1, SUPER)


def _iq4_xs_fields(b: np.ndarray) -> dict[str, np.ndarray]:
    """IQ4_XS super-blocks: d, the 8 blocks' 6-bit scales minus 32 (int8), and the values'
    indices [S, 256] (block j's 16 bytes hold its values 0..15 low, 16..31 high)."""
    high = np.ascontiguousarray(b[:, 2:4]).view(np.uint16)  # [S, 1]: bits 2j, 2j + 1 for block j
    j = np.arange(8)
    low = (b[:, 4 + j // 2] >> (4 * (j % 2)).astype(np.uint8)) & 0x0F
    top = ((high >> (2 * j).astype(np.uint16)) & 3).astype(np.uint8)
    sc = (low | (top << 4)).astype(np.int8) - np.int8(32)
    values = _nibble_values(b[:, 8:136].reshape(-1, 16)).reshape(-1, SUPER)  # block j: 16 bytes, as Q4_0's
    return {"values": values, "sc": sc, "d": _f16(b, 0)}


def _gguf_fields(b: np.ndarray, qtype: T, n: int) -> dict[str, np.ndarray]:
    """A GGUF tensor's blocks -> its values [n, K] and scale fields [n, *] (numpy)."""
    if qtype == GGUF_MXFP4:  # the exponent byte, then Q4_0's nibble order; the nibbles index MXFP4_VALUES
        out = {"values": _nibble_values(b[:, 1:17]), "e": b[:, 0:1]}
    elif qtype in (T.Q4_0, T.Q4_1, T.Q8_0, T.Q5_0, T.Q5_1, T.IQ4_NL):
        if qtype == T.Q4_0:
            out = {"values": _nibble_values(b[:, 2:18]), "scales": _f16(b, 0)}
        elif qtype == T.IQ4_NL:  # Q4_0's bytes; the nibbles index NONLINEAR
            out = {"values": _nibble_values(b[:, 2:18]), "d": _f16(b, 0)}
        elif qtype == T.Q4_1:
            out = {"values": _nibble_values(b[:, 4:20]), "scales": _f16(b, 0), "mins": _f16(b, 2)}
        elif qtype == T.Q8_0:
            out = {"values": np.ascontiguousarray(b[:, 2:34]).view(np.int8), "scales": _f16(b, 0)}
        else:
            at = 2 if qtype == T.Q5_0 else 4
            values = _nibble_values(b[:, at + 4:at + 20]) | (_fifth_bits(b[:, at:at + 4]) << 4)
            out = {"values": values, "scales": _f16(b, 0)}
            if qtype == T.Q5_1:
                out["mins"] = _f16(b, 2)
    elif qtype == T.IQ4_XS:
        out = _iq4_xs_fields(b)
    elif qtype in (T.Q4_K, T.Q5_K):
        if qtype == T.Q5_K:
            qh = b[:, 16:48]
            b = b[:, np.r_[0:16, 48:176]]
        f = _q4_k_fields(b)
        values = f.pop("low")
        if qtype == T.Q5_K:  # bit j of qh byte l: the fifth bit of value 32 j + l
            bits = (qh[:, None, :] >> np.arange(8, dtype=np.uint8).reshape(8, 1)) & 1
            values = values | (bits.reshape(-1, SUPER) << 4)
        out = {"values": values, **f}
    else:  # Q6_K
        out = {"values": _q6_k_values(b), "sc": b[:, 192:208].view(np.int8), "d": _f16(b, 208)}
    return {name: np.ascontiguousarray(a).reshape(n, -1) for name, a in out.items()}


def pack_fields(layout: str, values: Tensor, fields: dict[str, Tensor]) -> dict[str, Tensor]:
    """A layout's tensors from a matrix's values [n, K] (row order; q8 signed, the others
    unsigned as stored) and its scale fields in block order (q6k: sc per 16 values)."""
    if layout in PANEL_LAYOUTS:
        names = [name for name in LAYOUT_TENSORS[layout] if name not in _UNIT_TENSORS]
        return to_panels(layout, values, {name: fields[name] for name in names})
    out = dict(fields)
    out["qweight"] = pack_nibbles(values & 0x0F)
    if layout in ("q5", "q5s"):
        out["qhigh"] = pack_plane5(values >> 4)
    return {name: out[name].contiguous() for name in LAYOUT_TENSORS[layout]}


# The file's bytes converted at a time. Unpacking holds ~8x its input in temporaries (Q6_K: a
# 13 MiB ffn_down took ~100 MB above its output), so a chunk bounds them at ~16 MB.
_PACK_BYTES = 2 << 20


def pack_gguf(raw: np.ndarray, qtype: T, n: int, k: int, order: Optional[np.ndarray] = None
              ) -> Optional[dict[str, Tensor]]:
    """The packed tensors of a GGUF tensor [n, k] of type `qtype`, its rows taken in `order` (a
    permutation of range(n)) if given, or None if it has no native layout."""
    mapping = GGUF_LAYOUTS.get(qtype)
    if mapping is None or mapping.layout is None or k % BLOCK:
        return None
    if mapping.layout in ("q4k", "q5k", "q6k", "q4xs") and k % SUPER:
        return None
    block_bytes = GGML_QUANT_SIZES[qtype][1]
    rows = raw.reshape(n, -1) if order is None else raw.reshape(n, -1)[order]

    def part(r0: int, r1: int) -> dict[str, Tensor]:
        f = _gguf_fields(rows[r0:r1].reshape(-1, block_bytes), qtype, r1 - r0)
        values = torch.from_numpy(f.pop("values"))
        return pack_fields(mapping.layout, values, {name: torch.from_numpy(a) for name, a in f.items()})
    return _by_panels(n, rows.shape[1], part)


def _by_panels(n: int, row_bytes: int, part: Callable[[int, int], dict[str, Tensor]]) -> dict[str, Tensor]:
    """Packed tensors [n, ...] assembled from part(r0, r1), rows r0..r1 packed, over chunks of
    whole panels of about _PACK_BYTES (rows of `row_bytes`), so that a conversion's temporaries
    stay that small."""
    step = PANEL * max(1, _PACK_BYTES // (PANEL * row_bytes))
    out: dict[str, Tensor] = {}
    for r0 in range(0, n, step):
        r1 = min(n, r0 + step)
        chunk = part(r0, r1)
        if not out:
            out = {name: torch.empty((n, *t.shape[1:]), dtype=t.dtype) for name, t in chunk.items()}
        for name, t in chunk.items():
            out[name][r0:r1] = t
    return out


def requantize_gguf(raw: np.ndarray, qtype: T, n: int, k: int, decode, order: Optional[np.ndarray] = None
                    ) -> Optional[dict[str, Tensor]]:
    """A REQUANTIZED GGUF tensor [n, k] as q8 (`quantize`), its rows decoded to float32 by
    `decode` ([blocks, block_bytes] uint8 -> [blocks, block_size]) a few panels at a time (taken
    in `order` if given), or None if k is not a multiple of 32."""
    if k % BLOCK:
        return None
    rows = raw.reshape(n, -1) if order is None else raw.reshape(n, -1)[order]
    block_bytes = GGML_QUANT_SIZES[qtype][1]

    def part(r0: int, r1: int) -> dict[str, Tensor]:
        values = decode(np.ascontiguousarray(rows[r0:r1]).reshape(-1, block_bytes))
        return quantize(torch.from_numpy(np.ascontiguousarray(values)).reshape(r1 - r0, k), "q8")
    return _by_panels(n, 4 * k, part)  # chunks sized by the float32 rows


# -- float -> layouts ------------------------------------------------------------------------

class BlockSizeError(ValueError):
    """A matrix's inner dimension is not a multiple of the block size."""


def quantize(w: Tensor, layout: str) -> dict[str, Tensor]:
    """Quantize a float matrix [N, K] (K a multiple of 32) to `layout` with float16 scales, a few
    panels at a time (a 200k-token embedding's float32 temporaries would be GBs)."""
    n, k = w.shape
    if k % BLOCK:
        raise BlockSizeError(f"inner dimension {k} is not a multiple of {BLOCK}")
    return _by_panels(n, 4 * k, lambda r0, r1: _quantize_rows(w[r0:r1], layout))


def _quantize_rows(w: Tensor, layout: str) -> dict[str, Tensor]:
    n, k = w.shape
    wb = w.detach().to("cpu", torch.float32).reshape(n, k // BLOCK, BLOCK)
    if layout == "q8":
        d = (wb.abs().amax(-1) / 127).to(torch.float16)
        inv = torch.where(d > 0, 1 / d.float(), torch.zeros_like(d, dtype=torch.float32))
        q = torch.round(wb * inv[..., None]).clamp(-127, 127).to(torch.int8)
        return to_panels("q8", q.reshape(n, k), {"scales": d})
    lo, hi = wb.amin(-1), wb.amax(-1)
    m = lo.to(torch.float16)
    d = ((hi - m.float()) / 15).to(torch.float16)
    inv = torch.where(d > 0, 1 / d.float(), torch.zeros_like(d, dtype=torch.float32))
    q = torch.round((wb - m.float()[..., None]) * inv[..., None]).clamp(0, 15).to(torch.uint8)
    return to_panels("q4", q.reshape(n, k), {"scales": d, "mins": m})


# -- layouts -> float (the reference) --------------------------------------------------------

def kquant_values(t: dict[str, Tensor]) -> Tensor:
    """The unsigned integer values of a q5/q5s/q4nl/q4xs/q4mx group [..., K] (uint8, row
    order; q4nl's and q4xs' are indices into NONLINEAR, q4mx's into MXFP4_VALUES)."""
    vals = unpack_q4(t["qweight"])
    nb = vals.shape[-1] // BLOCK
    if "qhigh" in t:
        vals = vals | (unpack_high(t["qhigh"], nb) << 4)
    return vals


def kquant_scales(t: dict[str, Tensor]) -> tuple[Tensor, Optional[Tensor]]:
    """q4k/q5k (their fields in row order): float32 (d * sc, -(dmin * mn)) per block of 32 [..., K/32];
    q6k (its fields in row order): (d * sc per 16 values [..., K/16], None)."""
    q6 = "mn" not in t
    d = t["d"].float().repeat_interleave(16 if q6 else 8, dim=-1)
    scale = d * t["sc"].float()
    return scale, None if q6 else -(t["dmin"].float().repeat_interleave(8, dim=-1) * t["mn"].float())


def value_offset(t: dict[str, Tensor]) -> int:
    """What the stored values of a packed group are offset by: q5s 16, q4s 8, the rest 0
    (their zero point is a min, or they are signed)."""
    if "mins" in t or "scales" not in t or t["qweight"].dtype != torch.uint8:
        return 0
    return 16 if "qhigh" in t else 8


def e8m0_half(e: Tensor) -> Tensor:
    """E8M0 exponent bytes -> 2^(e - 128) in float32, exactly (the gguf package's
    e8m0_to_fp32_half): the float with bits (e - 1) << 23, and for e < 2, where that exponent
    field would be -1 or 0, the subnormals 2^-128 and 2^-127 (bits 0x00200000 << e)."""
    e = e.int()
    small = torch.bitwise_left_shift(torch.full_like(e, 0x00200000), e)
    return torch.where(e < 2, small, (e - 1) << 23).view(torch.float32)


def nonlinear_scales(t: dict[str, Tensor]) -> Tensor:
    """A q4nl, q4xs or q4mx group's float32 block scales [..., K/32]: q4nl's d; q4xs' d * sc (exact: a
    float16 times a 6-bit integer); q4mx's 2^(e - 128)."""
    if "e" in t:
        return e8m0_half(t["e"])
    if "sc" not in t:
        return t["d"].float()
    return t["d"].float().repeat_interleave(GROUP, dim=-1) * t["sc"].float()


def nonlinear_values(t: dict[str, Tensor]) -> Tensor:
    """A q4nl, q4xs or q4mx group's signed values [..., K] (int8, row order): NONLINEAR[q], q4mx's
    MXFP4_VALUES[q]. One comparison per entry rather than an index into a table tensor, which a
    traced graph (an exported package's embedding lookup) would hold as a constant that the
    package then asks the model for as a weight."""
    q = kquant_values(t)
    out = torch.zeros_like(q, dtype=torch.int8)
    for i, v in enumerate(MXFP4_VALUES if "e" in t else NONLINEAR):
        out = torch.where(q == i, v, out)
    return out


def dequantize(t: dict[str, Tensor], dtype: torch.dtype = torch.float32) -> Tensor:
    """Packed rows [..., K] back to float (float32 math, then `dtype`); a group in panels (q4, q8,
    q4s, q4k, q5k, q6k) is a whole matrix [N, K] (rows of one: `dequantize_rows`)."""
    layout = layout_of(t)
    if layout in PANEL_LAYOUTS:
        return _panel_float(layout, *from_panels(layout, t), dtype)
    if layout in TABLE_LAYOUTS:  # d * NONLINEAR[q], (d * sc) * NONLINEAR[q], 2^(e - 128) * MXFP4_VALUES[q], as gguf's
        vals = nonlinear_values(t)
        shape = vals.shape
        w = nonlinear_scales(t)[..., None] * vals.float().reshape(*shape[:-1], -1, BLOCK)
        return w.reshape(shape).to(dtype)
    offset = value_offset(t)
    if offset or ("qhigh" in t and "scales" in t):  # q5: scale * q + min; q5s: scale * (q - offset)
        vals = kquant_values(t)
        shape = vals.shape
        v = vals.float().reshape(*shape[:-1], -1, BLOCK)
        if "mins" in t:
            w = t["scales"].float()[..., None] * v + t["mins"].float()[..., None]
        else:
            w = t["scales"].float()[..., None] * (v - offset)
        return w.reshape(shape).to(dtype)
    raise ValueError(f"no dequantization for layout {layout}")


def _panel_float(layout: str, vals: Tensor, fields: dict[str, Tensor], dtype: torch.dtype) -> Tensor:
    """q4's scale * q + min, q8's scale * q, q4s' scale * (q - 8), q4k's and q5k's (d * sc) * q -
    dmin * mn, q6k's (d * sc) * (q - 32) per 16 values, from values [..., K] and fields in row order."""
    shape = vals.shape
    v = vals.reshape(*shape[:-1], -1, BLOCK).float()
    if layout in ("q4k", "q5k", "q6k"):  # the gguf package's operations, in its order
        scale, mins = kquant_scales(fields)
        if mins is None:
            return (scale[..., None] * (vals.float() - 32).reshape(*shape[:-1], -1, 16)).reshape(shape).to(dtype)
        return (scale[..., None] * v + mins[..., None]).reshape(shape).to(dtype)
    w = fields["scales"].float()[..., None] * (v - 8 if layout == "q4s" else v)
    if "mins" in fields:
        w = w + fields["mins"].float()[..., None]
    return w.reshape(shape).to(dtype)


def dequantize_rows(t: dict[str, Tensor], rows: Tensor, dtype: torch.dtype = torch.float32) -> Tensor:
    """Rows `rows` [...] of a packed matrix in float [..., K] (an embedding lookup)."""
    layout = layout_of(t)
    if layout in PANEL_LAYOUTS:
        return _panel_float(layout, *panel_rows(layout, t, rows), dtype)
    return dequantize({name: x[rows] for name, x in t.items()}, dtype)
