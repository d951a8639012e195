"""A user-visible cache of GGUF checkpoints converted to safetensors.

Parsing a GGUF's metadata and dequantizing its tensors takes seconds; reading
the converted copy back takes a fraction of that. Each entry is a directory

    <root>/converted/<file stem>-<key>/
        model-NNNNN.safetensors  weights in the requested dtype, or packed for the
                                 quantized kernels (weights="auto"), our key names; one
                                 file per part of the conversion (a layer, then the rest),
                                 each written as soon as it is converted, so a conversion
                                 holds one part in memory, not the model
        tokenizer_state.json     the tokenizer plus BOS/EOS/chat settings
        meta.json                format and layout versions, source, ModelArgs, the files
                                 and their sizes, which tensors are stored fused (read
                                 back as row views); written last

keyed by (format version, layout version, absolute source path, size, mtime, dtype, weights). An
entry packed for another layout version (`quant.LAYOUT_VERSION`) is rebuilt. An entry is
written in a temporary directory and renamed into place, so a crash never
leaves a half-written entry under its real name; meta.json records the sizes of
the other files and is checked on every read, and an entry that fails any check
is deleted and rebuilt. An entry whose tokenizer was built by an older rule
(`TOKENIZER_VERSION`) keeps its weights and has its tokenizer rebuilt from the source.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Callable, Iterable, Optional

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from ..kernels.malloc import trim_heap
from ..model.args import ModelArgs
from ..errors import FastDecodeError
from ..paths import cache_root, remove_stale_tmp
from ..quant.formats import LAYOUT_VERSION, SUFFIXES
from .hf_tokenizer import HFTokenizer
from .keys import check_state_dict

# 2: the matrices the model fuses are stored fused ("fused" in meta.json); 3: one weights file per part
FORMAT_VERSION = 3
# How the tokenizer state was built from a GGUF's metadata. 2: every `tokenizer.ggml.pre` split
# llama.cpp knows (gguf_splits.py), and the tool_use chat template; 3: Phi-3's "▁" before every piece of
# text between special tokens (gguf_tokenizer.EVERY_PIECE_PREFIX). An older state is rebuilt
# from the source on load (`replace_tokenizer`), the weights kept.
TOKENIZER_VERSION = 3
_TOKENIZER = "tokenizer_state.json"
log = logging.getLogger("fastdecode.checkpoints")


def clear_cache() -> Path:
    """Delete every converted checkpoint; returns the directory that was cleared."""
    target = cache_root() / "converted"
    shutil.rmtree(target, ignore_errors=True)
    return target


def entry_dir(source: Path, dtype: torch.dtype, weights: str = "float") -> Path:
    source = source.resolve()
    st = source.stat()
    # The layout version is in the key too, so that two versions of fastdecode sharing a
    # cache keep one entry each instead of rebuilding each other's.
    ident = f"{FORMAT_VERSION}|{LAYOUT_VERSION}|{source}|{st.st_size}|{st.st_mtime_ns}|{dtype}|{weights}"
    key = hashlib.sha256(ident.encode("utf-8")).hexdigest()[:16]
    return cache_root() / "converted" / f"{source.stem}-{key}"


@dataclasses.dataclass
class Entry:
    args: ModelArgs
    state_dict: dict[str, torch.Tensor]
    tokenizer: HFTokenizer
    weights_summary: str = ""
    tokenizer_version: int = TOKENIZER_VERSION  # an older one: rebuild the tokenizer from the source


class CorruptEntry(Exception):
    """A cache entry failed a check; the message says which."""


def read_entry(directory: Path, source: Path) -> Optional[Entry]:
    """The entry at `directory`, None if there is none, or CorruptEntry."""
    meta_path = directory / "meta.json"
    if not directory.exists():
        return None
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
        if meta.get("format") != FORMAT_VERSION or meta.get("source") != str(source.resolve()):
            raise CorruptEntry("meta.json does not describe this source")
        if meta.get("layout_version") != LAYOUT_VERSION:
            raise CorruptEntry(f"packed for kernel layout version {meta.get('layout_version')}, "
                               f"this fastdecode uses {LAYOUT_VERSION}")
        for name, expected in meta["sizes"].items():
            size = (directory / name).stat().st_size
            if size != expected:
                raise CorruptEntry(f"{name} has {size} bytes, expected {expected}")
        args = ModelArgs.from_dict(meta["args"])
        state_dict = {}
        for name in meta["weights"]:
            state_dict.update(load_file(str(directory / name)))  # memory-mapped, not read
        _split_fused(state_dict, meta.get("fused", {}))
        check_state_dict(state_dict, args, str(directory))
        tokenizer = _read_tokenizer(directory / _TOKENIZER)
    except CorruptEntry:
        raise
    except (OSError, ValueError, KeyError, TypeError, AttributeError, RuntimeError, SafetensorError) as e:
        # ValueError covers JSON errors and FastDecodeError from the checks.
        raise CorruptEntry(f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}") from None
    return Entry(args, state_dict, tokenizer, meta.get("weights_summary", ""), meta.get("tokenizer_version", 1))


def _read_tokenizer(path: Path) -> HFTokenizer:
    state = json.loads(path.read_text(encoding="utf-8"))
    try:
        return HFTokenizer.from_dict(state)
    except Exception as e:  # the tokenizers library raises plain Exception on bad JSON
        raise CorruptEntry(f"{path.name}: {str(e).splitlines()[0] if str(e) else type(e).__name__}") from None


def write_entry(directory: Path, source: Path, args: ModelArgs, tokenizer: HFTokenizer,
                parts: Iterable[dict[str, torch.Tensor]], summary: Callable[[], str] = lambda: "") -> bool:
    """Write an entry atomically, one weights file per item of `parts` (each written, then
    dropped, before the next is asked for); `summary()` is read once they are all written.
    The tensors' names and shapes are checked (`check_state_dict`) before the entry is
    named, so an entry that is in place is whole. False (with a warning) if the cache is
    not writable; `parts` may then be partly consumed."""
    root = directory.parent
    try:
        root.mkdir(parents=True, exist_ok=True)
        remove_stale_tmp(root)
        tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=root))
    except OSError as e:
        log.warning("not caching the converted checkpoint: cannot write %s (%s); set FASTDECODE_CACHE to a writable "
                    "folder", root, e.strerror or e)
        return False
    try:
        weights, fused, shapes = [], {}, {}
        for part in parts:
            state = {k: v.detach().to("cpu").contiguous() for k, v in part.items()}
            del part
            shapes.update({k: torch.empty(v.shape, dtype=v.dtype, device="meta") for k, v in state.items()})
            fused.update(_fuse_groups(state))
            name = f"model-{len(weights):05d}.safetensors"
            save_file(state, str(tmp / name))
            del state
            trim_heap()  # the parts before this one are freed: their blocks would stay resident
            weights.append(name)
        check_state_dict(shapes, args, str(source))
        (tmp / _TOKENIZER).write_text(json.dumps(tokenizer.to_dict()), encoding="utf-8")
        meta = {
            "format": FORMAT_VERSION,
            "layout_version": LAYOUT_VERSION,
            "tokenizer_version": TOKENIZER_VERSION,
            "weights_summary": summary(),
            "source": str(source.resolve()),
            "args": dataclasses.asdict(args),
            "weights": weights,
            "fused": fused,
            "sizes": {name: (tmp / name).stat().st_size for name in (*weights, _TOKENIZER)},
            "created": time.time(),
        }
        (tmp / "meta.json").write_text(json.dumps(meta, indent=1), encoding="utf-8")
        try:
            os.rename(tmp, directory)
        except OSError:
            # Another process renamed its copy into place first; theirs is as good as ours.
            if not (directory / "meta.json").exists():
                raise
        return True
    except OSError as e:
        log.warning("not caching the converted checkpoint: cannot write %s (%s); set FASTDECODE_CACHE to a writable "
                    "folder", root, e.strerror or e)
        return False
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # a no-op once renamed


def replace_tokenizer(directory: Path, tokenizer: HFTokenizer) -> None:
    """Store a rebuilt tokenizer in an entry: its state first, then meta.json with the new size
    and version, each by an atomic rename. An interruption between the two leaves a size that
    meta.json does not record, so the next read rebuilds the entry rather than use it."""
    try:
        meta = json.loads((directory / "meta.json").read_text(encoding="utf-8"))
        state = json.dumps(tokenizer.to_dict()).encode("utf-8")
        meta["sizes"][_TOKENIZER] = len(state)
        meta["tokenizer_version"] = TOKENIZER_VERSION
        _replace(directory / _TOKENIZER, state)
        _replace(directory / "meta.json", json.dumps(meta, indent=1).encode("utf-8"))
    except (OSError, ValueError, KeyError, TypeError) as e:
        log.warning("could not store the rebuilt tokenizer in %s (%s); it will be rebuilt on the next load",
                    directory, e)


def _replace(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


# The matrices the model runs as one (transformer._fuse): stored concatenated, so that a
# load assigns row views of the memory-mapped file (transformer.adjacent_rows) instead of
# concatenating copies, and resident memory stays that of the file. Each group is found by its
# first part's name, so an MoE layer's experts and shared expert are fused as a dense MLP is.
_GROUPS = {"wq": ("wq", "wk", "wv"), "w1": ("w1", "w3")}


def _fuse_groups(state: dict[str, torch.Tensor]) -> dict[str, dict]:
    """Concatenate each group's tensors in `state` (in place) where they share dtype and
    row shape; returns {fused key: {"parts": keys, "rows": row counts}} for meta.json."""
    fused: dict[str, dict] = {}
    for first in list(state):
        module, _, suffix = first.rpartition(".")
        base, _, name = module.rpartition(".")
        if name not in _GROUPS or suffix not in ("weight", "bias", *SUFFIXES):
            continue
        keys = [f"{base}.{p}.{suffix}" for p in _GROUPS[name]]
        if not all(k in state for k in keys):
            continue
        ts = [state[k] for k in keys]
        if any(t.dtype != ts[0].dtype or t.shape[1:] != ts[0].shape[1:] for t in ts):
            continue
        key = f"{base}.{'+'.join(_GROUPS[name])}.{suffix}"
        state[key] = torch.cat([state.pop(k) for k in keys])
        fused[key] = {"parts": keys, "rows": [t.shape[0] for t in ts]}
    return fused


def _split_fused(state: dict[str, torch.Tensor], fused: dict[str, dict]) -> None:
    """Undo `_fuse_groups` with row views (no copies)."""
    for key, rec in fused.items():
        for part, piece in zip(rec["parts"], state.pop(key).split(rec["rows"])):
            state[part] = piece


def discard(directory: Path, reason: str) -> None:
    log.warning("cache entry %s is stale or corrupt (%s); rebuilding it", directory, reason)
    shutil.rmtree(directory, ignore_errors=True)
    if directory.exists():
        raise FastDecodeError(f"{directory}: corrupt cache entry could not be removed; delete it by hand")
