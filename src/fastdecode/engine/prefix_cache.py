"""Prefix caching by slot: a new prompt reuses the KV rows of the longest prefix it
shares with what a slot already holds, so only the rest is prefilled.

Each slot's rows 0..n-1 hold the keys and values of one token sequence: its
last occupant's prompt and the tokens it fed (a free slot keeps them until it
is needed), or a running request's sequence so far. A new request goes to the
free slot holding its longest prefix; when a running request's slot holds a
longer one, its rows are copied (a memcpy, far cheaper than prefill), and so
are a free slot's when the prompt branches off inside that slot's last prompt
(another conversation after the same system prompt), which then stays for its
own next turn. Without
a match it takes the least recently used free slot, so recent prefixes live
longest. The last prompt token is always computed, for its logits.

Why slots and not blocks: the engine's cache is already one contiguous row
range per slot, which the attention kernel reads directly; reuse by slot
needs no block table in the model step, and copying a prefix between slots
costs microseconds per thousand tokens here. A block layout (shared blocks by
reference, vLLM) or a radix tree (SGLang) would keep more distinct prefixes
than there are slots; this index is the one place that would change.

Matching is on token ids plus the request's `cache_salt`: a prompt differing
at position k reuses exactly k tokens, and requests with different salts never
share rows. Since every quantized kernel computes a row the same way whatever
the chunk, batch or M, a hit gives the same tokens as a cold prefill. Float32
linears are the exception: past 8 rows they are BLAS GEMMs, whose sums may
differ from the native GEMV's in the last bits (a near-tie can then flip).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Optional, Sequence

from .request import Request


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


@dataclass
class Placement:
    slot: int
    reuse: int  # prompt tokens whose KV rows are reused (the request prefills from here)
    copy_from: Optional[int] = None  # a running request's slot to copy rows 0..reuse-1 from


class PrefixIndex:
    """What each slot's KV rows hold, and where a new prompt should go."""

    def __init__(self, n_slots: int):
        self.held: list[tuple[int, ...]] = [()] * n_slots  # a free slot's valid tokens
        self.salt: list[Optional[str]] = [None] * n_slots
        self.prompt_len = [0] * n_slots  # the prompt length of the request that left each slot
        self.released = [0] * n_slots  # when each slot was last freed (a clock tick), for LRU
        self._clock = itertools.count(1)
        self.queries = 0  # prompt tokens looked up, and found (vLLM's prefix_cache_queries / _hits)
        self.hits = 0

    def place(self, r: Request, free: Sequence[int], active: Sequence[Request]) -> Placement:
        """Choose a free slot for `r` (free must not be empty) and the prefix it reuses."""
        salt, prompt = r.config.cache_salt, r.prompt
        limit = len(prompt) - 1  # the last prompt token is always computed, for its logits
        if r.params.prompt_logprobs is not None:
            limit = 0  # every prompt position's logits are needed: nothing is reused
        best = max(free, key=lambda s: (min(limit, self._match(s, prompt, salt)), -self.released[s], -s))
        match = self._match(best, prompt, salt)
        reuse = min(limit, match)
        copy_from = None
        if 0 < reuse and match < self.prompt_len[best]:
            # `r` branches off inside the slot's last prompt (another conversation after a shared system
            # prompt): copy the shared rows into the least recently used slot rather than overwrite that
            # conversation. A prompt holding the last one whole (its next turn, even one whose history
            # renders the reply otherwise, as templates that drop the thinking do) supersedes it.
            copy_from = best
        for other in active:
            if other.config.cache_salt != salt or other.slot is None:
                continue
            n = min(limit, common_prefix(other.cached_tokens(), prompt))
            if n > reuse:
                reuse, copy_from = n, other.slot
        if copy_from is not None:  # rows come from elsewhere: give up the least recently used free slot
            best = min(free, key=lambda s: (self.released[s], s))
            if best == copy_from:  # it is the least recently used itself: take it as it is
                copy_from = None
        self.queries += len(prompt)
        self.hits += reuse
        self.held[best] = ()  # from now on the slot's rows are the new request's
        return Placement(best, reuse, copy_from)

    def release(self, r: Request) -> None:
        """`r` leaves its slot: the rows it wrote stay reusable."""
        self.held[r.slot] = tuple(r.cached_tokens())
        self.prompt_len[r.slot] = len(r.prompt)
        self.salt[r.slot] = r.config.cache_salt
        self.released[r.slot] = next(self._clock)

    def _match(self, slot: int, prompt: Sequence[int], salt: Optional[str]) -> int:
        return common_prefix(self.held[slot], prompt) if self.salt[slot] == salt else 0

    @property
    def nbytes(self) -> int:
        """Host memory the index holds for its token lists (8 bytes per token id reference)."""
        return sum(8 * len(t) for t in self.held)
