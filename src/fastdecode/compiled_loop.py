"""The `generate` compile strategy: K decode steps per compiled call.

One graph holds K model steps and everything between them: sampling with the
request's SamplingParams (randomness passed in as Exponential noise, drawn in
the same order as the eager loop draws it), repetition/frequency/presence
penalties, the EOS ban before min_new_tokens, and per-row finishing (a row
that emits a stop token or reaches max_new_tokens is done; later steps feed it
its stop token again). The host checks stop strings and "all rows done"
between calls, so the eager loop in `generate` drives this unchanged: it pulls
tokens one at a time, and a new chunk is computed when the last one is used up.

A chunk never writes past the request's cache: when fewer than K steps remain,
the rest runs through the single-step decode graph with the same sampler.
"""

from __future__ import annotations

from typing import Iterator, Optional

import torch
from torch import Tensor

from .compile import CompiledSteps, Steps, fit_cache, own_code
from .sampling import PenaltyState, SamplingParams, draw_noise, sample

DEFAULT_CHUNK = 8


class ChunkDecoder:
    """decode_tokens(token, start, n, left_pad, pick) -> iterator of next tokens [B].

    `pick` is generate's per-request sampler: its generator, penalty state, EOS
    mask, min_new_tokens and step count are read and advanced here exactly as
    its own __call__ would, which is what keeps seeded sampling identical.
    """

    def __init__(self, steps: CompiledSteps, k: int = DEFAULT_CHUNK):
        self.steps, self.k = steps, k
        model = steps.model

        # The K model steps are inlined, but each of their blocks is a nested
        # compile region (model.TransformerBlock): the graph compiles one block
        # and calls it K * n_layers times, so compile time barely grows with K.
        def model_step(token: Tensor, input_pos: Tensor, left_pad: Tensor) -> Tensor:
            return model(token[:, None], input_pos, left_pad=left_pad, last_only=True)[:, -1]  # [B, V]

        def chunk_fn(token: Tensor, input_pos: Tensor, left_pad: Tensor, noise: Optional[Tensor],
                     counts: Optional[Tensor], seen: Optional[Tensor], eos_mask: Tensor, step0: Tensor,
                     min_new: Tensor, done: Tensor, n_gen: Tensor, max_new: Tensor,
                     params: SamplingParams):
            # token: [B] at slot input_pos ([1]); noise: [K, B, V]; eos_mask: [V] bool;
            # step0, min_new, max_new: [] ; done: [B] bool; n_gen: [B] tokens so far.
            penalties = None if counts is None else PenaltyState(counts, seen)
            out = []
            for i in range(k):
                logits = model_step(token, input_pos + i, left_pad)
                banned = eos_mask & (step0 + i < min_new)  # [V]: EOS only before min_new_tokens
                nxt = sample(logits, params, None if noise is None else noise[i], penalties, banned)
                if penalties is not None:
                    penalties.update(nxt)
                # Finished rows repeat their last token; their output is ignored.
                nxt = torch.where(done, token, nxt)
                n_gen = n_gen + (~done).long()
                done = done | eos_mask[nxt] | (n_gen >= max_new)
                out.append(nxt)
                token = nxt
            return torch.stack(out), done, n_gen  # [K, B], [B], [B]

        self._chunk = torch.compile(own_code(chunk_fn), **steps.compile_kwargs)

    def __call__(self, token: Tensor, start: int, n: int, left_pad: Optional[Tensor], pick) -> Iterator[Tensor]:
        B, dev = token.shape[0], token.device
        V = pick.eos_ban.shape[0]
        with torch.inference_mode():
            pos = torch.tensor([start], device=dev)
            done = pick.eos_ban[token].clone()
            n_gen = torch.ones(B, dtype=torch.long, device=dev)
            max_new = torch.tensor(n + 1, device=dev)
            min_new = torch.tensor(pick.min_new, device=dev)
            pad = torch.zeros(B, dtype=torch.long, device=dev) if left_pad is None else left_pad.clone()
        produced = 0
        while n - produced >= self.k:
            with torch.inference_mode():
                noise = None if pick.generator is None else torch.stack(
                    [draw_noise(pick.generator, (B, V), dev) for _ in range(self.k)])
                pen = pick.penalties
                toks, done, n_gen = self.steps.call(
                    self._chunk, token.clone(), pos.clone(), pad, noise,
                    None if pen is None else pen.counts, None if pen is None else pen.seen,
                    pick.eos_ban, torch.tensor(pick.step, device=dev), min_new, done, n_gen, max_new,
                    params=pick.params, dynamic={0: (0,), 2: (0,), 3: (1,), 4: (0,), 5: (0,), 9: (0,), 10: (0,)})
            pick.step += self.k
            pos = pos + self.k
            produced += self.k
            for i in range(self.k):
                yield toks[i]
            token = toks[-1]
        # The tail, shorter than a chunk: single compiled steps, eager sampling.
        for _ in range(n - produced):
            with torch.inference_mode():
                token = pick(self.steps.decode(token[:, None], pos, left_pad)[:, -1])
            pos = pos + 1
            yield token

    def warmup(self) -> None:
        """Compile the greedy chunk graph (it serves every batch size)."""
        from .generate import RequestSampler, GenerationConfig

        model = self.steps.model
        device = model.device
        S = min(256, model.args.max_seq_len)
        V = model.args.vocab_size
        fit_cache(model, 1, S)
        params = SamplingParams(temperature=0)
        with torch.inference_mode(False):  # as generate builds it
            cfg = GenerationConfig(max_new_tokens=self.k + 1)
            pick = RequestSampler(params, cfg, frozenset(), [[0]], V, device)
        token = torch.zeros(1, dtype=torch.long, device=device)
        for _ in self(token, 1, self.k, None, pick):
            pass


def make_generate_steps(model: torch.nn.Module, k: int = DEFAULT_CHUNK, **kwargs) -> Steps:
    steps = CompiledSteps(model, **kwargs)
    chunk = ChunkDecoder(steps, k)
    steps.extra_warmups.append(chunk.warmup)
    return Steps(prefill=steps.prefill, decode=steps.decode, warmup=steps.warmup, chunk=chunk)
