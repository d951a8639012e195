"""Compiled grammars, cached, and one matcher per request.

llguidance compiles a grammar for a tokenizer when an `LLMatcher` is built; a
fresh matcher is kept per (constraint, vocabulary) and each request gets a
deep copy of it (microseconds), so a repeated schema costs no compile.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from typing import Optional

from ..errors import ConstraintFailed, FastDecodeError
from .constraint import Constraint, one_line, parser_limits
from .vocab import Vocab

CACHE_SIZE = 256  # compiled grammars kept, least recently used dropped


class GrammarCache:
    def __init__(self, size: int = CACHE_SIZE):
        self.size = size
        self._items: "OrderedDict[tuple[str, str], object]" = OrderedDict()
        self._lock = threading.Lock()
        self.hits = self.misses = 0
        self.last_compile_s = 0.0  # the latest miss's compile time (for benchmarks)

    def matcher(self, constraint: Constraint, vocab: Vocab):
        """A fresh llguidance matcher for `constraint` (FastDecodeError if it does not compile)."""
        import llguidance

        key = (constraint.key, vocab.fingerprint)
        with self._lock:
            base = self._items.get(key)
            if base is not None:
                self._items.move_to_end(key)
                self.hits += 1
                return base.deep_copy()
        t0 = time.perf_counter()
        base = llguidance.LLMatcher(vocab.ll, constraint.grammar_text(), log_level=0, limits=parser_limits())
        if base.is_error():
            raise FastDecodeError(f"{constraint.kind} does not compile: {one_line(base.get_error())}")
        self.last_compile_s = time.perf_counter() - t0
        with self._lock:
            self.misses += 1
            self._items[key] = base
            while len(self._items) > self.size:
                self._items.popitem(last=False)
        return base.deep_copy()

    def clear(self) -> None:
        with self._lock:
            self._items.clear()


CACHE = GrammarCache()  # one per process: the key holds the vocabulary's fingerprint


class GrammarState:
    """One request's place in its grammar. The engine consumes each accepted token;
    the runner reads masks at the current state (or after drafts, rolled back)."""

    def __init__(self, matcher, vocab: Vocab, eos_ids: frozenset[int]):
        self.m = matcher
        self.vocab = vocab
        self.eos_ids = eos_ids  # the request's own EOS ids, allowed exactly where the grammar accepts

    @property
    def accepting(self) -> bool:
        return self.m.is_accepting()

    @property
    def finished(self) -> bool:
        """No token can follow: the request ends here (finish_reason "stop")."""
        return self.m.is_stopped()

    def consume(self, token: int) -> None:
        if not self.m.consume_token(token):
            raise ConstraintFailed(f"the grammar rejected token {token}: {one_line(self.m.get_error())}")

    def error(self) -> Optional[str]:
        """Why the matcher failed (e.g. a mask past llguidance's limits), or None."""
        return one_line(self.m.get_error()) if self.m.is_error() else None


def start_state(constraint: Constraint, vocab: Vocab, eos_ids: frozenset[int],
                cache: GrammarCache = CACHE) -> GrammarState:
    return GrammarState(cache.matcher(constraint, vocab), vocab, eos_ids)
