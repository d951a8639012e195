"""The engine: one owner for the model, its KV cache and the slots.

Requests join and leave a running batch between steps. Each `step()` admits
waiting requests into free slots, decodes one token for every running request
in one batched forward, and prefills one chunk of new prompts (in that same
forward where the model takes mixed steps: Runner.mixed). Callers never
touch the model: they `submit` and read their request's outputs, which a
step hands to the request's sink.

Two ways to drive it, both reading outputs through a `RequestStream`
(stream.py):
- synchronously, `LLM.generate`/`stream`/`chat` call `step()` in their own
  thread until their requests finish (see api/generate.py);
- asynchronously, a thread runs `run_loop()` and an asyncio consumer reads
  the outputs (`generate_async`, and the server's handlers); `start()`
  spawns such a thread if none runs. Both may be used at once: steps are
  serialized.

Which thread runs the loop matters on CPUs: each thread that starts OpenMP
parallel regions gets a thread pool of its own, and once a second pool exists
libgomp sees more threads than cores and its workers stop spinning between
regions. A step then waits on a wake-up per parallel region: the default
model decoded 2-4x slower in a thread other than the one that had loaded it
(benchmarks/engine/README.md). `EngineThread` loads the model and runs the
loop in one thread, which avoids that; the server and bench-engine use it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import operator
import threading
import time
from collections import deque
from typing import Any, AsyncIterator, Callable, Optional, Sequence

import torch

from . import timing as metrics
from ..compile.steps import Steps
from ..errors import ConstraintFailed, FastDecodeError
from ..model.kv_cache import cache_bytes
from ..paths import BusyFlag
from ..sampling import SamplingParams
from ..structured import start_state, vocab_for
from ..text.tokenizer import Tokenizer
from .draft import DraftModel, DraftProposer
from .request import GenerationConfig, Request, RequestOutput, TokenLogprob
from ..kernels.malloc import keep_freed_blocks, share_main_arena
from .prefix_cache import PrefixIndex
from .runner import RowOutput, Runner
from .stream import RequestStream
from .speculative import check_speculative, draft_model_name
from .scheduler import Scheduler

log = logging.getLogger("fastdecode")

DEFAULT_PREFILL_CHUNK = 256


class Engine:
    """Built once from its parts, never changed afterwards.

    steps: the model's step callables (a compile strategy's, a package's, or
        compile.background.PackageWhenReady, which the engine refreshes between requests).
    draft: the draft model of `speculative="draft:<name>"` requests; its cache slots
        are allocated here, mirroring the model's.
    seed_policy: draws the seed of a request that brings none; None: a fresh one each
        (parallel.SharedSeeds: tensor-parallel ranks must draw the same).
    sync: parallel.lockstep.StepSync while tensor-parallel ranks serve in lockstep: rank 0
        broadcasts each step's new and cancelled requests, the other ranks follow().
    """

    def __init__(self, model: torch.nn.Module, tokenizer: Tokenizer, steps: Steps, *, max_batch_size: int,
                 max_seq_len: int, cache: str = "static", prefill_chunk: int = DEFAULT_PREFILL_CHUNK,
                 speculative: str = "none", prefix_cache: bool = True, draft: Optional[DraftModel] = None,
                 seed_policy: Optional[Callable[[], int]] = None, sync: Optional[Any] = None):
        self.model, self.tokenizer = model, tokenizer
        self.max_batch_size, self.max_seq_len = max_batch_size, max_seq_len
        check_speculative(speculative, 1, 1)
        self._check_stateless(speculative, model)
        name = draft_model_name(speculative)
        if name is not None and (draft is None or draft.name != name):
            raise FastDecodeError(f"speculative={speculative!r} needs the draft model {name!r} passed as draft=")
        self.speculative = speculative  # requests that do not say take this
        self.kv_dtype = model.kv_dtype_name  # "float32", "float16", "bfloat16" or "q8_0"
        self.cache_bytes = self._setup_caches(model, cache)
        # Reuse of cached prompt prefixes (prefix_cache.py); a dynamic cache has no fixed slots to keep,
        # and LFM2's convolutions a state that holds no positions (short_conv.py).
        reuse = prefix_cache and cache == "static" and not model.args.conv_layers
        self.prefix = PrefixIndex(max_batch_size) if reuse else None
        # Steps of rows of one token (Runner.mixed): decode rows and prompt chunks share a forward,
        # and prompts of different lengths a step. Not beside the `generate` strategy's K-token graphs.
        takes_mixed = model.mixes_steps and steps.chunk is None
        self.scheduler = Scheduler(max_batch_size, prefill_chunk, max_seq_len, self.prefix, ragged=takes_mixed)
        self.draft: Optional[DraftProposer] = None
        if draft is not None:
            self.draft = DraftProposer(draft, model.args.vocab_size, max_batch_size, max_seq_len)
            self._setup_caches(draft.model, cache)
        self.runner = Runner(model, steps, max_batch_size, max_seq_len, draft=self.draft, takes_mixed=takes_mixed)
        if model.device.type == "cpu":  # a scored chunk's logits [prefill_chunk, V] float32, reused each step
            keep_freed_blocks(prefill_chunk * model.args.vocab_size * 4 * 5 // 4)
        self._lock = threading.RLock()  # held for a whole step
        self._busy = BusyFlag()
        self._inbox: deque[Request] = deque()  # submitted, not yet seen by a step (append is atomic)
        self._wake = threading.Condition(threading.Lock())
        self._thread: Optional[threading.Thread] = None
        self._ids = itertools.count()
        self._uids = itertools.count()
        self.sync = sync
        self.seed_policy = seed_policy
        self.closed = False
        self.steps_run = 0
        self.mixed_steps = 0  # of those, steps whose decode rows and prompt chunks ran as one forward

    @staticmethod
    def _check_stateless(speculative: str, model: torch.nn.Module) -> None:
        """Drafts are verified by a forward whose rejected tokens a KV cache forgets; LFM2's
        convolutions would keep them in their state."""
        if speculative != "none" and model.args.conv_layers:
            raise FastDecodeError(f"speculative={speculative!r}: LFM2's convolution layers cannot take back rejected "
                                  "drafts; accepted: none")

    def _setup_caches(self, model: torch.nn.Module, cache: str) -> int:
        """Allocate `model`'s KV cache for the engine's slots; its size in bytes."""
        a = model.args
        size = cache_bytes(a.attention_layers, self.max_batch_size, a.n_kv_heads, self.max_seq_len, a.head_dim,
                           model.kv_dtype or model.dtype)
        # Outside inference mode: buffers made inside carry other dispatch keys,
        # which compiled graphs would guard on.
        with torch.inference_mode(False):
            model.setup_caches(self.max_batch_size, self.max_seq_len, kind=cache)
        log.info("KV cache: %d slots x %d positions, %s, %d bytes (%.1f MB)", self.max_batch_size,
                 self.max_seq_len, model.kv_dtype_name, size, size / 1e6)
        return size

    # -- submitting ---------------------------------------------------------------------

    def check(self, prompt: Sequence[int], params: SamplingParams, config: GenerationConfig,
              name: str = "the prompt") -> list[int]:
        """The prompt's ids as a list, or a one-line FastDecodeError (naming the
        prompt `name`) when the request cannot run here: the one check of every
        request, whichever way it comes in (`submit` makes it)."""
        prompt = list(prompt)
        V = self.model.args.vocab_size
        if not prompt:
            raise FastDecodeError(f"{name} is empty")
        try:
            if any(isinstance(t, bool) for t in prompt):
                raise TypeError
            prompt = [operator.index(t) for t in prompt]  # numpy integers too
        except TypeError:
            odd = next(t for t in prompt if isinstance(t, bool) or not hasattr(t, "__index__"))
            raise FastDecodeError(f"{name} has {odd!r}, which is not a token id; accepted: integers") from None
        bad = next((t for t in prompt if not 0 <= t < V), None)
        if bad is not None:
            raise FastDecodeError(f"{name} has token id {bad}, outside the vocabulary [0, {V})")
        # Cache positions written: the prompt's and every new token's but the last, which is
        # never fed back (so a prompt filling the cache still gets its one token: echo's logprobs).
        need = len(prompt) + config.max_new_tokens - 1
        if need > self.max_seq_len:
            raise FastDecodeError(
                f"{name} has {len(prompt)} tokens; with max_new_tokens={config.max_new_tokens} it needs "
                f"{need} cache positions > max_seq_len={self.max_seq_len}")
        bad = next((i for i, _ in params.logit_bias or () if not 0 <= i < V), None)
        if bad is not None:
            raise FastDecodeError(f"logit_bias has token id {bad}, outside the vocabulary [0, {V})")
        mode = config.speculative or self.speculative
        self._check_stateless(mode, self.model)
        draft = draft_model_name(mode)
        if draft is not None and (self.draft is None or self.draft.name != draft):
            loaded = f"draft:{self.draft.name}" if self.draft is not None else "none"
            raise FastDecodeError(f"speculative={mode!r} needs that draft model loaded with the target: "
                                  f"load(..., speculative={mode!r}); this model was loaded with {loaded!r}")
        if params.constraint is not None:
            self._grammar(params, frozenset())  # compiles it for this tokenizer (cached), or fails here
        return prompt

    def submit(self, prompt: Sequence[int], params: SamplingParams, config: GenerationConfig, *,
               sink: Optional[Callable[[RequestOutput], None]] = None, request_id: Optional[str] = None,
               name: str = "the prompt") -> Request:
        """Queue a request (prompt: token ids). Its outputs go to `sink`, or to
        `request.outputs` (a deque) without one. Raises FastDecodeError, with
        nothing queued, when the request cannot run (see `check`)."""
        if self.closed:
            raise FastDecodeError("the engine is closed; load the model again to generate")
        prompt = self.check(prompt, params, config, name)
        mode = config.speculative or self.speculative
        if params.seed is None and self.seed_policy is not None:
            params = dataclasses.replace(params, seed=self.seed_policy())
        outputs: deque = deque()
        req = self._request(next(self._uids), request_id or f"req-{next(self._ids)}", prompt, params, config,
                            mode, sink or outputs.append)
        req.outputs = outputs
        # Not under the step lock: a submitter (the server's event loop) never waits for a step.
        self._inbox.append(req)
        if self.closed:  # closed while this was submitted: abort it rather than leave it waiting
            self._abort_all()
        self._notify()
        return req

    def _request(self, uid: int, rid: str, prompt: list[int], params: SamplingParams, config: GenerationConfig,
                 mode: str, sink: Callable[[RequestOutput], None]) -> Request:
        eos = frozenset() if config.ignore_eos else (
            config.eos_token_ids if config.eos_token_ids is not None else self.tokenizer.eos_ids)
        req = Request(rid, prompt, params, config, eos, self.tokenizer, self.model.device, sink, speculative=mode)
        req.uid = uid
        if params.constraint is not None:
            req.grammar = self._grammar(params, eos)
        return req

    def _grammar(self, params: SamplingParams, eos: frozenset[int]):
        """The request's matcher, its grammar compiled for this tokenizer (cached by both)."""
        vocab = vocab_for(self.tokenizer)
        if vocab.size > self.model.args.vocab_size:
            raise FastDecodeError(f"the tokenizer has {vocab.size} ids, more than the model's "
                                  f"{self.model.args.vocab_size}: constrained decoding cannot mask them")
        return start_state(params.constraint, vocab, eos)

    def cancel(self, request: Request) -> None:
        """Stop a request; its slot is freed at the next step, with finish_reason "abort"."""
        request.cancelled = True
        self._notify()

    # -- stepping -------------------------------------------------------------------------

    def has_work(self) -> bool:
        return bool(self._inbox) or self.scheduler.has_work()

    @property
    def slots_in_use(self) -> int:
        return self.scheduler.slots_in_use

    @property
    def queue_length(self) -> int:
        """Requests waiting for a slot."""
        return len(self.scheduler.waiting) + len(self._inbox)

    def _reap(self, uids: Optional[set[int]] = None) -> None:
        """Free the slots of cancelled requests (at the start of each step); in
        lockstep, of exactly those rank 0 announced (`uids`)."""
        for r in [*self.scheduler.waiting, *self.scheduler.active]:
            if (r.cancelled if uids is None else r.uid in uids) and not r.finished:
                self._finish(r, "abort", "")

    def step(self) -> None:
        """Run one step: cancellations, admissions, a decode step and a prefill chunk."""
        with self._lock:
            new = []
            while self._inbox:
                new.append(self._inbox.popleft())
            cancelled = None
            if self.sync is not None:
                if self.sync.stopped:
                    return
                new, cancelled = self._lockstep(new)
                if self.sync.stopped:  # rank 0 has aborted its requests: so do the others, with no step
                    self._abort_all()
                    return
            for r in new:
                self.scheduler.add(r)
            self._reap(cancelled)
            if not self.scheduler.active:  # no request in flight: safe to change what the steps run
                self.runner.steps.refresh()
                if self.draft is not None:
                    self.draft.steps.refresh()
            plan = self.scheduler.schedule()
            self._busy.set(not plan.empty)  # background exports pause while this is held
            for src, dst, n in plan.copies:
                for layer in self.model.layers:
                    layer.attention.kv_cache.copy_rows(src, dst, n)
            if plan.empty:
                return
            for r in plan.admitted:
                self.runner.assign(r)
            results = []
            try:
                if self.runner.mixes(plan.decode, plan.drafts, plan.prefill):
                    results += self.runner.mixed(plan.decode, plan.prefill, plan.chunks)
                    self.mixed_steps += 1
                else:
                    if plan.decode:
                        results += self.runner.decode(plan.decode, plan.drafts)
                    if len(set(plan.chunks)) == 1:  # a [G, T] group
                        results += self.runner.prefill(plan.prefill, plan.chunks[0])
                    elif plan.prefill:  # chunks of several lengths (a ragged group)
                        results += self.runner.mixed([], plan.prefill, plan.chunks)
            except BaseException as e:  # the model failed: fail its requests, keep the engine usable
                for r in plan.decode + plan.prefill:
                    self._fail(r, e)
                raise
            self.steps_run += 1
            now = time.perf_counter()
            for out in results:
                self._apply(out, now)
            self._busy.set(self.scheduler.has_work())

    def _lockstep(self, new: list[Request]) -> tuple[list[Request], set[int]]:
        """Rank 0: broadcast this step's new and cancelled requests. Other ranks:
        receive them and make the same requests (their outputs go nowhere)."""
        from ..parallel.lockstep import StepNews

        if self.sync.leader:
            live = [*self.scheduler.waiting, *self.scheduler.active]
            news = StepNews([(r.uid, r.prompt, r.params, r.config, r.speculative) for r in new],
                            [r.uid for r in live if r.cancelled and not r.finished], stop=self.closed)
            self.sync.exchange(news)
            return new, set(news.cancelled)
        news = self.sync.exchange(None)
        if news.stop:
            self.closed = True
        new = [self._request(uid, f"req-{uid}", prompt, params, config, mode, lambda out: None)
               for uid, prompt, params, config, mode in news.new]
        return new, set(news.cancelled)

    def follow(self) -> None:
        """Run rank 0's steps until it stops (a tensor-parallel rank other than 0 of a server)."""
        while not self.sync.stopped:
            self.step()

    def _apply(self, out: RowOutput, now: float) -> None:
        """What the runner computed for a request becomes its state (only here)."""
        r = out.request
        r.pos += out.written
        r.prefilled += out.prefilled
        r.forwards += out.forwards
        if out.prompt_logprobs:
            r.prompt_logprobs += out.prompt_logprobs
        if out.drafted:
            r.spec.update(out.drafted, out.accepted)
        if out.tokens:
            self._advance(r, out.tokens, out.logprobs, now)

    def _advance(self, r: Request, ids: list[int], lps: Optional[list[TokenLogprob]], now: float) -> None:
        """Take a request's new tokens: stopping, text, and its output."""
        if r.finished:
            return
        r.t_first = r.t_first or now
        r.t_last = now
        new_ids, new_lps, piece, reason = [], [], "", None
        if r.spec is not None:
            r.spec.extend(ids)
        g = r.grammar
        if g is not None and g.error() is not None:  # e.g. a mask past llguidance's limits
            self._fail(r, ConstraintFailed(f"the constraint failed: {g.error()}"))
            return
        for i, tok in enumerate(ids):
            if g is not None and g.finished:  # a complete grammar takes nothing more (not even EOS)
                reason = "stop"
                break
            r.n_generated += 1
            r.last_token = tok
            if tok in r.eos_ids:
                reason = "stop"
                break
            if g is not None:
                try:
                    g.consume(tok)
                except FastDecodeError as e:  # the mask allowed it, but the lexer ran past its limits on it
                    self._fail(r, e)
                    return
            r.output_ids.append(tok)
            new_ids.append(tok)
            if lps is not None:
                new_lps.append(lps[i])
            piece += r.text.push(tok)
            if r.text.hit_stop or (g is not None and g.finished):
                reason = "stop"
            elif r.remaining <= 0 or r.pos - (len(ids) - 1 - i) >= self.max_seq_len:  # no slot to feed it
                reason = "length"
            if reason:
                break
        if r.logprobs is not None:
            r.logprobs += new_lps
        if reason:
            self._finish(r, reason, piece, new_ids, new_lps if r.logprobs is not None else None)
        else:
            self._emit(r, RequestOutput(r.id, piece, new_ids, new_lps if r.logprobs is not None else None))

    def _emit(self, r: Request, out: RequestOutput) -> None:
        try:
            r.sink(out)
        except Exception as e:  # noqa: BLE001 - e.g. a consumer's closed event loop: drop the request only
            log.warning("request %s: its output could not be delivered (%s); cancelling it", r.id, e)
            r.cancelled = True

    def _finish(self, r: Request, reason: str, piece: str, ids: Optional[list[int]] = None,
                lps: Optional[list] = None) -> None:
        r.finish_reason = reason
        piece += r.text.finish()
        self.scheduler.remove(r)
        r.generator = None
        done = r.completion(metrics.peak_memory_bytes(self.model.device))
        self._emit(r, RequestOutput(r.id, piece, ids or [], lps, finished=True, finish_reason=reason, completion=done))

    def _fail(self, r: Request, error: BaseException) -> None:
        if r.finished:
            return
        r.finish_reason = "error"
        self.scheduler.remove(r)
        self._emit(r, RequestOutput(r.id, "", [], finished=True, finish_reason="error", error=error))

    # -- the background loop and the async interface ------------------------------------

    def _notify(self) -> None:
        with self._wake:
            self._wake.notify_all()

    def start(self) -> None:
        """Run steps in a background thread whenever there is work, unless a
        thread already runs the loop (see the module docstring on which thread)."""
        if not self.background:
            self._thread = threading.Thread(target=self.run_loop, name="fastdecode-engine", daemon=True)
            self._thread.start()

    @property
    def background(self) -> bool:
        """Whether a thread runs the loop (callers then wait for outputs instead of stepping)."""
        return self._thread is not None and self._thread.is_alive()

    def run_loop(self) -> None:
        """Run steps in the calling thread whenever there is work, until close()."""
        self._thread = threading.current_thread()
        heartbeat = self.sync.heartbeat_s if self.sync is not None else None
        while not self.closed:
            with self._wake:
                while not self.closed and not self.has_work():
                    if not self._wake.wait(heartbeat):
                        break  # in lockstep: an empty step keeps the other ranks' collective alive
            if self.closed:
                break
            try:
                self.step()
            except BaseException as e:  # noqa: BLE001 - its requests were failed with it; keep serving
                log.error("engine step failed: %s", e)

    def _abort_all(self) -> None:
        with self._lock:
            while self._inbox:
                self.scheduler.add(self._inbox.popleft())
            for r in [*self.scheduler.waiting, *self.scheduler.active]:
                self._finish(r, "abort", "")

    def close(self) -> None:
        """Cancel everything and stop the loop; later submissions are refused."""
        self.closed = True
        self._abort_all()
        self.runner.masks.close()
        if self.sync is not None and self.sync.leader:
            with self._lock:
                if not self.sync.stopped:
                    self.step()  # tells the other ranks to stop (closed: the news says so)
        self._notify()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=10)


    async def generate_async(self, prompt: Sequence[int], params: SamplingParams, config: GenerationConfig,
                             request_id: Optional[str] = None) -> AsyncIterator[RequestOutput]:
        """Submit, then yield the request's outputs as steps produce them; leaving
        the iteration early (or being cancelled) cancels the request."""
        stream = RequestStream(self, asyncio.get_running_loop()).submit([prompt], params, config,
                                                                       request_ids=[request_id])
        self.start()
        try:
            async for _, out in stream.outputs():
                yield out
        finally:
            stream.cancel()


