"""Engines in lockstep across tensor-parallel ranks, for serving.

With `generate`, every rank is handed the same prompts and runs the same
steps on its own. A server's requests reach rank 0 only, at any moment, and
clients cancel them at any moment. So before each engine step rank 0
broadcasts what changed since the last one: the requests it took in (prompt
and settings, the seed already drawn) and the ones cancelled. Every rank then
applies the same news to the same queue and runs the same step; sampling
needs no further traffic, since each request's generator is seeded alike on
every rank. The other ranks' requests have no consumer: their outputs are
dropped.

An idle leader still broadcasts an empty message every HEARTBEAT_S seconds,
so a follower waiting for the next step never reaches the collective's
timeout, and a leader that has gone away fails the followers' next broadcast.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch.distributed as dist

HEARTBEAT_S = 5.0


@dataclass
class StepNews:
    """What rank 0's engine took in since its last step. new: (uid, prompt,
    params, config, speculative mode) per request; cancelled: uids."""

    new: list[tuple] = field(default_factory=list)
    cancelled: list[int] = field(default_factory=list)
    stop: bool = False


class StepSync:
    def __init__(self, group: dist.ProcessGroup, heartbeat_s: float = HEARTBEAT_S):
        self.group = group
        self.leader = dist.get_rank(group) == 0
        self.heartbeat_s = heartbeat_s
        self.stopped = False  # set once the stop message has gone out (leader) or come in (follower)

    def exchange(self, news: Optional[StepNews]) -> StepNews:
        """The leader's news on every rank (followers pass None)."""
        box = [news if self.leader else None]
        dist.broadcast_object_list(box, src=dist.get_global_rank(self.group, 0), group=self.group)
        got = box[0]
        self.stopped = got.stop
        return got
