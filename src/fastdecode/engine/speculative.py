"""Drafting for speculative decoding, and the adaptive draft length.

Two sources of drafts:
- prompt lookup: the tokens that followed the most recent earlier occurrence
  of the request's last n tokens (n = ngram_size, then shorter down to 2), in
  its prompt and output so far;
- a draft model (`draft:<model>`): a smaller model with the same vocabulary
  proposes k tokens one at a time (engine/draft.py).
The engine verifies the drafts in one forward over the k+1 positions
(runner.Runner.verify) and keeps only what the target model's own
distribution allows, so the output is exactly the target's.
"""

from __future__ import annotations

from ..errors import FastDecodeError

MODES = ("none", "prompt-lookup", "draft:<model>")
MAX_DRAFT_TOKENS = 16
MAX_NGRAM = 8
RETRY_AFTER = 8  # decode steps without drafts before a row whose k fell to 0 tries k = 1 again


def draft_model_name(mode) -> str | None:
    """The model of a `draft:<model>` mode, else None."""
    if isinstance(mode, str) and mode.startswith("draft:"):
        return mode[len("draft:"):]
    return None


def check_speculative(mode, num_draft_tokens, ngram_size) -> None:
    name = draft_model_name(mode)
    if name is not None and not name.strip():
        raise FastDecodeError(f"speculative={mode!r} names no draft model; accepted: draft:<model>, with a model "
                              "load() accepts (a preset, a known checkpoint or a path)")
    if mode is not None and name is None and mode not in MODES:
        raise FastDecodeError(f"speculative={mode!r} is not a mode; accepted: {', '.join(MODES)}")
    for name, value, cap in (("num_draft_tokens", num_draft_tokens, MAX_DRAFT_TOKENS),
                             ("ngram_size", ngram_size, MAX_NGRAM)):
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= cap:
            raise FastDecodeError(f"{name}={value!r} is out of range; accepted: an integer 1..{cap}")


class Drafting:
    """One request's drafting state: its tokens so far, the adaptive draft
    length k and the counts for the report."""

    def __init__(self, tokens: list[int], max_k: int):
        self.seq: list[int] = []
        self.k = max_k  # the current draft length, adapted per verify
        self.max_k = max_k
        self.wait = 0  # decode steps left before retrying when k == 0
        self.drafted = self.accepted = 0
        self.extend(tokens)

    def extend(self, tokens: list[int]) -> None:
        self.seq.extend(tokens)

    def want(self, limit: int) -> int:
        """How many drafts to propose now: min(k, limit), or 0 while backing off."""
        if self.k == 0:
            self.wait -= 1
            if self.wait > 0:
                return 0
            self.k = 1
        return max(0, min(self.k, limit))

    def update(self, drafted: int, accepted: int) -> None:
        """Grow k after a fully accepted run, shrink it when little is accepted, down to 0."""
        self.drafted += drafted
        self.accepted += accepted
        if accepted == drafted:
            self.k = min(self.max_k, self.k + 1)
        elif accepted == 0:
            self.k = max(0, min(self.k, drafted) - 1)
            if self.k == 0:
                self.wait = RETRY_AFTER
        else:
            self.k = accepted + 1


class DraftModelRow(Drafting):
    """A request drafted by the draft model (engine/draft.py), whose cache state the proposer keeps."""


class PromptLookup(Drafting):
    """An n-gram index over one request's tokens: for each size s and s-gram,
    the position that followed its latest occurrence. Updated per new token."""

    def __init__(self, tokens: list[int], ngram_size: int, max_k: int):
        self.sizes = list(range(ngram_size, max(1, min(2, ngram_size)) - 1, -1))  # n, n-1, ..., 2 (or 1)
        self.index: dict[int, dict[tuple, int]] = {s: {} for s in self.sizes}
        super().__init__(tokens, max_k)

    def extend(self, tokens: list[int]) -> None:
        for t in tokens:
            i = len(self.seq)
            for s in self.sizes:
                if i >= s:
                    self.index[s][tuple(self.seq[i - s:i])] = i
            self.seq.append(t)

    def propose(self, limit: int) -> list[int]:
        """Up to min(k, limit) draft tokens (none while backing off)."""
        k = self.want(limit)
        if k <= 0:
            return []
        for s in self.sizes:
            if len(self.seq) <= s:
                continue
            start = self.index[s].get(tuple(self.seq[-s:]))
            if start is not None:
                return self.seq[start:start + k]
        return []
