"""Dequantize GGML tensor types to float with vectorized numpy ops.

Every quantized type is a sequence of fixed-size blocks; we view the raw bytes
as `[n_blocks, block_bytes]` and decode all blocks at once. The layouts follow
ggml's `block_q*` structs (little-endian, fp16 scales). Correctness is checked
against `gguf.quants.dequantize` in the tests, which is written independently.

numpy rather than torch: these are byte-sized elementwise ops, where torch's
intra-op threads cost more than they gain, badly so when cores are busy.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as T
from gguf import quants as gguf_quants

from ..errors import FastDecodeError
from ..quant.formats import GGUF_MXFP4, MXFP4_VALUES, NONLINEAR, REQUANTIZED, e8m0_half

_Decoder = Callable[[np.ndarray], np.ndarray]  # [n, block_bytes] uint8 -> [n, block_size] f32


def _f16(b: np.ndarray, at: int) -> np.ndarray:
    """The fp16 field at byte `at` of every block, as [n, 1] float32."""
    return np.ascontiguousarray(b[:, at:at + 2]).view(np.float16).astype(np.float32)


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """[n, 16] bytes -> [n, 32]: ggml puts the low nibbles first, then the high ones."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=-1)


def _bits32(qh: np.ndarray) -> np.ndarray:
    """[n, 4] bytes of a little-endian uint32 -> its 32 bits, bit j at column j."""
    shifts = np.arange(8, dtype=np.uint8)
    return ((qh[..., None] >> shifts) & 1).reshape(qh.shape[0], 32)


def _q4_0(b: np.ndarray) -> np.ndarray:
    return _f16(b, 0) * (_nibbles(b[:, 2:18]).astype(np.float32) - 8)


def _q4_1(b: np.ndarray) -> np.ndarray:
    return _f16(b, 0) * _nibbles(b[:, 4:20]).astype(np.float32) + _f16(b, 2)


def _q5_0(b: np.ndarray) -> np.ndarray:
    q = _nibbles(b[:, 6:22]) | (_bits32(b[:, 2:6]) << 4)
    return _f16(b, 0) * (q.astype(np.float32) - 16)


def _q5_1(b: np.ndarray) -> np.ndarray:
    q = _nibbles(b[:, 8:24]) | (_bits32(b[:, 4:8]) << 4)
    return _f16(b, 0) * q.astype(np.float32) + _f16(b, 2)


def _q8_0(b: np.ndarray) -> np.ndarray:
    return _f16(b, 0) * np.ascontiguousarray(b[:, 2:34]).view(np.int8).astype(np.float32)


def _iq4_nl(b: np.ndarray) -> np.ndarray:
    """Q4_0's bytes; the nibbles index IQ4_NL's 16 values."""
    return _f16(b, 0) * np.array(NONLINEAR, dtype=np.float32)[_nibbles(b[:, 2:18])]


