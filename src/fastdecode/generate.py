"""The generation loop: prefill once, then decode one token per step.

A batch of prompts of different lengths is left-padded to a common length T,
so every row writes the same cache slots; `left_pad[b]` tells the model which
leading slots of row b are padding (skipped by attention, not counted by RoPE).

    slots:      0   1   2   3   4 | 5   6   ...
    row 0:    pad pad  p0  p1  p2 | g0  g1         left_pad[0] = 2
    row 1:     p0  p1  p2  p3  p4 | g0  g1         left_pad[1] = 0
              '---- prefill ----' '- decode steps -'
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterator, Optional, Sequence

import torch
from torch import Tensor

from . import metrics
from .errors import FastDecodeError
from .kv_cache import KVCache
from .sampling import PenaltyState, SamplingParams, draw_noise, make_generator, sample
from .tokenizer import StreamDecoder, Tokenizer

# (tokens [B, T], input_pos [T], left_pad [B] or None) -> logits [B, 1, V] of the last slot
StepFn = Callable[[Tensor, Tensor, Optional[Tensor]], Tensor]
# (token [B], start slot, n, left_pad, pick) -> the next n tokens [B], one at a time;
# a compile strategy may supply one that decodes several steps per call.
DecodeTokensFn = Callable[..., Iterator[Tensor]]


@dataclass(frozen=True)
class GenerationConfig:
    """When to stop.

    max_new_tokens: >= 1, the most tokens generated per prompt.
    min_new_tokens: EOS is suppressed until this many tokens exist (0 <= min <= max).
    stop: strings that end a completion; the text is cut before the match.
    ignore_eos: keep going through EOS tokens (until max_new_tokens or a stop string).
    eos_token_ids: ids that end a completion; None takes the tokenizer's.
    """

    max_new_tokens: int = 256
    min_new_tokens: int = 0
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    eos_token_ids: Optional[frozenset[int]] = None

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
        stop = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())
        if any(not isinstance(s, str) or not s for s in stop):
            raise FastDecodeError(f"stop must be non-empty strings, got {self.stop!r}")
        object.__setattr__(self, "stop", stop)
        if self.eos_token_ids is not None:
            object.__setattr__(self, "eos_token_ids", frozenset(int(i) for i in self.eos_token_ids))


@dataclass
class Completion:
    """One prompt's result. `token_ids` are the generated ids only (no EOS)."""

    text: str
    token_ids: list[int]
    finish_reason: str  # "stop" (EOS or stop string) or "length"
    prompt_tokens: int
    completion_tokens: int
    time_to_first_token_s: float  # prefill, including the first sample
    decode_tokens_per_s: float  # decode steps per second for this batch, per sequence
    peak_memory_bytes: int


@dataclass
class StepOutput:
    """What one step added: the text piece per row ('' if none or finished)."""

    pieces: list[str]
    finished: list[bool]


# -- the three steps ----------------------------------------------------------

def prefill(step: StepFn, tokens: Tensor, left_pad: Optional[Tensor],
            pick: Callable[[Tensor], Tensor]) -> Tensor:
    """Run the whole (padded) prompt through the model once.

    With a prompt of T tokens, this writes K/V for slots 0..T-1 into every
    layer's cache and returns the token for slot T, picked from the logits of
    slot T-1. tokens: [B, T] -> next token [B].
    """
    input_pos = torch.arange(tokens.shape[1], device=tokens.device)
    return pick(step(tokens, input_pos, left_pad)[:, -1])


def decode_one_token(step: StepFn, token: Tensor, input_pos: Tensor, left_pad: Optional[Tensor],
                     pick: Callable[[Tensor], Tensor]) -> Tensor:
    """Feed one token per row at slot `input_pos` ([1]).

    This writes that token's K/V into slot input_pos, attends over slots
    0..input_pos (minus padding) and returns the token for slot input_pos + 1.
    token: [B] -> next token [B].
    """
    return pick(step(token[:, None], input_pos, left_pad)[:, -1])


