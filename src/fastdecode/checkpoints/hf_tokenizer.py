"""The checkpoint's own tokenizer, on top of the `tokenizers` library.

`HFTokenizer` wraps a `tokenizers.Tokenizer` built either from a GGUF file's
metadata (see `gguf_tokenizer.py`) or from a Hugging Face `tokenizer.json`.
Special-token strings in the text (e.g. `<|im_start|>`) are matched as added
tokens by the library, as transformers does.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Iterable, Optional, Sequence

from tokenizers import Tokenizer as Backend
from tokenizers import processors

from ..errors import FastDecodeError
from ..text.tokenizer import Tokenizer, check_unicode

SPECIAL_NAMES = ("bos_token", "eos_token", "unk_token", "pad_token")
BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")
REPLACEMENT = "\ufffd".encode("utf-8")


class HFTokenizer(Tokenizer):
    """A `tokenizers` backend plus what the checkpoint says about BOS/EOS and chat.

    Args:
        backend: the tokenizer; its post-processor is replaced when `add_bos` or
            `add_eos` is given, and otherwise decides what `encode` adds.
        special: token strings by name (bos_token, eos_token, unk_token, pad_token).
        extra_eos_ids: more ids that end a generation (end-of-turn and the like).
        tool_template: the checkpoint's "tool_use" chat template, for requests that offer tools.
    """

    def __init__(
        self,
        backend: Backend,
        *,
        special: dict[str, Optional[str]],
        extra_eos_ids: Iterable[int] = (),
        chat_template: Optional[str] = None,
        tool_template: Optional[str] = None,
        add_bos: Optional[bool] = None,
        add_eos: Optional[bool] = None,
    ):
        self.backend = backend
        self.special_tokens_map = {k: special.get(k) for k in SPECIAL_NAMES}
        self.chat_template = chat_template
        self.tool_template = tool_template
        self.vocab_size = backend.get_vocab_size(with_added_tokens=True)
        self.bos_id = self._id(self.special_tokens_map["bos_token"])
        eos_id = self._id(self.special_tokens_map["eos_token"])
        self.eos_ids = frozenset({*(int(i) for i in extra_eos_ids), *([eos_id] if eos_id is not None else [])})
        pad_id = self._id(self.special_tokens_map["pad_token"])
        self.pad_id = pad_id if pad_id is not None else (eos_id if eos_id is not None else 0)
        if add_bos is not None or add_eos is not None:
            self._set_post_processor(bool(add_bos), bool(add_eos))
        self.add_bos = self._adds_bos()
        self._bytes: dict[int, int] = {}  # byte-fallback token id -> its byte
        if "ByteFallback" in repr(backend.decoder):
            for token, i in backend.get_vocab(with_added_tokens=False).items():
                if (m := BYTE_TOKEN.fullmatch(token)):
                    self._bytes[i] = int(m.group(1), 16)
        if len(set(self._bytes.values())) < 256:  # not a byte-fallback vocabulary: leave decoding as it is
            self._bytes = {}
        self._byte_ids = {b: i for i, b in self._bytes.items()}
        self._special_ids = {i for i, t in backend.get_added_tokens_decoder().items() if t.special}

    def _id(self, token: Optional[str]) -> Optional[int]:
        return None if token is None else self.backend.token_to_id(token)

    def _set_post_processor(self, add_bos: bool, add_eos: bool) -> None:
        # Same rule as transformers: a flag without its token is dropped.
        bos, eos = self.special_tokens_map["bos_token"], self.special_tokens_map["eos_token"]
        add_bos = add_bos and self._id(bos) is not None
        add_eos = add_eos and self._id(eos) is not None
        single = " ".join([*([f"{bos}:0"] if add_bos else []), "$A:0", *([f"{eos}:0"] if add_eos else [])])
        pair = " ".join([single, *([f"{bos}:1"] if add_bos else []), "$B:1", *([f"{eos}:1"] if add_eos else [])])
        tokens = [(t, self._id(t)) for t, on in ((bos, add_bos), (eos, add_eos)) if on]
        self.backend.post_processor = processors.TemplateProcessing(
            single=single, pair=pair, special_tokens=tokens)

    def _adds_bos(self) -> bool:
        if self.bos_id is None:
            return False
        ids = self.backend.encode("a", add_special_tokens=True).ids
        return bool(ids) and ids[0] == self.bos_id

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        if not isinstance(text, str):
            raise FastDecodeError(f"encode expects a str, got {type(text).__name__}")
        return self.backend.encode(check_unicode(text), add_special_tokens=add_special_tokens).ids

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = True) -> str:
        ids = [int(i) for i in ids]
        if self._bytes:
            ids = self._mend_byte_runs(ids, skip_special_tokens)
        return self.backend.decode(ids, skip_special_tokens=skip_special_tokens)

    def _mend_byte_runs(self, ids: list[int], skip_special_tokens: bool) -> list[int]:
        """Byte-fallback tokens whose bytes are not valid UTF-8 get each bad byte spelled as U+FFFD's
        bytes. The backend's ByteFallback turns every byte of such a run into U+FFFD, the valid
        characters in it too, so a stream that had shown those characters saw the decode of the
        longer text disagree and stopped; SentencePiece and llama.cpp replace only the bad bytes."""
        out: list[int] = []
        run: list[int] = []

        def close_run() -> None:
            text = bytes(self._bytes[i] for i in run).decode("utf-8", errors="surrogateescape")
            if any("\udc80" <= c <= "\udcff" for c in text):  # a byte that decodes to nothing
                fixed = b"".join(REPLACEMENT if "\udc80" <= c <= "\udcff" else c.encode("utf-8") for c in text)
                out.extend(self._byte_ids[b] for b in fixed)
            else:
                out.extend(run)
            run.clear()

        for i in ids:
            if i in self._bytes:
                run.append(i)
            elif i >= self.vocab_size or (skip_special_tokens and i in self._special_ids):
                continue  # dropped by the backend too, so the bytes around it are one run
            else:
                if run:
                    close_run()
                out.append(i)
        if run:
            close_run()
        return out

    def to_dict(self) -> dict[str, Any]:
        """Everything needed to rebuild this tokenizer (used by the conversion cache)."""
        return {
            "backend": self.backend.to_str(),
            "special": self.special_tokens_map,
            "eos_ids": sorted(self.eos_ids),
            "chat_template": self.chat_template,
            "tool_template": self.tool_template,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "HFTokenizer":
        # The saved backend already carries the post-processor decided at build time.
        return cls(Backend.from_str(d["backend"]), special=d["special"],
                   extra_eos_ids=d["eos_ids"], chat_template=d["chat_template"],
                   tool_template=d.get("tool_template"))


def _token_str(value: Any) -> Optional[str]:
    """tokenizer_config stores special tokens as strings or as AddedToken dicts."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _read_json(path: Path) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:  # RecursionError: nesting too deep
        raise FastDecodeError(f"{path}: cannot read JSON ({e})") from None
    if not isinstance(data, dict):
        raise FastDecodeError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data


