"""Open a GGUF file with the `gguf` package and turn its failures into one-line errors.

`gguf.GGUFReader` memory-maps the file and raises assorted numpy errors on bad
input; we check what we can up front (existence, magic, size) and name the file
and the problem for the rest.
"""

from __future__ import annotations

import ctypes
import math
import os
import re
import struct
from pathlib import Path
from typing import Any, Optional

import torch
import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFReader, GGUFValueType
from gguf.gguf_reader import ReaderTensor

from ..errors import FastDecodeError
from . import dequant

GGUF_MAGIC = b"GGUF"
_MADV_DONTNEED = 4  # Linux


class _CutShort(Exception):
    """A tensor's data runs past the end of the file (_Reader)."""


class _BadHeader(Exception):
    """A header entry cannot be read (_Reader): the message says which."""


class _Reader(GGUFReader):
    """GGUFReader with two changes.

    It reads a metadata array in one pass. The reader makes two numpy views per element
    through its general path, and a tokenizer's arrays have hundreds of thousands: the
    default model's 49,152 tokens and 48,900 merges took 2.6-2.9 s and 157 MB of a first
    load (0.1-0.2 s and 18 MB here), Gemma 3's 262,144 tokens, scores and types 13.6 s. The fields are the same: a string array's parts are its
    strings (one view each, without the length views), a number array's values are one
    part; `data` indexes them as before, so `ReaderField.contents()` reads the same lists.

    And, when mapping the tensors fails, it says which tensor the file cuts short: the
    reader maps every tensor as it opens the file, and a truncated file then fails inside
    numpy with a shape error that names neither the tensor nor the offset. Likewise a
    header entry that cannot be read is named by where it starts (_BadHeader)."""

    _last_key: Optional[str] = None  # the last metadata key read
    _info_at: Optional[int] = None  # where the tensor description being read starts

    def __init__(self, path: Path):
        try:
            super().__init__(path)
        except (IndexError, OverflowError, TypeError, KeyError, UnicodeDecodeError) as e:
            raise _BadHeader(f"{self._where()} runs past the end of the file or holds an impossible value "
                             f"({type(e).__name__})") from None
        except ValueError as e:
            # A value type (of an entry or an array's items) outside GGUF's; the reader's other
            # ValueErrors (version, alignment, tensor type) are described by GGUFFile.
            m = re.search(r"(\d+)\)? is not a valid GGUFValueType", str(e))
            if m is None:
                raise
            raise _BadHeader(f"{self._where()} has unknown value type {m.group(1)}; GGUF's are 0-12") from None

    def _where(self) -> str:
        """The header entry being read when the reader failed."""
        if self._info_at is not None:
            return f"the tensor description at byte {self._info_at}"
        if self._last_key is not None and not self._last_key.startswith("GGUF."):
            return f"the metadata entry after {self._last_key!r}"
        return "the first metadata entry"

    def _push_field(self, field: Any, skip_sum: bool = False) -> int:
        if field.name in self.fields:
            raise _BadHeader(f"the metadata key {field.name!r} appears twice")
        size = super()._push_field(field, skip_sum)
        self._last_key = field.name
        return size

    def _get_tensor_info_field(self, orig_offs: int) -> Any:
        self._info_at = orig_offs
        return super()._get_tensor_info_field(orig_offs)

    def _get_field_parts(self, orig_offs: int, raw_type: int) -> tuple[int, list, list[int], list]:
        if raw_type != GGUFValueType.ARRAY or self.byte_order != "I":
            return super()._get_field_parts(orig_offs, raw_type)
        raw_itype, alen = self._get(orig_offs, np.uint32), self._get(orig_offs + 4, np.uint64)
        if len(raw_itype) < 1 or len(alen) < 1:
            raise IndexError("a metadata array is cut short")
        itype, n, offs = GGUFValueType(int(raw_itype[0])), int(alen[0]), orig_offs + 12
        types = [GGUFValueType.ARRAY] + ([itype] if n else [])
        if itype == GGUFValueType.STRING:
            data, size = self.data.view(np.ndarray), len(self.data)  # plain views: memmap's are slower
            if offs + 8 * n > size:  # a corrupt count: fail now, not after a pass over the whole file
                raise IndexError("a metadata array is cut short")
            parts = [raw_itype, alen]
            for _ in range(n):
                if offs + 8 > size:
                    raise IndexError("a metadata string is cut short")
                (length,) = struct.unpack_from("=Q", data, offs)
                offs += 8
                if offs + length > size:
                    raise IndexError("a metadata string is cut short")
                parts.append(data[offs:offs + length])
                offs += length
            return offs - orig_offs, parts, list(range(2, n + 2)), types
        nptype = self.gguf_scalar_to_np.get(itype)
        if nptype is None:  # arrays of arrays: the reader's own way
            return super()._get_field_parts(orig_offs, raw_type)
        values = self._get(offs, nptype, n)
        if len(values) != n:
            raise IndexError("a metadata array is cut short")
        return 12 + int(values.nbytes), [raw_itype, alen, values], [2] if n else [], types

    def _build_tensors(self, *args: Any, **kwargs: Any) -> None:
        # (start_offs, fields) in the gguf versions we know; any other shape, or a tensor
        # description _tensor_info cannot read, keeps the reader's own error.
        if len(args) >= 2:
            _check_layout(*args[:2], len(self.data), int(self.alignment))
        super()._build_tensors(*args, **kwargs)


