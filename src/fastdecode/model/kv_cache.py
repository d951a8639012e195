"""Key/value caches for incremental decoding.

Both caches store keys and values **unexpanded**, with the model's
n_kv_heads, not n_heads: attention groups the query heads instead of copying
the cache (see `transformer.Attention`), so grouped-query models keep their memory
saving. Storage is `[slots, S, H_kv, D]`, so that one (slot, position) is one
contiguous row and a step's writes are a single `index_copy_` along a flat
axis; `update` returns `[slots, H_kv, S, D]` views (D stays contiguous).

Slot s of the cache holds one sequence: one sequence lives in it from position 0 up. A
model step names, per batch row, the slot it works on (`rows [B]`) and the
positions of its tokens (`input_pos [B, T]`), so sequences at different
lengths share one step, and a slot's previous occupant is never seen: a query
at position p attends to keys 0..p only, all written by the current occupant.

The storage dtype (`kv_dtype`) may differ from the model's: float32, float16,
bfloat16, or q8_0, llama.cpp's 8-bit blocks: per (slot, position, kv head) row,
D / 32 blocks of 34 bytes, a float16 scale then 32 int8 values, in an int8
tensor [slots, S, H_kv, D / 32 * 34]. Writes convert (round to nearest even,
or quantize); the native attention kernel reads every format as float32, and
the portable path converts what it reads (`to_float`).
"""

from __future__ import annotations

import torch
from typing import Union

from torch import Tensor, nn


Q8_0 = "q8_0"
Q8_BLOCK = 32  # values per q8_0 block
Q8_BYTES = 34  # bytes per block: a float16 scale, 32 int8 values
# The names load(kv_dtype=) accepts besides "auto" (which resolves to one of them).
KV_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16, Q8_0: torch.int8}

KvDtype = Union[torch.dtype, str]  # a float dtype, or "q8_0"


def kv_name(dtype: KvDtype) -> str:
    """"float32", "float16", "bfloat16" or "q8_0"."""
    return dtype if isinstance(dtype, str) else str(dtype).removeprefix("torch.")


def kv_storage(dtype: KvDtype, head_dim: int) -> tuple[torch.dtype, int]:
    """(storage dtype, last dim) of a cache of this kv dtype."""
    if isinstance(dtype, str):
        if dtype != Q8_0:
            return KV_DTYPES[dtype], head_dim
        if head_dim % Q8_BLOCK:
            raise ValueError(f"q8_0 KV cache needs head_dim a multiple of {Q8_BLOCK}, got {head_dim}")
        return torch.int8, head_dim // Q8_BLOCK * Q8_BYTES
    return dtype, head_dim


def cache_bytes(n_layers: int, batch_size: int, n_kv_heads: int, seq_len: int, head_dim: int,
                dtype: KvDtype) -> int:
    """Bytes of K and V caches for the whole model."""
    storage, last = kv_storage(dtype, head_dim)
    return 2 * n_layers * batch_size * n_kv_heads * seq_len * last * torch.empty(0, dtype=storage).element_size()


