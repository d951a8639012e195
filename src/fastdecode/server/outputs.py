"""One choice's outputs as they arrive: its text, finish reason, counts and logprobs.

A token's string is the text it completes: with byte-level tokens a
character can span several ids, so each id is pushed through a streaming
decoder and a token that ends mid-character gets '' (the one completing it
gets the character). The strings of a choice's tokens join to its text.
"""

from __future__ import annotations

from typing import Optional

from ..engine import Completion, RequestOutput, TokenLogprob
from ..tokenizer import StreamDecoder, Tokenizer
from .protocol import ChatLogprobs, ChatTokenLogprob, CompletionLogprobs, TopLogprob

_FLOOR = -9999.0  # JSON has no -inf


class ChoiceState:
    def __init__(self, tokenizer: Tokenizer, logprobs: bool):
        self.tokenizer = tokenizer
        self.text = ""
        self.finish_reason: Optional[str] = None
        self.completion: Optional[Completion] = None
        self._decoder = StreamDecoder(tokenizer) if logprobs else None
        self.tokens: list[tuple[str, TokenLogprob]] = []  # (token string, logprob), when asked for

    def add(self, out: RequestOutput) -> tuple[str, list[tuple[str, TokenLogprob]]]:
        """Take one output; returns its new text and its tokens' (string, logprob) pairs."""
        self.text += out.text
        new = []
        if self._decoder is not None and out.logprobs:
            new = [(self._decoder.push([lp.token_id]), lp) for lp in out.logprobs]
            self.tokens += new
        if out.finished:
            self.finish_reason, self.completion = out.finish_reason, out.completion
            if self._decoder is not None and self.tokens:
                new = self._settle(new)
        return out.text, new

    def _settle(self, new: list[tuple[str, TokenLogprob]]) -> list[tuple[str, TokenLogprob]]:
        """At the end: the decoder's held-back tail goes to the last token, and text a stop
        string cut off comes off the last tokens, so the strings join to the text."""
        tail = self._decoder.flush()
        s, lp = self.tokens[-1]
        self.tokens[-1] = (s + tail, lp)
        excess = sum(len(s) for s, _ in self.tokens) - len(self.text)
        i = len(self.tokens) - 1
        while excess > 0 and i >= 0:
            s, lp = self.tokens[i]
            cut = min(excess, len(s))
            self.tokens[i] = (s[:len(s) - cut], lp)
            excess -= cut
            i -= 1
        start = len(self.tokens) - len(new)
        return self.tokens[start:]

    @property
    def completion_tokens(self) -> int:
        return self.completion.completion_tokens if self.completion is not None else 0


def _piece(tokenizer: Tokenizer, token_id: int) -> str:
    return tokenizer.decode([token_id])


def _lp(x: float) -> float:
    return max(float(x), _FLOOR)


def chat_logprobs(tokenizer: Tokenizer, tokens: list[tuple[str, TokenLogprob]]) -> ChatLogprobs:
    return ChatLogprobs(content=[
        ChatTokenLogprob(token=s, logprob=_lp(lp.logprob), bytes=list(s.encode("utf-8")), top_logprobs=[
            TopLogprob(token=(t := _piece(tokenizer, i)), logprob=_lp(v), bytes=list(t.encode("utf-8")))
            for i, v in lp.top])
        for s, lp in tokens])


def completion_logprobs(tokenizer: Tokenizer, tokens: list[tuple[str, TokenLogprob]],
                        offset: int) -> CompletionLogprobs:
    """`offset`: characters of the choice's text before these tokens (text_offset counts from there)."""
    offsets = []
    for s, _ in tokens:
        offsets.append(offset)
        offset += len(s)
    return CompletionLogprobs(
        tokens=[s for s, _ in tokens], token_logprobs=[_lp(lp.logprob) for _, lp in tokens],
        top_logprobs=[{_piece(tokenizer, i): _lp(v) for i, v in lp.top} for _, lp in tokens],
        text_offset=offsets)
