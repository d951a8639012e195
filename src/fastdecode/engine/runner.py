"""Runs a plan's steps on the model: builds the step's tensors, samples, and
returns what each row got (`RowOutput`). Owns the per-slot sampling state and
the masks of constrained rows (filled on the host while the model step runs);
the requests' own state (positions, tokens, finishing, their grammars' place)
is the engine's, which applies each RowOutput (Engine._apply)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Sequence

import torch
from torch import Tensor

from ..compile.steps import Steps
from ..sampling import SamplingBatch, adjust, draw_from, logits_to_probs, sample, token_logprobs
from ..sampling.acceptance import accept_or_resample
from ..sampling.slots import SlotSampling
from ..structured.mask import Masks, Pending
from .draft import DraftProposer, model_logits
from .request import Request, TokenLogprob
from .scheduler import rows_of_one
from .speculative import DraftModelRow

Picked = tuple[Request, list[int], Optional[list]]  # (request, its new token, its logprobs)


@dataclass
class RowOutput:
    """What one step did for one request."""

    request: Request
    tokens: list[int]  # picked, in order (none for a prompt chunk that is not the prompt's last)
    logprobs: Optional[list[TokenLogprob]] = None
    written: int = 0  # cache positions written for it: its pos advances by this
    prefilled: int = 0  # prompt tokens fed
    forwards: int = 0  # model forwards that produced its tokens
    prompt_logprobs: list[TokenLogprob] = field(default_factory=list)  # for the prompt tokens after the chunk's
    drafted: int = 0  # drafts verified, and of those accepted (speculative decoding)
    accepted: int = 0


class Runner:
    def __init__(self, model: torch.nn.Module, steps: Steps, n_slots: int, max_seq_len: int,
                 draft: Optional[DraftProposer] = None, takes_mixed: bool = False):
        self.model, self.steps = model, steps
        self.takes_mixed = takes_mixed  # steps may carry rows of one token (`mixed`)
        self.device = model.device
        self.V = model.args.vocab_size
        self.max_seq_len = max_seq_len
        self.sampling = SlotSampling(n_slots, self.V, self.device)
        self.masks = Masks(self.V, self.device)
        self.draft = draft  # for requests that speculate with a draft model

    def _tensor(self, values) -> Tensor:
        return torch.tensor(values, dtype=torch.long, device=self.device)

    def _step(self, tokens: list, pos: list, reqs: Sequence[Request], last_only: bool = True,
              at: Optional[list] = None) -> Tensor:
        return model_logits(self.steps, self.device, tokens, pos, [r.slot for r in reqs], last_only, at)

    def assign(self, r: Request) -> None:
        self.sampling.assign(r.slot, r.params, r.prompt, r.eos_ids)

    # -- steps -----------------------------------------------------------------------

    def prefill(self, reqs: Sequence[Request], n: int) -> list[RowOutput]:
        """Feed the next n prompt tokens of each request; the requests whose
        prompt is then complete get their first token."""
        tokens = [r.prompt[r.prefilled:r.prefilled + n] for r in reqs]
        pos = [list(range(r.prefilled, r.prefilled + n)) for r in reqs]
        outs = [RowOutput(r, [], written=n, prefilled=n) for r in reqs]
        # The first token's masks (the grammars' start), filled while the chunk runs.
        masks = self.masks.start([(i, r.grammar, ()) for i, r in enumerate(reqs)
                                  if r.grammar is not None and r.prefilled + n >= len(r.prompt)])
        scored = [i for i, r in enumerate(reqs) if r.prompt_logprobs is not None]
        if scored:  # every position's logits [G, n, V], for this chunk only
            every = self._step(tokens, pos, reqs, last_only=False)
            logits = every[:, -1].clone()  # _prompt_logprobs overwrites its rows of `every`
            mine = every if len(scored) == len(reqs) else every[scored]
            for i, lps in zip(scored, self._prompt_logprobs([reqs[i] for i in scored], mine)):
                outs[i].prompt_logprobs = lps
        else:
            logits = self._step(tokens, pos, reqs)  # [G, V]
        mirror = [i for i, r in enumerate(reqs) if isinstance(r.spec, DraftModelRow)]
        if mirror:
            self.draft.prefill([reqs[i] for i in mirror], [tokens[i] for i in mirror], [pos[i] for i in mirror])
        done = [i for i, r in enumerate(reqs) if r.prefilled + n >= len(r.prompt)]
        if not done:
            return outs
        if len(done) < len(reqs):
            logits = logits[done]
        for i, (_, ids, lps) in zip(done, self.pick([reqs[i] for i in done], logits, allowed=masks.allowed(done))):
            outs[i].tokens, outs[i].logprobs, outs[i].forwards = ids, lps, 1
        return outs

    def mixes(self, decode: Sequence[Request], drafts: Sequence[tuple[list[int], int]],
              prefill: Sequence[Request]) -> bool:
        """Whether this step's decode rows and prompt chunks run as one forward (`mixed`): where
        steps take rows of one token, when no row speculates this step and no chunk is scored
        (prompt logprobs) or mirrored into a draft model."""
        return (self.takes_mixed and bool(decode) and bool(prefill) and not any(d or k for d, k in drafts)
                and all(rows_of_one(r) for r in prefill))

    def mixed(self, decode: Sequence[Request], prefill: Sequence[Request], chunks: Sequence[int]) -> list[RowOutput]:
        """A decode step (maybe of no rows) and the next chunks[i] prompt tokens of each
        prefilling request i in one forward: every token a row of its own ([N, 1]; a chunk's are
        consecutive rows of its slot, so chunks may differ in length), logits for the decode rows
        and each completed prompt's last token only. The weights are read
        once for both, where a decode step alone costs a quarter of the prompt's forward (15
        rows and a prompt of 123 tokens, default model: 93-96 against 104-108 ms,
        benchmarks/serve/README.md). On the quantized kernels each row's results are those of
        the separate steps, bit for bit (float32 matmuls round by the rows beside them)."""
        D = len(decode)
        done = [i for i, (r, n) in enumerate(zip(prefill, chunks)) if r.prefilled + n >= len(r.prompt)]
        picked = [*decode, *(prefill[i] for i in done)]  # the rows that get a token
        masks = self.masks.start([(i, r.grammar, ()) for i, r in enumerate(picked) if r.grammar is not None])
        tokens, pos, slots = [r.last_token for r in decode], [r.pos for r in decode], [r.slot for r in decode]
        ends = []  # each chunk's last row
        for r, n in zip(prefill, chunks):
            tokens += r.prompt[r.prefilled:r.prefilled + n]
            pos += range(r.prefilled, r.prefilled + n)
            slots += [r.slot] * n
            ends.append(len(tokens) - 1)
        at = list(range(D)) + [ends[i] for i in done]  # flat indices of the rows picked from
        t = self._tensor
        with torch.inference_mode():
            logits = self.steps.step(t(tokens)[:, None], t(pos)[:, None], t(slots), t(at)[:, None])[:, 0]
        got = self.pick(picked, logits, allowed=masks.allowed(range(len(picked))))
        out = [RowOutput(r, ids, lps, written=1, forwards=1) for r, ids, lps in got[:D]]
        fed = [RowOutput(r, [], written=n, prefilled=n) for r, n in zip(prefill, chunks)]
        for i, (_, ids, lps) in zip(done, got[D:]):
            fed[i].tokens, fed[i].logprobs, fed[i].forwards = ids, lps, 1
        return out + fed

    def _prompt_logprobs(self, reqs: Sequence[Request], logits: Tensor) -> list[list[TokenLogprob]]:
        """Position j of a chunk predicts the prompt token after it: the raw log_softmax's
        logprob of that token, its rank (for requests that ask for it) and the top
        alternatives, per request. All the chunk's requests at once: one log_softmax,
        gather and topk over logits [G, n, V], which it overwrites with the logprobs
        (on CPU: a fresh [G, n, V] output costs more in page faults than the op itself)."""
        G, n, V = logits.shape
        targets = [r.prompt[r.prefilled + 1:r.prefilled + 1 + n] for r in reqs]  # the last prompt token predicts nothing
        out: list[list[TokenLogprob]] = [[] for _ in reqs]
        if not any(targets):
            return out
        with torch.inference_mode():
            flat = logits.reshape(G * n, V)
            if flat.dtype == torch.float32 and flat.device.type == "cpu" and flat.is_contiguous():
                logp = torch._log_softmax(flat, -1, False, out=flat)  # in place: same values as log_softmax
            else:
                logp = torch.log_softmax(flat.float(), dim=-1)
            # Rows past a request's last target (its final chunk) get target 0 and are dropped below.
            tgt = self._tensor([t + [0] * (n - len(t)) for t in targets]).view(G * n, 1)
            chosen_t = logp.gather(-1, tgt)  # [G*n, 1]
            chosen = chosen_t[:, 0].tolist()
            ranks: list = [None] * (G * n)
            ranked = [i for i, r in enumerate(reqs) if targets[i] and r.params.prompt_logprob_ranks]
            for i in ranked:  # a pass over [m, V] per request: only where the output needs the rank
                a, b = i * n, i * n + len(targets[i])
                above = (logp[a:b] > chosen_t[a:b]).view(torch.uint8)  # summed as bytes: no int64 copy
                ranks[a:b] = (above.sum(-1, dtype=torch.int32) + 1).tolist()
            tops: dict[int, tuple[list, list]] = {}  # per k: the alternatives of every row
            for k in {r.params.prompt_logprobs for r in reqs} - {0}:
                # max is topk for k=1 (a third of its time), its index the first of equal maxima
                top = logp.max(-1, keepdim=True) if k == 1 else torch.topk(logp, k, dim=-1)
                tops[k] = (top.indices.tolist(), top.values.tolist())
        for i, (r, ts) in enumerate(zip(reqs, targets)):
            k = r.params.prompt_logprobs
            ids, vals = tops.get(k, (None, None))
            base = i * n
            out[i] = [TokenLogprob(t, chosen[base + j], list(zip(ids[base + j], vals[base + j])) if k else [],
                                   rank=ranks[base + j]) for j, t in enumerate(ts)]
        return out

    def decode(self, reqs: Sequence[Request], drafts: Sequence[tuple[list[int], int]]) -> list[RowOutput]:
        """New tokens for each running request: one (K with the `generate`
        strategy's chunks, for rows without a constraint), or 1 + its accepted
        drafts when it speculates.
        drafts[i]: request i's prompt-lookup drafts, and how many the draft model
        proposes for it ([], 0: it decodes plainly), as the scheduler decided."""
        plain, drafted, by_model = [], [], []
        for r, (d, k) in zip(reqs, drafts):
            if d:
                drafted.append((r, d, None))
            elif k:
                by_model.append((r, k))
            else:
                plain.append(r)
        if by_model:
            drafted += [(r, d, q) for (r, _), (d, q) in zip(by_model, self.draft.propose(self, by_model))]
        out = self.verify(drafted) if drafted else []
        if not plain:
            return out
        chunk = self.steps.chunk
        # A constrained row's mask depends on each token it samples, so it cannot run K
        # steps inside the chunk's graph: it decodes one token per step beside the chunk.
        free = [r for r in plain if r.grammar is None]
        if (chunk is not None and free and max(r.remaining for r in free) >= chunk.k
                and all(r.params.logprobs is None for r in free)):
            plain = [r for r in plain if r.grammar is not None]
            masks = self._masks(plain)  # filled while the chunk runs
            out += self._chunk(free)
            if not plain:
                return out
        else:
            masks = self._masks(plain)
        logits = self._step([[r.last_token] for r in plain], [[r.pos] for r in plain], plain)
        picked = self.pick(plain, logits, allowed=masks.allowed(range(len(plain))))
        return out + [RowOutput(r, ids, lps, written=1, forwards=1) for r, ids, lps in picked]

    def _masks(self, reqs: Sequence[Request], drafts: Optional[Sequence[Sequence[int]]] = None) -> Pending:
        """Start filling the masks of the constrained rows among reqs (after each of their drafts)."""
        return self.masks.start([(i, r.grammar, drafts[i] if drafts is not None else ())
                                 for i, r in enumerate(reqs) if r.grammar is not None])

    def _chunk(self, reqs: Sequence[Request]) -> list[RowOutput]:
        """K tokens per request in one compiled call (the `generate` strategy)."""
        chunk, slots, s = self.steps.chunk, [r.slot for r in reqs], self.sampling
        with torch.inference_mode():
            t = self._tensor
            rows = t(slots)
            tokens = chunk(t([r.last_token for r in reqs]), t([r.pos for r in reqs]), rows, self.uniforms(reqs, chunk.k),
                           s.batch(slots, full=True), s.counts, s.seen, s.bias[rows], s.eos[rows],
                           t([r.n_generated for r in reqs]), t([r.config.min_new_tokens for r in reqs]))
        ids = tokens.t().tolist()  # [B, K]
        return [RowOutput(r, ids[i], written=chunk.k, forwards=chunk.k) for i, r in enumerate(reqs)]

    def verify(self, rows: Sequence[tuple[Request, list[int], Optional[Tensor]]]) -> list[RowOutput]:
        """One forward over each request's newest token and its k drafts (with
        their distributions q where a sampled request's drafts come from the
        draft model); then, position by position, the token the request would
        pick there anyway (same sampling, same draws from its generator), kept
        while it equals the draft. The first that differs, or the one after the
        last draft, ends the run."""
        T = 1 + max(len(d) for _, d, _ in rows)
        # A row with fewer drafts repeats its last one: those positions lie past
        # what it keeps, are written in its own slot, and are overwritten later.
        if any(r.pos + T > self.max_seq_len for r, _, _ in rows):
            # Padding would run past the cache for some row: verify rows one by one, unpadded
            # (a row's own drafts always fit: the scheduler caps them at the cache's end).
            return [x for row in rows for x in self._verify([row], 1 + len(row[1]))]
        return self._verify(rows, T)

    def _verify(self, rows, T: int) -> list[RowOutput]:
        """Deterministic drafts (prompt lookup, or a greedy request's draft-model
        argmaxes) are kept while they equal the token picked at their position.
        A sampled request's draft-model drafts go through the acceptance rule
        against their distributions q (sampling/acceptance.py)."""
        reqs = [r for r, _, _ in rows]
        tokens = [[r.last_token] + d + [d[-1]] * (T - 1 - len(d)) for r, d, _ in rows]
        # Constrained rows: the mask at each draft position, from the grammar advanced along the drafts.
        masks = self._masks(reqs, [d for _, d, _ in rows])
        logits = self._step(tokens, [list(range(r.pos, r.pos + T)) for r in reqs], reqs, last_only=False)
        ids: list[list[int]] = [[] for _ in rows]
        lps: list[Optional[list]] = [None if r.params.logprobs is None else [] for r in reqs]
        active = list(range(len(rows)))
        for j in range(T):
            ruled = [i for i in active if rows[i][2] is not None]
            plain = [i for i in active if rows[i][2] is None]
            picked = list(zip(plain, self.pick([reqs[i] for i in plain], logits[plain, j], offset=j,
                                               allowed=masks.allowed(plain, j))))
            if ruled:
                picked += zip(ruled, self._accept([rows[i] for i in ruled], logits[ruled, j], j,
                                                  masks.allowed(ruled, j)))
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
        out = []
        for i, (r, d, _) in enumerate(rows):
            accepted = len(ids[i]) - 1
            if isinstance(r.spec, DraftModelRow):
                # The draft's cache holds the request's tokens, then the drafts it was fed: those accepted stay.
                self.draft.keep(r, len(r.spec.seq) + accepted)
            out.append(RowOutput(r, ids[i], lps[i], written=accepted + 1, forwards=1, drafted=len(d),
                                 accepted=accepted))
        return out

    def _accept(self, rows, logits: Tensor, j: int, allowed: Optional[Tensor] = None) -> list[Picked]:
        """Position j of a verify for sampled rows with draft-model drafts: the
        acceptance rule where row i has a draft there, the bonus token (a draw
        from p) after its last draft. A rejected draft's position gets the
        resample, which differs from the draft and so ends its run."""
        reqs = [r for r, _, _ in rows]
        with torch.inference_mode():
            adjusted, batch = self.adjusted(reqs, logits, j, allowed)
            p = logits_to_probs(adjusted, batch)  # [B, V]
            u = self.uniforms(reqs)
            tokens = draw_from(p, u)
            drafting = [i for i, (_, d, _) in enumerate(rows) if j < len(d)]
            if drafting:
                q = torch.stack([rows[i][2][j] for i in drafting])
                draft = self._tensor([rows[i][1][j] for i in drafting])
                uniform = torch.cat([torch.rand(1, generator=reqs[i].generator, device=self.device)
                                     for i in drafting])
                at = self._tensor(drafting)
                # u[at]: the drafting rows' draws, whose tokens above this replaces
                tokens[at] = accept_or_resample(p[at], q, draft, uniform, u[at])[1]
        return self._picked(reqs, logits, tokens, batch)

    # -- sampling ----------------------------------------------------------------------

    def uniforms(self, reqs: Sequence[Request], k: Optional[int] = None) -> Optional[Tensor]:
        """Uniform [0, 1) draws [B] (or [k, B]), each row from its own request's
        generator, one per token in order; 0.5 on greedy rows."""
        if all(r.generator is None for r in reqs) and k is None:
            return None
        out = torch.full((len(reqs),) if k is None else (k, len(reqs)), 0.5, device=self.device)
        for i, r in enumerate(reqs):
            if r.generator is not None:
                if k is None:
                    out[i].uniform_(generator=r.generator)
                else:  # a row's k draws in order, written into column i
                    out[:, i] = torch.empty(k, device=self.device).uniform_(generator=r.generator)
        return out

    def banned(self, reqs: Sequence[Request], rows: Tensor, offset: int = 0) -> Optional[Tensor]:
        # offset: tokens this request already picked in this step (a verify run).
        """[B, V]: EOS ids of the rows still short of min_new_tokens (None if none are)."""
        short = [r.n_generated + offset < r.config.min_new_tokens for r in reqs]
        if not any(short):
            return None
        return self.sampling.eos[rows] & torch.tensor(short, device=self.device)[:, None]

    def adjusted(self, reqs: Sequence[Request], logits: Tensor, offset: int = 0,
                 allowed: Optional[Tensor] = None) -> tuple[Tensor, SamplingBatch]:
        """logits [B, V] with each row's penalties, logit bias and bans applied (and, with
        `allowed` [B, V], its grammar's mask), and the rows' settings."""
        slots = [r.slot for r in reqs]
        rows = self._tensor(slots)
        batch = self.sampling.batch(slots)
        s = self.sampling
        pen = batch.use_penalties
        return adjust(logits, batch, counts=s.counts[rows] if pen else None, seen=s.seen[rows] if pen else None,
                      bias=s.bias[rows] if s.uses_bias(slots) else None,
                      banned=self.banned(reqs, rows, offset), allowed=allowed), batch

    def pick(self, reqs: Sequence[Request], logits: Tensor, offset: int = 0,
             allowed: Optional[Tensor] = None) -> list[Picked]:
        """Sample one token per row of logits [B, V] (allowed: [B, V], the grammars' masks)."""
        if not reqs:
            return []
        with torch.inference_mode():
            adjusted, batch = self.adjusted(reqs, logits, offset, allowed)
            tokens = sample(adjusted, batch, self.uniforms(reqs))
        return self._picked(reqs, logits, tokens, batch)

    def _picked(self, reqs: Sequence[Request], logits: Tensor, tokens: Tensor, batch: SamplingBatch) -> list[Picked]:
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
