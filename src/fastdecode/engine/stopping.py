"""Turning a request's tokens into text, and where a stop string ends it."""

from __future__ import annotations

from ..text.tokenizer import StreamDecoder, Tokenizer


class StopText:
    """Streams one request's text, holding back what could still become a stop string.

    Each new piece is searched only where a stop string could newly end: from
    len(longest stop) - 1 characters before it, never the whole text again.
    """

    def __init__(self, tokenizer: Tokenizer, stop: tuple[str, ...], skip_special_tokens: bool = True):
        self.decoder = StreamDecoder(tokenizer, skip_special_tokens)
        self.stop = stop
        self.longest = max((len(s) for s in stop), default=0)
        self.text = ""  # everything decoded so far (cut at a stop string once found)
        self.emitted = 0  # chars of self.text already handed out
        self.hit_stop = False

    def push(self, token: int) -> str:
        piece = self.decoder.push([token])
        if not self.stop:
            self.text += piece
            return self._emit(len(self.text))
        start = max(0, len(self.text) - self.longest + 1)
        self.text += piece
        cut = min((i for i in (self.text.find(s, start) for s in self.stop) if i >= 0), default=-1)
        if cut >= 0:
            self.text, self.hit_stop = self.text[:cut], True
            return self._emit(len(self.text))
        return self._emit(len(self.text) - self._partial_stop_len())

    def finish(self) -> str:
        """The rest of the text, once no more tokens come."""
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
