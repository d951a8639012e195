"""A Hugging Face directory's weight files: safetensors (one file or shards with an index), else
PyTorch's pickled `pytorch_model.bin` (the same), which older repositories hold alone.

The .bin files are read with `torch.load(weights_only=True)`, which unpickles tensors and plain
containers only (no code runs), memory-mapped.
"""

from __future__ import annotations

import json
import zipfile
from pathlib import Path
from typing import Callable, Iterator

import torch
from safetensors import SafetensorError, safe_open

from ..errors import FastDecodeError

_FORMATS = (("model.safetensors", "safetensors"), ("pytorch_model.bin", "PyTorch .bin"))


def weight_files(directory: Path) -> list[Path]:
    """The directory's weight files: model.safetensors or its index's shards, else pytorch_model.bin or
    its index's shards."""
    for name, kind in _FORMATS:
        single, index = directory / name, directory / f"{name}.index.json"
        if single.is_file():
            return [single]
        if index.is_file():
            try:
                shards = sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()))
                files = [directory / shard for shard in shards]
            except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError, KeyError, TypeError,
                    AttributeError) as e:
                raise FastDecodeError(f"{index}: not a {kind} index ({e})") from None
            # A shard is a file beside its index, of the index's format: a name with a folder in it
            # ("../x", "/x") would read a file from anywhere, and a .bin shard of a safetensors index a pickle.
            suffix = Path(name).suffix
            odd = [s for s in shards if Path(s).name != s or not s.endswith(suffix)]
            if odd:
                raise FastDecodeError(f"{index}: shard {odd[0]!r} is not a {suffix} file name beside the index")
            missing = [f for f in files if not f.is_file()]
            if missing:
                raise FastDecodeError(f"{index}: shard {missing[0].name} is missing")
            return files
    raise FastDecodeError(f"{directory}: no model.safetensors or model.safetensors.index.json (or PyTorch's "
                          "pytorch_model.bin or its index); a Hugging Face directory holds its weights in one")


def tensors(file: Path) -> Iterator[tuple[str, Callable[[], torch.Tensor]]]:
    """(name, a function that reads the tensor) for each tensor of `file`, in the file's order; a file
    that cannot be read is one line naming it."""
    if file.suffix == ".safetensors":
        def unreadable(e: Exception) -> FastDecodeError:
            return FastDecodeError(f"{file}: cannot read safetensors ({e})")

        def read(f, name: str) -> torch.Tensor:
            try:
                return f.get_tensor(name)
            except (SafetensorError, OSError) as e:
                raise unreadable(e) from None

        try:
            with safe_open(str(file), framework="pt") as f:
                for name in f.keys():
                    yield name, lambda f=f, name=name: read(f, name)
        except (SafetensorError, OSError) as e:
            raise unreadable(e) from None
        return
    try:
        # torch.save's format before PyTorch 1.6 (not a zip) cannot be memory-mapped: read whole, as
        # transformers does.
        state = torch.load(str(file), map_location="cpu", weights_only=True, mmap=zipfile.is_zipfile(file))
    except Exception as e:  # a pickle that is not tensors, a truncated zip: torch raises many kinds
        raise FastDecodeError(f"{file}: cannot read a PyTorch weights file ({_load_problem(e)})") from None
    if not isinstance(state, dict) or not all(isinstance(k, str) and isinstance(v, torch.Tensor)
                                              for k, v in state.items()):
        raise FastDecodeError(f"{file}: not a state dict of named tensors")
    for name, t in state.items():
        yield name, lambda t=t: t


def _load_problem(e: Exception) -> str:
    """torch.load's failure in a line. Its weights_only refusal starts with advice to unpickle without
    it (running the file's code) and names the reason lines later: that reason is what we show."""
    text = str(e)
    _, marker, rest = text.partition("WeightsUnpickler error:")
    reason = next((line.strip() for line in rest.splitlines() if line.strip()), "") if marker else ""
    if reason:
        return f"weights_only unpickling refused it: {reason}"
    return f"{type(e).__name__}: {text.splitlines()[0] if text else ''}"
