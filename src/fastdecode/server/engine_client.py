"""The handlers' only way to the engine: submit an HTTP request's choices, read their outputs.

The engine's thread owns the model; here we only queue requests and read
what its steps hand back. All choices of one HTTP request share one asyncio
queue, so n > 1 streams need no extra tasks.
"""

from __future__ import annotations

import asyncio
from typing import AsyncIterator, Sequence

from ..engine import Engine, GenerationConfig, Request, RequestOutput
from ..sampling import SamplingParams
from .errors import APIError


class Choices:
    """One HTTP request's engine requests: choice i runs prompts[i] with params[i]."""

    def __init__(self, engine: Engine, request_id: str):
        self.engine, self.request_id = engine, request_id
        self.requests: list[Request] = []
        self._cancelled = False
        self._queue: asyncio.Queue = asyncio.Queue()

    async def submit(self, prompts: Sequence[list[int]], params: Sequence[SamplingParams],
                     config: GenerationConfig) -> None:
        """Queue every choice, or none (FastDecodeError, e.g. a logit_bias id outside the vocabulary)."""
        loop = asyncio.get_running_loop()

        def sink(index: int):
            def put(out: RequestOutput) -> None:
                try:
                    loop.call_soon_threadsafe(self._queue.put_nowait, (index, out))
                except RuntimeError:  # the event loop has closed (shutdown): nobody is reading
                    pass
            return put

        def submit_all() -> None:
            try:
                for i, (p, sp) in enumerate(zip(prompts, params)):
                    req = self.engine.submit(p, sp, config, sink=sink(i), request_id=f"{self.request_id}-{i}")
                    self.requests.append(req)
                    if self._cancelled:  # the client left while we were submitting
                        self.engine.cancel(req)
            except BaseException:
                self.cancel()
                raise

        submit_all()  # never waits for a step: submissions go through the engine's inbox
        self.engine.start()  # no-op while the server's engine thread runs the loop

    async def outputs(self) -> AsyncIterator[tuple[int, RequestOutput]]:
        """(choice index, output) as steps produce them, until every choice has finished."""
        running = len(self.requests)
        while running:
            index, out = await self._queue.get()
            if out.error is not None:
                raise APIError(500, f"the engine failed this request: {type(out.error).__name__}: {out.error}")
            if out.finished:
                running -= 1
            yield index, out

    def cancel(self) -> None:
        """Stop every unfinished choice; their slots are freed at the engine's next step."""
        self._cancelled = True
        for r in list(self.requests):
            if not r.finished:
                self.engine.cancel(r)
