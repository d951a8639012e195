"""Runs a plan's steps on the model: builds the step's tensors, samples, and
returns each row's new tokens. Owns the per-slot sampling state."""

from __future__ import annotations

from typing import Optional, Sequence

import torch
from torch import Tensor

from ..compile.steps import Steps
from ..sampling import SamplingBatch, adjust, logits_to_probs, sample, token_logprobs
from ..sampling.acceptance import accept_or_resample
from ..sampling.slots import SlotSampling
from .draft import DraftProposer, model_logits
from .request import Request, TokenLogprob
from .speculative import DraftModelRow, PromptLookup


class Runner:
    def __init__(self, model: torch.nn.Module, steps: Steps, n_slots: int, max_seq_len: int,
                 draft: Optional[DraftProposer] = None):
        self.model, self.steps = model, steps
        self.device = model.device
        self.V = model.args.vocab_size
        self.max_seq_len = max_seq_len
        self.sampling = SlotSampling(n_slots, self.V, self.device)
        self.draft = draft  # for requests that speculate with a draft model

    def _tensor(self, values) -> Tensor:
        return torch.tensor(values, dtype=torch.long, device=self.device)

    def _step(self, tokens: list, pos: list, reqs: Sequence[Request], last_only: bool = True,
              at: Optional[list] = None) -> Tensor:
        return model_logits(self.steps, self.device, tokens, pos, [r.slot for r in reqs], last_only, at)

    def assign(self, r: Request) -> None:
        self.sampling.assign(r.slot, r.params, r.prompt, r.eos_ids)

    # -- steps -----------------------------------------------------------------------

    def prefill(self, reqs: Sequence[Request], n: int) -> list[tuple[Request, list[int], Optional[list]]]:
        """Feed the next n prompt tokens of each request; the requests whose
        prompt is then complete get their first token."""
        tokens = [r.prompt[r.prefilled:r.prefilled + n] for r in reqs]
        pos = [list(range(r.prefilled, r.prefilled + n)) for r in reqs]
        scored = [i for i, r in enumerate(reqs) if r.prompt_logprobs is not None]
        if scored:  # every position's logits [G, n, V], for this chunk only
            every = self._step(tokens, pos, reqs, last_only=False)
            self._prompt_logprobs([reqs[i] for i in scored], every[scored])
            logits = every[:, -1]
        else:
            logits = self._step(tokens, pos, reqs)  # [G, V]
        mirror = [i for i, r in enumerate(reqs) if isinstance(r.spec, DraftModelRow)]
        if mirror:
            self.draft.prefill([reqs[i] for i in mirror], [tokens[i] for i in mirror], [pos[i] for i in mirror])
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

    def _prompt_logprobs(self, reqs: Sequence[Request], logits: Tensor) -> None:
        """Position j of a chunk predicts the prompt token after it: the raw log_softmax's
        logprob of that token, its rank and the top alternatives, appended per request."""
        n = logits.shape[1]
        with torch.inference_mode():
            for i, r in enumerate(reqs):
                start = r.prefilled
                targets = r.prompt[start + 1:start + 1 + n]  # the last prompt token predicts nothing
                if not targets:
                    continue
                logp = torch.log_softmax(logits[i, :len(targets)].float(), dim=-1)  # [m, V]
                tgt = self._tensor(targets)
                chosen = logp.gather(-1, tgt[:, None])  # [m, 1]
                ranks = (logp > chosen).sum(-1) + 1
                k = r.params.prompt_logprobs
                top = torch.topk(logp, k, dim=-1) if k else None
                chosen, ranks = chosen[:, 0].tolist(), ranks.tolist()
                top_v, top_i = (top.values.tolist(), top.indices.tolist()) if top is not None else (None, None)
                for j, t in enumerate(targets):
                    alts = list(zip(top_i[j], top_v[j])) if top is not None else []
                    r.prompt_logprobs.append(TokenLogprob(t, chosen[j], alts, rank=ranks[j]))

    def decode(self, reqs: Sequence[Request]) -> list[tuple[Request, list[int], Optional[list]]]:
        """New tokens for each running request: one (K with the `generate`
        strategy's chunks), or 1 + its accepted drafts when it speculates."""
        plain, drafted, by_model = [], [], []
        for r in reqs:
            # Drafts never pass max_new_tokens nor the end of the cache.
            limit = min(r.remaining - 1, self.max_seq_len - 1 - r.pos)
            if r.spec is None or limit <= 0:
                plain.append(r)
            elif isinstance(r.spec, PromptLookup) and (d := r.spec.propose(limit)):
                drafted.append((r, d))
            elif isinstance(r.spec, DraftModelRow) and (k := r.spec.want(limit)):
                by_model.append((r, k))
            else:  # no drafts this step (none found, or backing off)
                plain.append(r)
        if by_model:
            drafted += zip([r for r, _ in by_model], self.draft.propose(self, by_model))
        out = self.verify(drafted) if drafted else []
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
        """Deterministic drafts (prompt lookup, or a greedy request's draft-model
        argmaxes) are kept while they equal the token picked at their position.
        A sampled request's draft-model drafts go through the acceptance rule
        against their distributions q (sampling/acceptance.py)."""
        reqs = [r for r, _ in rows]
        tokens = [[r.last_token] + d + [d[-1]] * (T - 1 - len(d)) for r, d in rows]
        logits = self._step(tokens, [list(range(r.pos, r.pos + T)) for r in reqs], reqs, last_only=False)
        ids: list[list[int]] = [[] for _ in rows]
        lps: list[Optional[list]] = [None if r.params.logprobs is None else [] for r in reqs]
        active = list(range(len(rows)))
        for j in range(T):
            ruled = [i for i in active if reqs[i].spec.q is not None]
            plain = [i for i in active if reqs[i].spec.q is None]
            picked = list(zip(plain, self.pick([reqs[i] for i in plain], logits[plain, j], offset=j)))
            if ruled:
                picked += zip(ruled, self._accept([rows[i] for i in ruled], logits[ruled, j], j))
            still = []
            for i, (r, tok, lp) in picked:
                ids[i] += tok
                if lp is not None:
                    lps[i] += lp
                d = rows[i][1]
                if j < len(d) and tok[0] == d[j] and tok[0] not in r.eos_ids:
                    still.append(i)
            active = sorted(still)
            if not active:
                break
        for i, (r, d) in enumerate(rows):
            accepted = len(ids[i]) - 1
            r.pos += accepted + 1
            r.forwards += 1
            if isinstance(r.spec, DraftModelRow):
                # The draft's cache holds the request's tokens, then the drafts it was fed: those accepted stay.
                r.spec.fed = min(r.spec.fed, len(r.spec.seq) + accepted)
                r.spec.q = None
            r.spec.update(len(d), accepted)
        return [(r, ids[i], lps[i]) for i, r in enumerate(reqs)]

    def _accept(self, rows, logits: Tensor, j: int) -> list[tuple[Request, list[int], Optional[list]]]:
        """Position j of a verify for sampled rows with draft-model drafts: the
        acceptance rule where row i has a draft there, the bonus token (a draw
        from p) after its last draft. A rejected draft's position gets the
        resample, which differs from the draft and so ends its run."""
        reqs = [r for r, _ in rows]
        with torch.inference_mode():
            adjusted, batch = self.adjusted(reqs, logits, j)
            p = logits_to_probs(adjusted, batch)  # [B, V]
            noise = self.noise(reqs)
            tokens = (p / noise).argmax(-1)
            drafting = [i for i, (_, d) in enumerate(rows) if j < len(d)]
            if drafting:
                q = torch.stack([rows[i][0].spec.q[j] for i in drafting])
                draft = self._tensor([rows[i][1][j] for i in drafting])
                uniform = torch.cat([torch.rand(1, generator=reqs[i].generator, device=self.device)
                                     for i in drafting])
                at = self._tensor(drafting)
                tokens[at] = accept_or_resample(p[at], q, draft, uniform, noise[at])[1]
        return self._picked(reqs, logits, tokens, batch)

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

    def adjusted(self, reqs: Sequence[Request], logits: Tensor, offset: int = 0) -> tuple[Tensor, SamplingBatch]:
        """logits [B, V] with each row's penalties, logit bias and bans applied, and the rows' settings."""
        slots = [r.slot for r in reqs]
        rows = self._tensor(slots)
        batch = self.sampling.batch(slots)
        s = self.sampling
        pen = batch.use_penalties
        return adjust(logits, batch, counts=s.counts[rows] if pen else None, seen=s.seen[rows] if pen else None,
                      bias=s.bias[rows] if s.uses_bias(slots) else None,
                      banned=self.banned(reqs, rows, offset)), batch

    def pick(self, reqs: Sequence[Request], logits: Tensor,
             offset: int = 0) -> list[tuple[Request, list[int], Optional[list]]]:
        """Sample one token per row of logits [B, V]."""
        if not reqs:
            return []
        with torch.inference_mode():
            adjusted, batch = self.adjusted(reqs, logits, offset)
            tokens = sample(adjusted, batch, self.noise(reqs))
        return self._picked(reqs, logits, tokens, batch)

    def _picked(self, reqs: Sequence[Request], logits: Tensor, tokens: Tensor,
                batch: SamplingBatch) -> list[tuple[Request, list[int], Optional[list]]]:
        """Record the tokens [B] picked from logits [B, V] (penalty counts) and
        hand them out with their logprobs where asked."""
        with torch.inference_mode():
            if batch.use_penalties:
                self.sampling.record(self._tensor([r.slot for r in reqs]), tokens)
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
