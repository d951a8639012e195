"""The handlers' only way to the engine: an HTTP request's choices as one RequestStream.

The engine's thread owns the model; here we only queue requests and read
what its steps hand back. All choices of one HTTP request share one asyncio
queue, so n > 1 streams need no extra tasks.
"""

from __future__ import annotations

import asyncio
from typing import Optional, Sequence

from ..engine import Engine, GenerationConfig
from ..engine.stream import RequestStream
from ..errors import ConstraintFailed
from ..sampling import SamplingParams
from .errors import APIError


class Choices(RequestStream):
    """One HTTP request's engine requests: choice i runs prompts[i] with params[i]."""

    def __init__(self, engine: Engine, request_id: str):
        super().__init__(engine, asyncio.get_running_loop())
        self.request_id = request_id

    async def submit(self, prompts: Sequence[list[int]], params: Sequence[SamplingParams],
                     config: GenerationConfig, names: Optional[Sequence[str]] = None) -> None:
        """Queue every choice, or none (FastDecodeError, e.g. a logit_bias id outside the vocabulary)."""
        # Never waits for a step: submissions go through the engine's inbox.
        super().submit(prompts, params, config, names=names,
                       request_ids=[f"{self.request_id}-{i}" for i in range(len(prompts))])
        self.engine.start()  # no-op while the server's engine thread runs the loop

    def failed(self, error: BaseException) -> BaseException:
        if isinstance(error, ConstraintFailed):  # the request's own regex, grammar or schema: its 400
            return APIError(400, f"the output constraint failed while generating: {error}", code="constraint_failed")
        return APIError(500, f"the engine failed this request: {type(error).__name__}: {error}")
