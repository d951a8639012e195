"""Reading tool calls out of a reply as its text arrives, in any pieces.

`CallParser.feed(piece)` returns what the piece adds: content (free text
before the calls), a call's start (its id and name, once the name is
complete) and fragments of its arguments (their JSON text, as written). The
same parser reads a whole reply (`parse_reply`), so a streamed reply and a
whole one agree byte for byte whatever the pieces were.

The markers never reach the content: text that may still become the
format's trigger is held back until it does or cannot, and whitespace just
before the calls is dropped. Text that leaves the format (it cannot while
the grammar holds the reply; a stop string can cut it) is kept as content
from where it left.
"""

from __future__ import annotations

import hashlib
import secrets
import string
from dataclasses import dataclass, field
from typing import Callable, Iterable, Optional, Union

from .formats import ToolFormat

MAX_NAME = 64


@dataclass(frozen=True)
class Content:
    text: str


@dataclass(frozen=True)
class CallStart:
    index: int
    id: str
    name: str


@dataclass(frozen=True)
class Arguments:
    index: int
    text: str


Event = Union[Content, CallStart, Arguments]


@dataclass
class Call:
    id: str
    name: str
    arguments: str = ""  # the JSON text, as written (cut short when the reply was)
    complete: bool = False  # its arguments' JSON value ended (a reply cut short may leave it open)


def new_call_id() -> str:
    return "call_" + secrets.token_hex(12)


_ALNUM = string.ascii_letters + string.digits


def new_short_id() -> str:
    """9 letters and digits: the only call ids Mistral's templates accept."""
    return "".join(secrets.choice(_ALNUM) for _ in range(9))


def short_id(call_id: str) -> str:
    """A client's call id as 9 letters and digits, the same for the same id (so that a call
    and its result still pair up); such an id already is kept."""
    if len(call_id) == 9 and call_id.isascii() and call_id.isalnum():
        return call_id
    return hashlib.sha256(call_id.encode("utf-8")).hexdigest()[:9]


class _JsonEnd:
    """Finds where one JSON value ends, a character at a time, across pieces."""

    def __init__(self) -> None:
        self.kind: Optional[str] = None  # container, string or scalar
        self.depth = 0
        self.in_string = False
        self.escaped = False

    def take(self, text: str) -> tuple[int, bool]:
        """How many characters of `text` belong to the value, and whether it is complete."""
        for i, c in enumerate(text):
            if self.kind is None:
                if c in " \t\r\n":
                    continue
                self.kind = "container" if c in "{[" else "string" if c == '"' else "scalar"
                self.depth, self.in_string = (1, False) if self.kind == "container" else (0, self.kind == "string")
                continue
            if self.kind == "scalar":
                if c in " \t\r\n,}]":
                    return i, True
                continue
            if self.in_string:
                if self.escaped:
                    self.escaped = False
                elif c == "\\":
                    self.escaped = True
                elif c == '"':
                    self.in_string = False
                    if self.kind == "string":
                        return i + 1, True
                continue
            if c == '"':
                self.in_string = True
            elif c in "{[":
                self.depth += 1
            elif c in "}]":
                self.depth -= 1
                if self.depth == 0:
                    return i + 1, True
        return len(text), False


