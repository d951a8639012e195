"""One choice's outputs as they arrive: its text, finish reason, counts and logprobs.

A token's string is the text it completes: with byte-level tokens a
character can span several ids, so each id is pushed through a streaming
decoder and a token that ends mid-character gets '' (the one completing it
gets the character). The strings of a choice's tokens join to its text.
"""

from __future__ import annotations

from typing import Optional

from ..engine import Completion, RequestOutput, TokenLogprob
from ..text.tokenizer import StreamDecoder, Tokenizer
from .protocol import ChatLogprobs, ChatTokenLogprob, CompletionLogprobs, PromptLogprob, TopLogprob

_FLOOR = -9999.0  # JSON has no -inf


class ChoiceState:
    def __init__(self, tokenizer: Tokenizer, logprobs: bool, skip_special_tokens: bool = True):
        self.tokenizer = tokenizer
        self.text = ""
        self.finish_reason: Optional[str] = None
        self.completion: Optional[Completion] = None
        # decoded as the engine decodes the text, so the token strings join to it
        self._decoder = StreamDecoder(tokenizer, skip_special_tokens) if logprobs else None
        self.tokens: list[tuple[str, TokenLogprob]] = []  # (token string, logprob) handed out, when asked for
        self._held: list[tuple[str, TokenLogprob]] = []  # tokens whose text the engine still holds back
        self._chars = 0  # characters of the handed-out tokens' strings

    def add(self, out: RequestOutput) -> tuple[str, list[tuple[str, TokenLogprob]]]:
        """Take one output; returns its new text and its tokens' (string, logprob) pairs.
        A token is handed out once the text it completes has been (the engine holds back
        what may become a stop string), so tokens a stop string cut never go out."""
        self.text += out.text
        if self._decoder is None:
            if out.finished:
                self.finish_reason, self.completion = out.finish_reason, out.completion
            return out.text, []
        if out.logprobs:
            self._held += [(self._decoder.push([lp.token_id]), lp) for lp in out.logprobs]
        if out.finished:
            self.finish_reason, self.completion = out.finish_reason, out.completion
            if self._held:
                s, lp = self._held[-1]
                self._held[-1] = (s + self._decoder.flush(), lp)
        new = []
        while self._held:
            s, lp = self._held[0]
            room = len(self.text) - self._chars
            if len(s) > room:
                if not out.finished:
                    break
                if room <= 0 and s:  # all of its text was cut by a stop string
                    self._held.clear()
                    break
                s = s[:max(room, 0)]
            self._held.pop(0)
            new.append((s, lp))
            self._chars += len(s)
        self.tokens += new
        return out.text, new

    @property
    def completion_tokens(self) -> int:
        return self.completion.completion_tokens if self.completion is not None else 0


def _piece(tokenizer: Tokenizer, token_id: int, skip_special_tokens: bool = True) -> str:
    return tokenizer.decode([token_id], skip_special_tokens=skip_special_tokens)


def _lp(x: float) -> float:
    return max(float(x), _FLOOR)


def chat_logprobs(tokenizer: Tokenizer, tokens: list[tuple[str, TokenLogprob]],
                  skip_special_tokens: bool = True) -> ChatLogprobs:
    return ChatLogprobs(content=[
        ChatTokenLogprob(token=s, logprob=_lp(lp.logprob), bytes=list(s.encode("utf-8")), top_logprobs=[
            TopLogprob(token=(t := _piece(tokenizer, i, skip_special_tokens)), logprob=_lp(v),
                       bytes=list(t.encode("utf-8")))
            for i, v in lp.top])
        for s, lp in tokens])


def completion_logprobs(tokenizer: Tokenizer, tokens: list[tuple[str, Optional[TokenLogprob]]],
                        offset: int, k: Optional[int] = None, chosen: bool = False,
                        skip_special_tokens: bool = True) -> CompletionLogprobs:
    """`offset`: characters of the choice's text before these tokens (text_offset counts from there).
    A None logprob (the first prompt token with echo) gives nulls. k: alternatives kept per token;
    chosen: the token itself joins its top_logprobs when outside the top k (as OpenAI does).
    skip_special_tokens: as the text was decoded, so a chosen token's key is its string."""
    offsets = []
    for s, _ in tokens:
        offsets.append(offset)
        offset += len(s)

    def top(lp: Optional[TokenLogprob]) -> Optional[dict[str, float]]:
        if lp is None:
            return None
        out: dict[str, float] = {}
        pairs = lp.top if k is None else lp.top[:k]
        seen = set()
        for i, v in [*pairs, *([(lp.token_id, lp.logprob)] if chosen else [])]:
            if i in seen:
                continue
            seen.add(i)
            key = _piece(tokenizer, i, skip_special_tokens)
            if key in out:  # two ids with one string (e.g. partial UTF-8 bytes, both '\ufffd'): keep both values
                key = f"{key}<{i}>"
            out[key] = _lp(v)
        return out

    return CompletionLogprobs(
        tokens=[s for s, _ in tokens], token_logprobs=[None if lp is None else _lp(lp.logprob) for _, lp in tokens],
        top_logprobs=[top(lp) for _, lp in tokens], text_offset=offsets)


def prompt_pieces(tokenizer: Tokenizer, prompt: list[int], skip_special_tokens: bool = True) -> list[str]:
    """The prompt's token strings (joined: its text), as generated tokens' are made."""
    decoder = StreamDecoder(tokenizer, skip_special_tokens)
    pieces = [decoder.push([t]) for t in prompt]
    pieces[-1] += decoder.flush()
    return pieces


def vllm_prompt_logprobs(tokenizer: Tokenizer, entries: Optional[list[Optional[TokenLogprob]]],
                         k: int, skip_special_tokens: bool = True) -> Optional[list]:
    """vLLM's prompt_logprobs: null, then per prompt token {id: {logprob, rank, decoded_token}}
    for the token itself and its k most likely alternatives, decoded as the reply's text is."""
    if entries is None:
        return None
    out: list = []
    for e in entries:
        if e is None:
            out.append(None)
            continue
        d = {str(e.token_id): PromptLogprob(logprob=_lp(e.logprob), rank=e.rank or 1,
                                            decoded_token=_piece(tokenizer, e.token_id, skip_special_tokens))}
        for rank, (i, v) in enumerate(e.top[:k], 1):
            d.setdefault(str(i), PromptLogprob(logprob=_lp(v), rank=rank,
                                               decoded_token=_piece(tokenizer, i, skip_special_tokens)))
        out.append(d)
    return out
