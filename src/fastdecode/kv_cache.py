"""Key/value caches for incremental decoding.

Both caches store keys and values **unexpanded**: `[B, H_kv, S, D]` with the
model's n_kv_heads, not n_heads. Attention groups the query heads instead of
copying the cache (see `model.Attention`), so grouped-query models keep their
memory saving.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


class KVCache(nn.Module):
    """Preallocated ("static") cache written in place at `input_pos`.

    Shapes are fixed for the cache's lifetime, which is what compiled decoding
    and CUDA graphs need. `generate` sizes it to the request (bucketed), not to
    the model's context length, so attention cost follows the length in use.
    """

    def __init__(self, batch_size: int, n_kv_heads: int, seq_len: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device | str | None = None):
        super().__init__()
        shape = (batch_size, n_kv_heads, seq_len, head_dim)
        self.register_buffer("k_cache", torch.zeros(shape, dtype=dtype, device=device), persistent=False)
        self.register_buffer("v_cache", torch.zeros(shape, dtype=dtype, device=device), persistent=False)
        # True when every update covers all batch rows (compiled and exported steps,
        # see compile.fit_cache): writes then index the whole buffer, which Inductor
        # updates in place; through a [:B] slice it copied the whole cache every step.
        self.whole_batch = False

    @classmethod
    def from_tensors(cls, k_cache: Tensor, v_cache: Tensor) -> "KVCache":
        """A cache over existing [B, H_kv, S, D] tensors, written in place
        (an exported graph takes its caches as inputs; see aot.py)."""
        cache = cls.__new__(cls)
        nn.Module.__init__(cache)
        cache.register_buffer("k_cache", k_cache, persistent=False)
        cache.register_buffer("v_cache", v_cache, persistent=False)
        cache.whole_batch = True  # an exported step's caches have the batch's rows
        return cache

    @property
    def batch_size(self) -> int:
        return self.k_cache.shape[0]

    @property
    def seq_len(self) -> int:
        return self.k_cache.shape[2]

    def kv_len(self, input_pos: Tensor) -> int:
        """Number of key slots attention sees after this update: the whole buffer."""
        return self.seq_len

    def update(self, input_pos: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Write k, v at slots `input_pos` and return views of the whole cache.

        input_pos: [T] slot indices; k, v: [B, H_kv, T, D] with B <= batch_size.
        Returns k, v views of shape [B, H_kv, S, D].
        """
        # Compiled code trusts the flag (a shape test there would be a guard); eager checks.
        if self.whole_batch and (torch.compiler.is_compiling() or k.shape[0] == self.batch_size):
            self.k_cache.index_copy_(2, input_pos, k)
            self.v_cache.index_copy_(2, input_pos, v)
            return self.k_cache, self.v_cache
        B = k.shape[0]
        k_out, v_out = self.k_cache[:B], self.v_cache[:B]
        k_out.index_copy_(2, input_pos, k)
        v_out.index_copy_(2, input_pos, v)
        return k_out, v_out

    def reset(self) -> None:
        self.k_cache.zero_()
        self.v_cache.zero_()


class DynamicKVCache(nn.Module):
    """A cache that grows by concatenation, as eager Hugging Face generation does.

    This is the baseline mode of the benchmark: no preallocation, a new tensor
    per step, so it cannot be compiled into a static graph. Writes must be
    contiguous appends (`input_pos` continues where the last call ended).
    """

    def __init__(self, dtype: torch.dtype, device: torch.device | str | None = None, **_: object):
        super().__init__()
        self.dtype, self.device = dtype, device
        self.k: Tensor | None = None
        self.v: Tensor | None = None

    @property
    def seq_len(self) -> int:
        return 0 if self.k is None else self.k.shape[2]

    def kv_len(self, input_pos: Tensor) -> int:
        # Eager only: reading the last position costs a host sync, which this
        # baseline mode accepts.
        return int(input_pos[-1]) + 1

    def update(self, input_pos: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Append k, v ([B, H_kv, T, D]) and return the whole cache ([B, H_kv, S, D])."""
        start = int(input_pos[0])
        if self.k is None or start == 0:
            self.k, self.v = k.clone(), v.clone()
        else:
            if start != self.k.shape[2]:
                raise RuntimeError(f"DynamicKVCache appends only: at {self.k.shape[2]}, got {start}")
            self.k = torch.cat([self.k, k], dim=2)
            self.v = torch.cat([self.v, v], dim=2)
        return self.k, self.v

    def reset(self) -> None:
        self.k = self.v = None
