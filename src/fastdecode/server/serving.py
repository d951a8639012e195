"""The two generation endpoints: parse, prepare, submit, then answer whole or as events.

Handlers never touch the model: they submit to the engine (engine_client.py)
and turn the outputs into OpenAI's response or chunk shapes.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from typing import Any, AsyncIterator, Callable, Optional, Union

from pydantic import BaseModel, ValidationError
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from ..errors import FastDecodeError
from .engine_client import Choices
from .errors import APIError, from_fastdecode, from_validation
from .metrics import ChoiceTimer
from .outputs import ChoiceState, chat_logprobs, completion_logprobs, prompt_pieces, vllm_prompt_logprobs
from .prepare import Job, prepare_chat, prepare_completion
from .protocol import (AssistantMessage, ChatChoice, ChatChunkChoice, ChatCompletion, ChatCompletionChunk,
                       ChatCompletionRequest, CompletionChoice, CompletionRequest, Delta,
                       PromptTokensDetails, TextCompletion, Usage)
from ..text.harmony import HarmonySplitter
from .reasoning import ReasoningSplitter
from .state import ServerState

log = logging.getLogger("fastdecode.server")
Model = Union[ChatCompletionRequest, CompletionRequest]


async def read_body(request: Request, limit: int) -> bytes:
    """The body, refused with 413 as soon as it passes `limit` bytes."""
    length = request.headers.get("content-length", "")
    if length.isdigit() and int(length) > limit:
        raise APIError(413, f"the body has {int(length)} bytes; this server accepts at most {limit}",
                       code="body_too_large")
    body = bytearray()
    try:
        async for chunk in request.stream():
            body += chunk
            if len(body) > limit:
                raise APIError(413, f"the body is over this server's limit of {limit} bytes", code="body_too_large")
    except ClientDisconnect:
        # The client left before its body was read (or uvicorn saw it close first): nobody
        # reads the answer, and it is no server error.
        raise APIError(499, "the client closed the connection before its request body was read",
                       code="client_closed") from None
    return bytes(body)


def parse(body: bytes, model: type[BaseModel]) -> Any:
    try:
        return model.model_validate_json(body)
    except ValidationError as e:
        raise from_validation(e) from None


async def handle(state: ServerState, request: Request, chat: bool) -> Response:
    llm = state.ready_llm()
    req = parse(await read_body(request, state.settings.max_body_bytes),
                ChatCompletionRequest if chat else CompletionRequest)
    if req.model is not None and req.model != state.model_name:
        raise APIError(404, f"the model {req.model!r} does not exist; this server serves {state.model_name!r}",
                       param="model", code="model_not_found")
    if chat:
        job = await asyncio.to_thread(prepare_chat, req, llm, state.settings.max_tokens_limit,
                                      state.settings.reasoning == "auto")
    else:
        job = await asyncio.to_thread(prepare_completion, req, llm, state.settings.max_tokens_limit)
    run = Run(state, job, chat, request.scope.setdefault("fastdecode", {}))
    try:
        await run.choices.submit(job.choice_prompts, job.params, job.config, names=job.choice_names)
    except FastDecodeError as e:
        if llm.engine.closed:
            raise APIError(503, "the server is shutting down", code="shutting_down") from None
        raise from_fastdecode(e, {"max_new_tokens": "max_tokens"}) from None
    except BaseException:
        run.close()
        raise
    state.metrics.prompt_tokens.inc(job.prompt_tokens)
    if req.stream:
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        events = run.chat_events(include_usage) if chat else run.completion_events(include_usage)
        return EventStream(sse(events, run.log), on_close=run.close)
    return await run.until_done_or_disconnect(request)


class Run:
    """One request in flight: its choices' states, metrics and log fields."""

    def __init__(self, state: ServerState, job: Job, chat: bool, log_fields: dict):
        self.state, self.job, self.chat = state, job, chat
        self.tokenizer = state.llm.tokenizer
        self.id = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:24]}"
        self.created = int(time.time())
        self.choices = Choices(state.llm.engine, self.id)
        n = len(job.params)
        skip = job.config.skip_special_tokens
        self.states = [ChoiceState(self.tokenizer, job.logprobs is not None, skip) for _ in range(n)]
        self.timers = [ChoiceTimer(state.metrics) for _ in range(n)]
        self.sent_chars = [0] * n  # completions' text_offset while streaming
        self.readers = [job.tools.reader() for _ in range(n)] if job.tools is not None else None
        self.splitters = ([HarmonySplitter(keep_calls=job.tools is not None) for _ in range(n)] if job.harmony
                          else [ReasoningSplitter(job.thinking) for _ in range(n)] if job.thinking is not None
                          else None)
        self.log = log_fields
        self.log.update(id=self.id, prompt_tokens=job.prompt_tokens)

    async def outputs(self) -> AsyncIterator[tuple[int, str, list, Any]]:
        """(choice, new text, new (token string, logprob) pairs, output), metrics and log kept."""
        async for i, out in self.choices.outputs():
            piece, tokens = self.states[i].add(out)
            self.timers[i].tokens(len(out.token_ids))
            if out.finished:
                self.timers[i].finished(out.finish_reason, out.completion)
                self._log_finished()
            yield i, piece, tokens, out

    def close(self) -> None:
        """However the response ended: cancel what still runs (the client left), counted as aborted."""
        self.choices.cancel()
        left = [s for s in self.states if s.finish_reason is None]
        for s in left:
            s.finish_reason = "abort"
            self.state.metrics.finished.labels("abort").inc()
        if left:
            self._log_finished()

    def _log_finished(self) -> None:
        done = [s.completion for s in self.states if s.completion is not None]
        self.log["completion_tokens"] = sum(c.completion_tokens for c in done)
        firsts = [c.time_to_first_token_s for c in done if c.completion_tokens]
        if firsts:
            self.log["ttft_s"] = min(firsts)
        self.log["finish"] = ",".join(sorted({s.finish_reason for s in self.states if s.finish_reason}))

    def usage(self) -> Usage:
        # max_tokens=0 (echo): the one token generated is dropped, so nothing counts.
        completion = 0 if self.job.drop else sum(s.completion_tokens for s in self.states)
        # Each prompt counts once, as its first choice found it in the prefix cache.
        firsts = [self.states[i].completion for i in range(0, len(self.states), self.job.n)]
        cached = sum(c.cached_tokens for c in firsts if c is not None)
        return Usage(prompt_tokens=self.job.prompt_tokens, completion_tokens=completion,
                     total_tokens=self.job.prompt_tokens + completion,
                     prompt_tokens_details=PromptTokensDetails(cached_tokens=cached))

    # -- whole responses ------------------------------------------------------------------

    async def until_done_or_disconnect(self, request: Request) -> Response:
        """The whole response; a client that leaves first cancels its choices."""
        work = asyncio.ensure_future(self._collect())
        gone = asyncio.ensure_future(_disconnected(request))
        try:
            await asyncio.wait({work, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
            if not work.done():
                work.cancel()
            self.close()
        if not work.done() or work.cancelled():
            self.log["status"] = 499  # nginx's "client closed request": nobody reads this answer
            return Response(status_code=499)
        return JSONResponse(work.result().model_dump())

    async def _collect(self) -> BaseModel:
        async for _ in self.outputs():
            pass
        if self.chat:
            choices = []
            for i, s in enumerate(self.states):
                message, reason = self._message(i, s)
                choices.append(ChatChoice(index=i, message=message, logprobs=self._chat_logprobs(s.tokens),
                                          finish_reason=reason, prompt_logprobs=self._prompt_logprobs(s)))
            return ChatCompletion(id=self.id, created=self.created, model=self.state.model_name, usage=self.usage(),
                                  choices=choices, prompt_logprobs=choices[0].prompt_logprobs)
        return TextCompletion(id=self.id, created=self.created, model=self.state.model_name, usage=self.usage(),
                              choices=[self._completion_choice(i, s) for i, s in enumerate(self.states)])

    def _message(self, i: int, s: ChoiceState) -> tuple[AssistantMessage, Optional[str]]:
        """The reply and its finish reason; with tools, the calls read from its text (after the
        thinking, when it is read apart)."""
        text, reasoning = s.text, None
        if self.splitters is not None:
            reasoning, text = self.splitters[i].feed(text, finished=True)
            reasoning = reasoning or None
        if self.readers is None:
            return AssistantMessage(content=text, reasoning_content=reasoning), s.finish_reason
        reader = self.readers[i]
        reader.deltas(text, finished=True)
        message = reader.message()
        message.reasoning_content = reasoning
        return message, reader.finish_reason(s.finish_reason)

    def _completion_choice(self, i: int, s: ChoiceState) -> CompletionChoice:
        job = self.job
        text, tokens, logprobs = s.text, s.tokens, None
        if job.drop:  # max_tokens=0: only the prompt
            text, tokens = "", []
        reason = "length" if job.drop else s.finish_reason
        if not job.echo:
            return CompletionChoice(index=i, text=text, logprobs=self._completion_logprobs(tokens, 0),
                                    finish_reason=reason, prompt_logprobs=self._prompt_logprobs(s))
        pieces = prompt_pieces(self.tokenizer, job.choice_prompts[i], job.config.skip_special_tokens)
        prompt_text = "".join(pieces)
        if job.logprobs is not None:
            entries = s.completion.prompt_logprobs if s.completion is not None else None
            entries = entries or [None] * len(pieces)
            k = job.logprobs
            logprobs = completion_logprobs(self.tokenizer, list(zip(pieces, entries)) + tokens, 0, k=k, chosen=True,
                                           skip_special_tokens=job.config.skip_special_tokens)
        return CompletionChoice(index=i, text=prompt_text + text, logprobs=logprobs, finish_reason=reason,
                                prompt_logprobs=self._prompt_logprobs(s))

    def _prompt_logprobs(self, s: ChoiceState):
        if self.job.prompt_logprobs is None or s.completion is None:
            return None
        return vllm_prompt_logprobs(self.tokenizer, s.completion.prompt_logprobs, self.job.prompt_logprobs,
                                    self.job.config.skip_special_tokens)

    def _chat_logprobs(self, tokens: list):
        if self.job.logprobs is None:
            return None
        return chat_logprobs(self.tokenizer, tokens, self.job.config.skip_special_tokens)

    def _completion_logprobs(self, tokens: list, offset: int):
        # The sampled token is in its top_logprobs however likely it was (OpenAI's "up to logprobs+1"; vLLM's)
        if self.job.logprobs is None:
            return None
        return completion_logprobs(self.tokenizer, tokens, offset, chosen=True,
                                   skip_special_tokens=self.job.config.skip_special_tokens)

    # -- server-sent events -----------------------------------------------------------------

    def _chat_chunk(self, choices: list[ChatChunkChoice], usage: Optional[Usage] = None) -> ChatCompletionChunk:
        return ChatCompletionChunk(id=self.id, created=self.created, model=self.state.model_name,
                                   choices=choices, usage=usage)

    def _completion_chunk(self, choices: list[CompletionChoice], usage: Optional[Usage] = None) -> TextCompletion:
        return TextCompletion(id=self.id, created=self.created, model=self.state.model_name, choices=choices,
                          usage=usage)

    async def chat_events(self, include_usage: bool) -> AsyncIterator[BaseModel]:
        for i in range(len(self.states)):  # the first chunk of each choice carries the role
            first = Delta(role="assistant") if self.readers else Delta(role="assistant", content="")
            yield self._chat_chunk([ChatChunkChoice(index=i, delta=first)])
        async for i, piece, tokens, out in self.outputs():
            reasoning = None
            if self.splitters is not None:
                reasoning, piece = self.splitters[i].feed(piece, out.finished)
                reasoning = reasoning or None
            if self.readers is not None:
                for choice in self._tool_chunk_choices(i, piece, tokens, out, reasoning):
                    yield self._chat_chunk([choice])
            elif piece or reasoning or tokens or out.finished:
                delta = Delta(content=piece if piece or (tokens and not reasoning) else None,
                              reasoning_content=reasoning)
                lps = self._chat_logprobs(tokens) if tokens else None
                yield self._chat_chunk([ChatChunkChoice(
                    index=i, delta=delta, logprobs=lps, finish_reason=out.finish_reason if out.finished else None,
                    prompt_logprobs=self._prompt_logprobs(self.states[i]) if out.finished else None)])
        if include_usage:
            yield self._chat_chunk([], self.usage())

    def _tool_chunk_choices(self, i: int, piece: str, tokens: list, out: Any,
                            reasoning: Optional[str] = None) -> list[ChatChunkChoice]:
        """A piece of a reply that may call tools: its thinking, then its content and call deltas
        (the markers are never content), the tokens' logprobs on the first, the finish reason on a
        last empty one."""
        choices = [ChatChunkChoice(index=i, delta=Delta(reasoning_content=reasoning))] if reasoning else []
        choices += [ChatChunkChoice(index=i, delta=d) for d in self.readers[i].deltas(piece, out.finished)]
        if tokens and self.job.logprobs is not None:
            if not choices:
                choices.append(ChatChunkChoice(index=i, delta=Delta()))
            choices[0].logprobs = self._chat_logprobs(tokens)
        if out.finished:
            choices.append(ChatChunkChoice(index=i, delta=Delta(),
                                           finish_reason=self.readers[i].finish_reason(out.finish_reason),
                                           prompt_logprobs=self._prompt_logprobs(self.states[i])))
        return choices

    async def completion_events(self, include_usage: bool) -> AsyncIterator[BaseModel]:
        async for i, piece, tokens, out in self.outputs():
            if piece or tokens or out.finished:
                lps = self._completion_logprobs(tokens, self.sent_chars[i]) if tokens else None
                self.sent_chars[i] += sum(len(s) for s, _ in tokens)
                yield self._completion_chunk([CompletionChoice(
                    index=i, text=piece, logprobs=lps, finish_reason=out.finish_reason if out.finished else None,
                    prompt_logprobs=self._prompt_logprobs(self.states[i]) if out.finished else None)])
        if include_usage:
            yield self._completion_chunk([], self.usage())


async def _disconnected(request: Request) -> None:
    """Returns when the client goes away (the body has been read, so only that can arrive)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def sse(events: AsyncIterator[BaseModel], log_fields: dict) -> AsyncIterator[bytes]:
    """`data: {json}` per event, then `data: [DONE]`; an error after the start is an `error` event."""
    try:
        async for event in events:
            yield b"data: " + event.model_dump_json().encode() + b"\n\n"
    except Exception as e:  # noqa: BLE001 - the stream has started: the client gets an error event, not a 500
        err = e if isinstance(e, APIError) else APIError(500, "internal server error")
        if not isinstance(e, APIError):
            log.error("stream failed: %s: %s", type(e).__name__, e)
        log_fields["error"] = err.message
        yield b"event: error\ndata: " + err.body().model_dump_json().encode() + b"\n\n"
    yield b"data: [DONE]\n\n"


class EventStream(StreamingResponse):
    """A text/event-stream response that runs `on_close` however it ends, even when the
    client leaves before the first event (the generator's own `finally` would not run)."""

    def __init__(self, content: AsyncIterator[bytes], on_close: Callable[[], None]):
        super().__init__(content, media_type="text/event-stream",
                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self.on_close = on_close

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.on_close()
