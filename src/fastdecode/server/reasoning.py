"""A reply's thinking read apart from its answer, as `reasoning_content` beside `content`.

Templates that write `<think>` (Qwen 3, QwQ, DeepSeek-R1's distills, SmolLM3) have the
model think between `<think>` and `</think>` before it answers. The reply thinks when it
opens with `<think>`, or when the prompt already did (DeepSeek-R1's templates end the prompt
with `<think>\\n`); the thinking ends at `</think>`, and a reply cut off before it is all
thinking. Whitespace around the thinking and before the answer is dropped, streamed or not,
so that the streamed pieces add up to the whole reply's fields.
"""

from __future__ import annotations

from typing import Optional

OPEN, CLOSE = "<think>", "</think>"
MARKERS = (OPEN, CLOSE)


def thinks(template: Optional[str]) -> bool:
    """Whether a chat template has its model think in `<think>` blocks."""
    return template is not None and OPEN in template and CLOSE in template


def inside_thinking(prompt_tail: str) -> bool:
    """Whether a prompt ending in `prompt_tail` leaves the reply inside an open `<think>`."""
    return prompt_tail.rfind(OPEN) > prompt_tail.rfind(CLOSE)


class ReasoningSplitter:
    """One choice's reply, fed piece by piece: each piece gives (reasoning, content) to send.
    Text that may still turn out to be a marker or trailing whitespace is held back."""

    def __init__(self, thinking: bool):
        self.state = "think" if thinking else "start"
        self.buf = ""
        self.started = False  # some thinking was sent (leading whitespace is dropped before it)
        self.reasoning, self.content = "", ""

    def feed(self, text: str, finished: bool = False) -> tuple[str, str]:
        self.buf += text
        reasoning, content = "", ""
        if self.state == "start":
            head = self.buf.lstrip()
            if head.startswith(OPEN):
                self.state, self.buf = "think", head[len(OPEN):]
            elif OPEN.startswith(head) and not finished:
                return "", ""  # only whitespace or a part of <think> so far
            else:
                self.state = "answer"
        if self.state == "think":
            end = self.buf.find(CLOSE)
            if end >= 0:
                reasoning = self.buf[:end].rstrip()
                self.state, self.buf = "after", self.buf[end + len(CLOSE):]
            else:
                cut = len(self.buf) if finished else _safe_end(self.buf)
                reasoning, self.buf = self.buf[:cut], self.buf[cut:]
                if finished:  # cut off before </think>: all of it was thinking
                    reasoning, self.buf = reasoning.rstrip(), ""
            if not self.started:
                reasoning = reasoning.lstrip()
                self.started = bool(reasoning)
        if self.state == "after":
            self.buf = self.buf.lstrip()
            if self.buf or finished:
                self.state = "answer"
        if self.state == "answer":
            content, self.buf = self.buf, ""
        self.reasoning += reasoning
        self.content += content
        return reasoning, content


def _safe_end(text: str) -> int:
    """How much of `text` (inside thinking) can be sent: not a tail that could begin `</think>`,
    nor the whitespace before it (dropped if `</think>` follows)."""
    cut = len(text)
    for k in range(min(len(CLOSE) - 1, len(text)), 0, -1):
        if CLOSE.startswith(text[-k:]):
            cut -= k
            break
    while cut > 0 and text[cut - 1].isspace():
        cut -= 1
    return cut
