"""fastdecode's quantized weight layouts, and how GGUF types and float weights map onto them.

Two layouts, both in blocks of 32 values along K (the input dimension), one
row per output feature, which is what the kernels in `kernels/quant.cpp` read:

    q4: qweight uint8 [N, K/2]   blocks in pairs: 32 bytes hold block 2p's values
                                 in their low nibbles and block 2p+1's in their high
                                 ones (one load, two masks, two blocks); an odd last
                                 block has 16 bytes, values j and j+16 in byte j
        scales, mins [N, K/32]   float16 or float32;  w = scale * q + min, q in 0..15
    q8: qweight int8 [N, K]
        scales [N, K/32]         float16 or float32;  w = scale * q

GGUF types and what they become (`GGUF_LAYOUTS`); "exact" means dequantizing
the packed form gives bit-identical float32 values to dequantizing the file:

    Q4_0  -> q4, float16 scales, min = -8 * scale      exact
    Q4_1  -> q4, float16 scales and mins               exact (the same nibbles, re-paired)
    Q4_K  -> q4, float32 scale d*sc and min -dmin*m    exact (products of fp16 and
             per 32-value sub-block                    6-bit ints fit float32)
    Q8_0  -> q8, float16 scales                        exact (the same bytes)
    Q5_0  -> q8, float16 scales, q - 16 as int8        exact
    Q5_1, Q5_K, Q6_K                                   dequantized at load: no native
                                                       layout yet (Q6_K needs per-16 scales)
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

LAYOUT_VERSION = 2  # bump when a layout changes; cached conversions are rebuilt
BLOCK = 32
SUFFIXES = ("qweight", "scales", "mins")


@dataclass(frozen=True)
class Mapping:
    layout: Optional[str]  # "q4", "q8" or None (dequantized to float)
    exact: bool


GGUF_LAYOUTS: dict[T, Mapping] = {
    T.Q4_0: Mapping("q4", True), T.Q4_1: Mapping("q4", True), T.Q4_K: Mapping("q4", True),
    T.Q8_0: Mapping("q8", True), T.Q5_0: Mapping("q8", True),
    T.Q5_1: Mapping(None, False), T.Q5_K: Mapping(None, False), T.Q6_K: Mapping(None, False),
}


def layout_of(tensors: dict[str, Tensor]) -> str:
    """'q4' or 'q8' from a packed tensor group (qweight's dtype tells)."""
    return "q4" if tensors["qweight"].dtype == torch.uint8 else "q8"


def packed_shapes(layout: str, n: int, k: int) -> dict[str, tuple[int, ...]]:
    nb = k // BLOCK
    if layout == "q4":
        return {"qweight": (n, k // 2), "scales": (n, nb), "mins": (n, nb)}
    return {"qweight": (n, k), "scales": (n, nb)}


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
        out = _q4_k(b)
    elif qtype == T.Q8_0:
        out = {"qweight": np.ascontiguousarray(b[:, 2:34]).view(np.int8), "scales": _f16(b, 0)}
    elif qtype == T.Q5_0:
        lo = np.concatenate([b[:, 6:22] & 0x0F, b[:, 6:22] >> 4], axis=-1)
        high = (b[:, 2:6, None] >> np.arange(8, dtype=np.uint8)) & 1  # bit j of the 32-bit qh
        q = (lo | (high.reshape(-1, 32) << 4)).astype(np.int16) - 16
        out = {"qweight": q.astype(np.int8), "scales": _f16(b, 0)}
    else:  # pragma: no cover - GGUF_LAYOUTS and this function list the same types
        return None
    shapes = packed_shapes(mapping.layout, n, k)
    return {name: torch.from_numpy(np.ascontiguousarray(a).reshape(shapes[name]).copy())
            for name, a in out.items()}


def _q4_k(b: np.ndarray) -> dict[str, np.ndarray]:
    """Q4_K super-blocks of 256 -> 8 q4 blocks of 32, each with its own float32 scale and min."""
    n = b.shape[0]
    d = _f16(b, 0).astype(np.float32)
    dmin = _f16(b, 2).astype(np.float32)
    s = b[:, 4:16]
    lo, mid, hi = s[:, 0:4], s[:, 4:8], s[:, 8:12]
    sc = np.concatenate([lo & 63, (hi & 0x0F) | ((lo >> 6) << 4)], axis=-1).astype(np.float32)
    mn = np.concatenate([mid & 63, (hi >> 4) | ((mid >> 6) << 4)], axis=-1).astype(np.float32)
    # 32-byte chunk c holds sub-block 2c in its low nibbles and 2c+1 in its high ones.
    qs = b[:, 16:144].reshape(n, 4, 1, 32)
    values = np.concatenate([qs & 0x0F, qs >> 4], axis=2).reshape(n, 8, 32)
    return {"qweight": pack_nibbles(values), "scales": (d * sc).reshape(n, 8),
            "mins": (-(dmin * mn)).reshape(n, 8)}


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


def dequantize(t: dict[str, Tensor], dtype: torch.dtype = torch.float32) -> Tensor:
    """Packed rows [..., K] back to float (float32 math, then `dtype`)."""
    q = t["qweight"]
    vals = unpack_q4(q) if q.dtype == torch.uint8 else q
    shape = vals.shape
    vals = vals.reshape(*shape[:-1], -1, BLOCK).float()
    w = vals * t["scales"].float()[..., None]
    if "mins" in t:
        w = w + t["mins"].float()[..., None]
    return w.reshape(shape).to(dtype)
