"""The interactive chat behind `fastdecode chat`.

One user message per input line; replies stream to stdout, notices go to
stderr. The history is re-rendered with the chat template every turn and, when
it no longer leaves `max_new_tokens` of room in the context window, the oldest
turns are dropped (the system message stays).
"""

from __future__ import annotations

import dataclasses
import sys
from typing import IO, Callable, Optional, Sequence

from ..api.llm import LLM
from ..engine.request import GenerationConfig
from ..errors import FastDecodeError
from ..sampling import SamplingParams
from ..text.harmony import HarmonySplitter, is_harmony

COMMANDS = ("/reset", "/exit")


class ChatSession:
    """A conversation: the turns so far and how to extend them by one reply."""

    def __init__(self, llm: LLM, params: SamplingParams, config: GenerationConfig,
                 system: Optional[str] = None):
        self.llm, self.params, self.system = llm, params, system
        # gpt-oss: its reply decoded with the channel markers, and only the answer shown and kept
        self.harmony = is_harmony(llm.tokenizer.chat_template)
        self.config = dataclasses.replace(config, skip_special_tokens=False) if self.harmony else config
        self.turns: list[dict] = []  # alternating user / assistant messages

    @property
    def room(self) -> int:
        """Most prompt tokens that still leave max_new_tokens for the reply."""
        return self.llm.max_seq_len - self.config.max_new_tokens

    def reset(self) -> None:
        self.turns = []

    def messages(self) -> list[dict]:
        head = [{"role": "system", "content": self.system}] if self.system else []
        return head + self.turns

    def fit(self) -> tuple[list[int], int]:
        """Prompt ids of the history, dropping the oldest exchanges until it fits.

        Returns (ids, number of exchanges dropped). The newest user message is
        never dropped: if it alone does not fit, that is an error.
        """
        dropped = 0
        while True:
            ids = self.llm.chat_prompt(self.messages())
            if len(ids) <= self.room:
                return ids, dropped
            if len(self.turns) <= 1:
                raise FastDecodeError(
                    f"message too long: {len(ids)} tokens with the template, room for {self.room} "
                    f"(max_seq_len={self.llm.max_seq_len} minus max_new_tokens={self.config.max_new_tokens})")
            del self.turns[:2]  # the oldest user message and its reply
            dropped += 1

    def ask(self, message: str) -> tuple[list[int], int]:
        """Add a user message; return the prompt ids and how many exchanges were dropped."""
        self.turns.append({"role": "user", "content": message})
        try:
            return self.fit()
        except FastDecodeError:
            self.turns.pop()
            raise

    def answer(self, ids: list[int], write: Callable[[str], None]) -> tuple[str, bool]:
        """Stream the reply to `ids` through `write` and keep it in the history.

        Returns (reply text, whether Ctrl-C cut it short). A reply cut short
        stays in the history as far as it was shown.
        """
        steps = iter(self.llm.start([ids], self.params, self.config))  # a generator: close() cancels
        text, stopped = "", False
        splitter = HarmonySplitter() if self.harmony else None
        try:
            for step in steps:
                piece = step.pieces[0]
                if splitter is not None:
                    piece = splitter.feed(piece, step.finished[0])[1]
                if piece:
                    write(piece)
                    text += piece
        except KeyboardInterrupt:
            stopped = True
        finally:
            steps.close()
        self.turns.append({"role": "assistant", "content": text})
        return text, stopped


def read_message(stdin: IO[str], interactive: bool) -> Optional[str]:
    """The next input line without its newline, or None at end of input."""
    if interactive:
        try:
            line = input("> ")
        except EOFError:
            return None
        except UnicodeDecodeError as e:
            raise FastDecodeError(f"message is not valid UTF-8 (byte 0x{e.object[e.start]:02x}); ignored") from None
        return line
    raw = stdin.buffer.readline() if hasattr(stdin, "buffer") else stdin.readline()
    if not raw:
        return None
    if isinstance(raw, bytes):
        try:
            raw = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise FastDecodeError(f"message is not valid UTF-8 (byte 0x{raw[e.start]:02x}); ignored") from None
    return raw.rstrip("\r\n")


def run_repl(session: ChatSession, opening: Sequence[str] = (), *, stdin: Optional[IO[str]] = None,
             stdout: Optional[IO[str]] = None, stderr: Optional[IO[str]] = None) -> int:
    """Chat until /exit or end of input. `opening` messages are sent first."""
    stdin = sys.stdin if stdin is None else stdin
    stdout = sys.stdout if stdout is None else stdout
    stderr = sys.stderr if stderr is None else stderr
    interactive = _isatty(stdin) and stdin is sys.stdin

    def write(text: str) -> None:
        stdout.write(text)
        stdout.flush()

    def notice(text: str) -> None:
        print(f"[{text}]", file=stderr, flush=True)

    if interactive:
        notice("chat: /reset clears the history, /exit or Ctrl-D quits, Ctrl-C stops an answer")
    pending = list(opening)
    while True:
        try:
            message = pending.pop(0) if pending else read_message(stdin, interactive)
        except FastDecodeError as e:
            notice(str(e))
            continue
        if message is None or message.strip() == "/exit":
            return 0
        if message.strip() == "/reset":
            session.reset()
            notice("history cleared")
            continue
        if not message.strip():
            continue
        if message.startswith("/") and " " not in message.strip():
            notice(f"unknown command {message.strip()}; accepted: {', '.join(COMMANDS)}")
            continue
        try:
            ids, dropped = session.ask(message)
        except FastDecodeError as e:
            notice(str(e))
            continue
        if dropped:
            notice(f"dropped the {dropped} oldest exchange(s) to fit the context window "
                   f"({session.llm.max_seq_len} tokens)")
        _, stopped = session.answer(ids, write)
        write("\n")
        if stopped:
            notice("stopped")


def _isatty(stream: IO[str]) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False
