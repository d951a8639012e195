"""Settings for command-line recipes: a flat dataclass filled from a YAML file
and `key=value` overrides.

The dataclass is the one source of keys, types, defaults and help
(`field(metadata={"help": ...})`); range checks stay in the dataclasses the
values are handed to. Overrides win over the file. Values are parsed by the
field's annotation:

    int, float, str     `top_k=40`, `temperature=0.7`, `model=tiny`
    bool                true/false, yes/no, on/off, 1/0
    Optional[X]         `none` or `null` -> None, anything else parsed as X
    list/tuple/set[X]   repeat the key: `prompt=a prompt=b` (or a YAML list);
                        an empty value, `stop=`, gives the empty list
    JsonText            JSON text as given (`json_schema='{"type": "object"}'`); in YAML
                        also a mapping or list, written back as JSON
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import re
import textwrap
import types
import typing
from typing import Any, Optional, TypeVar

import yaml

from ..config import LoadOptions
from ..errors import FastDecodeError

T = TypeVar("T")

_TRUE = ("true", "yes", "on", "1")
_FALSE = ("false", "no", "off", "0")
_NONE = ("none", "null", "~")
_SEQUENCES = (list, tuple, set, frozenset)
_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*\Z")


class JsonText(str):
    """The type of a key whose value is JSON text (checked by whoever reads it)."""


def is_override(arg: str) -> bool:
    """True if `arg` has the `key=value` form (the key an identifier)."""
    key, eq, _ = arg.partition("=")
    return bool(eq) and bool(_KEY.match(key))


def load_settings(cls: type[T], overrides: list[str], config_path: Optional[str] = None) -> T:
    """Build `cls` from the YAML file at `config_path` (if any), then `overrides`."""
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    values: dict[str, Any] = {}
    if config_path is not None:
        for key, raw in read_yaml(config_path).items():
            name = _check_key(key, names, f"in config file {config_path!r}")
            try:
                values[name] = _from_yaml(name, hints[name], raw)
            except FastDecodeError as e:
                raise FastDecodeError(f"{e} (in config file {config_path!r})") from None
    from_cli: dict[str, list[str]] = {}
    for arg in overrides:
        key, eq, text = arg.partition("=")
        if not eq:
            raise FastDecodeError(f"expected key=value, got {arg!r}")
        from_cli.setdefault(_check_key(key, names, "on the command line"), []).append(text)
    for name, texts in from_cli.items():
        values[name] = _from_texts(name, hints[name], texts)
    try:
        return cls(**values)
    except TypeError as e:  # a programming error in cls, not user input
        raise TypeError(f"cannot build {cls.__name__}: {e}") from None


def read_user_file(path: str, what: str) -> bytes:
    """The bytes of a file the user named, or a one-line error naming `what` and the path."""
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        raise FastDecodeError(f"{what} {path!r} not found") from None
    except IsADirectoryError:
        raise FastDecodeError(f"{what} {path!r} is a directory") from None
    except OSError as e:
        raise FastDecodeError(f"cannot read {what} {path!r}: {e.strerror or e}") from None


def decode_utf8(data: bytes, path: str, what: str) -> str:
    """`data` as strict UTF-8, or a one-line error naming `what`, the byte and its line."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[:e.start].count(b"\n") + 1
        raise FastDecodeError(
            f"{what} {path!r} is not valid UTF-8: byte 0x{data[e.start]:02x} on line {line}") from None


def read_yaml(path: str) -> dict[str, Any]:
    """The mapping at the top of a YAML file ({} for an empty file)."""
    raw = read_user_file(path, "config file")
    try:
        data = yaml.safe_load(raw)
    except yaml.YAMLError as e:
        where = getattr(e, "problem_mark", None)
        line = f" at line {where.line + 1}" if where is not None else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise FastDecodeError(f"config file {path!r} is not valid YAML{line}: {problem}") from None
    except RecursionError:  # PyYAML composes nested collections recursively
        raise FastDecodeError(f"config file {path!r} is not valid YAML: it is nested too deeply to read") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise FastDecodeError(
            f"config file {path!r} must hold a mapping of key: value, got a {type(data).__name__}")
    return data


def describe_settings(cls: type) -> str:
    """Every key with its default and its help text, one block per key."""
    lines = []
    for f in dataclasses.fields(cls):
        lines.append(f"  {f.name} = {format_value(_default(f))}")
        lines += textwrap.wrap(f.metadata.get("help", ""), 88, initial_indent=" " * 6,
                               subsequent_indent=" " * 6)
    return "\n".join(lines)


