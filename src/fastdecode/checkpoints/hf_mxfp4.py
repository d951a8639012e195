"""gpt-oss's experts as OpenAI publishes them: MXFP4 in safetensors (config `quant_method: mxfp4`).

Each layer's experts are four uint8 tensors, `{gate_up,down}_proj_blocks` [experts, rows, K / 32, 16]
and `{gate_up,down}_proj_scales` [experts, rows, K / 32] (gate_up: gate and up in alternate rows;
rows are the outputs, so no transpose). In a block of 32, value 2j is byte j's low nibble and 2j + 1
its high one, each an E2M1 code, scaled by 2^(s - 127).

GGUF's MXFP4 block holds the same scale byte and the same codes in Q4_0's nibble order (value j low,
j + 16 high) over E2M1's doubled values scaled by 2^(e - 128): the same numbers. So the codes are
reordered into GGUF blocks, exactly, and from there take the GGUF path: packed as q4mx, or decoded.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import torch

from ..errors import FastDecodeError
from ..model.args import ModelArgs
from ..quant.formats import GGUF_MXFP4, pack_gguf
from .dequant import decoder

METHOD = "mxfp4"
SUFFIXES = ("_blocks", "_scales")
_BLOCK_BYTES = 17  # GGUF MXFP4: the exponent byte, then 16 bytes of codes


def gguf_rows(blocks: torch.Tensor, scales: torch.Tensor) -> np.ndarray:
    """OpenAI's blocks [..., G, 16] and scales [..., G] -> GGUF MXFP4 rows [..., G * 17] uint8.
    GGUF's byte j holds values j and j + 16: for j = 2i, the low nibbles of OpenAI's bytes i and
    i + 8; for j = 2i + 1, their high nibbles."""
    out = torch.empty(*blocks.shape[:-1], _BLOCK_BYTES, dtype=torch.uint8)
    out[..., 0] = scales
    first, second = blocks[..., :8], blocks[..., 8:]  # values 0-15 and 16-31
    out[..., 1::2] = (first & 0x0F) | (second << 4)
    out[..., 2::2] = (first >> 4) | (second & 0xF0)
    return out.reshape(*blocks.shape[:-2], -1).numpy()


def experts(key: str, blocks: torch.Tensor, scales: torch.Tensor, args: ModelArgs, dtype: torch.dtype,
            weights: str, kinds: Counter, file: Path) -> dict[str, torch.Tensor]:
    """One layer's `gate_up_proj` or `down_proj` (key: layers.N.feed_forward.experts.NAME) as each
    expert's w1 and w3, or w2: packed q4mx tensors (weights auto, int8, int4) or floats in `dtype`."""
    if GGUF_MXFP4 is None:
        raise FastDecodeError(f"{file}: MXFP4 weights need a gguf package that knows MXFP4 (pip install -U gguf)")
    base, name = key.rsplit(".", 1)
    n, dim, hidden = args.experts(int(key.split(".")[1])), args.dim, args.expert_hidden_dim
    rows, k = (2 * hidden, dim) if name == "gate_up_proj" else (dim, hidden)
    want = (n, rows, k // 32, 16)
    if k % 32 or tuple(blocks.shape) != want or tuple(scales.shape) != want[:-1]:
        raise FastDecodeError(f"{file}: {key}'s MXFP4 blocks {list(blocks.shape)} and scales {list(scales.shape)} "
                              f"do not fit the config, which makes them {list(want)} and {list(want[:-1])}")
    if blocks.dtype != torch.uint8 or scales.dtype != torch.uint8:
        raise FastDecodeError(f"{file}: {key}'s MXFP4 blocks and scales must be uint8, got {blocks.dtype} "
                              f"and {scales.dtype}")
    raw = gguf_rows(blocks, scales)  # [experts, rows, K / 32 * 17]
    parts = (("w1", slice(0, None, 2)), ("w3", slice(1, None, 2))) if name == "gate_up_proj" else (("w2", slice(None)),)
    out: dict[str, torch.Tensor] = {}
    for e in range(n):
        for w, sel in parts:
            part = np.ascontiguousarray(raw[e, sel])
            if weights == "float":
                out[f"{base}.{e}.{w}.weight"] = _decode(part, k).to(dtype)
                kinds["MXFP4->float"] += 1
            else:
                packed = pack_gguf(part, GGUF_MXFP4, part.shape[0], k)
                out.update({f"{base}.{e}.{w}.{s}": t for s, t in packed.items()})
                kinds["MXFP4->q4mx"] += 1
    return out


def _decode(rows: np.ndarray, k: int) -> torch.Tensor:
    return torch.from_numpy(decoder(GGUF_MXFP4)(rows.reshape(-1, _BLOCK_BYTES))).reshape(-1, k)
