"""RequestStream: a group of requests' outputs, from the engine's steps to one consumer.

A step hands each output to its request's sink, in the thread that runs the
step; the stream queues them, tagged with the request's index in the group,
for one consumer that reads them either synchronously (`next_step`:
LLM.generate/stream/chat, which step the engine themselves when no thread
runs its loop) or from asyncio (`outputs`: Engine.generate_async and the
server). It is the one way out of the engine, as `Engine.submit` is the one
way in.
"""

from __future__ import annotations

import asyncio
import queue
from typing import Any, AsyncIterator, Optional, Sequence, Union

from ..sampling import SamplingParams
from .request import GenerationConfig, Request, RequestOutput

Item = tuple[int, RequestOutput]


class RequestStream:
    """loop: the asyncio loop of an async consumer (None: a synchronous one)."""

    def __init__(self, engine: Any, loop: Optional[asyncio.AbstractEventLoop] = None):
        self.engine = engine  # an engine.Engine (not imported: the engine imports this module)
        self.requests: list[Request] = []
        self._loop = loop
        self._queue: Union[asyncio.Queue, queue.SimpleQueue] = asyncio.Queue() if loop else queue.SimpleQueue()
        self._cancelled = False

    def submit(self, prompts: Sequence[Sequence[int]], params: Union[SamplingParams, Sequence[SamplingParams]],
               config: GenerationConfig, *, names: Optional[Sequence[str]] = None,
               request_ids: Optional[Sequence[Optional[str]]] = None) -> "RequestStream":
        """Queue request i for prompts[i] (with params[i], or the same params for all),
        or none: every request is checked first, and a FastDecodeError names the prompt
        (names[i]) that cannot run."""
        n = len(prompts)
        params = [params] * n if isinstance(params, SamplingParams) else list(params)
        names = list(names) if names is not None else ["the prompt"] * n
        for p, sp, name in zip(prompts, params, names):
            self.engine.check(p, sp, config, name)
        try:
            for i, (p, sp) in enumerate(zip(prompts, params)):
                rid = request_ids[i] if request_ids is not None else None
                self.requests.append(self.engine.submit(p, sp, config, sink=self._sink(i), request_id=rid,
                                                        name=names[i]))
                if self._cancelled:  # the consumer left while we were submitting
                    self.engine.cancel(self.requests[-1])
        except BaseException:
            self.cancel()
            raise
        return self

    def _sink(self, i: int):
        if self._loop is None:
            return lambda out: self._queue.put((i, out))
        loop, q = self._loop, self._queue

        def put(out: RequestOutput) -> None:
            try:
                loop.call_soon_threadsafe(q.put_nowait, (i, out))
            except RuntimeError:  # the event loop has closed: nobody reads, so stop the request
                if i < len(self.requests):
                    self.engine.cancel(self.requests[i])
        return put

    # -- a synchronous consumer ----------------------------------------------------------

    def next_step(self) -> list[Item]:
        """The outputs of the next step that produced any for these requests: this
        thread runs the step unless a thread runs the engine's loop (then it waits)."""
        while True:
            pending = []
            if self.engine.background:
                pending.append(self._queue.get())  # the engine's thread steps; wait for it
            else:
                self.engine.step()
            while True:
                try:
                    pending.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            for _, out in pending:
                if out.error is not None:
                    raise self.failed(out.error)
            if pending:
                return pending

    # -- an asyncio consumer ---------------------------------------------------------------

    async def outputs(self) -> AsyncIterator[Item]:
        """(index, output) as steps produce them, until every request has finished;
        an output carrying the engine's error raises `failed(error)`."""
        running = len(self.requests)
        while running:
            i, out = await self._queue.get()
            if out.error is not None:
                raise self.failed(out.error)
            if out.finished:
                running -= 1
            yield i, out

    def failed(self, error: BaseException) -> BaseException:
        """What a consumer gets raised when the engine failed a request (the error itself)."""
        return error

    def cancel(self) -> None:
        """Stop every unfinished request (a flag: their slots are freed at the next step)."""
        self._cancelled = True
        for r in list(self.requests):
            if not r.finished:
                self.engine.cancel(r)