def copy_fields(cls: type, exclude: tuple[str, ...] = (), include: Optional[tuple[str, ...]] = None,
                help: Optional[dict[str, str]] = None) -> list[tuple[str, Any, Any]]:
    """The fields of dataclass `cls` as `make_dataclass` entries: same names, types
    and defaults, with help taken from the field's metadata or the `name: meaning`
    lines of its docstring (`help` replaces a field's text for one command).
    include: only these fields, in this order.

    This lets a settings class expose another dataclass's fields without
    re-typing their defaults or documentation.
    """
    hints = typing.get_type_hints(cls)
    docs = docstring_help(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    out = []
    for name in include if include is not None else list(fields):
        f = fields[name]
        if f.name in exclude:
            continue
        meta = {"help": (help or {}).get(f.name) or f.metadata.get("help") or docs.get(f.name, "")}
        if f.default_factory is not dataclasses.MISSING:
            spec = dataclasses.field(default_factory=f.default_factory, metadata=meta)
        else:
            spec = dataclasses.field(default=f.default, metadata=meta)
        out.append((f.name, hints[f.name], spec))
    return out


def docstring_help(cls: type) -> dict[str, str]:
    """`{name: text}` from docstring lines `name: text`, with indented continuation lines."""
    entries: dict[str, str] = {}
    current = None
    for line in inspect.cleandoc(cls.__doc__ or "").splitlines():
        m = re.match(r"(\w+): (.*)", line)
        if m:
            current = m.group(1)
            entries[current] = m.group(2).strip()
        elif current is not None and line.startswith((" ", "\t")) and line.strip():
            entries[current] += " " + line.strip()
        else:
            current = None
    return entries


# The keys that pick and load a model (LoadOptions' fields), shared by the commands built
# on `load()` (bench, bench-engine, bench-spec, export, perplexity); a command may redefine
# one to say more.
ModelKeys = dataclasses.make_dataclass(
    "ModelKeys", copy_fields(LoadOptions, include=("model", "device", "dtype", "weights")),
    namespace={"__module__": __name__, "__doc__": "The keys that pick and load a model (LoadOptions' fields)."})


def format_value(value: Any) -> str:
    """A value as it would be written after `key=`."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, _SEQUENCES):
        items = sorted(value) if isinstance(value, (set, frozenset)) else value
        return "[" + ", ".join(format_value(v) for v in items) + "]"
    if isinstance(value, str):
        return repr(value) if (value == "" or value != value.strip() or "\n" in value) else value
    return str(value)


# -- parsing -------------------------------------------------------------------------

def _default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    raise TypeError(f"settings field {f.name!r} needs a default")


def _check_key(key: Any, names: list[str], where: str) -> str:
    name = key.replace("-", "_") if isinstance(key, str) else key
    if name not in names:
        raise FastDecodeError(f"unknown key {key!r} {where}; valid keys: {', '.join(names)}")
    return name


def _split(tp: Any) -> tuple[Any, bool]:
    """(type without Optional, whether None is allowed)."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) != 1:
            raise TypeError(f"unsupported settings type {tp!r}")
        return args[0], True
    return tp, False


def _container(tp: Any) -> Optional[tuple[type, Any]]:
    origin = typing.get_origin(tp)
    if origin in _SEQUENCES:
        args = [a for a in typing.get_args(tp) if a is not Ellipsis]
        return origin, (args[0] if args else str)
    return None


def _from_texts(name: str, tp: Any, texts: list[str]) -> Any:
    base, optional = _split(tp)
    if optional and len(texts) == 1 and texts[0].strip().lower() in _NONE:
        return None
    seq = _container(base)
    if seq is None:
        if len(texts) > 1:
            raise FastDecodeError(f"{name} was given {len(texts)} times; it takes one value")
        return _scalar(name, base, texts[0], optional)
    kind, item = seq
    if texts == [""]:
        return kind()
    return kind(_scalar(name, item, t) for t in texts)


def _from_yaml(name: str, tp: Any, raw: Any) -> Any:
    base, optional = _split(tp)
    if raw is None:
        if optional:
            return None
        raise FastDecodeError(f"{name} is empty; accepted: {_accepted(base)}")
    seq = _container(base)
    if seq is None:
        return _yaml_scalar(name, base, raw, optional)
    kind, item = seq
    raw_items = raw if isinstance(raw, list) else [raw]
    return kind(_yaml_scalar(name, item, v) for v in raw_items)


def _yaml_scalar(name: str, tp: Any, raw: Any, optional: bool = False) -> Any:
    # YAML already typed the value; strings (e.g. `1e-3`, which YAML 1.1 leaves
    # as text) go through the same parser as the command line.
    if isinstance(raw, str):
        return _scalar(name, tp, raw, optional)
    if tp is JsonText and isinstance(raw, (dict, list, bool, int, float)):
        return json.dumps(raw, ensure_ascii=False)
    if tp is bool and isinstance(raw, bool):
        return raw
    if tp is int and isinstance(raw, int) and not isinstance(raw, bool):
        return raw
    if tp is float and isinstance(raw, (int, float)) and not isinstance(raw, bool):
        return float(raw)
    raise FastDecodeError(f"{name}={format_value(raw)} is not valid; accepted: {_accepted(tp, optional)}")


def _scalar(name: str, tp: Any, text: str, optional: bool = False) -> Any:
    s = text.strip()
    try:
        if tp is str or tp is JsonText:
            return text
        if tp is bool:
            if s.lower() in _TRUE:
                return True
            if s.lower() in _FALSE:
                return False
            raise ValueError
        if tp is int:
            return int(s)
        if tp is float:
            return float(s)
    except ValueError:
        raise FastDecodeError(f"{name}={text!r} is not valid; accepted: {_accepted(tp, optional)}") from None
    raise TypeError(f"unsupported settings type {tp!r} for {name}")


def _accepted(tp: Any, optional: bool = False) -> str:
    seq = _container(tp)
    if seq is not None:
        text = f"one or more values, each {_accepted(seq[1])}"
    else:
        text = {bool: "true or false", int: "an integer", float: "a number", str: "a string",
                JsonText: "JSON text (in YAML, also a mapping)"}.get(tp, str(tp))
    return text + " or none" if optional else text


def parse_config_args(argv: list[str]) -> tuple[Optional[str], list[str], bool]:
    """Arguments of the key=value commands (all but generate and chat): (config path, overrides, help asked)."""
    config, overrides = None, []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg in ("-h", "--help"):
            return config, overrides, True
        if arg == "--config":
            if i + 1 >= len(argv):
                raise FastDecodeError("--config needs a file path")
            config, i = argv[i + 1], i + 2
            continue
        if arg.startswith("--config="):
            config = arg.split("=", 1)[1]
        elif is_override(arg):
            overrides.append(arg)
        else:
            raise FastDecodeError(f"unexpected argument {arg!r}; accepted: --config FILE and key=value")
        i += 1
    return config, overrides, False
