"""Which requests run in the next step: slots, the queue, prefill chunks and drafts.

The scheduler decides; the runner executes. A step is a `Plan`: the running
requests decode one token each (all together; a speculating one verifies the
drafts chosen here), and then at most one group of prompt chunks is
prefilled, at most `prefill_chunk` tokens in all, so a long prompt delays
running streams by one chunk per step, not by its whole length. A group's
chunks have one length (a `[G, T]` forward), unless the runner takes rows of
one token (`ragged`: Runner.mixed), where prompts of any lengths share the
budget.
"""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass, field

from typing import Optional

from .prefix_cache import PrefixIndex
from .request import Request
from .speculative import DraftModelRow, PromptLookup


@dataclass
class Plan:
    decode: list[Request] = field(default_factory=list)
    # per decode request: its prompt-lookup drafts, and how many the draft model proposes ([], 0: none)
    drafts: list[tuple[list[int], int]] = field(default_factory=list)
    prefill: list[Request] = field(default_factory=list)
    chunks: list[int] = field(default_factory=list)  # the prompt tokens each of `prefill` feeds
    admitted: list[Request] = field(default_factory=list)  # took a slot in this step
    # (source slot, destination slot, n): copy KV rows 0..n-1 before the step runs (prefix reuse)
    copies: list[tuple[int, int, int]] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not self.decode and not self.prefill


class Scheduler:
    def __init__(self, n_slots: int, prefill_chunk: int, max_seq_len: int, prefix: Optional[PrefixIndex] = None,
                 ragged: bool = False):
        self.n_slots, self.prefill_chunk, self.max_seq_len = n_slots, prefill_chunk, max_seq_len
        self.ragged = ragged  # the runner runs chunks of different lengths in one forward (rows of one token)
        # With a prefix index a request goes where its prompt's longest cached prefix
        # is; without, to the lowest free slot.
        self.prefix = prefix
        self._free = list(range(n_slots))  # a heap: the lowest free slot first
        self.waiting: deque[Request] = deque()
        self.active: list[Request] = []  # hold a slot: prefilling or decoding, in admission order

    @property
    def slots_in_use(self) -> int:
        return len(self.active)

    def has_work(self) -> bool:
        return bool(self.waiting or self.active)

    def add(self, request: Request) -> None:
        self.waiting.append(request)

    def remove(self, request: Request) -> None:
        """Take a finished or cancelled request out, freeing its slot at once."""
        if request.slot is not None:
            if self.prefix is not None:
                self.prefix.release(request)
            self.active.remove(request)
            heapq.heappush(self._free, request.slot)
            request.slot = None
        elif request in self.waiting:
            self.waiting.remove(request)

    def schedule(self) -> Plan:
        plan = Plan()
        while self.waiting and self._free:
            r = self.waiting.popleft()
            if self.prefix is None or isinstance(r.spec, DraftModelRow):
                # (a draft model's own slots would lack the reused rows)
                r.slot = heapq.heappop(self._free)
            else:
                place = self.prefix.place(r, self._free, self.active)
                self._free.remove(place.slot)
                heapq.heapify(self._free)
                r.slot, r.prefilled, r.pos, r.cached = place.slot, place.reuse, place.reuse, place.reuse
                if place.copy_from is not None:
                    plan.copies.append((place.copy_from, place.slot, place.reuse))
            self.active.append(r)
            plan.admitted.append(r)
        plan.decode = [r for r in self.active if not r.prefilling]
        plan.drafts = [self._drafts(r) for r in plan.decode]
        # One group of prompt chunks, oldest first while the budget lasts: of equal length (one
        # [G, T] forward; the oldest sets T), or, ragged, each the rest of its prompt or of the
        # budget. Chunks whose every token has logits (prompt logprobs) or that a draft model
        # mirrors take the equal-length group, as the runner's `prefill` runs them.
        prefilling = [r for r in self.active if r.prefilling]
        ragged = self.ragged and bool(prefilling) and rows_of_one(prefilling[0])
        budget = self.prefill_chunk
        for r in prefilling:
            n = min(budget, len(r.prompt) - r.prefilled)
            if plan.prefill and not (rows_of_one(r) if ragged else n == plan.chunks[0]):
                continue
            plan.prefill.append(r)
            plan.chunks.append(n)
            budget -= n
            if budget == 0:
                break
        return plan

    def _drafts(self, r: Request) -> tuple[list[int], int]:
        """A decoding request's drafts this step: (prompt-lookup drafts, draft-model k)."""
        # Drafts never pass max_new_tokens nor the end of the cache.
        limit = min(r.remaining - 1, self.max_seq_len - 1 - r.pos)
        if r.spec is None or limit <= 0:
            return [], 0
        if isinstance(r.spec, PromptLookup):
            return r.spec.propose(limit), 0
        if isinstance(r.spec, DraftModelRow):
            return [], r.spec.want(limit)
        return [], 0


def rows_of_one(r: Request) -> bool:
    """Whether r's prompt chunks may run as rows of one token (Runner.mixed): not when every
    token needs logits (prompt logprobs) or a draft model mirrors the chunk (DraftProposer)."""
    return r.prompt_logprobs is None and not isinstance(r.spec, DraftModelRow)