def quantize_q8_0(x: Tensor) -> Tensor:
    """x [..., D] float -> int8 [..., D / 32 * 34]: per block of 32, d = max|x| / 127 as float16,
    q = round(x / d), as llama.cpp's quantize_row_q8_0."""
    *lead, D = x.shape
    blocks = x.float().reshape(*lead, D // Q8_BLOCK, Q8_BLOCK)
    d = blocks.abs().amax(-1, keepdim=True) / 127
    inv = torch.where(d > 0, 1.0 / d, torch.zeros_like(d))
    q = torch.round(blocks * inv).clamp(-127, 127).to(torch.int8)
    scale = d.to(torch.float16).view(torch.int8)  # [..., nb, 2]: the scale's bytes
    return torch.cat([scale, q], dim=-1).reshape(*lead, D // Q8_BLOCK * Q8_BYTES)


def dequantize_q8_0(x: Tensor, dtype: torch.dtype = torch.float32) -> Tensor:
    """int8 [..., D / 32 * 34] -> [..., D] of `dtype`."""
    *lead, n = x.shape
    blocks = x.reshape(*lead, n // Q8_BYTES, Q8_BYTES)
    d = blocks[..., :2].contiguous().view(torch.float16).float()  # [..., nb, 1]
    return (blocks[..., 2:].float() * d).reshape(*lead, n // Q8_BYTES * Q8_BLOCK).to(dtype)


def to_float(x: Tensor, dtype: torch.dtype) -> Tensor:
    """Cache contents (any kv dtype) as `dtype`, for readers without the native kernel."""
    if x.dtype == torch.int8:
        return dequantize_q8_0(x, dtype)
    return x if x.dtype == dtype else x.to(dtype)


class KVCache(nn.Module):
    """Preallocated ("static") cache written in place at `(rows, input_pos)`.

    Shapes are fixed for the cache's lifetime, which is what compiled decoding
    and CUDA graphs need. It is allocated once, by the engine that owns it.
    """

    def __init__(self, batch_size: int, n_kv_heads: int, seq_len: int, head_dim: int,
                 dtype: KvDtype, device: torch.device | str | None = None, zero: bool = True):
        super().__init__()
        storage, last = kv_storage(dtype, head_dim)
        shape = (batch_size, seq_len, n_kv_heads, last)
        # zero=False leaves the memory untouched, so it becomes resident only as positions
        # are written; only for readers that never look past a row's own position (the
        # native attention kernel). A masked read of garbage could meet a NaN, and NaN * 0
        # is NaN, so the masked attention path needs zeros.
        make = torch.zeros if zero else torch.empty
        self.register_buffer("k_cache", make(shape, dtype=storage, device=device), persistent=False)
        self.register_buffer("v_cache", make(shape, dtype=storage, device=device), persistent=False)

    @classmethod
    def from_tensors(cls, k_cache: Tensor, v_cache: Tensor) -> "KVCache":
        """A cache over existing [slots, S, H_kv, D] tensors, written in place
        (an exported graph takes its caches as inputs; see compile/aot.py)."""
        cache = cls.__new__(cls)
        nn.Module.__init__(cache)
        cache.register_buffer("k_cache", k_cache, persistent=False)
        cache.register_buffer("v_cache", v_cache, persistent=False)
        return cache

    @property
    def batch_size(self) -> int:
        return self.k_cache.shape[0]

    @property
    def seq_len(self) -> int:
        return self.k_cache.shape[1]

    def update(self, rows: Tensor, input_pos: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Write k, v of batch row b at slot rows[b], positions input_pos[b].

        rows: [B]; input_pos: [B, T]; k, v: [B, T, H_kv, D].
        Returns views of the whole cache, [slots, H_kv, S, D]: row b reads slot rows[b].
        """
        _write(self.k_cache, rows, input_pos, k)
        _write(self.v_cache, rows, input_pos, v)
        return self.k_cache.transpose(1, 2), self.v_cache.transpose(1, 2)

    def copy_rows(self, src: int, dst: int, n: int) -> None:
        """Slot dst's positions 0..n-1 become slot src's (a reused prompt prefix)."""
        self.k_cache[dst, :n].copy_(self.k_cache[src, :n])
        self.v_cache[dst, :n].copy_(self.v_cache[src, :n])


def _write(cache: Tensor, rows: Tensor, input_pos: Tensor, x: Tensor) -> None:
    # One index_copy_ into the whole buffer along its flat (slot, position)
    # axis: compiled code updates it in place, and a 1-d index has no
    # broadcasting for graphs to specialize on (sizes of 1 stay symbolic).
    slots, S, H, D = cache.shape
    B, T = input_pos.shape
    flat = (rows[:, None] * S + input_pos).view(B * T)
    if cache.dtype == torch.int8:
        x = quantize_q8_0(x)  # a new contiguous tensor
    elif x.dtype == cache.dtype:
        # An explicit copy: reshape would copy or not depending on whether B or T is 1.
        x = x.clone(memory_format=torch.contiguous_format)
    else:  # converting copies (float16, bfloat16: round to nearest even)
        x = x.to(dtype=cache.dtype, memory_format=torch.contiguous_format)
    cache.view(slots * S, H, D).index_copy_(0, flat, x.view(B * T, H, D))


class DynamicKVCache(nn.Module):
    """A cache that grows by concatenation, as eager Hugging Face generation does.

    This is the baseline mode of the benchmark: no preallocation along the
    sequence, a new tensor whenever a step writes past the current length, so it
    cannot be compiled into a static graph. Slots and positions work as in
    `KVCache`.
    """

    def __init__(self, batch_size: int, n_kv_heads: int, head_dim: int, dtype: KvDtype,
                 device: torch.device | str | None = None):
        super().__init__()
        storage, last = kv_storage(dtype, head_dim)
        self.k = torch.zeros(batch_size, 0, n_kv_heads, last, dtype=storage, device=device)
        self.v = torch.zeros_like(self.k)

    @property
    def batch_size(self) -> int:
        return self.k.shape[0]

    @property
    def seq_len(self) -> int:
        return self.k.shape[1]

    def update(self, rows: Tensor, input_pos: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """As `KVCache.update`, growing the sequence axis to the largest position first."""
        grow = int(input_pos.max()) + 1 - self.k.shape[1]  # eager only: a host sync this baseline accepts
        if grow > 0:
            pad = self.k.new_zeros(self.k.shape[0], grow, *self.k.shape[2:])
            self.k, self.v = torch.cat([self.k, pad], dim=1), torch.cat([self.v, pad], dim=1)
        _write(self.k, rows, input_pos, k)
        _write(self.v, rows, input_pos, v)
        return self.k.transpose(1, 2), self.v.transpose(1, 2)
