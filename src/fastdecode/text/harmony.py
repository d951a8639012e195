"""gpt-oss's replies (OpenAI's "harmony" format) read as reasoning and answer (the server's
`reasoning_content` and `content`; the chat REPL shows the answer).

A harmony reply is a run of messages, each a header and a body:
`<|channel|>analysis<|message|>...<|end|><|start|>assistant<|channel|>final<|message|>...`. The
analysis channel is the model's reasoning; the final channel (and commentary addressed to no tool,
which OpenAI shows users as a preamble) is the answer. A message ends at `<|end|>`, or at
`<|return|>` / `<|call|>`, which end the reply and are not in its text. The markers are special
tokens, so the reply's text is decoded keeping them, and the splitter takes every one out.
"""

from __future__ import annotations

import re
from typing import Optional

CHANNEL, MESSAGE, START, END = "<|channel|>", "<|message|>", "<|start|>", "<|end|>"
ENDS = (END, "<|return|>", "<|call|>")
MARKERS = (CHANNEL, MESSAGE, START, "<|constrain|>", *ENDS)
# A message to a tool, as the model writes it and as tool calls are read: recipient, then arguments.
CALL_HEADER = CHANNEL + "commentary to={} <|constrain|>json" + MESSAGE
_RECIPIENT = re.compile(r" to=([^\s<]+)")


def is_harmony(template: Optional[str]) -> bool:
    """Whether a chat template writes harmony's channels (gpt-oss's)."""
    return template is not None and CHANNEL in template and MESSAGE in template


class HarmonySplitter:
    """One choice's reply, fed piece by piece: each piece gives (reasoning, content) to send.
    The same interface as reasoning.ReasoningSplitter; a marker cut across pieces is held back."""

    def __init__(self, keep_calls: bool = False) -> None:
        """keep_calls: a message to a tool (`to=` in its header) goes to content as CALL_HEADER and its
        body, for the tool-call parser to read (server/tools/formats.py's harmony), whichever of the
        header's two orders the model wrote (the recipient after the role or after the channel)."""
        self.keep_calls = keep_calls
        self.buf = ""
        self.in_header = True  # before the current message's <|message|> (its header is in buf)
        self.reasoning_body = False
        self.reasoning, self.content = "", ""

    def feed(self, text: str, finished: bool = False) -> tuple[str, str]:
        self.buf += text
        reasoning, content = "", ""
        while self.buf:
            if self.in_header:  # up to <|message|>
                if not (self.buf.startswith("<|") or "<|".startswith(self.buf)):
                    self.in_header, self.reasoning_body = False, False  # text with no header: an answer
                    continue
                at = self.buf.find(MESSAGE)
                if at < 0:
                    if finished:  # cut off inside a header: nothing of it is text
                        self.buf = ""
                    break
                header = self.buf[:at]
                self.reasoning_body = _channel(header) == "analysis"
                self.buf, self.in_header = self.buf[at + len(MESSAGE):], False
                to = _RECIPIENT.search(header)
                if self.keep_calls and to:
                    content += CALL_HEADER.format(to.group(1))
                    self.reasoning_body = False
                continue
            end, marker = _first_end(self.buf)
            if end < 0:  # all of it is body, but for a tail that may begin a marker
                cut = len(self.buf) if finished else _safe_end(self.buf)
                body, self.buf = self.buf[:cut], self.buf[cut:]
            else:
                body, self.buf = self.buf[:end], self.buf[end + (len(marker) if marker != START else 0):]
                self.in_header = True
            if self.reasoning_body:
                reasoning += body
            else:
                content += body
            if end < 0:
                break
        self.reasoning += reasoning
        self.content += content
        return reasoning, content


def _channel(header: str) -> str:
    """The channel a message header names ("analysis", "final", ...; "" for none)."""
    at = header.find(CHANNEL)
    if at < 0:
        return ""
    name = header[at + len(CHANNEL):].split("<|", 1)[0]
    return name.split(" ", 1)[0].strip()


def _first_end(text: str) -> tuple[int, str]:
    """Where the first marker that ends a body is, and which; (-1, "") for none. A new message's
    <|start|> ends one too (a model that left out <|end|>)."""
    found = [(text.find(m), m) for m in (*ENDS, START)]
    found = [(i, m) for i, m in found if i >= 0]
    return min(found) if found else (-1, "")


def _safe_end(text: str) -> int:
    """How much of a body can be sent: not a tail that could begin a marker."""
    at = text.rfind("<|")
    if at >= 0 and "|>" not in text[at:]:
        return at
    return len(text) - 1 if text.endswith("<") else len(text)
