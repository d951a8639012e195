"""Prometheus metrics, in a registry of the app's own (two apps in one process never clash)."""

from __future__ import annotations

import time
from typing import Callable, Optional

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from ..engine import Completion

# Seconds; CPU prefill of long prompts behind a queue reaches tens of seconds.
TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56)


class Metrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self, slots_in_use: Callable[[], int], queue_length: Callable[[], int]):
        self.registry = r = CollectorRegistry()
        self.requests = Counter("fastdecode_requests", "HTTP requests answered, by route and status",
                                ["route", "status"], registry=r)
        self.prompt_tokens = Counter("fastdecode_prompt_tokens", "prompt tokens of submitted requests", registry=r)
        self.generated_tokens = Counter("fastdecode_generation_tokens", "tokens generated", registry=r)
        self.finished = Counter("fastdecode_choices_finished", "choices finished, by finish reason",
                                ["finish_reason"], registry=r)
        # In tokens, as vLLM counts them: prompt tokens looked up in the prefix cache, and found there.
        self.prefix_queries = Counter("fastdecode_prefix_cache_queries",
                                      "prompt tokens of finished choices looked up in the prefix cache", registry=r)
        self.prefix_hits = Counter("fastdecode_prefix_cache_hits",
                                   "prompt tokens of finished choices reused from the prefix cache", registry=r)
        Gauge("fastdecode_slots_in_use", "engine slots holding a request", registry=r).set_function(slots_in_use)
        Gauge("fastdecode_queue_length", "requests waiting for a slot", registry=r).set_function(queue_length)
        self.ttft = Histogram("fastdecode_time_to_first_token_seconds",
                              "from submission (queueing included) to a choice's first token",
                              buckets=TTFT_BUCKETS, registry=r)
        self.itl = Histogram("fastdecode_inter_token_latency_seconds", "time between a choice's tokens",
                             buckets=ITL_BUCKETS, registry=r)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class ChoiceTimer:
    """Inter-token latency of one choice: time between outputs, spread over their tokens."""

    def __init__(self, metrics: Metrics):
        self.metrics = metrics
        self.last: Optional[float] = None

    def tokens(self, n: int) -> None:
        if n <= 0:
            return
        now = time.perf_counter()
        if self.last is not None:
            gap = (now - self.last) / n
            for _ in range(n):
                self.metrics.itl.observe(gap)
        self.last = now

    def finished(self, reason: Optional[str], completion: Optional[Completion]) -> None:
        self.metrics.finished.labels(reason or "unknown").inc()
        if completion is not None:
            self.metrics.generated_tokens.inc(completion.completion_tokens)
            self.metrics.prefix_queries.inc(completion.prompt_tokens)
            self.metrics.prefix_hits.inc(completion.cached_tokens)
            if completion.completion_tokens:
                self.metrics.ttft.observe(completion.time_to_first_token_s)