def _read_template(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:  # else a bare exception naming neither the file nor the byte's place
        raise FastDecodeError(f"{path}: not UTF-8 text (byte 0x{e.object[e.start]:02x} at offset {e.start})") from None
    except OSError as e:
        raise FastDecodeError(f"{path}: cannot read the chat template ({e.strerror or e})") from None


def _chat_templates(directory: Path, config: dict[str, Any]) -> tuple[Optional[str], Optional[str]]:
    """(the default chat template, the "tool_use" one) as transformers finds them."""
    named: dict[str, Any] = {}
    # Newer transformers save the templates beside the config instead of inside it.
    jinja = directory / "chat_template.jinja"
    if jinja.is_file():
        named["default"] = _read_template(jinja)
    elif (directory / "chat_template.json").is_file():
        named["default"] = _read_json(directory / "chat_template.json").get("chat_template")
    else:
        named["default"] = config.get("chat_template")
    if isinstance(named["default"], list):  # named templates; an entry without a string name is skipped, as
        # one that is not an object is (a list as a name failed as "unhashable type")
        named = {t["name"]: t.get("template") for t in named["default"]
                 if isinstance(t, dict) and isinstance(t.get("name"), str)}
    extra = directory / "additional_chat_templates" / "tool_use.jinja"
    if extra.is_file():
        named["tool_use"] = _read_template(extra)
    default, tool_use = named.get("default"), named.get("tool_use")
    return (default if isinstance(default, str) else None, tool_use if isinstance(tool_use, str) else None)


def _generation_eos_ids(directory: Path) -> list[int]:
    ids: list[int] = []
    for name in ("config.json", "generation_config.json"):
        if (directory / name).is_file():
            value = _read_json(directory / name).get("eos_token_id")
            listed = value if isinstance(value, list) else [value] if isinstance(value, int) else []
            # A list item that is not an id ("<eos>", null, 2.5) is named here, not left to fail as a bare
            # ValueError or TypeError; a scalar of another kind is ignored as before.
            bad = [i for i in listed if isinstance(i, bool) or not isinstance(i, int)]
            if bad:
                raise FastDecodeError(f"{directory / name}: eos_token_id must be an integer or a list of integers, "
                                      f"got {bad[0]!r:.40} in {value!r:.80}")
            ids.extend(listed)
    return ids


def tokenizer_from_hf_dir(directory: Path) -> HFTokenizer:
    """Build the tokenizer of a Hugging Face checkpoint directory from tokenizer.json."""
    path = directory / "tokenizer.json"
    if not path.is_file():
        extra = " (tokenizer.model alone is not supported)" if (directory / "tokenizer.model").exists() else ""
        raise FastDecodeError(f"{directory}: no tokenizer.json{extra}; re-save the tokenizer with transformers")
    try:
        backend = Backend.from_file(str(path))
    except Exception as e:  # the Rust side raises a plain Exception on malformed files
        raise FastDecodeError(f"{path}: cannot parse tokenizer ({str(e).splitlines()[0]})") from None
    config_path = directory / "tokenizer_config.json"
    config = _read_json(config_path) if config_path.is_file() else {}
    special = {name: _token_str(config.get(name)) for name in SPECIAL_NAMES}
    default, tool_use = _chat_templates(directory, config)
    # BOS/EOS come from tokenizer.json's post-processor alone: transformers (5.x)
    # drops tokenizer_config's add_bos_token/add_eos_token when tokenizer.json exists.
    return HFTokenizer(
        backend,
        special=special,
        extra_eos_ids=_generation_eos_ids(directory),
        chat_template=default,
        tool_template=tool_use,
    )
