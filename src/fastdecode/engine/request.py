"""A request's settings, its life in the engine, and what it hands back."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Optional

import torch

from ..errors import FastDecodeError
from ..sampling import SamplingParams, make_generator
from ..text.tokenizer import Tokenizer
from .speculative import DraftModelRow, PromptLookup, check_speculative, draft_model_name
from .stopping import StopText


@dataclass(frozen=True)
class GenerationConfig:
    """When to stop.

    max_new_tokens: >= 1, the most tokens generated per prompt.
    min_new_tokens: EOS is suppressed until this many tokens exist (0 <= min <= max).
    stop: strings that end a completion; the text is cut before the match.
    ignore_eos: keep going through EOS tokens (until max_new_tokens or a stop string).
    eos_token_ids: ids that end a completion; None takes the tokenizer's.
    speculative: "none", "prompt-lookup" (drafts from n-grams of the prompt and output)
        or "draft:<model>" (drafts from that model, which load(speculative=...) must
        have loaded); drafts are verified by the model, so the output is the model's
        own (the same tokens when greedy). None takes load()'s.
    num_draft_tokens: the most drafts per verify step (1..16); adapted per request.
    ngram_size: the longest n-gram looked up for drafts (1..8).
    cache_salt: requests share cached prompt prefixes only with requests of the same salt
        (None: the unsalted pool), so tenants' prompts never meet.
    skip_special_tokens: leave special tokens out of the text (False: a reply whose format
        marks tool calls with special tokens, as Mistral's `[TOOL_CALLS]`, keeps them).
    """

    max_new_tokens: int = 256
    min_new_tokens: int = 0
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    eos_token_ids: Optional[frozenset[int]] = None
    speculative: Optional[str] = None
    num_draft_tokens: int = 4
    ngram_size: int = 3
    cache_salt: Optional[str] = None
    skip_special_tokens: bool = True

    def __post_init__(self) -> None:
        for name in ("max_new_tokens", "min_new_tokens"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int):
                raise FastDecodeError(f"{name} must be an integer, got {v!r}")
        if self.max_new_tokens < 1:
            raise FastDecodeError(f"max_new_tokens={self.max_new_tokens} is out of range; accepted: an integer >= 1")
        if not 0 <= self.min_new_tokens <= self.max_new_tokens:
            raise FastDecodeError(
                f"min_new_tokens={self.min_new_tokens} is out of range; accepted: 0 <= min_new_tokens <= "
                f"max_new_tokens ({self.max_new_tokens})")
        if self.stop is not None and not isinstance(self.stop, (str, list, tuple)):
            raise FastDecodeError(f"stop must be a string or a list of strings, got {self.stop!r:.40}")
        stop = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())
        bad = [s for s in stop if not isinstance(s, str) or not s]
        if bad:
            raise FastDecodeError(f"stop must be non-empty strings, got {bad[0]!r:.40}")
        object.__setattr__(self, "stop", stop)
        if self.eos_token_ids is not None:
            object.__setattr__(self, "eos_token_ids", frozenset(int(i) for i in self.eos_token_ids))
        check_speculative(self.speculative, self.num_draft_tokens, self.ngram_size)
        for name in ("ignore_eos", "skip_special_tokens"):
            if not isinstance(getattr(self, name), bool):
                raise FastDecodeError(f"{name} must be true or false, got {getattr(self, name)!r:.40}")
        if self.cache_salt is not None and not isinstance(self.cache_salt, str):
            raise FastDecodeError(f"cache_salt must be a string, got {type(self.cache_salt).__name__}")


@dataclass
class TokenLogprob:
    """A generated token's log-probability under the model, with the most likely alternatives."""

    token_id: int
    logprob: float
    top: list[tuple[int, float]]  # (id, logprob), most likely first
    rank: Optional[int] = None  # 1 + tokens strictly more likely (set for prompt logprobs)


@dataclass
class Completion:
    """One request's result. `token_ids` are the generated ids only (no EOS);
    `completion_tokens` counts what the model generated, a final EOS included (as OpenAI)."""

    text: str
    token_ids: list[int]
    finish_reason: str  # "stop" (EOS or stop string), "length" or "abort" (cancelled)
    prompt_tokens: int
    completion_tokens: int
    time_to_first_token_s: float  # from submission to the first token (queueing and prefill)
    decode_tokens_per_s: float  # tokens after the first, per second of this request's decoding
    peak_memory_bytes: int
    logprobs: Optional[list[TokenLogprob]] = None
    target_forwards: int = 0  # model forwards that produced this request's tokens (prefill's last chunk included)
    draft_tokens: int = 0  # speculative drafts proposed, and accepted
    accepted_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens reused from the prefix cache (not prefilled)
    # With SamplingParams.prompt_logprobs: one per prompt token, the first None.
    prompt_logprobs: Optional[list[Optional[TokenLogprob]]] = None
    # LLM.chat on a template whose replies keep their reasoning apart (gpt-oss's analysis channel):
    # that reasoning, with `text` the answer alone; None otherwise.
    reasoning: Optional[str] = None

    @property
    def acceptance_rate(self) -> Optional[float]:
        return self.accepted_tokens / self.draft_tokens if self.draft_tokens else None

    @property
    def tokens_per_forward(self) -> float:
        return self.completion_tokens / self.target_forwards if self.target_forwards else 0.0


@dataclass
class RequestOutput:
    """What one engine step added to a request."""

    request_id: str
    text: str  # the new text ('' while a partial stop string or UTF-8 sequence is held back)
    token_ids: list[int]  # the new tokens (EOS excluded)
    logprobs: Optional[list[TokenLogprob]] = None
    finished: bool = False
    finish_reason: Optional[str] = None
    completion: Optional[Completion] = None  # set on the last output
    error: Optional[BaseException] = None  # set when the engine failed this request


class Request:
    """One prompt's state in the engine. Only the engine's thread changes it,
    except `cancelled`, which any thread may set (through Engine.cancel)."""

    def __init__(self, request_id: str, prompt: list[int], params: SamplingParams, config: GenerationConfig,
                 eos_ids: frozenset[int], tokenizer: Tokenizer, device: torch.device,
                 sink: Callable[[RequestOutput], None], speculative: str = "none"):
        self.id, self.prompt, self.params, self.config = request_id, prompt, params, config
        self.uid = 0  # the engine's number for it, the same on every tensor-parallel rank
        self.speculative = speculative
        self.eos_ids = eos_ids
        self.sink = sink
        self.generator = None if params.greedy else make_generator(params, device)
        self.slot: Optional[int] = None
        self.prefilled = 0  # prompt tokens already in the cache
        self.cached = 0  # of those, reused from the prefix cache rather than prefilled
        self.pos = 0  # the next cache position to write
        self.last_token = 0  # the newest token, fed at `pos` by the next decode step
        self.n_generated = 0  # tokens picked so far (an EOS counts)
        self.output_ids: list[int] = []
        self.logprobs: Optional[list[TokenLogprob]] = [] if params.logprobs is not None else None
        self.prompt_logprobs: Optional[list[Optional[TokenLogprob]]] = (
            [None] if params.prompt_logprobs is not None else None)
        self.text = StopText(tokenizer, config.stop, config.skip_special_tokens)
        self.forwards = 0  # model forwards that produced its tokens
        # Drafting state for speculative decoding, from its own prompt and output.
        self.spec = (PromptLookup(prompt, config.ngram_size, config.num_draft_tokens)
                     if speculative == "prompt-lookup" else
                     DraftModelRow(prompt, config.num_draft_tokens) if draft_model_name(speculative) else None)
        # Its place in its grammar (structured.GrammarState), set by the engine, with a constraint.
        self.grammar = None
        self.finish_reason: Optional[str] = None
        self.cancelled = False
        self.t_submit = time.perf_counter()
        self.t_first: Optional[float] = None
        self.t_last: Optional[float] = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def prefilling(self) -> bool:
        return self.prefilled < len(self.prompt)

    def cached_tokens(self) -> list[int]:
        """The tokens whose keys and values its slot's rows 0..n-1 hold now."""
        if self.prefilling:
            return self.prompt[:self.prefilled]
        return (self.prompt + self.output_ids)[:self.pos]

    @property
    def remaining(self) -> int:
        """Tokens it may still generate."""
        return self.config.max_new_tokens - self.n_generated

    def completion(self, peak_memory_bytes: int) -> Completion:
        t_first = self.t_first if self.t_first is not None else time.perf_counter()
        span = (self.t_last or t_first) - t_first
        return Completion(
            text=self.text.text, token_ids=list(self.output_ids), finish_reason=self.finish_reason,
            prompt_tokens=len(self.prompt), cached_tokens=self.cached, completion_tokens=self.n_generated,
            time_to_first_token_s=t_first - self.t_submit,
            decode_tokens_per_s=(self.n_generated - 1) / span if span > 0 and self.n_generated > 1 else 0.0,
            peak_memory_bytes=peak_memory_bytes, logprobs=self.logprobs, prompt_logprobs=self.prompt_logprobs,
            target_forwards=self.forwards,
            draft_tokens=self.spec.drafted if self.spec else 0,
            accepted_tokens=self.spec.accepted if self.spec else 0)
