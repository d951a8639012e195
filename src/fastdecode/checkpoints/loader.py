"""`load_checkpoint`: a .gguf file or a Hugging Face directory -> args, weights, tokenizer."""

from __future__ import annotations

import logging
import os
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Union

import torch

from ..model.args import ModelArgs
from ..errors import FastDecodeError
from ..text.tokenizer import Tokenizer
from . import cache
from .gguf_file import GGUFFile
from .gguf_config import gguf_model_args
from .gguf_loader import gguf_shards, gguf_state_dict, summarize
from .gguf_tokenizer import tokenizer_from_gguf
from .hf_config import hf_model_args, read_config
from .hf_loader import hf_state_dict
from .hf_tokenizer import tokenizer_from_hf_dir
from .keys import check_state_dict

log = logging.getLogger("fastdecode.checkpoints")

@dataclass
class Checkpoint:
    """A loaded checkpoint, ready for `Transformer(args).load_state_dict(state_dict, assign=True)`."""

    args: ModelArgs
    state_dict: dict[str, torch.Tensor]  # our key names, in the requested dtype and device
    tokenizer: Tokenizer
    source: str  # the path it came from
    load_seconds: float
    format: str  # "gguf" or "hf"
    cache_path: Optional[Path] = None  # the converted copy read or written, if any
    from_cache: bool = False
    weights_summary: str = ""  # what became of each tensor type (packed, dequantized, quantized)


def load_checkpoint(path: Union[str, os.PathLike], *, dtype: torch.dtype,
                    device: Union[str, torch.device] = "cpu", use_cache: bool = True,
                    weights: str = "float") -> Checkpoint:
    """Load a .gguf file or a Hugging Face checkpoint directory.

    weights: "float" dequantizes everything to `dtype`; "auto" keeps a GGUF's
    quantized matrices packed (quant/formats.py); "int8"/"int4" quantize float
    matrices. GGUF files are converted once and kept in the cache (see
    `cache.py`) unless `use_cache` is False.
    """
    from ..quant import check_weights

    check_weights(weights)
    start = time.perf_counter()
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise FastDecodeError(f"dtype must be a floating torch.dtype such as torch.float32, got {dtype!r}")
    p = Path(path).expanduser()
    if not p.exists():
        raise FastDecodeError(f"checkpoint not found: {p}")
    if p.is_dir():
        kinds: Counter[str] = Counter()  # gpt-oss's MXFP4 experts, what became of them
        args, state_dict, tokenizer = _load_hf(p, dtype, weights, kinds)
        packed = f"{summarize(kinds)}, " if kinds else ""
        summary = packed + (f"quantized to {weights} at load" if weights in ("int8", "int4") else "float")
        ckpt = Checkpoint(args, state_dict, tokenizer, str(p), 0.0, "hf", weights_summary=summary)
    else:
        ckpt = _load_gguf(p, dtype, use_cache, weights)
    ckpt.state_dict = {k: v.to(device) for k, v in ckpt.state_dict.items()}
    ckpt.load_seconds = time.perf_counter() - start
    log.info("loaded %s in %.2fs%s", p, ckpt.load_seconds,
             f" (converted copy: {ckpt.cache_path})" if ckpt.cache_path else "")
    return ckpt


def _load_hf(directory: Path, dtype: torch.dtype, weights: str, kinds: Counter):
    args = hf_model_args(read_config(directory), directory)
    tokenizer = tokenizer_from_hf_dir(directory)
    state_dict = hf_state_dict(directory, args, dtype, weights, kinds)
    if args.tie_embeddings and any(k.startswith("output.") for k in state_dict):  # a head of its own (hf_loader)
        args = args.replace(tie_embeddings=False)
    check_state_dict(state_dict, args, str(directory))
    _check_vocab(args, tokenizer, directory)
    return args, state_dict, tokenizer


def _open_gguf(path: Path) -> tuple[GGUFFile, ModelArgs, Tokenizer]:
    f = GGUFFile(path)
    args = gguf_model_args(f)
    tokenizer = tokenizer_from_gguf(f)
    _check_vocab(args, tokenizer, path)
    return f, args, tokenizer


def _convert_gguf(path: Path, dtype: torch.dtype, weights: str) -> cache.Entry:
    """The whole conversion in memory (no cache, or one that could not be written)."""
    f, args, tokenizer = _open_gguf(path)
    state_dict, summary = gguf_state_dict(f, args, dtype, weights)
    check_state_dict(state_dict, args, str(path))
    return cache.Entry(args, state_dict, tokenizer, summary)


def _load_gguf(path: Path, dtype: torch.dtype, use_cache: bool, weights: str) -> Checkpoint:
    if not use_cache:
        entry = _convert_gguf(path, dtype, weights)
        return Checkpoint(entry.args, entry.state_dict, entry.tokenizer, str(path), 0.0, "gguf",
                          weights_summary=entry.weights_summary)
    directory = cache.entry_dir(path, dtype, weights)
    entry = _read_or_discard(directory, path)
    if entry is not None:
        if entry.tokenizer_version != cache.TOKENIZER_VERSION:  # built by an older rule: rebuilt, weights kept
            _, _, entry.tokenizer = _open_gguf(path)
            cache.replace_tokenizer(directory, entry.tokenizer)
        return Checkpoint(entry.args, entry.state_dict, entry.tokenizer, str(path), 0.0, "gguf",
                          cache_path=directory, from_cache=True, weights_summary=entry.weights_summary)
    # Converted a layer at a time, each written out before the next, then run from the
    # memory-mapped entry as a warm load does: the conversion never holds the model.
    f, args, tokenizer = _open_gguf(path)
    kinds: Counter[str] = Counter()
    written = cache.write_entry(directory, path, args, tokenizer, gguf_shards(f, args, dtype, weights, kinds),
                                lambda: summarize(kinds, weights))
    if written:
        log.info("cached converted copy of %s at %s", path.name, directory)
        cached = _read_or_discard(directory, path)
        if cached is not None:
            return Checkpoint(cached.args, cached.state_dict, cached.tokenizer, str(path), 0.0, "gguf",
                              cache_path=directory, weights_summary=cached.weights_summary)
    # The entry was not written, and the streamed conversion's tensors are gone.
    entry = _convert_gguf(path, dtype, weights)
    return Checkpoint(entry.args, entry.state_dict, entry.tokenizer, str(path), 0.0, "gguf",
                      weights_summary=entry.weights_summary)


def _read_or_discard(directory: Path, source: Path) -> Optional[cache.Entry]:
    """The cache entry at `directory`, or None if there is none or it failed a check (then deleted)."""
    try:
        return cache.read_entry(directory, source)
    except cache.CorruptEntry as e:
        cache.discard(directory, str(e))
        return None


def _check_vocab(args: ModelArgs, tok: Tokenizer, source: Path) -> None:
    """Checked before any conversion is cached, so a mismatched file never enters the cache."""
    n = args.vocab_size
    if tok.vocab_size > n:
        raise FastDecodeError(f"{source}: tokenizer has {tok.vocab_size} tokens but the model's vocabulary is {n}")
    bad = [i for i in (tok.bos_id, *tok.eos_ids) if i is not None and not 0 <= i < n]
    if bad:
        raise FastDecodeError(f"{source}: special token id {bad[0]} is outside the model's vocabulary of {n}")