class _BadLayout(Exception):
    """The tensor descriptions give a layout llama.cpp refuses (_check_layout): the message says how."""


def _check_layout(start_offs: int, fields: list, size: int, alignment: int) -> None:
    """Each tensor named once, its rows whole blocks of its type, its bytes aligned and apart from every
    other tensor's. The reader checks none of this: a duplicate name or a row that is not whole blocks
    failed as a truncated file, and an offset that overlaps another tensor, or wraps past 2^64 into the
    header, loaded those bytes as weights (llama.cpp refuses all of these)."""
    seen: set[str] = set()
    extents = []
    for field in fields:
        info = _tensor_info(field)
        if info is None:
            return  # the reader's own error names it (an unknown type id, say)
        name, qtype, shape, begin = info
        block, type_size = GGML_QUANT_SIZES[qtype]
        if name in seen:
            raise _BadLayout(f"tensor {name!r} appears twice")
        seen.add(name)
        if shape and shape[0] % block:
            raise _BadLayout(f"tensor {name!r} of type {qtype.name} has rows of {shape[0]} values, "
                             f"not a whole number of its {block}-value blocks")
        if begin % alignment:
            raise _BadLayout(f"tensor {name!r} starts at data offset {begin}, not a multiple of the "
                             f"file's alignment {alignment}")
        extents.append((begin, begin + math.prod(shape) * type_size // block, name))
    for begin, end, name in extents:
        if start_offs + end > size:
            raise _CutShort(_cut_short(name, start_offs + begin, start_offs + end, size))
    for (_, end, before), (begin, _, name) in zip(sorted(extents), sorted(extents)[1:]):
        if begin < end:
            raise _BadLayout(f"tensor {name!r} (data bytes from {begin}) overlaps tensor {before!r} "
                             f"(data bytes to {end})")


def _cut_short(name: str, begin: int, end: int, size: int) -> str:
    return f"truncated GGUF: tensor {name!r} (bytes {begin}-{end}) is cut short at byte {size}, the end of the file"


def _tensor_info(field: Any) -> Optional[tuple[str, GGMLQuantizationType, list[int], int]]:
    """(name, type, shape, offset in the data section) of a tensor description, or None where it
    cannot be read that way (then the reader's own error stands)."""
    try:
        _, name, _, dims, raw_dtype, offset = field.parts
        qtype = GGMLQuantizationType(int(raw_dtype[0]))
        if qtype not in GGML_QUANT_SIZES:
            return None
        return bytes(name).decode("utf-8", errors="replace"), qtype, [int(d) for d in dims], int(offset[0])
    except (ValueError, KeyError, IndexError, TypeError):
        return None


class GGUFFile:
    """Metadata and tensors of one GGUF file, validated on open."""

    def __init__(self, path: Path):
        self.path = path
        check_file(path)
        with open(path, "rb") as f:
            magic = f.read(4)
        if magic != GGUF_MAGIC:
            raise FastDecodeError(
                f"{path}: not a GGUF file (magic {magic!r}, expected {GGUF_MAGIC!r}); "
                "pass a .gguf file or a Hugging Face checkpoint directory")
        try:
            self._reader = _Reader(path)
        except _CutShort as e:
            raise FastDecodeError(f"{path}: {e}") from None
        except ValueError as e:
            raise FastDecodeError(f"{path}: {_describe_reader_error(e)}") from None
        except _BadHeader as e:
            raise FastDecodeError(f"{path}: truncated or corrupt GGUF header: {e}") from None
        except _BadLayout as e:
            raise FastDecodeError(f"{path}: corrupt GGUF tensor layout: {e}") from None
        if self._reader.byte_order == "S":
            raise FastDecodeError(f"{path}: big-endian GGUF files are not supported")
        self.tensors: dict[str, ReaderTensor] = {t.name: t for t in self._reader.tensors}
        self._check_tensors()

    def _check_tensors(self) -> None:
        size = self.path.stat().st_size
        for t in self._reader.tensors:
            if t.data_offset + t.n_bytes > size:
                raise FastDecodeError(f"{self.path}: {_cut_short(t.name, t.data_offset, t.data_offset + t.n_bytes, size)}")

    def get(self, key: str, default: Any = None) -> Any:
        """The metadata value at `key`: a str, int, float, bool or list of them."""
        field = self._reader.fields.get(key)
        if field is None:
            return default
        return _field_value(field)

    def tensor(self, name: str, dtype: torch.dtype) -> torch.Tensor:
        """The named tensor dequantized to `dtype`, in torch (row-major) shape.

        Call `check_tensor_types` first.
        """
        return dequant.dequantize(*self.raw(name), dtype)

    def raw(self, name: str) -> tuple[Any, GGMLQuantizationType, tuple[int, ...]]:
        """The named tensor's bytes (a read-only uint8 view of the file), type and torch shape."""
        t = self.tensors[name]
        raw = self._reader.data[t.data_offset:t.data_offset + t.n_bytes]
        return raw, GGMLQuantizationType(int(t.tensor_type)), tuple(reversed([int(d) for d in t.shape]))

    def drop_pages(self) -> None:
        """Unmap the file's pages that reading has brought into this process (they stay in
        the OS's page cache), so that converting tensor by tensor does not end up holding
        the whole file; later reads map them in again."""
        data = self._reader.data
        libc = ctypes.CDLL(None, use_errno=True)
        libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        libc.madvise(data.ctypes.data, data.nbytes, _MADV_DONTNEED)  # advice only: a failure changes nothing

    def check_tensor_types(self) -> None:
        """Fail on the first tensor whose type we cannot decode."""
        for t in self._reader.tensors:
            qtype = GGMLQuantizationType(int(t.tensor_type))
            if not dequant.is_supported(qtype):
                raise FastDecodeError(
                    f"{self.path}: tensor {t.name!r} has unsupported type {qtype.name}; "
                    f"supported: {', '.join(dequant.SUPPORTED_TYPES)}"
                )


def check_file(path: Path) -> None:
    if not path.exists():
        raise FastDecodeError(f"checkpoint not found: {path}")
    if not path.is_file():
        raise FastDecodeError(f"{path}: expected a .gguf file or a Hugging Face checkpoint directory")
    if not os.access(path, os.R_OK):
        raise FastDecodeError(f"{path}: file is not readable")


def _describe_reader_error(e: ValueError) -> str:
    text = str(e)
    # The id shows as "99" or "np.uint32(99)" depending on numpy's version.
    m = re.search(r"(\d+)\)? is not a valid GGMLQuantizationType", text)
    if m:
        return (f"unknown tensor type id {m.group(1)}; supported: "
                f"{', '.join(dequant.SUPPORTED_TYPES)}")
    if "version" in text:
        return f"unsupported GGUF version ({text})"
    if "alignment" in text:
        return f"general.alignment must be a uint32 power of two ({text})"
    # Everything else the reader trips over is a short read: reshape or slice past the end.
    return "truncated or corrupt GGUF (the header or tensor data is cut short)"


def _field_value(field: Any) -> Any:
    types = field.types
    if types[0] == GGUFValueType.ARRAY:
        if types[-1] == GGUFValueType.STRING:
            return [bytes(field.parts[i]).decode("utf-8", errors="replace") for i in field.data]
        return [v for i in field.data for v in field.parts[i].tolist()]
    if types[0] == GGUFValueType.STRING:
        return bytes(field.parts[field.data[0]]).decode("utf-8", errors="replace")
    value = field.parts[field.data[0]][0]
    return bool(value) if types[0] == GGUFValueType.BOOL else value.item()


def optional_int(value: Optional[Any], path: Path, key: str) -> Optional[int]:
    if value is None:
        return None
    if isinstance(value, list):
        raise FastDecodeError(f"{path}: per-layer {key} is not supported (got a list)")
    if isinstance(value, float) and value.is_integer():  # an odd writer's float32 of a whole number
        return int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise FastDecodeError(f"{path}: {key} must be an integer, got {value!r:.40}")
    return value


def number(f: GGUFFile, key: str, default: float) -> float:
    """The metadata value `key` as a finite float (`default` when absent); anything else is named."""
    value = f.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise FastDecodeError(f"{f.path}: {key} must be a number, got {value!r:.40}")
    return float(value)
