"""A request's `tools`, `tool_choice` and `parallel_tool_calls`, checked: what may be called, and how.

Shapes (a tool is `{"type": "function", "function": {...}}`) are checked by
the pydantic models in protocol.py; here are the checks across fields, each
a 400 naming the field and what is accepted.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Optional

from ...structured import schema_error
from ..errors import APIError

NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")  # OpenAI's rule for function names
MODES = ("none", "auto", "required")
# OpenAI: leaving parameters out means none, so the only arguments are `{}`.
NO_PARAMETERS = {"type": "object", "properties": {}, "additionalProperties": False}


@dataclass(frozen=True)
class Function:
    name: str
    parameters: dict  # JSON Schema of the arguments
    definition: dict  # the tool as the client sent it, for the chat template


@dataclass(frozen=True)
class ToolSpec:
    """Calls are possible: choice is auto, required, or function (then `named` is the function)."""

    functions: tuple[Function, ...]  # every tool offered (the prompt lists them all)
    choice: str
    named: Optional[str]
    parallel: bool  # one or more calls; false: exactly one

    @property
    def callable(self) -> tuple[Function, ...]:
        return tuple(f for f in self.functions if f.name == self.named) if self.named else self.functions

    @property
    def definitions(self) -> list[dict]:
        return [f.definition for f in self.functions]


def tool_spec(tools: Optional[list[Any]], tool_choice: Any, parallel: Optional[bool]) -> Optional[ToolSpec]:
    """The calls a request allows, or None when it allows none (no tools, or tool_choice none)."""
    mode, named = _choice(tool_choice)
    if tools is not None and not tools:
        raise APIError(400, "tools is an empty list; give at least one tool, or leave tools out", param="tools")
    if not tools:
        if mode in ("required", "function"):
            what = f"names the function {named!r}" if named else "is 'required'"
            raise APIError(400, f"tool_choice {what}, but the request has no tools; add them to tools",
                           param="tool_choice")
        return None
    functions = tuple(_function(i, t) for i, t in enumerate(tools))
    seen: set[str] = set()
    for i, f in enumerate(functions):
        if f.name in seen:
            raise APIError(400, f"tools[{i}].function.name: {f.name!r} is given twice; names must be unique",
                           param=f"tools[{i}].function.name")
        seen.add(f.name)
    if mode == "none":
        return None
    if named is not None and named not in seen:
        raise APIError(400, f"tool_choice names the function {named!r}, which is not in tools; accepted: "
                       + ", ".join(repr(n) for n in sorted(seen)), param="tool_choice")
    return ToolSpec(functions, mode, named, True if parallel is None else bool(parallel))


def _choice(value: Any) -> tuple[str, Optional[str]]:
    if value is None:
        return "auto", None  # with tools; without, nothing is called anyway
    if isinstance(value, str):
        if value in MODES:
            return value, None
        raise APIError(400, f"tool_choice {value!r} is not valid; accepted: 'none', 'auto', 'required' or "
                       '{"type": "function", "function": {"name": ...}}', param="tool_choice")
    fn = value.get("function") if isinstance(value, dict) else None
    if isinstance(value, dict) and value.get("type") == "function" and isinstance(fn, dict) \
            and isinstance(fn.get("name"), str):
        return "function", fn["name"]
    raise APIError(400, f"tool_choice {_short(value)} is not valid; accepted: 'none', 'auto', 'required' or "
                   '{"type": "function", "function": {"name": ...}}', param="tool_choice")


def _function(i: int, tool: Any) -> Function:
    """One tool; `tool` is protocol.ToolDefinition (type already checked to be 'function')."""
    fn = tool.function
    param = f"tools[{i}].function"
    if not NAME.fullmatch(fn.name):
        raise APIError(400, f"{param}.name {fn.name!r} is not valid; accepted: 1 to 64 letters, digits, "
                       "underscores or dashes", param=f"{param}.name")
    parameters = NO_PARAMETERS if fn.parameters is None else fn.parameters
    if not isinstance(parameters, dict):
        raise APIError(400, f"{param}.parameters must be a JSON Schema object, got {_short(parameters)}",
                       param=f"{param}.parameters")
    error = schema_error(parameters)
    if error:
        raise APIError(400, f"{param}.parameters: {error}", param=f"{param}.parameters")
    kind = parameters.get("type", "object")
    # A list of types (["object", "null"]: a nullable object) names arguments when it admits objects.
    if kind != "object" and not (isinstance(kind, list) and "object" in kind):
        raise APIError(400, f"{param}.parameters must describe an object (type 'object': the arguments are "
                       f"named), got type {_short(kind)}", param=f"{param}.parameters")
    # Arguments are always a JSON object, also where the schema leaves its type open ({} or bare properties)
    # or lists other types beside it.
    held = parameters if kind == "object" and "type" in parameters else {**parameters, "type": "object"}
    return Function(fn.name, held, tool.model_dump(exclude_none=True))


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
