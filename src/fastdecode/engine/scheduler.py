"""Which requests run in the next step: slots, the queue, and prefill chunks.

The scheduler decides; the runner executes. A step is a `Plan`: the running
requests decode one token each (all together), and then at most one group of
prompt chunks is prefilled, at most `prefill_chunk` tokens in all, so a long
prompt delays running streams by one chunk per step, not by its whole length.
"""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass, field

from .request import Request


@dataclass
class Plan:
    decode: list[Request] = field(default_factory=list)
    prefill: list[Request] = field(default_factory=list)  # each prefills `prefill_len` prompt tokens
    prefill_len: int = 0
    admitted: list[Request] = field(default_factory=list)  # took a slot in this step

    @property
    def empty(self) -> bool:
        return not self.decode and not self.prefill


class Scheduler:
    def __init__(self, n_slots: int, prefill_chunk: int):
        self.n_slots, self.prefill_chunk = n_slots, prefill_chunk
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
            self.active.remove(request)
            heapq.heappush(self._free, request.slot)
            request.slot = None
        elif request in self.waiting:
            self.waiting.remove(request)

    def schedule(self) -> Plan:
        plan = Plan()
        while self.waiting and self._free:
            r = self.waiting.popleft()
            r.slot = heapq.heappop(self._free)
            self.active.append(r)
            plan.admitted.append(r)
        plan.decode = [r for r in self.active if not r.prefilling]
        # One group of prompt chunks of equal length (one [G, T] forward): the
        # oldest prefilling request sets T, and others join while the budget lasts.
        for r in self.active:
            if not r.prefilling:
                continue
            n = min(self.prefill_chunk, len(r.prompt) - r.prefilled)
            if not plan.prefill:
                plan.prefill_len = n
            elif n != plan.prefill_len or (len(plan.prefill) + 1) * n > self.prefill_chunk:
                continue
            plan.prefill.append(r)
        return plan