class CallParser:
    def __init__(self, fmt: ToolFormat, names: Iterable[str], new_id: Callable[[], str] = new_call_id):
        self.fmt = fmt
        self.names = frozenset(names)
        self.new_id = new_id
        self.calls: list[Call] = []
        self._content: list[str] = []
        self._buf = ""
        self._state = "text" if fmt.anywhere else "start"
        self._expect: list[tuple[str, str]] = []  # literal state: (text, state after it) candidates
        self._json: Optional[_JsonEnd] = None
        self._finished = False

    @property
    def content(self) -> Optional[str]:
        """The free text; None when the reply is calls only."""
        text = "".join(self._content)
        return None if not text and self.calls else text

    def feed(self, text: str) -> list[Event]:
        self._buf += text
        return self._run()

    def finish(self) -> list[Event]:
        """The reply has ended: what was held back is settled."""
        self._finished = True
        return self._run()

    # -- the states ------------------------------------------------------------------------------

    def _run(self) -> list[Event]:
        out: list[Event] = []
        while True:
            step = getattr(self, "_" + self._state)(out)
            if not step:
                return [e for e in out if not isinstance(e, (Content, Arguments)) or e.text]

    def _emit_content(self, out: list[Event], text: str) -> None:
        if text:
            self._content.append(text)
            out.append(Content(text))

    def _text(self, out: list[Event]) -> bool:
        trigger, buf = self.fmt.trigger, self._buf
        at = buf.find(trigger)
        if at >= 0:
            self._emit_content(out, buf[:at].rstrip())  # the whitespace before the calls is not content
            self._buf = buf[at + len(trigger):]
            return self._open_block(len(trigger))
        if self._finished:
            self._emit_content(out, buf)
            self._buf = ""
            return False
        # Hold back a tail that may still become the trigger, and the whitespace before it.
        held = next((k for k in range(min(len(trigger) - 1, len(buf)), 0, -1) if trigger.startswith(buf[-k:])), 0)
        cut = len(buf[:len(buf) - held].rstrip())
        self._emit_content(out, buf[:cut])
        self._buf = buf[cut:]
        return False

    def _start(self, out: list[Event]) -> bool:
        trigger, buf = self.fmt.trigger, self._buf
        if buf.startswith(trigger):
            self._buf = buf[len(trigger):]
            return self._open_block(len(trigger))
        if trigger.startswith(buf) and not self._finished:
            return False  # may still become the trigger
        self._state = "raw"  # the reply is text: calls only open it
        return True

    def _open_block(self, matched: int) -> bool:
        rest = (self.fmt.begin + self.fmt.call_open)[matched:]
        self._expect = [(rest, "name")]
        self._state = "literal"
        return True

    def _literal(self, out: list[Event]) -> bool:
        buf = self._buf
        if not self._finished and any(len(t) > len(buf) and t.startswith(buf) for t, _ in self._expect):
            return False  # wait: the buffer may still become a longer candidate
        matches = [(t, s) for t, s in self._expect if buf.startswith(t)]
        if not matches:
            if self._finished and any(t.startswith(buf) for t, _ in self._expect):
                self._buf, self._state = "", "done"  # cut off inside the format's own text
                return False
            self._state = "raw"
            return True
        text, state = max(matches, key=lambda m: len(m[0]))
        self._buf = buf[len(text):]
        self._state = state
        if state == "args":
            self._json = _JsonEnd()
        return True

    def _name(self, out: list[Event]) -> bool:
        buf = self._buf
        end = buf.find(self.fmt.args_key[0])  # a name has no '"' or '[' (spec.NAME)
        if end < 0:
            if len(buf) > MAX_NAME:
                self._state = "raw"
                return True
            if self._finished:  # cut off inside the name: no call
                self._buf, self._state = "", "done"
            return False
        name = buf[:end]
        if name not in self.names:
            self._state = "raw"
            return True
        call = Call(self.new_id(), name)
        self.calls.append(call)
        out.append(CallStart(len(self.calls) - 1, call.id, name))
        self._buf = buf[end:]
        self._expect = [(self.fmt.args_key, "args")]
        self._state = "literal"
        return True

    def _args(self, out: list[Event]) -> bool:
        n, complete = self._json.take(self._buf)
        complete = complete or (self._finished and self._json.kind == "scalar")
        piece, self._buf = self._buf[:n], self._buf[n:]
        index = len(self.calls) - 1
        self.calls[index].arguments += piece
        out.append(Arguments(index, piece))
        self.calls[index].complete = complete
        if not complete:
            if self._finished:
                self._state = "done"  # cut off inside the arguments: the call keeps what came
            return False
        fmt = self.fmt
        after = [(fmt.end, "done")] if fmt.one_call else [(fmt.separator + fmt.call_open, "name"), (fmt.end, "done")]
        self._expect = [(fmt.call_close + t, s) for t, s in after]
        self._state = "literal"
        return True

    def _done(self, out: list[Event]) -> bool:
        if self._buf:
            self._state = "raw"
            return True
        return False

    def _raw(self, out: list[Event]) -> bool:
        self._emit_content(out, self._buf)
        self._buf = ""
        return False


@dataclass
class Reply:
    content: Optional[str]
    calls: list[Call] = field(default_factory=list)


def parse_reply(fmt: ToolFormat, names: Iterable[str], text: str,
                new_id: Callable[[], str] = new_call_id) -> Reply:
    """A whole reply: its content and calls."""
    parser = CallParser(fmt, names, new_id)
    parser.feed(text)
    parser.finish()
    return Reply(parser.content, parser.calls)