class EngineThread(threading.Thread):
    """Loads a model with `load_llm()` and runs its engine loop, both in this
    thread (see the module docstring). `wait()` returns the LLM once loaded,
    or raises what loading raised; `on_loaded(llm, error)`, if given, is called
    in this thread once loading has ended (llm None on error), before the loop starts."""

    def __init__(self, load_llm: Callable[[], Any], name: str = "fastdecode-engine",
                 on_loaded: Optional[Callable[[Any, Optional[BaseException]], None]] = None):
        share_main_arena()  # before this thread's first allocation: see malloc.py
        super().__init__(name=name, daemon=True)
        self._load, self._on_loaded = load_llm, on_loaded
        self.llm = None
        self.error: Optional[BaseException] = None
        self.loaded = threading.Event()

    def run(self) -> None:
        try:
            self.llm = self._load()
        except BaseException as e:  # noqa: BLE001 - handed to wait()'s caller
            self.error = e
        finally:
            self.loaded.set()
            if self._on_loaded is not None:
                self._on_loaded(self.llm, self.error)
        if self.error is None:
            self.llm.engine.run_loop()

    def wait(self, timeout: Optional[float] = None):
        if not self.loaded.wait(timeout):
            return None
        if self.error is not None:
            raise self.error
        return self.llm
