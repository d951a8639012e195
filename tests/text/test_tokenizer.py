"""tokenizer.py: the byte tokenizer, the chat-template hook of the interface, and streaming detokenization.

The GGUF and Hugging Face tokenizers have their own tests under tests/checkpoints/.
"""

import pytest

from fastdecode.text.chat_template import render_chat_template
from fastdecode.errors import FastDecodeError
from fastdecode.text.tokenizer import BYTE_CHAT_TEMPLATE, ByteTokenizer, StreamDecoder, Tokenizer

TEXTS = ["", "hello", "héllo 世界 🎉 ok", "line\nbreak\ttab", "\u00e9\u0301 combining", "\x00nul"]


class PieceTokenizer(Tokenizer):
    """Tokens are arbitrary byte strings, as in byte-level BPE: a token may end or
    start in the middle of a character, or hold the end of one and the start of the next."""

    def __init__(self, pieces: list[bytes]):
        self.pieces = pieces
        self.vocab_size = len(pieces)

    def decode(self, ids, *, skip_special_tokens=True):
        return b"".join(self.pieces[i] for i in ids).decode("utf-8", errors="replace")


class SpaceTokenizer(Tokenizer):
    """SentencePiece-like: "▁" marks a word start, and decoding drops the leading space of the text."""

    def __init__(self, pieces: list[str]):
        self.pieces = pieces
        self.vocab_size = len(pieces)

    def decode(self, ids, *, skip_special_tokens=True):
        return "".join(self.pieces[i] for i in ids).replace("▁", " ").removeprefix(" ")


def stream(tok: Tokenizer, ids: list[int], step: int = 1) -> list[str]:
    dec = StreamDecoder(tok)
    return [dec.push(ids[i:i + step]) for i in range(0, len(ids), step)] + [dec.flush()]


@pytest.mark.parametrize("text", TEXTS)
def test_byte_tokenizer_round_trip(text):
    tok = ByteTokenizer()
    ids = tok.encode(text)
    assert ids == [ByteTokenizer.BOS, *text.encode("utf-8")]
    assert tok.encode(text, add_special_tokens=False) == ids[1:]
    assert tok.decode(ids) == text
    assert all(0 <= i < tok.vocab_size for i in ids)


def test_byte_tokenizer_decode_skips_special_ids_and_replaces_broken_bytes():
    tok = ByteTokenizer()
    assert tok.decode([tok.BOS, *b"ok", tok.EOS, tok.PAD, 259]) == "ok"
    assert tok.decode([0xC3]) == "\ufffd"  # half of "é"


def test_byte_tokenizer_needs_room_for_its_special_ids():
    assert ByteTokenizer(259).vocab_size == 259
    with pytest.raises(FastDecodeError, match="vocab_size >= 259, got 258"):
        ByteTokenizer(258)


@pytest.mark.parametrize("step", [1, 2, 3])
def test_stream_decoder_never_splits_characters(step):
    text = "héllo 世界 🎉 ok"
    pieces = stream(ByteTokenizer(), list(text.encode("utf-8")), step)
    assert "".join(pieces) == text
    assert all("\ufffd" not in p for p in pieces)


def test_stream_decoder_joins_characters_split_across_multi_byte_tokens():
    # "é🤖世" = c3 a9 | f0 9f a4 96 | e4 b8 96; tokens cut through all three characters. A piece
    # comes out once the text ends on a whole character: the token that completes 🤖 also starts 世.
    tok = PieceTokenizer([b"a", b"\xc3", b"\xa9", b"\xf0\x9f", b"\xa4\x96\xe4", b"\xb8\x96 b"])
    pieces = stream(tok, [0, 1, 2, 3, 4, 5])
    assert pieces == ["a", "", "é", "", "", "🤖世 b", ""]


def test_stream_decoder_keeps_the_space_before_a_word():
    tok = SpaceTokenizer(["▁hello", "▁wor", "ld", "!"])
    pieces = stream(tok, [0, 1, 2, 3, 0])
    assert "".join(pieces) == tok.decode([0, 1, 2, 3, 0]) == "hello world! hello"
    assert pieces[1] == " wor"  # decoded alone, "▁wor" would lose its space


def test_stream_decoder_flushes_a_character_cut_off_at_the_end():
    pieces = stream(ByteTokenizer(), [*b"ok", 0xF0, 0x9F])  # the first half of an emoji
    assert pieces[:-1] == ["o", "k", "", ""] and pieces[-1] == "\ufffd"


def test_chat_template_is_rendered_by_the_sandboxed_renderer():
    tok = ByteTokenizer(chat_template=BYTE_CHAT_TEMPLATE)
    messages = [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "hi"}]
    assert tok.apply_chat_template(messages) == "<|system|>Be terse.\n<|user|>hi\n<|assistant|>"
    assert tok.apply_chat_template(messages, add_generation_prompt=False) == \
        render_chat_template(tok, messages, add_generation_prompt=False)


def test_a_continued_final_message_ends_the_prompt():
    tok = ByteTokenizer(chat_template=BYTE_CHAT_TEMPLATE)
    asked = [{"role": "user", "content": "hi"}]
    for text, kept in [("The answer is ", "The answer is "), ("", ""), ("  ", ""), ("a\nb", "a\nb")]:
        messages = asked + [{"role": "assistant", "content": text}]
        got = tok.apply_chat_template(messages, add_generation_prompt=False, continue_final_message=True)
        # the turn as the template opens it, then the text, and no end of turn (the template's "\n")
        assert got == "<|user|>hi\n<|assistant|>" + kept, text
    # A template that trims the text (Llama 3's): cut after the text as written, as transformers cuts.
    trims = "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] | trim }}<end>{% endfor %}"
    got = render_chat_template(ByteTokenizer(chat_template=trims), asked + [{"role": "assistant", "content": " so "}],
                               add_generation_prompt=False, continue_final_message=True)
    assert got == "[user] hi<end>[assistant] so"


@pytest.mark.parametrize("case, messages, flags, match", [
    ("both flags", [{"role": "user", "content": "x"}], {"add_generation_prompt": True}, "add_generation_prompt false"),
    ("not text", [{"role": "user", "content": ["x"]}], {"add_generation_prompt": False}, "content as text"),
])
def test_continuing_needs_the_generation_prompt_off_and_text(case, messages, flags, match):
    tok = ByteTokenizer(chat_template=BYTE_CHAT_TEMPLATE)
    with pytest.raises(FastDecodeError, match=match):
        tok.apply_chat_template(messages, continue_final_message=True, **flags)


def test_a_template_that_drops_the_final_message_cannot_continue_it():
    drops = "{% for m in messages[:-1] %}{{ m['content'] }}{% endfor %}"
    tok = ByteTokenizer(chat_template=drops)
    messages = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]
    with pytest.raises(FastDecodeError, match="does not write the final assistant message's text"):
        tok.apply_chat_template(messages, add_generation_prompt=False, continue_final_message=True)


def test_no_chat_template():
    with pytest.raises(FastDecodeError, match="no chat template"):
        ByteTokenizer().apply_chat_template([{"role": "user", "content": "x"}])
