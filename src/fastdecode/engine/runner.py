"""Runs a plan's steps on the model: builds the step's tensors, samples, and
returns each row's new tokens. Owns the per-slot sampling state."""

from __future__ import annotations

from typing import Optional, Sequence

import torch
from torch import Tensor

from ..compile import Steps
from ..sampling import sample, token_logprobs
from ..sampling.slots import SlotSampling
from .request import Request, TokenLogprob


class Runner:
    def __init__(self, model: torch.nn.Module, steps: Steps, n_slots: int, max_seq_len: int):
        self.model, self.steps = model, steps
        self.device = model.device
        self.V = model.args.vocab_size
        self.max_seq_len = max_seq_len
        self.sampling = SlotSampling(n_slots, self.V, self.device)

    def _tensor(self, values) -> Tensor:
        return torch.tensor(values, dtype=torch.long, device=self.device)

    def assign(self, r: Request) -> None:
        self.sampling.assign(r.slot, r.params, r.prompt, r.eos_ids)

    # -- steps -----------------------------------------------------------------------

    def prefill(self, reqs: Sequence[Request], n: int) -> list[tuple[Request, list[int], Optional[list]]]:
        """Feed the next n prompt tokens of each request; the requests whose
        prompt is then complete get their first token."""
        tokens = self._tensor([r.prompt[r.prefilled:r.prefilled + n] for r in reqs])  # [G, n]
        pos = self._tensor([list(range(r.prefilled, r.prefilled + n)) for r in reqs])  # [G, n]
        with torch.inference_mode():
            logits = self.steps.step(tokens, pos, self._tensor([r.slot for r in reqs]))[:, -1]  # [G, V]
        for r in reqs:
            r.prefilled += n
            r.pos = r.prefilled
        done = [i for i, r in enumerate(reqs) if not r.prefilling]
        if not done:
            return []
        if len(done) < len(reqs):
            logits = logits[done]
        return self.pick([reqs[i] for i in done], logits)

    def decode(self, reqs: Sequence[Request]) -> list[tuple[Request, list[int], Optional[list]]]:
        """One new token per request (K with the `generate` strategy's chunks)."""
        chunk = self.steps.chunk
        if (chunk is not None and max(r.remaining for r in reqs) >= chunk.k
                and all(r.params.logprobs is None for r in reqs)):
            return chunk(self, reqs)
        tokens = self._tensor([[r.last_token] for r in reqs])
        pos = self._tensor([[r.pos] for r in reqs])
        for r in reqs:
            r.pos += 1
        with torch.inference_mode():
            logits = self.steps.step(tokens, pos, self._tensor([r.slot for r in reqs]))[:, -1]
        return self.pick(reqs, logits)

    # -- sampling ----------------------------------------------------------------------

    def noise(self, reqs: Sequence[Request], k: Optional[int] = None) -> Optional[Tensor]:
        """Exponential noise [B, V] (or [k, B, V]), each row from its own request's
        generator, one [V] draw per token in order; ones on greedy rows."""
        if all(r.generator is None for r in reqs) and k is None:
            return None
        shape = (len(reqs), self.V) if k is None else (k, len(reqs), self.V)
        out = torch.ones(shape, device=self.device)
        for i, r in enumerate(reqs):
            if r.generator is not None:
                for j in range(1 if k is None else k):
                    (out[i] if k is None else out[j, i]).exponential_(1.0, generator=r.generator)
        return out

    def banned(self, reqs: Sequence[Request], rows: Tensor, offset: int = 0) -> Optional[Tensor]:
        """[B, V]: EOS ids of the rows still short of min_new_tokens (None if none are)."""
        short = [r.n_generated + offset < r.config.min_new_tokens for r in reqs]
        if not any(short):
            return None
        return self.sampling.eos[rows] & torch.tensor(short, device=self.device)[:, None]

    def pick(self, reqs: Sequence[Request], logits: Tensor) -> list[tuple[Request, list[int], Optional[list]]]:
        """Sample one token per row of logits [B, V]."""
        slots = [r.slot for r in reqs]
        with torch.inference_mode():
            rows = self._tensor(slots)
            batch = self.sampling.batch(slots)
            s = self.sampling
            pen = batch.use_penalties
            tokens = sample(logits, batch, self.noise(reqs),
                            counts=s.counts[rows] if pen else None, seen=s.seen[rows] if pen else None,
                            bias=s.bias[rows] if s.uses_bias(slots) else None, banned=self.banned(reqs, rows))
            if pen:
                s.record(rows, tokens)
            want = [r.params.logprobs for r in reqs]
            lps = None
            if any(w is not None for w in want):
                n = max(max(w for w in want if w is not None), 1)
                chosen, top_v, top_i = (t.tolist() for t in token_logprobs(logits, tokens, n))
        ids = tokens.tolist()  # the step's one host sync
        out = []
        for i, r in enumerate(reqs):
            if want[i] is not None:
                lps = [TokenLogprob(ids[i], chosen[i], list(zip(top_i[i][:want[i]], top_v[i][:want[i]])))]
            else:
                lps = None
            out.append((r, [ids[i]], lps))
        return out