def decode_n_tokens(step: StepFn, token: Tensor, start: int, n: int, left_pad: Optional[Tensor],
                    pick: Callable[[Tensor], Tensor]) -> Iterator[Tensor]:
    """Decode up to n tokens after `token`, which sits at slot `start`.

    Yields each new token [B] as soon as it exists; slot start+i receives the
    K/V of the i-th fed token. The caller stops the iteration early (EOS).
    """
    input_pos = torch.tensor([start], device=token.device)
    for _ in range(n):
        token = decode_one_token(step, token, input_pos, left_pad, pick)
        input_pos += 1
        yield token


# -- per-request sampling state -------------------------------------------------

class RequestSampler:
    """Sampling for one request, called once per generated token ([B, V] logits -> [B]).

    Its state is public because compiled strategies advance it in bulk: `generator`
    (None when greedy), `penalties` (None without penalties), `eos_ban` ([V] bool),
    `min_new` and `step` (tokens picked so far).
    """

    def __init__(self, params: SamplingParams, cfg: GenerationConfig, eos_ids: frozenset[int],
                 prompts: Sequence[Sequence[int]], vocab_size: int, device: torch.device):
        self.params, self.device = params, device
        self.generator = None if params.greedy else make_generator(params, device)
        self.penalties = (PenaltyState.from_prompts(prompts, vocab_size, device)
                          if params.uses_penalties else None)
        self.min_new = cfg.min_new_tokens
        self.eos_ban = torch.zeros(vocab_size, dtype=torch.bool, device=device)
        self.eos_ban[[i for i in eos_ids if 0 <= i < vocab_size]] = True
        self.step = 0

    def __call__(self, logits: Tensor) -> Tensor:  # [B, V] -> [B]
        noise = None if self.generator is None else draw_noise(self.generator, logits.shape, self.device)
        banned = self.eos_ban if self.step < self.min_new else None
        token = sample(logits, self.params, noise, self.penalties, banned)
        if self.penalties is not None:
            self.penalties.update(token)
        self.step += 1
        return token


# -- text bookkeeping ---------------------------------------------------------------

class _RowText:
    """Streams one row's text, holding back what could still become a stop string."""

    def __init__(self, tokenizer: Tokenizer, stop: tuple[str, ...]):
        self.decoder = StreamDecoder(tokenizer)
        self.stop = stop
        self.text = ""  # everything decoded so far (cut at a stop string once found)
        self.emitted = 0  # chars of self.text already handed out
        self.hit_stop = False

    def push(self, token: int) -> str:
        self.text += self.decoder.push([token])
        if self.stop:
            cut = min((i for i in (self.text.find(s) for s in self.stop) if i >= 0), default=-1)
            if cut >= 0:
                self.text, self.hit_stop = self.text[:cut], True
                return self._emit(len(self.text))
            return self._emit(len(self.text) - self._partial_stop_len())
        return self._emit(len(self.text))

    def finish(self) -> str:
        if not self.hit_stop:
            self.text += self.decoder.flush()
        return self._emit(len(self.text))

    def _partial_stop_len(self) -> int:
        """Length of the longest tail of the text that begins some stop string."""
        best = 0
        for s in self.stop:
            for n in range(min(len(s) - 1, len(self.text)), best, -1):
                if self.text.endswith(s[:n]):
                    best = n
                    break
        return best

    def _emit(self, upto: int) -> str:
        upto = max(upto, self.emitted)
        piece, self.emitted = self.text[self.emitted:upto], upto
        return piece


# -- the loop ---------------------------------------------------------------------------

def bucket_length(needed: int, limit: int, minimum: int = 256) -> int:
    """Cache length for a request: the next power of two >= needed, capped at `limit`.

    Attention always spans the whole cache, so sizing it to the request keeps the
    cost per step proportional to the length in use (at most 2x), while the
    few distinct sizes keep compiled graphs and allocations reusable.
    """
    size = minimum
    while size < needed:
        size *= 2
    return min(size, limit)


@dataclass
class GenerationRun:
    """Iterate to drive the loop (one StepOutput per step); then read `completions`."""

    steps: Iterator[StepOutput]
    completions: list[Completion] = field(default_factory=list)

    def __iter__(self) -> Iterator[StepOutput]:
        return self.steps


