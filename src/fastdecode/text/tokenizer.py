"""Tokenizer interface, the byte tokenizer of the tiny test model, and streaming detokenization.

Real checkpoints bring their own tokenizer (see `fastdecode.checkpoints`); every
tokenizer implements the `Tokenizer` interface below so the generation loop
never needs to know where it came from.
"""

from __future__ import annotations

from typing import Any, Iterable, Optional, Sequence

from ..errors import FastDecodeError


def check_unicode(text: str) -> str:
    """text, if it is Unicode text: a lone surrogate (JSON's "\\ud800" escape decodes to one)
    has no UTF-8 bytes, and a tokenizer fails on it with an error that names neither."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise FastDecodeError(f"the text holds a lone surrogate {text[e.start]!r} at character {e.start}, which "
                              "is not Unicode text; accepted: valid Unicode strings") from None
    return text


class Tokenizer:
    """What the engine needs from a tokenizer.

    Attributes:
        vocab_size: number of ids the tokenizer can produce.
        bos_id: id prepended by `encode` when `add_bos` applies, or None.
        eos_ids: ids that end a generation.
        pad_id: the padding id reported to clients (GET /tokenizer_info); nothing here pads.
        chat_template: Jinja source of the checkpoint's chat template, or None.
        tool_template: the checkpoint's template for chats that offer tools ("tool_use"), or
            None: chat_template serves both.
    """

    vocab_size: int
    bos_id: Optional[int] = None
    eos_ids: frozenset[int] = frozenset()
    pad_id: int = 0
    chat_template: Optional[str] = None
    tool_template: Optional[str] = None
    add_bos: bool = False

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        raise NotImplementedError

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = True) -> str:
        raise NotImplementedError

    def template_for(self, tools: bool) -> Optional[str]:
        """The template a chat is rendered with: the tool-use one when tools are offered and the
        checkpoint has one (transformers' rule), else chat_template."""
        return self.tool_template if tools and self.tool_template is not None else self.chat_template

    def apply_chat_template(self, messages: list[dict], *, add_generation_prompt: bool = True,
                            continue_final_message: bool = False, tools: Optional[list[dict]] = None,
                            variables: Optional[dict[str, Any]] = None) -> str:
        """Render `messages` as the model's prompt text (render_chat_template); `tools` reach the
        template as `tools`, `variables` as themselves (e.g. Qwen 3's {"enable_thinking": False})."""
        template = self.template_for(tools is not None)
        if template is None:
            raise FastDecodeError("this model has no chat template; use plain prompts instead")
        from .chat_template import render_chat_template

        return render_chat_template(self, messages, add_generation_prompt=add_generation_prompt,
                                    continue_final_message=continue_final_message, tools=tools, template=template,
                                    variables=variables)


# A minimal ChatML-like template for the byte-level presets, so chat paths can be
# tested on the tiny model (real checkpoints bring their own template).
BYTE_CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


class ByteTokenizer(Tokenizer):
    """UTF-8 bytes as ids 0-255, then <bos>=256, <eos>=257, <pad>=258.

    Used by the tiny random model. Random weights produce arbitrary bytes, which
    exercises the rule that streamed pieces are never broken UTF-8.
    """

    BOS, EOS, PAD = 256, 257, 258

    def __init__(self, vocab_size: int = 260, chat_template: Optional[str] = None):
        if vocab_size < 259:
            raise FastDecodeError(f"ByteTokenizer needs vocab_size >= 259, got {vocab_size}")
        self.vocab_size = vocab_size
        self.bos_id = self.BOS
        self.eos_ids = frozenset({self.EOS})
        self.pad_id = self.PAD
        self.add_bos = True
        self.chat_template = chat_template

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        ids = list(check_unicode(text).encode("utf-8"))
        return [self.BOS, *ids] if (add_special_tokens and self.add_bos) else ids

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = True) -> str:
        data = bytes(int(i) for i in ids if 0 <= int(i) < 256)
        return data.decode("utf-8", errors="replace")


class StreamDecoder:
    """Turns a stream of token ids into text pieces that are never cut mid-character.

    Decoding one token at a time is wrong for byte-level BPE (a character can span
    tokens) and for SentencePiece (leading spaces depend on context). We decode a
    short window of recent ids twice, with and without the newest ones, and emit
    the difference once it no longer ends in an incomplete character.
    """

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = True):
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.ids: list[int] = []
        self._prefix = 0  # window start: context for the next piece
        self._read = 0  # ids before this index have been emitted

    def _decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens)

    def push(self, ids: Iterable[int]) -> str:
        self.ids.extend(int(i) for i in ids)
        decode = self._decode
        prev = decode(self.ids[self._prefix:self._read])
        cur = decode(self.ids[self._prefix:])
        if len(cur) > len(prev) and not cur.endswith("\ufffd") and cur.startswith(prev):
            self._prefix, self._read = self._read, len(self.ids)
            return cur[len(prev):]
        return ""

    def flush(self) -> str:
        """Whatever is still held back (an incomplete character at the very end)."""
        decode = self._decode
        prev = decode(self.ids[self._prefix:self._read])
        cur = decode(self.ids[self._prefix:])
        self._prefix = self._read = len(self.ids)
        return cur[len(prev):] if cur.startswith(prev) else ""
