"""Q and K rows whose rotary dims come in interleaved pairs, put back in our RoPE's order.

Our RoPE (and transformers' rotate_half) rotates dim i of a head with dim i + rot/2. llama.cpp's
converter interleaves Llama's rows into pairs (2i, 2i + 1) for its kernel, and GLM 4 is trained
with pairs; both are undone by the same permutation of each head's first `rot` rows, which leaves
q . k, and so attention, as it was.
"""

from __future__ import annotations

from typing import Optional

import torch


def unpermute_rows(w: torch.Tensor, n_heads: int, rot: Optional[int] = None) -> torch.Tensor:
    """w [n_heads x head_dim, ...] (a weight or a bias): in each head, rows 0, 2, ..., rot - 2 then
    1, 3, ..., rot - 1 of its first `rot` (default: all), the rest as they are."""
    d = w.shape[0] // n_heads
    rot = d if rot is None else rot
    heads = w.reshape(n_heads, d, *w.shape[1:])
    pairs = heads[:, :rot].reshape(n_heads, rot // 2, 2, *w.shape[1:]).transpose(1, 2)
    return torch.cat([pairs.reshape(n_heads, rot, *w.shape[1:]), heads[:, rot:]], dim=1).reshape(w.shape)
