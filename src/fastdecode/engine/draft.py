"""A draft model for speculative decoding (`speculative="draft:<model>"`).

The draft is a second, smaller model with the target's vocabulary. It has a
KV cache of its own with the same slots, so a request's rows line up in both:
the target's prefill chunks are fed to the draft in the same step, and before
each verify the draft catches up with the tokens it has not seen (the newest
token, and the last draft when all were accepted) and proposes k tokens, one
forward each. Its drafts are drawn with the request's own sampling settings
and generator (argmax for greedy requests), and their distributions q go to
the verify step's acceptance rule (sampling/acceptance.py). The proposer owns
its cache's state (how many of each slot's tokens it holds); the request's
own state is the engine's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Sequence

import torch
from torch import Tensor

from ..compile.steps import Steps
from ..errors import FastDecodeError
from ..sampling import draw_from, first_max, greedy_or_drawn, logits_to_probs
from .request import Request

CATCH_UP = 64  # tokens a row may be behind before it catches up alone, chunk by chunk


@dataclass(frozen=True)
class DraftModel:
    """A draft model's parts, built before the engine: the name `draft:<name>` asks
    for, the model (its KV cache is the engine's to allocate) and its steps."""

    name: str
    model: torch.nn.Module
    steps: Steps


def model_logits(steps: Steps, device: torch.device, tokens: list, pos: list, slots: list[int],
                 last_only: bool = True, at: Optional[list] = None) -> Tensor:
    """A model step over rows of equal length: logits [B, V] of each row's last
    token (or of the index `at` [B, 1] gives per row), or [B, T, V] of every token."""
    B, T = len(tokens), len(tokens[0])
    if at is None:
        at = [[T - 1]] * B if last_only else [list(range(T))] * B
    at = [[b * T + t for t in ts] for b, ts in enumerate(at)]  # the step takes flat token indices

    def tensor(values) -> Tensor:
        return torch.tensor(values, dtype=torch.long, device=device)

    with torch.inference_mode():
        logits = steps.step(tensor(tokens), tensor(pos), tensor(slots), tensor(at))
    return logits[:, -1] if last_only else logits


class DraftProposer:
    """Drafts from a DraftModel whose cache slots mirror the target's."""

    def __init__(self, draft: DraftModel, target_vocab_size: int, n_slots: int, max_seq_len: int):
        V = draft.model.args.vocab_size
        if V != target_vocab_size:
            raise FastDecodeError(
                f"draft model {draft.name!r}: its vocabulary has {V} tokens but the target's has "
                f"{target_vocab_size}; a draft model must share the target's tokenizer")
        self.name, self.model, self.steps = draft.name, draft.model, draft.steps
        self.max_seq_len = max_seq_len
        self.fed = [0] * n_slots  # how many of its request's tokens each slot's draft cache holds

    def _step(self, tokens: list, pos: list, reqs: Sequence[Request], at: Optional[list] = None) -> Tensor:
        return model_logits(self.steps, self.model.device, tokens, pos, [r.slot for r in reqs], at=at)

    def prefill(self, reqs: Sequence[Request], tokens: list[list[int]], pos: list[list[int]]) -> None:
        """Feed the prompt chunk the target has just taken."""
        self._step(tokens, pos, reqs)
        for r, p in zip(reqs, pos):
            self.fed[r.slot] = p[-1] + 1

    def keep(self, r: Request, n: int) -> None:
        """After a verify: of what the draft cache holds for `r`, its first n tokens are still valid."""
        self.fed[r.slot] = min(self.fed[r.slot], n)

    def propose(self, target: Any, rows: Sequence[tuple[Request, int]]) -> list[tuple[list[int], Optional[Tensor]]]:
        """k drafts for each (request, k), sampled as `target` (the engine's
        runner: its `adjusted` logits and `uniforms`) would sample them, with their
        distributions q [k, V] for the verify step's acceptance rule (None for
        greedy requests, whose drafts are argmaxes)."""
        reqs = [r for r, _ in rows]
        logits = self._feed(reqs, [r.spec.seq[self.fed[r.slot]:] for r in reqs])
        drafts: list[list[int]] = [[] for _ in rows]
        qs: list[list[Tensor]] = [[] for _ in rows]
        active = list(range(len(rows)))
        while True:
            sub = [reqs[i] for i in active]
            tokens, q = self._draw(target, sub, logits, offset=len(drafts[active[0]]))
            for n, i in enumerate(active):
                drafts[i].append(tokens[n])
                if q is not None:
                    qs[i].append(q[n])
            active = [i for i in active if len(drafts[i]) < rows[i][1]]
            if not active:
                break
            logits = self._feed([reqs[i] for i in active], [[drafts[i][-1]] for i in active])
        return [(drafts[i], torch.stack(qs[i]) if r.generator is not None else None) for i, r in enumerate(reqs)]

    def _draw(self, target: Any, reqs: Sequence[Request], logits: Tensor, offset: int):
        """One draft per row of logits [B, V]: the argmax of the adjusted logits on
        greedy rows, a draw from q elsewhere. Returns (tokens, q [B, V] or None)."""
        adjusted, batch = target.adjusted(reqs, logits, offset)
        if batch.all_greedy:
            return first_max(adjusted).tolist(), None
        q = logits_to_probs(adjusted, batch)
        return greedy_or_drawn(adjusted, batch, draw_from(q, target.uniforms(reqs))).tolist(), q

    def _feed(self, reqs: Sequence[Request], pending: list[list[int]]) -> Tensor:
        """Feed each row's pending tokens at its next draft positions; logits [B, V]
        at each row's last one. Rows are padded to one length by repeating their
        last token: those positions lie past what the row holds and are
        overwritten before they are read."""
        fed = self.fed
        for r, p in zip(reqs, pending):
            while len(p) > CATCH_UP:  # far behind (e.g. after backing off): catch up alone
                n = min(len(p) - 1, CATCH_UP)
                self._step([p[:n]], [list(range(fed[r.slot], fed[r.slot] + n))], [r])
                fed[r.slot] += n
                del p[:n]
        T = max(len(p) for p in pending)
        if len(reqs) > 1 and any(fed[r.slot] + T > self.max_seq_len for r in reqs):
            return torch.cat([self._feed([r], [p]) for r, p in zip(reqs, pending)])
        tokens = [p + [p[-1]] * (T - len(p)) for p in pending]
        logits = self._step(tokens, [list(range(fed[r.slot], fed[r.slot] + T)) for r in reqs], reqs,
                            at=[[len(p) - 1] for p in pending])
        for r, p in zip(reqs, pending):
            fed[r.slot] += len(p)
        return logits
