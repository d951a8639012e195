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

    def _step(self, tokens: list, pos: list, reqs: Sequence[Request], last_only: bool = True) -> Tensor:
        """The model step over rows of equal length: logits [B, V] of each row's
        last token, or [B, T, V] of every token."""
        B, T = len(tokens), len(tokens[0])
        at = [[T - 1]] * B if last_only else [list(range(T))] * B
        with torch.inference_mode():
            logits = self.steps.step(self._tensor(tokens), self._tensor(pos), self._tensor([r.slot for r in reqs]),
                                     self._tensor(at))
        return logits[:, -1] if last_only else logits

    def assign(self, r: Request) -> None:
        self.sampling.assign(r.slot, r.params, r.prompt, r.eos_ids)

    # -- steps -----------------------------------------------------------------------

    def prefill(self, reqs: Sequence[Request], n: int) -> list[tuple[Request, list[int], Optional[list]]]:
        """Feed the next n prompt tokens of each request; the requests whose
        prompt is then complete get their first token."""
        logits = self._step([r.prompt[r.prefilled:r.prefilled + n] for r in reqs],
                            [list(range(r.prefilled, r.prefilled + n)) for r in reqs], reqs)  # [G, V]
        for r in reqs:
            r.prefilled += n
            r.pos = r.prefilled
        done = [i for i, r in enumerate(reqs) if not r.prefilling]
        for i in done:
            reqs[i].forwards += 1
        if not done:
            return []
        if len(done) < len(reqs):
            logits = logits[done]
        return self.pick([reqs[i] for i in done], logits)

    def decode(self, reqs: Sequence[Request]) -> list[tuple[Request, list[int], Optional[list]]]:
        """New tokens for each running request: one (K with the `generate`
        strategy's chunks), or 1 + its accepted drafts when it speculates."""
        plain, drafted = [], []
        for r in reqs:
            # Drafts never pass max_new_tokens nor the end of the cache.
            limit = min(r.remaining - 1, self.max_seq_len - 1 - r.pos)
            d = r.lookup.propose(limit) if r.lookup is not None and limit > 0 else []
            (drafted if d else plain).append((r, d))
        out = self.verify(drafted) if drafted else []
        plain = [r for r, _ in plain]
        if not plain:
            return out
        chunk = self.steps.chunk
        if (chunk is not None and max(r.remaining for r in plain) >= chunk.k
                and all(r.params.logprobs is None for r in plain)):
            for r in plain:
                r.forwards += chunk.k
            return out + chunk(self, plain)
        logits = self._step([[r.last_token] for r in plain], [[r.pos] for r in plain], plain)
        for r in plain:
            r.pos += 1
            r.forwards += 1
        return out + self.pick(plain, logits)

    def verify(self, rows: Sequence[tuple[Request, list[int]]]) -> list[tuple[Request, list[int], Optional[list]]]:
        """One forward over each request's newest token and its k drafts; then,
        position by position, the token the request would pick there anyway
        (same sampling, same draws from its generator), kept while it equals the
        draft. The first that differs, or the one after the last draft, ends the run."""
        T = 1 + max(len(d) for _, d in rows)
        # A row with fewer drafts repeats its last one: those positions lie past
        # what it keeps, are written in its own slot, and are overwritten later.
        if any(r.pos + T > self.max_seq_len for r, _ in rows):
            # Padding would run past the cache for some row: verify rows one by one, unpadded
            # (a row's own drafts always fit: decode caps them at the cache's end).
            return [x for r, d in rows for x in self._verify([(r, d)], 1 + len(d))]
        return self._verify(rows, T)

    def _verify(self, rows, T: int) -> list[tuple[Request, list[int], Optional[list]]]:
        reqs = [r for r, _ in rows]
        tokens = [[r.last_token] + d + [d[-1]] * (T - 1 - len(d)) for r, d in rows]
        logits = self._step(tokens, [list(range(r.pos, r.pos + T)) for r in reqs], reqs, last_only=False)
        ids: list[list[int]] = [[] for _ in rows]
        lps: list[Optional[list]] = [None if r.params.logprobs is None else [] for r in reqs]
        active = list(range(len(rows)))
        for j in range(T):
            picked = self.pick([reqs[i] for i in active], logits[active, j], offset=j)
            still = []
            for i, (r, tok, lp) in zip(active, picked):
                ids[i] += tok
                if lp is not None:
                    lps[i] += lp
                d = rows[i][1]
                if j < len(d) and tok[0] == d[j] and tok[0] not in r.eos_ids:
                    still.append(i)
            active = still
            if not active:
                break
        for i, (r, d) in enumerate(rows):
            accepted = len(ids[i]) - 1
            r.pos += accepted + 1
            r.forwards += 1
            r.lookup.update(len(d), accepted)
        return [(r, ids[i], lps[i]) for i, r in enumerate(reqs)]

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
        # offset: tokens this request already picked in this step (a verify run).
        """[B, V]: EOS ids of the rows still short of min_new_tokens (None if none are)."""
        short = [r.n_generated + offset < r.config.min_new_tokens for r in reqs]
        if not any(short):
            return None
        return self.sampling.eos[rows] & torch.tensor(short, device=self.device)[:, None]

    def pick(self, reqs: Sequence[Request], logits: Tensor,
             offset: int = 0) -> list[tuple[Request, list[int], Optional[list]]]:
        """Sample one token per row of logits [B, V]."""
        slots = [r.slot for r in reqs]
        with torch.inference_mode():
            rows = self._tensor(slots)
            batch = self.sampling.batch(slots)
            s = self.sampling
            pen = batch.use_penalties
            tokens = sample(logits, batch, self.noise(reqs),
                            counts=s.counts[rows] if pen else None, seen=s.seen[rows] if pen else None,
                            bias=s.bias[rows] if s.uses_bias(slots) else None,
                            banned=self.banned(reqs, rows, offset))
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
