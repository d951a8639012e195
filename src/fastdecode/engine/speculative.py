"""Prompt-lookup drafting for speculative decoding, and the adaptive draft length.

A request's drafts are the tokens that followed the most recent earlier
occurrence of its last n tokens (n = ngram_size, then shorter down to 2), in
its prompt and output so far. The engine verifies them in one forward over
the k+1 positions and keeps those the target model itself would have picked
(runner.Runner.verify), so the output is exactly the target's.
"""

from __future__ import annotations

from ..errors import FastDecodeError

MODES = ("none", "prompt-lookup")
MAX_DRAFT_TOKENS = 16
MAX_NGRAM = 8
RETRY_AFTER = 8  # decode steps without drafts before a row whose k fell to 0 tries k = 1 again


def check_speculative(mode, num_draft_tokens, ngram_size) -> None:
    if mode is not None and mode not in MODES:
        if isinstance(mode, str) and mode.startswith("draft:"):
            raise FastDecodeError(f"speculative={mode!r}: draft models are not supported yet; accepted: "
                                  f"{', '.join(MODES)}")
        raise FastDecodeError(f"speculative={mode!r} is not a mode; accepted: {', '.join(MODES)}")
    for name, value, cap in (("num_draft_tokens", num_draft_tokens, MAX_DRAFT_TOKENS),
                             ("ngram_size", ngram_size, MAX_NGRAM)):
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= cap:
            raise FastDecodeError(f"{name}={value!r} is out of range; accepted: an integer 1..{cap}")


class PromptLookup:
    """An n-gram index over one request's tokens: for each size s and s-gram,
    the position that followed its latest occurrence. Updated per new token."""

    def __init__(self, tokens: list[int], ngram_size: int, max_k: int):
        self.seq: list[int] = []
        self.sizes = list(range(ngram_size, max(1, min(2, ngram_size)) - 1, -1))  # n, n-1, ..., 2 (or 1)
        self.index: dict[int, dict[tuple, int]] = {s: {} for s in self.sizes}
        self.k = max_k  # the current draft length, adapted per verify
        self.max_k = max_k
        self.wait = 0  # decode steps left before retrying when k == 0
        self.drafted = self.accepted = 0
        self.extend(tokens)

    def extend(self, tokens: list[int]) -> None:
        for t in tokens:
            i = len(self.seq)
            for s in self.sizes:
                if i >= s:
                    self.index[s][tuple(self.seq[i - s:i])] = i
            self.seq.append(t)

    def propose(self, limit: int) -> list[int]:
        """Up to min(k, limit) draft tokens (none while backing off)."""
        if self.k == 0:
            self.wait -= 1
            if self.wait > 0:
                return []
            self.k = 1
        k = min(self.k, limit)
        if k <= 0:
            return []
        for s in self.sizes:
            if len(self.seq) <= s:
                continue
            start = self.index[s].get(tuple(self.seq[-s:]))
            if start is not None:
                return self.seq[start:start + k]
        return []

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
