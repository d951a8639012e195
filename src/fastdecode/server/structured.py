"""The request fields that ask for structured output, mapped to one `Constraint`.

- OpenAI: `response_format` {"type": "text"} | {"type": "json_object"} |
  {"type": "json_schema", "json_schema": {"name", "schema", "strict", "description"}};
  llama.cpp's {"type": "json_object", "schema": {...}} is a json_schema too.
- vLLM: `structured_outputs` {"json" | "regex" | "choice" | "grammar" | "json_object"},
  and its older top-level `guided_json`, `guided_regex`, `guided_choice`, `guided_grammar`.
- llama.cpp: top-level `json_schema` (a schema) and `grammar` (GBNF, or Lark).

At most one of them may ask for a constraint. `strict` is accepted either way: the
schema is always enforced, and a keyword llguidance does not implement is a 400 in
both modes, never ignored. Errors are `APIError(400)` naming the field.
"""

from __future__ import annotations

from typing import Any, Optional

from ..errors import FastDecodeError
from ..structured import Constraint, vocab_for
from ..structured.compiler import CACHE
from ..text.tokenizer import Tokenizer
from .errors import APIError

RESPONSE_FORMATS = ("text", "json_object", "json_schema")
VLLM_KEYS = ("json", "regex", "choice", "grammar", "json_object")
_GUIDED = {"guided_json": "json", "guided_regex": "regex", "guided_choice": "choice", "guided_grammar": "grammar"}


def request_constraint(req: Any) -> Optional[Constraint]:
    """The Constraint a chat or completion request asks for, or None."""
    found = _asked(req)
    return found[1] if found else None


def _asked(req: Any) -> Optional[tuple[str, Constraint]]:
    """(the field that asked, its Constraint), or None."""
    found: list[tuple[str, Constraint]] = []
    if req.response_format is not None:
        c = _response_format(req.response_format)
        if c is not None:
            found.append(("response_format", c))
    if req.structured_outputs is not None:
        found.append(_vllm(req.structured_outputs, "structured_outputs"))
    for field, key in _GUIDED.items():
        value = getattr(req, field)
        if value is not None:
            found.append((field, _build(key, value, field)))
    if req.json_schema is not None:
        found.append(("json_schema", _build("json", req.json_schema, "json_schema")))
    if req.grammar is not None:
        found.append(("grammar", _build("grammar", req.grammar, "grammar")))
    if len(found) > 1:
        names = ", ".join(name for name, _ in found)
        raise APIError(400, f"{names}: give only one way of constraining the output", param=found[1][0])
    return found[0] if found else None


def prepare_constraint(req: Any, tokenizer: Tokenizer) -> Optional[Constraint]:
    """request_constraint(req), compiled for this tokenizer now (prepare runs in a worker
    thread), so the engine's submit finds it cached; errors that need the vocabulary
    (a special token it lacks) are 400s naming the field too."""
    found = _asked(req)
    if found is None:
        return None
    param, constraint = found
    try:
        CACHE.matcher(constraint, vocab_for(tokenizer))
    except FastDecodeError as e:
        raise APIError(400, f"{param}: {e}", param=param) from None
    return constraint


def _response_format(value: Any) -> Optional[Constraint]:
    if not isinstance(value, dict):
        raise APIError(400, f"response_format must be an object with a type; accepted types: "
                       f"{', '.join(RESPONSE_FORMATS)}", param="response_format")
    kind = value.get("type")
    if kind not in RESPONSE_FORMATS:
        raise APIError(400, f"response_format.type {kind!r} is unknown; accepted: {', '.join(RESPONSE_FORMATS)}",
                       param="response_format.type")
    if kind == "text":
        return None
    if kind == "json_object":
        if value.get("schema") is not None:  # llama.cpp's form
            return _build("json", value["schema"], "response_format.schema")
        return Constraint.json_object()
    spec = value.get("json_schema")
    if not isinstance(spec, dict):
        raise APIError(400, 'response_format.json_schema must be an object {"name", "schema", "strict"}',
                       param="response_format.json_schema")
    name = spec.get("name")
    if name is not None and not isinstance(name, str):
        raise APIError(400, f"response_format.json_schema.name must be a string, got {type(name).__name__}",
                       param="response_format.json_schema.name")
    strict = spec.get("strict")
    if strict is not None and not isinstance(strict, bool):
        raise APIError(400, f"response_format.json_schema.strict must be a boolean, got {strict!r}",
                       param="response_format.json_schema.strict")
    if "schema" not in spec:
        # OpenAI allows leaving it out: any JSON object.
        return Constraint.json_object()
    return _build("json", spec["schema"], "response_format.json_schema.schema")


def _vllm(value: Any, param: str) -> tuple[str, Constraint]:
    if not isinstance(value, dict):
        raise APIError(400, f"{param} must be an object with one of: {', '.join(VLLM_KEYS)}", param=param)
    asked = {k: v for k, v in value.items() if k in VLLM_KEYS and v is not None and v is not False}
    if "structural_tag" in value and value["structural_tag"] is not None:
        raise APIError(400, f"{param}.structural_tag is not supported; accepted: {', '.join(VLLM_KEYS)}",
                       param=f"{param}.structural_tag")
    if len(asked) != 1:
        what = ", ".join(asked) if asked else "none"
        raise APIError(400, f"{param} must set exactly one of {', '.join(VLLM_KEYS)}; got {what}", param=param)
    key, spec = next(iter(asked.items()))
    return f"{param}.{key}", _build(key, spec, f"{param}.{key}")


def _build(key: str, spec: Any, param: str) -> Constraint:
    try:
        if key == "json":
            return Constraint.json_schema(spec)
        if key == "json_object":
            return Constraint.json_object()
        if key in ("regex", "grammar") and not isinstance(spec, str):
            raise FastDecodeError(f"must be a string, got {type(spec).__name__}")
        return Constraint(key, spec)
    except FastDecodeError as e:
        raise APIError(400, f"{param}: {e}", param=param) from None
