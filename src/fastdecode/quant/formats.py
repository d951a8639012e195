"""fastdecode's quantized weight layouts, and how GGUF types and float weights map onto them.

All layouts are row-major, one row per output feature, K (the input dimension)
in blocks of 32 values; the kernels (`kernels/quant_kernel.h`) read them as is.
Bits per weight count every byte stored:

    q4  (5 bpw with float16 scales and mins, 6 with float32)
        qweight uint8 [N, K/2]   blocks in pairs: 32 bytes hold block 2p's values
                                 in their low nibbles and block 2p+1's in their high
                                 ones (one load, two masks, two blocks); an odd last
                                 block has 16 bytes, values j and j+16 in byte j
        scales, mins [N, K/32]   float16 or float32;  w = scale * q + min, q in 0..15
    q8  (8.5 bpw)
        qweight int8 [N, K]
        scales [N, K/32]         float16 or float32;  w = scale * q
    q4k (4.625 bpw; Q4_K's own fields, unpacked to bytes; K a multiple of 256)
        qweight uint8 [N, K/2]   q4's nibble pairs (Q4_K's qs bytes as they are)
        sc, mn uint8 [N, K/32]   the 6-bit scale and min of each block of 32
        d, dmin float16 [N, K/256]    w = (d * sc) * q - (dmin * mn)
    q5k (5.625 bpw; Q5_K) q4k plus
        qhigh uint8 [N, K/8]     each 256 values' 32 bytes: bit j of byte l is the
                                 fifth bit of value 32 j + l (Q5_K's qh as it is);
                                 q = nibble | bit << 4, in 0..31
    q6k (6.5625 bpw; Q6_K's bytes as they are; K a multiple of 256)
        qweight uint8 [N, K/2]   per 256 values Q6_K's ql (128 bytes): value
                                 128 h + 32 g + l has its low 4 bits in byte
                                 64 h + 32 (g % 2) + l, low nibble for g < 2
        qhigh uint8 [N, K/4]     per 256 values Q6_K's qh (64 bytes): its top 2 bits
                                 are bits 2g, 2g + 1 of byte 32 h + l
        sc int8 [N, K/16]        one scale per 16 values
        d float16 [N, K/256]     w = (d * sc) * (q - 32), q in 0..63
    q5  (6 bpw; Q5_1) q4's qweight, float16 scales and mins [N, K/32], and
        qhigh uint8 [N, 32 ceil(K/256)]   q5k's plane (a last group of fewer than 8
                                 blocks padded); w = scale * q + min, q in 0..31
    q5s (5.5 bpw; Q5_0) q5 without mins; w = scale * (q - 16)

GGUF types and what they become (`GGUF_LAYOUTS`); "exact" means dequantizing
the packed form gives bit-identical float32 values to dequantizing the file:

    Q4_0  -> q4, float16 scales, min = -8 * scale      exact
    Q4_1  -> q4, float16 scales and mins               exact (the same nibbles, re-paired)
    Q4_K  -> q4k                                       exact (the same bytes, scales unpacked)
    Q5_K  -> q5k                                       exact
    Q6_K  -> q6k                                       exact (the same bytes)
    Q8_0  -> q8, float16 scales                        exact (the same bytes)
    Q5_0  -> q5s                                       exact (results equal the former
                                                       q8 repack's: the same int32 lanes)
    Q5_1  -> q5                                        exact
    F32, F16, BF16                                     float (or int8/int4 on request)

`weights=int8` / `int4` quantize float weights to q8 (absmax per block, scale
rounded to float16 first) and q4 (min/max per block).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as T
from torch import Tensor

LAYOUT_VERSION = 4  # bump when a layout changes; cached conversions are rebuilt
BLOCK = 32
SUPER = 256  # the K-quants' super-blocks
# Every packed tensor's suffix, in the order the ops take them.
SUFFIXES = ("qweight", "qhigh", "scales", "mins", "sc", "mn", "d", "dmin")
# Each layout's tensors in its op's argument order.
LAYOUT_TENSORS: dict[str, tuple[str, ...]] = {
    "q4": ("qweight", "scales", "mins"),
    "q8": ("qweight", "scales"),
    "q4k": ("qweight", "sc", "mn", "d", "dmin"),
    "q5k": ("qweight", "qhigh", "sc", "mn", "d", "dmin"),
    "q6k": ("qweight", "qhigh", "sc", "d"),
    "q5": ("qweight", "qhigh", "scales", "mins"),
    "q5s": ("qweight", "qhigh", "scales"),
}
# The K-quant layouts' tensors have fixed dtypes (q4/q8 scales are float16 or float32).
_DTYPES = {"qhigh": torch.uint8, "sc": torch.uint8, "mn": torch.uint8, "d": torch.float16, "dmin": torch.float16}


@dataclass(frozen=True)
class Mapping:
    layout: Optional[str]  # a LAYOUT_TENSORS key, or None (dequantized to float)
    exact: bool


GGUF_LAYOUTS: dict[T, Mapping] = {
    T.Q4_0: Mapping("q4", True), T.Q4_1: Mapping("q4", True), T.Q4_K: Mapping("q4k", True),
    T.Q8_0: Mapping("q8", True), T.Q5_0: Mapping("q5s", True),
    T.Q5_1: Mapping("q5", True), T.Q5_K: Mapping("q5k", True), T.Q6_K: Mapping("q6k", True),
}


def layout_of(tensors: dict[str, Tensor]) -> str:
    """The layout of a packed tensor group, from which tensors it has (and qweight's dtype)."""
    for layout in ("q5k", "q4k", "q6k", "q5", "q5s"):
        if set(LAYOUT_TENSORS[layout]) == set(tensors):
            return layout
    return "q4" if tensors["qweight"].dtype == torch.uint8 else "q8"


def tensor_dtypes(layout: str, scale_dtype: Optional[torch.dtype] = None) -> dict[str, torch.dtype]:
    """Each tensor's dtype in `layout` (scale_dtype: q4/q8's scales and mins)."""
    out = {}
    for name in LAYOUT_TENSORS[layout]:
        if name == "qweight":
            out[name] = torch.int8 if layout == "q8" else torch.uint8
        elif name in ("scales", "mins"):
            out[name] = scale_dtype or torch.float16
        else:
            out[name] = torch.int8 if (layout, name) == ("q6k", "sc") else _DTYPES[name]
    return out


def packed_k(layout: str, tensors: dict[str, Tensor]) -> int:
    """The inner dimension K of a packed group."""
    return tensors["qweight"].shape[-1] * (1 if layout == "q8" else 2)


def packed_shapes(layout: str, n: int, k: int) -> dict[str, tuple[int, ...]]:
    nb = k // BLOCK
    if layout == "q4":
        return {"qweight": (n, k // 2), "scales": (n, nb), "mins": (n, nb)}
    if layout == "q8":
        return {"qweight": (n, k), "scales": (n, nb)}
    if layout in ("q5", "q5s"):
        out = {"qweight": (n, k // 2), "qhigh": (n, (nb + 7) // 8 * BLOCK), "scales": (n, nb), "mins": (n, nb)}
        if layout == "q5s":
            del out["mins"]
        return out
    ns = k // SUPER
    if layout == "q6k":
        return {"qweight": (n, k // 2), "qhigh": (n, k // 4), "sc": (n, k // 16), "d": (n, ns)}
    out = {"qweight": (n, k // 2), "qhigh": (n, k // 8), "sc": (n, nb), "mn": (n, nb), "d": (n, ns), "dmin": (n, ns)}
    if layout == "q4k":
        del out["qhigh"]
    return out


def bits_per_weight(layout: str, k: int = 4096, scale_dtype: torch.dtype = torch.float16) -> float:
    """Bytes stored per row, times 8, over K."""
    shapes = packed_shapes(layout, 1, k)
    dtypes = tensor_dtypes(layout, scale_dtype)
    nbytes = sum(int(np.prod(s)) * dtypes[name].itemsize for name, s in shapes.items())
    return 8 * nbytes / k


# -- GGUF blocks -> layouts (numpy over raw bytes) --------------------------------------------

def _f16(b: np.ndarray, at: int) -> np.ndarray:
    return np.ascontiguousarray(b[:, at:at + 2]).view(np.float16)  # [n, 1]


def _fp16_or_fp32(scales: np.ndarray, mins: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Float32 arrays -> float16 when that is exact for both, else kept float32."""
    s16, m16 = scales.astype(np.float16), mins.astype(np.float16)
    if np.array_equal(s16.astype(np.float32), scales) and np.array_equal(m16.astype(np.float32), mins):
        return s16, m16
    return scales, mins


def pack_gguf(raw: np.ndarray, qtype: T, n: int, k: int) -> Optional[dict[str, Tensor]]:
    """The packed tensors of a GGUF tensor [n, k] of type `qtype`, or None if it has no native layout."""
    mapping = GGUF_LAYOUTS.get(qtype)
    if mapping is None or mapping.layout is None or k % BLOCK:
        return None
    if mapping.layout in ("q4k", "q5k", "q6k") and k % SUPER:
        return None
    block_size, block_bytes = GGML_QUANT_SIZES[qtype]
    b = raw.reshape(-1, block_bytes)
    nb = k // BLOCK
    if qtype == T.Q4_1:
        out = {"qweight": _gguf_nibbles(b[:, 4:20], n, nb), "scales": _f16(b, 0), "mins": _f16(b, 2)}
    elif qtype == T.Q4_0:
        d = _f16(b, 0).astype(np.float32)
        s, m = _fp16_or_fp32(d, -8 * d)
        out = {"qweight": _gguf_nibbles(b[:, 2:18], n, nb), "scales": s, "mins": m}
    elif qtype == T.Q4_K:
        out = _q4_k(b, n)
    elif qtype == T.Q5_K:
        out = _q4_k(b[:, np.r_[0:16, 48:176]], n)
        out["qhigh"] = b[:, 16:48]
    elif qtype == T.Q6_K:
        out = {"qweight": b[:, 0:128], "qhigh": b[:, 128:192], "sc": b[:, 192:208].view(np.int8),
               "d": _f16(b, 208)}
    elif qtype in (T.Q5_0, T.Q5_1):
        at = 2 if qtype == T.Q5_0 else 4  # qh: the 32 fifth bits of the block, a little-endian uint32
        bits = (b[:, at:at + 4, None] >> np.arange(8, dtype=np.uint8)) & 1  # [n nb, 4, 8]: bit j at 8 byte + bit
        out = {"qweight": _gguf_nibbles(b[:, at + 4:at + 20], n, nb), "qhigh": _high_plane(bits.reshape(n, nb, BLOCK)),
               "scales": _f16(b, 0)}
        if qtype == T.Q5_1:
            out["mins"] = _f16(b, 2)
    elif qtype == T.Q8_0:
        out = {"qweight": np.ascontiguousarray(b[:, 2:34]).view(np.int8), "scales": _f16(b, 0)}
    else:  # pragma: no cover - GGUF_LAYOUTS and this function list the same types
        return None
    shapes = packed_shapes(mapping.layout, n, k)
    return {name: torch.from_numpy(np.ascontiguousarray(a).reshape(shapes[name]).copy())
            for name, a in out.items()}


def _q4_k(b: np.ndarray, n: int) -> dict[str, np.ndarray]:
    """Q4_K super-blocks of 256: the nibbles as they are (chunk c of 32 bytes holds
    sub-block 2c in its low nibbles and 2c+1 in its high ones, as q4 pairs blocks),
    the 12 bytes of 6-bit scales and mins unpacked to one byte each."""
    s = b[:, 4:16]
    lo, mid, hi = s[:, 0:4], s[:, 4:8], s[:, 8:12]
    sc = np.concatenate([lo & 63, (hi & 0x0F) | ((lo >> 6) << 4)], axis=-1)
    mn = np.concatenate([mid & 63, (hi >> 4) | ((mid >> 6) << 4)], axis=-1)
    return {"qweight": b[:, 16:144], "sc": sc, "mn": mn, "d": _f16(b, 0), "dmin": _f16(b, 2)}


def _high_plane(bits: np.ndarray) -> np.ndarray:
    """Fifth bits [n, nb, 32] (0/1) -> q5's plane [n, ceil(nb/8) * 32]: bit j of byte l of
    group g is the bit of value l of block 8 g + j (a last group of fewer blocks padded with 0)."""
    n, nb, _ = bits.shape
    groups = (nb + 7) // 8
    padded = np.zeros((n, groups * 8, BLOCK), np.uint8)
    padded[:, :nb] = bits
    shifted = padded.reshape(n, groups, 8, BLOCK) << np.arange(8, dtype=np.uint8).reshape(8, 1)
    return np.bitwise_or.reduce(shifted, axis=2).reshape(n, groups * BLOCK)


def _gguf_nibbles(qs: np.ndarray, n: int, nb: int) -> np.ndarray:
    """GGUF's 16 bytes per block (low nibbles: values 0..15, high: 16..31) -> our pairs."""
    values = np.concatenate([qs & 0x0F, qs >> 4], axis=-1).reshape(n, nb, BLOCK)
    return pack_nibbles(values)


def pack_nibbles(values: np.ndarray) -> np.ndarray:
    """Values 0..15 [n, nb, 32] -> q4 bytes [n, nb * 16] (see the module docstring)."""
    n, nb, _ = values.shape
    values = values.astype(np.uint8)
    pairs = nb // 2 * 2
    paired = values[:, 0:pairs:2] | (values[:, 1:pairs:2] << 4)  # [n, nb/2, 32]
    parts = [paired.reshape(n, -1)]
    if nb % 2:
        last = values[:, -1]
        parts.append(last[:, :16] | (last[:, 16:] << 4))
    return np.concatenate(parts, axis=1)


# -- float -> layouts ------------------------------------------------------------------------

class BlockSizeError(ValueError):
    """A matrix's inner dimension is not a multiple of the block size."""


def quantize(w: Tensor, layout: str) -> dict[str, Tensor]:
    """Quantize a float matrix [N, K] (K a multiple of 32) to `layout` with float16 scales."""
    n, k = w.shape
    if k % BLOCK:
        raise BlockSizeError(f"inner dimension {k} is not a multiple of {BLOCK}")
    wb = w.detach().to("cpu", torch.float32).reshape(n, k // BLOCK, BLOCK)
    if layout == "q8":
        d = (wb.abs().amax(-1) / 127).to(torch.float16)
        inv = torch.where(d > 0, 1 / d.float(), torch.zeros_like(d, dtype=torch.float32))
        q = torch.round(wb * inv[..., None]).clamp(-127, 127).to(torch.int8)
        return {"qweight": q.reshape(n, k), "scales": d}
    lo, hi = wb.amin(-1), wb.amax(-1)
    m = lo.to(torch.float16)
    d = ((hi - m.float()) / 15).to(torch.float16)
    inv = torch.where(d > 0, 1 / d.float(), torch.zeros_like(d, dtype=torch.float32))
    q = torch.round((wb - m.float()[..., None]) * inv[..., None]).clamp(0, 15).to(torch.uint8)
    packed = torch.from_numpy(pack_nibbles(q.numpy()))
    return {"qweight": packed, "scales": d, "mins": m}


# -- layouts -> float (the reference) --------------------------------------------------------

def unpack_q4(qweight: Tensor) -> Tensor:
    """q4 bytes [..., K/2] -> values 0..15 [..., K] (uint8)."""
    lead, nbytes = qweight.shape[:-1], qweight.shape[-1]
    nb = nbytes // 16
    pairs = nb // 2 * 2
    parts = []
    if pairs:
        p = qweight[..., :pairs * 16].reshape(*lead, pairs // 2, 1, BLOCK)
        parts.append(torch.cat([p & 0x0F, p >> 4], dim=-2).reshape(*lead, pairs * BLOCK))
    if nb % 2:
        last = qweight[..., pairs * 16:]
        parts.append(torch.cat([last & 0x0F, last >> 4], dim=-1))
    return torch.cat(parts, dim=-1) if len(parts) > 1 else parts[0]


def unpack_high(qhigh: Tensor, nb: int) -> Tensor:
    """q5k/q5 high-bit planes [..., 32 per 8 blocks] -> the fifth bits [..., nb * 32] (uint8 0/1)."""
    lead = qhigh.shape[:-1]
    g = qhigh.reshape(*lead, -1, 1, BLOCK)  # [..., groups, 1, 32]
    shifts = torch.arange(8, dtype=torch.uint8, device=qhigh.device).reshape(8, 1)
    bits = (g >> shifts) & 1  # [..., groups, 8 blocks, 32]
    return bits.reshape(*lead, -1)[..., :nb * BLOCK]


def unpack_q6k(qweight: Tensor, qhigh: Tensor) -> Tensor:
    """q6k bytes -> values 0..63 [..., K] (uint8)."""
    lead = qweight.shape[:-1]
    ql = qweight.reshape(*lead, -1, 2, 1, 64)  # [..., super, half, 1, 64]
    low = torch.cat([ql & 0x0F, ql >> 4], dim=-2).reshape(*lead, -1, 2, 4, BLOCK)  # group g = 2 * nibble + chunk
    qh = qhigh.reshape(*lead, -1, 2, 1, BLOCK)
    shifts = torch.tensor([0, 2, 4, 6], dtype=torch.uint8, device=qweight.device).reshape(4, 1)
    high = (qh >> shifts) & 3
    return (low | (high << 4)).reshape(*lead, -1)


def kquant_values(t: dict[str, Tensor]) -> Tensor:
    """The unsigned integer values of a q4k/q5k/q6k/q5/q5s group [..., K] (uint8)."""
    if "sc" in t and "mn" not in t:
        return unpack_q6k(t["qweight"], t["qhigh"])
    vals = unpack_q4(t["qweight"])
    if "qhigh" in t:
        vals = vals | (unpack_high(t["qhigh"], vals.shape[-1] // BLOCK) << 4)
    return vals


def kquant_scales(t: dict[str, Tensor]) -> tuple[Tensor, Optional[Tensor]]:
    """q4k/q5k: float32 (d * sc, -(dmin * mn)) per block of 32 [..., K/32];
    q6k: (d * sc per 16 values [..., K/16], None)."""
    per = 16 if "mn" not in t else 8
    d = t["d"].float().repeat_interleave(per, dim=-1)
    scale = d * t["sc"].float()
    if "mn" not in t:
        return scale, None
    return scale, -(t["dmin"].float().repeat_interleave(per, dim=-1) * t["mn"].float())


def dequantize(t: dict[str, Tensor], dtype: torch.dtype = torch.float32) -> Tensor:
    """Packed rows [..., K] back to float (float32 math, then `dtype`)."""
    if "qhigh" in t and "scales" in t:  # q5: scale * q + min; q5s: scale * (q - 16)
        vals = kquant_values(t)
        shape = vals.shape
        v = vals.float().reshape(*shape[:-1], -1, BLOCK)
        if "mins" in t:
            w = t["scales"].float()[..., None] * v + t["mins"].float()[..., None]
        else:
            w = t["scales"].float()[..., None] * (v - 16)
        return w.reshape(shape).to(dtype)
    if "d" in t:  # q4k, q5k, q6k: the gguf package's operations, in its order
        vals = kquant_values(t)
        shape = vals.shape
        scale, mins = kquant_scales(t)
        if mins is None:  # q6k: (d * sc) * (q - 32) per 16 values
            w = scale[..., None] * (vals.float() - 32).reshape(*shape[:-1], -1, 16)
        else:
            w = scale[..., None] * vals.float().reshape(*shape[:-1], -1, BLOCK) + mins[..., None]
        return w.reshape(shape).to(dtype)
    q = t["qweight"]
    vals = unpack_q4(q) if q.dtype == torch.uint8 else q
    shape = vals.shape
    vals = vals.reshape(*shape[:-1], -1, BLOCK).float()
    w = vals * t["scales"].float()[..., None]
    if "mins" in t:
        w = w + t["mins"].float()[..., None]
    return w.reshape(shape).to(dtype)
