"""llguidance's view of a fastdecode tokenizer: each token's bytes and the special ids.

Checkpoint tokenizers (`HFTokenizer`, from a GGUF's metadata or a tokenizer.json)
hand llguidance their `tokenizers` pipeline as JSON, which it reads in Rust;
the byte tokenizer of the tiny presets is described token by token.
Built once per tokenizer (~0.1-1 s for a real vocabulary) and kept.
"""

from __future__ import annotations

import hashlib
import threading
import weakref
from dataclasses import dataclass

from ..errors import FastDecodeError
from ..text.tokenizer import ByteTokenizer, Tokenizer


@dataclass
class Vocab:
    """ll: the llguidance tokenizer; size: its ids (the model's vocabulary may be larger:
    ids past `size` are never allowed); fingerprint: a hash of the vocabulary, part of
    the compiled-grammar cache's key; eos: the ids llguidance treats as EOS."""

    ll: object
    size: int
    fingerprint: str
    eos: frozenset[int]


_built: "weakref.WeakKeyDictionary[Tokenizer, Vocab]" = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def vocab_for(tokenizer: Tokenizer) -> Vocab:
    """The tokenizer's Vocab, built on first use."""
    with _lock:
        v = _built.get(tokenizer)
        if v is None:
            v = _built[tokenizer] = _build(tokenizer)
        return v


def _build(tokenizer: Tokenizer) -> Vocab:
    import llguidance

    eos = sorted(tokenizer.eos_ids)
    backend = getattr(tokenizer, "backend", None)
    if backend is not None and hasattr(backend, "to_str"):  # a `tokenizers.Tokenizer`
        text = backend.to_str()
        try:
            ll = llguidance.LLTokenizer(text, eos_token=eos or None)
        except Exception as e:  # noqa: BLE001 - the Rust side raises plain exceptions
            raise FastDecodeError(f"constrained decoding cannot read this tokenizer: {str(e).splitlines()[0]}") \
                from None
        return Vocab(ll, ll.vocab_size, hashlib.sha256(text.encode("utf-8")).hexdigest(), frozenset(ll.eos_tokens))
    if isinstance(tokenizer, ByteTokenizer):
        wrapper = llguidance.TokenizerWrapper(_ByteTokens(tokenizer))
        ll = llguidance.LLTokenizer(wrapper, eos_token=eos or None)
        return Vocab(ll, ll.vocab_size, f"bytes:{tokenizer.vocab_size}", frozenset(ll.eos_tokens))
    raise FastDecodeError(f"constrained decoding needs a checkpoint tokenizer or the byte tokenizer; "
                          f"got {type(tokenizer).__name__}")


class _ByteTokens:
    """What llguidance.TokenizerWrapper reads: ids 0-255 are bytes, the rest special."""

    def __init__(self, tokenizer: ByteTokenizer):
        n = tokenizer.vocab_size
        names = {ByteTokenizer.BOS: b"<bos>", ByteTokenizer.EOS: b"<eos>", ByteTokenizer.PAD: b"<pad>"}
        self.tokens = [bytes([i]) for i in range(256)] + [names.get(i, b"<unused%d>" % i) for i in range(256, n)]
        self.special_token_ids = list(range(256, n))
        self.eos_token_id = ByteTokenizer.EOS
        self.bos_token_id = ByteTokenizer.BOS

    def __call__(self, text) -> list[int]:
        return list(text.encode("utf-8") if isinstance(text, str) else text)