def _iq4_xs(b: np.ndarray) -> np.ndarray:
    """Super-blocks of 256: d, 8 six-bit block scales (4 low bits in 4 bytes, 2 high in a uint16)
    taken as scale - 32, and each block's 16 bytes of indices (low nibbles first)."""
    j = np.arange(8)
    high = np.ascontiguousarray(b[:, 2:4]).view(np.uint16)
    ls = ((b[:, 4 + j // 2] >> (4 * (j % 2)).astype(np.uint8)) & 0x0F) | (((high >> (2 * j)) & 3) << 4)
    dl = _f16(b, 0) * (ls.astype(np.float32) - 32)  # [n, 8]
    idx = _nibbles(b[:, 8:136].reshape(-1, 16)).reshape(-1, 8, 32)  # block j: 16 bytes, as Q4_0's
    q = np.array(NONLINEAR, dtype=np.float32)[idx]
    return (dl[..., None] * q).reshape(-1, 256)


def _mxfp4(b: np.ndarray) -> np.ndarray:
    """An E8M0 exponent byte e, then Q4_0's nibble order; the nibbles index MXFP4's 16 values
    (E2M1's doubled), so w = 2^(e - 128) v (formats.e8m0_half, exactly)."""
    scale = e8m0_half(torch.from_numpy(np.ascontiguousarray(b[:, :1]))).numpy()
    return scale * np.array(MXFP4_VALUES, dtype=np.float32)[_nibbles(b[:, 1:17])]


def _k_scales(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Unpack the 12-byte field of Q4_K/Q5_K into 8 six-bit scales and 8 six-bit mins."""
    lo, mid, hi = s[:, 0:4], s[:, 4:8], s[:, 8:12]
    scales = np.concatenate([lo & 63, (hi & 0x0F) | ((lo >> 6) << 4)], axis=-1)
    mins = np.concatenate([mid & 63, (hi >> 4) | ((mid >> 6) << 4)], axis=-1)
    return scales.astype(np.float32), mins.astype(np.float32)


def _k_nibbles(qs: np.ndarray) -> np.ndarray:
    """[n, 128] bytes -> [n, 8, 32]: each 32-byte chunk holds sub-block 2c (low) and 2c+1 (high)."""
    qs = qs.reshape(-1, 4, 1, 32)
    return np.concatenate([qs & 0x0F, qs >> 4], axis=2).reshape(-1, 8, 32)


def _q4_k(b: np.ndarray) -> np.ndarray:
    scales, mins = _k_scales(b[:, 4:16])
    q = _k_nibbles(b[:, 16:144]).astype(np.float32)
    out = (_f16(b, 0) * scales)[..., None] * q - (_f16(b, 2) * mins)[..., None]
    return out.reshape(-1, 256)


def _q5_k(b: np.ndarray) -> np.ndarray:
    scales, mins = _k_scales(b[:, 4:16])
    # Bit k of qh[l] is the fifth bit of element l of sub-block k.
    shifts = np.arange(8, dtype=np.uint8).reshape(1, 8, 1)
    high = (b[:, None, 16:48] >> shifts) & 1
    q = (_k_nibbles(b[:, 48:176]) | (high << 4)).astype(np.float32)
    out = (_f16(b, 0) * scales)[..., None] * q - (_f16(b, 2) * mins)[..., None]
    return out.reshape(-1, 256)


def _q6_k(b: np.ndarray) -> np.ndarray:
    n = b.shape[0]
    # Two halves of 128 values; in each, 64 bytes of low nibbles and 32 of 2-bit pairs.
    ql = b[:, 0:128].reshape(n, 2, 1, 2, 32)
    low = np.concatenate([ql & 0x0F, ql >> 4], axis=2).reshape(n, 2, 4, 32)
    shifts = np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 1, 4, 1)
    high = (b[:, 128:192].reshape(n, 2, 1, 32) >> shifts) & 3
    q = (low | (high << 4)).astype(np.float32).reshape(n, 16, 16) - 32
    scales = np.ascontiguousarray(b[:, 192:208]).view(np.int8).astype(np.float32)[..., None]  # one per 16 values
    return (_f16(b, 208)[..., None] * scales * q).reshape(n, 256)


def _by_gguf(qtype: T) -> _Decoder:
    """The `gguf` package's decoder, for the types we neither pack nor decode ourselves
    (formats.REQUANTIZED)."""
    def decode(b: np.ndarray) -> np.ndarray:
        try:
            return gguf_quants.dequantize(b, qtype)
        except NotImplementedError:
            raise FastDecodeError(f"this gguf package cannot decode {qtype.name}; upgrade it "
                                  "(pip install -U gguf)") from None
    return decode


_DECODERS: dict[T, _Decoder] = {
    T.Q4_0: _q4_0, T.Q4_1: _q4_1, T.Q5_0: _q5_0, T.Q5_1: _q5_1, T.Q8_0: _q8_0,
    T.Q4_K: _q4_k, T.Q5_K: _q5_k, T.Q6_K: _q6_k, T.IQ4_NL: _iq4_nl, T.IQ4_XS: _iq4_xs,
    **({GGUF_MXFP4: _mxfp4} if GGUF_MXFP4 is not None else {}),
    **{t: _by_gguf(t) for t in REQUANTIZED},
}
_FLOATS: dict[T, torch.dtype] = {T.F32: torch.float32, T.F16: torch.float16, T.BF16: torch.bfloat16}

SUPPORTED_TYPES: tuple[str, ...] = tuple(t.name for t in (*_FLOATS, *_DECODERS))


def is_supported(qtype: T) -> bool:
    return qtype in _FLOATS or qtype in _DECODERS


def decoder(qtype: T) -> _Decoder:
    """The block decoder of a quantized type: [n, block_bytes] uint8 -> [n, block_size] float32."""
    return _DECODERS[qtype]


def dequantize(raw: np.ndarray, qtype: T, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """Decode the uint8 bytes `raw` of one tensor of type `qtype` to `shape` in `dtype`.

    The caller checks `is_supported(qtype)` and the byte count first.
    """
    raw = raw.reshape(-1)
    if qtype in _FLOATS:
        # A copy: the file's memory map is read-only and torch wants writable memory.
        return torch.from_numpy(raw.copy()).view(_FLOATS[qtype]).reshape(shape).to(dtype)
    block_size, block_bytes = GGML_QUANT_SIZES[qtype]
    values = _DECODERS[qtype](raw.reshape(-1, block_bytes))
    return torch.from_numpy(values).reshape(shape).to(dtype)
