"""Token masks of constrained rows: filled on the host, applied to the logits on the device.

llguidance writes one bit per token id into an int32 bitmask row. A step's
job fills a row per constrained request (and per draft position when it
speculates) in a worker thread, so the host work runs while the model step
does; `allowed()` then unpacks the rows into [n, V] bool on the device.
Rows without a constraint get no bitmask and cost nothing.
"""

from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Optional, Sequence

import numpy as np
import torch
from torch import Tensor

from .compiler import GrammarState

Row = tuple[int, GrammarState, Sequence[int]]  # (row in the step's batch, its grammar, its drafts)


class Masks:
    """One per runner. `seconds`/`built`: host and unpack time spent, and masks built
    (the benchmark's mask time per token). overlap=False fills in the caller's thread."""

    def __init__(self, vocab_size: int, device: torch.device, overlap: bool = True):
        self.V, self.device = vocab_size, device
        self.words = (vocab_size + 31) // 32
        self.overlap = overlap
        self._pool: Optional[ThreadPoolExecutor] = None
        self._last: Optional[Future] = None
        self._shifts = torch.arange(32, dtype=torch.int32, device=device)
        self.seconds = 0.0
        self.built = 0

    def start(self, rows: Sequence[Row]) -> "Pending":
        """Begin filling the masks of `rows` (none: a no-op job)."""
        if not rows:
            return Pending(self, [], None, {})
        if self._last is not None:  # a job nobody waited for (its step failed) must not overlap this one
            self._last.exception()
        n = sum(len(d) + 1 for _, _, d in rows)
        buf = torch.empty(n, self.words, dtype=torch.int32, pin_memory=self.device.type == "cuda")
        index: dict[tuple[int, int], int] = {}
        k = 0
        for i, _, d in rows:
            for j in range(len(d) + 1):
                index[(i, j)] = k
                k += 1
        if self.overlap:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="fastdecode-masks")
            future = self._pool.submit(_fill, rows, buf, index)
            self._last = future
        else:
            future = Future()
            future.set_result(_fill(rows, buf, index))
        return Pending(self, rows, future, index, buf)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False)
            self._pool = None


class Pending:
    def __init__(self, masks: Masks, rows: Sequence[Row], future: Optional[Future], index: dict,
                 buf: Optional[Tensor] = None):
        self.masks, self.rows, self.future, self.index, self.buf = masks, rows, future, index, buf
        self._unpacked: Optional[Tensor] = None

    def _all(self) -> Tensor:
        """Every filled mask as [n, V] bool on the device (unpacked once)."""
        if self._unpacked is None:
            spent = self.future.result()
            t0 = time.perf_counter()
            m = self.masks
            bm = self.buf.to(m.device, non_blocking=True)
            bits = (bm.unsqueeze(-1) >> m._shifts) & 1  # [n, W, 32]: bit b of word w is token 32w + b
            self._unpacked = bits.view(bm.shape[0], -1)[:, :m.V].bool()
            m.seconds += spent + time.perf_counter() - t0
            m.built += bm.shape[0]
        return self._unpacked

    def allowed(self, rows: Sequence[int], j: int = 0) -> Optional[Tensor]:
        """[len(rows), V] bool: the tokens each of these batch rows may take at draft position j
        (all, for rows without a constraint); None when none of them has one."""
        ks = [self.index.get((i, j)) for i in rows]
        if all(k is None for k in ks):
            return None
        unpacked = self._all()
        if all(k is not None for k in ks):  # every row constrained (batch 1, say): no merge needed
            if ks == list(range(unpacked.shape[0])):
                return unpacked
            return unpacked[torch.tensor(ks, device=unpacked.device)]
        out = torch.ones(len(rows), self.masks.V, dtype=torch.bool, device=self.masks.device)
        at = [n for n, k in enumerate(ks) if k is not None]
        out[torch.tensor(at, device=out.device)] = unpacked[torch.tensor([ks[n] for n in at], device=out.device)]
        return out


def _fill(rows: Sequence[Row], buf: Tensor, index: dict) -> float:
    """Fill buf's rows (host); returns the seconds spent. A row's masks after its drafts
    are computed by advancing its matcher along them, then rolling it back."""
    t0 = time.perf_counter()
    words = buf.numpy().view(np.uint32)  # [n, W], shares buf's memory
    for i, g, drafts in rows:
        m = g.m
        ll_bytes = (g.vocab.size + 31) // 32 * 4
        advanced = 0
        for j in range(len(drafts) + 1):
            k = index[(i, j)]
            if m.is_stopped() or m.is_error():
                # Nothing may follow (the engine ends the request there): only EOS, or, for a
                # request without EOS ids, anything (whatever is drawn is dropped).
                words[k] = 0 if g.eos_ids else 0xFFFFFFFF
                _set_eos(words[k], g, True)
            else:
                words[k] = 0
                m.unsafe_compute_mask_ptr(buf[k].data_ptr(), ll_bytes)
                _set_eos(words[k], g, m.is_accepting())
            if j < len(drafts):
                if m.try_consume_tokens([drafts[j]]) != 1:
                    for jj in range(j + 1, len(drafts) + 1):  # never reached: draft j is masked out
                        words[index[(i, jj)]] = 0xFFFFFFFF
                    break
                advanced += 1
        if advanced:
            m.rollback(advanced)
    return time.perf_counter() - t0


def _set_eos(row: np.ndarray, g: GrammarState, accepting: bool) -> None:
    """EOS means the request's own ids (its eos_ids): allowed where the grammar accepts, and
    where the grammar itself names that token (llguidance then set its bit while not
    accepting). llguidance's EOS ids that end nothing for this request are dropped where
    they would mean "end here"."""
    if not accepting:
        return
    for t in g.vocab.eos - g.eos_ids:
        w, b = divmod(t, 32)
        if w < row.shape[0]:
            row[w] &= np.uint32(~(1 << b) & 0xFFFFFFFF)
    for t in g.eos_ids:
        w, b = divmod(t, 32)
        if w < row.shape[0]:
            row[w] |= np.uint32(1 << b)