def run_generation(model: torch.nn.Module, tokenizer: Tokenizer, prompts: list[list[int]],
                   params: SamplingParams, cfg: GenerationConfig, *, prefill_step: StepFn,
                   decode_step: StepFn, pad_id: int, max_seq_len: int,
                   cache_kind: str = "static", decode_tokens: Optional[DecodeTokensFn] = None) -> GenerationRun:
    """Generate for already-validated prompts (lists of ids). See module docstring."""
    run = GenerationRun(iter(()))
    if decode_tokens is None:
        def decode_tokens(token, start, n, left_pad, pick):
            return decode_n_tokens(decode_step, token, start, n, left_pad, pick)
    run.steps = _loop(run, model, tokenizer, prompts, params, cfg, prefill_step, decode_tokens,
                      pad_id, max_seq_len, cache_kind)
    return run


def _loop(run, model, tokenizer, prompts, params, cfg, prefill_step, decode_tokens, pad_id,
          max_seq_len, cache_kind) -> Iterator[StepOutput]:
    device = next(model.parameters()).device
    B, T = len(prompts), max(len(p) for p in prompts)
    eos_ids = frozenset() if cfg.ignore_eos else (
        cfg.eos_token_ids if cfg.eos_token_ids is not None else tokenizer.eos_ids)
    S = bucket_length(T + cfg.max_new_tokens, max_seq_len)
    cache = model.kv_cache
    if cache_kind == "dynamic":
        model.setup_caches(B, S, kind="dynamic")
    elif not (isinstance(cache, KVCache) and cache.batch_size >= B and cache.seq_len == S):
        model.setup_caches(B, S)

    pads = [T - len(p) for p in prompts]
    tokens = torch.tensor([[pad_id] * n + list(p) for n, p in zip(pads, prompts)], device=device)
    left_pad = torch.tensor(pads, device=device) if any(pads) else None
    pick = RequestSampler(params, cfg, eos_ids, prompts, model.args.vocab_size, device)
    rows = [_RowText(tokenizer, cfg.stop) for _ in range(B)]
    out_ids: list[list[int]] = [[] for _ in range(B)]
    reasons: list[Optional[str]] = [None] * B

    metrics.reset_peak_memory(device)
    t0 = metrics.now(device)
    # Inference mode is entered per model call, never across a `yield`: a
    # suspended generator would otherwise leave the caller's thread in it.
    with torch.inference_mode():
        token = prefill(prefill_step, tokens, left_pad, pick)
    t_first = metrics.now(device)
    decode = decode_tokens(token, T, cfg.max_new_tokens - 1, left_pad, pick)
    n_steps = 0
    while True:
        ids = token.tolist()  # the one host sync per step
        pieces = [""] * B
        for b in range(B):
            if reasons[b] is not None:
                continue
            if ids[b] in eos_ids:
                reasons[b] = "stop"
                pieces[b] = rows[b].finish()
                continue
            out_ids[b].append(ids[b])
            pieces[b] = rows[b].push(ids[b])
            if rows[b].hit_stop:
                reasons[b] = "stop"
            elif len(out_ids[b]) >= cfg.max_new_tokens:
                reasons[b] = "length"
                pieces[b] += rows[b].finish()
        finished = [r is not None for r in reasons]
        yield StepOutput(pieces, finished)
        if all(finished):
            break
        with torch.inference_mode():
            token = next(decode)
        n_steps += 1
    t_end = metrics.now(device)

    decode_rate = n_steps / (t_end - t_first) if n_steps and t_end > t_first else 0.0
    peak = metrics.peak_memory_bytes(device)
    run.completions = [
        Completion(text=rows[b].text, token_ids=out_ids[b], finish_reason=reasons[b],
                   prompt_tokens=len(prompts[b]), completion_tokens=len(out_ids[b]),
                   time_to_first_token_s=t_first - t0, decode_tokens_per_s=decode_rate,
                   peak_memory_bytes=peak)
        for b in range(B)
    ]
