"""Build the tokenizer a GGUF file describes in its `tokenizer.ggml.*` metadata.

A GGUF has no tokenizer.json: it stores the vocabulary, merges, token types and
special ids. We rebuild the equivalent `tokenizers` pipeline the way transformers
does for `from_pretrained(..., gguf_file=...)`, since that is our reference:
  - "gpt2": byte-level BPE, split by the regexes `tokenizer.ggml.pre` names
    (gguf_splits.py; GPT-2's own when the name is not one we know);
  - "llama": SentencePiece-style BPE with byte fallback and a "▁" word prefix.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional, Union

from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers
from tokenizers import Tokenizer as Backend

from ..errors import FastDecodeError
from .gguf_file import GGUFFile, optional_int
from .gguf_splits import IGNORE_MERGES, splits
from .hf_tokenizer import HFTokenizer

# llama.cpp token types (llama_token_type).
CONTROL, USER_DEFINED = 3, 4

SUPPORTED_MODELS = ("gpt2", "llama")
# SentencePiece vocabularies whose own tokenizer prepends "▁" to every piece of text between special
# tokens (a normalizer, not Metaspace): "<|user|>\nhi" is <|user|> ▁ \n hi. transformers picks this by
# architecture too; llama.cpp does it for every SentencePiece vocabulary with add_space_prefix.
EVERY_PIECE_PREFIX = ("phi3",)
# Tokens that end an assistant turn in chat templates. A file that names no EOT
# token stops at the one its template uses as well as at EOS (llama.cpp's rule):
# an instruction-tuned Gemma ends its turns with <end_of_turn>, not <eos>.
END_OF_TURN = ("<end_of_turn>", "<|eot_id|>", "<|im_end|>", "<|end|>")
# gpt-oss's o200k_harmony vocabulary: <|end|> closes every message of a reply, its reasoning's too; the
# reply ends at <|return|> (an answer) or <|call|> (a tool call), as llama.cpp reads such a vocabulary.
HARMONY_ENDS = ("<|return|>", "<|call|>")


def byte_alphabet() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map used by byte-level BPE."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    mapping = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in mapping:
            mapping[b] = chr(256 + extra)
            extra += 1
    return mapping


def _byte_level(tokens: list[str], merges: list[tuple[str, str]], pre: Optional[str]) -> Backend:
    spell = byte_alphabet()
    alphabet = set(spell.values())
    # A token written outside the byte alphabet is a raw string: spell out its bytes.
    vocab = {
        (t if set(t) <= alphabet else "".join(spell[b] for b in t.encode("utf-8"))): i
        for i, t in enumerate(tokens)
    }
    backend = Backend(models.BPE(vocab=vocab, merges=merges, dropout=None, fuse_unk=False,
                                 continuing_subword_prefix="", end_of_word_suffix="",
                                 ignore_merges=pre in IGNORE_MERGES))
    regexes = splits(pre)
    if regexes is None:
        backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    else:
        backend.pre_tokenizer = pre_tokenizers.Sequence([
            *(pre_tokenizers.Split(Regex(r), behavior="isolated") for r in regexes),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ])
    backend.decoder = decoders.ByteLevel()
    return backend


def merges_from_scores(tokens: list[str], scores: list[float]) -> list[tuple[str, str]]:
    """Recover BPE merges from a SentencePiece vocabulary that lists none.

    Every split of a token into two vocabulary pieces is a merge ranked by the
    token's score (higher first); ties go to shorter left then right pieces.
    """
    vocab = {t: i for i, t in enumerate(tokens)}
    found: list[tuple[str, str, float]] = []
    for token, score in zip(tokens, scores):
        pairs = [(token[:k], token[k:]) for k in range(1, len(token))
                 if token[:k] in vocab and token[k:] in vocab]
        pairs.sort(key=lambda p: (vocab[p[0]], vocab[p[1]]))
        found.extend((left, right, score) for left, right in pairs)
    found.sort(key=lambda m: (m[2], len(m[0]), len(m[1])), reverse=True)
    return [(left, right) for left, right, _ in found]


def _sentencepiece(tokens: list[str], merges: list[tuple[str, str]], add_space_prefix: bool,
                   every_piece: bool = False) -> Backend:
    """every_piece: "▁" goes before each stretch of text between special tokens, and before text that
    already starts with a space (Phi-3's own tokenizer.json; llama.cpp and transformers read its GGUF so);
    else only before the text's start, unless it starts with a space."""
    vocab = {t: i for i, t in enumerate(tokens)}
    backend = Backend(models.BPE(vocab=vocab, merges=merges, dropout=None, fuse_unk=True, byte_fallback=True))
    if every_piece and add_space_prefix:
        backend.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
        backend.pre_tokenizer = None
    else:
        backend.normalizer = None
        backend.pre_tokenizer = pre_tokenizers.Metaspace(
            replacement="▁", prepend_scheme="first" if add_space_prefix else "never", split=False)
    steps = [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
    if add_space_prefix:
        steps.append(decoders.Strip(content=" ", left=1))
    backend.decoder = decoders.Sequence(steps)
    return backend


def _name(tokens: list[str], token_id: Optional[int]) -> Optional[str]:
    return tokens[token_id] if token_id is not None and 0 <= token_id < len(tokens) else None


def _string(f: GGUFFile, key: str) -> Optional[str]:
    """The string at `key` (None when absent); another type is a one-line error naming the key, where
    the code below would fail deep inside (a template that is a number) without naming file or key."""
    value = f.get(key)
    if value is not None and not isinstance(value, str):
        raise FastDecodeError(f"{f.path}: {key} must be a string, got {_kind(value)}")
    return value


def _array(f: GGUFFile, key: str, item: Union[type, tuple[type, ...]], what: str) -> Optional[list]:
    """The array of `item`s (`what`, for the error) at `key`, None when absent; as `_string`."""
    value = f.get(key)
    if value is not None and not (isinstance(value, list) and all(
            isinstance(v, item) and not isinstance(v, bool) for v in value)):
        raise FastDecodeError(f"{f.path}: {key} must be an array of {what}, got {_kind(value)}")
    return value


def _kind(value: Any) -> str:
    return "an array of other values" if isinstance(value, list) else f"{type(value).__name__} {value!r:.40}"


def _token_id(f: GGUFFile, key: str) -> Optional[int]:
    value = f.get(key)
    if isinstance(value, list):
        raise FastDecodeError(f"{f.path}: {key} must be an integer, got an array")
    return optional_int(value, f.path, key)


def tokenizer_from_gguf(f: GGUFFile) -> HFTokenizer:
    path: Path = f.path
    kind = _string(f, "tokenizer.ggml.model")
    tokens = _array(f, "tokenizer.ggml.tokens", str, "strings")
    if kind is None or not tokens:
        raise FastDecodeError(f"{path}: no tokenizer in the file (tokenizer.ggml.model/tokens missing)")
    if kind not in SUPPORTED_MODELS:
        raise FastDecodeError(
            f"{path}: unsupported tokenizer type {kind!r}; supported: {', '.join(SUPPORTED_MODELS)}")
    types = _array(f, "tokenizer.ggml.token_type", int, "integers") or [1] * len(tokens)
    raw_merges = _array(f, "tokenizer.ggml.merges", str, "strings")
    if raw_merges is not None:
        merges = [tuple(m.split(" ", 1)) for m in raw_merges]
        bad = next((i for i, m in enumerate(merges) if len(m) != 2), None)
        if bad is not None:  # the tokenizers library's own error names neither the entry nor the format
            raise FastDecodeError(f"{path}: tokenizer.ggml.merges entry {bad} ({raw_merges[bad]!r:.40}) is not two "
                                  "tokens separated by a space")
    elif kind == "llama":
        merges = merges_from_scores(tokens, _array(f, "tokenizer.ggml.scores", (int, float), "numbers")
                                    or [0.0] * len(tokens))
    else:
        raise FastDecodeError(f"{path}: gpt2 tokenizer without tokenizer.ggml.merges")

    try:
        if kind == "gpt2":
            backend = _byte_level(tokens, merges, _string(f, "tokenizer.ggml.pre"))
        else:
            # transformers always prepends "▁"; llama.cpp honours add_space_prefix, and so do we.
            backend = _sentencepiece(tokens, merges, bool(f.get("tokenizer.ggml.add_space_prefix", True)),
                                     every_piece=f.get("general.architecture") in EVERY_PIECE_PREFIX)
    except Exception as e:  # the tokenizers library raises plain Exception, e.g. a merge of unknown tokens
        raise FastDecodeError(f"{path}: cannot build the tokenizer ({str(e).splitlines()[0]})") from None
    if kind == "gpt2":
        alphabet = set(byte_alphabet().values())
        # A "control" token outside the byte alphabet is a llama.cpp mislabel; adding it
        # would grow the vocabulary past the model's, so it stays an ordinary token.
        control = [t for t, k in zip(tokens, types) if k == CONTROL and set(t) <= alphabet]
    else:
        control = [t for t, k in zip(tokens, types) if k == CONTROL]

    special = {
        "bos_token": _name(tokens, _token_id(f, "tokenizer.ggml.bos_token_id")),
        "eos_token": _name(tokens, _token_id(f, "tokenizer.ggml.eos_token_id")),
        "unk_token": _name(tokens, _token_id(f, "tokenizer.ggml.unknown_token_id")),
        "pad_token": _name(tokens, _token_id(f, "tokenizer.ggml.padding_token_id")),
    }
    named = [t for t in special.values() if t is not None and t not in control]
    backend.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in [*control, *named]])
    vocab = backend.get_vocab(with_added_tokens=False)
    user = [t for t, k in zip(tokens, types) if k == USER_DEFINED and t in vocab]
    if user:
        backend.add_tokens([AddedToken(t, normalized=False, special=False) for t in user])

    extra_eos = [_token_id(f, f"tokenizer.ggml.{k}_token_id") for k in ("eot", "eom")]
    template = _string(f, "tokenizer.chat_template")
    index = {t: i for i, t in enumerate(tokens) if t in (*END_OF_TURN, *HARMONY_ENDS)}
    if all(t in index for t in HARMONY_ENDS):
        extra_eos = [index[t] for t in HARMONY_ENDS]
    elif extra_eos[0] is None and template:
        extra_eos += [index[t] for t in END_OF_TURN if t in index and t in template]
    return HFTokenizer(
        backend,
        special=special,
        extra_eos_ids=[i for i in extra_eos if i is not None],
        chat_template=template,
        tool_template=_string(f, "tokenizer.chat_template.tool_use"),  # llama.cpp's key for a named template
        # SentencePiece vocabularies get BOS unless the file says otherwise (llama.cpp's rule).
        add_bos=bool(f.get("tokenizer.ggml.add_bos_token", kind == "llama")),
        add_eos=bool(f.get("tokenizer.ggml.add_eos_token", False)),
    )
