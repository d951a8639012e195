"""A chat's messages and tools as the chat template takes them.

Templates with tool support (hermes, llama3_json, the Mistral formats) get `tools=`
and render the tool definitions, assistant `tool_calls` and `tool` results
themselves; their calls' `arguments` are handed over as objects (templates write
them with `tojson`, as transformers' callers pass them), not as the API's JSON
string. Mistral's templates take only 9-character call ids: other ids are mapped.

Templates without it (generic) see only plain text: the tools go into a system
message of ours, an assistant's calls become its text in the generic format,
and tool results become a user message.
"""

from __future__ import annotations

import json
from typing import Any, Optional

from .formats import GENERIC, ToolFormat, generic_system_prompt
from .parse import short_id
from .spec import ToolSpec


def _arguments_text(arguments: Any) -> str:
    return arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)


def _arguments_value(arguments: Any) -> Any:
    if not isinstance(arguments, str):
        return arguments
    try:
        return json.loads(arguments)
    except ValueError:
        return arguments  # not JSON: the template writes the string


def _message(m: Any) -> dict:
    """A request message (protocol.ChatMessage) as a plain dict; keys a template tests with
    `in` (tool_calls, tool_call_id, name) only when given."""
    out: dict = {"role": "system" if m.role == "developer" else m.role, "content": m.content}
    if m.name is not None:
        out["name"] = m.name
    if m.tool_calls:
        out["tool_calls"] = [{"id": c.id, "type": "function",
                              "function": {"name": c.function.name, "arguments": c.function.arguments}}
                             for c in m.tool_calls]
    if m.tool_call_id is not None:
        out["tool_call_id"] = m.tool_call_id
    return out


def template_input(messages: list[Any], fmt: ToolFormat, spec: Optional[ToolSpec]) -> tuple[list[dict], Optional[list]]:
    """(messages, tools) for the chat template; tools is None when none are offered."""
    plain = [_message(m) for m in messages]
    if fmt.short_ids:  # the template refuses other ids; a call and its result keep their pairing
        for m in plain:
            for call in m.get("tool_calls", ()):
                call["id"] = short_id(call["id"])
            if m.get("tool_call_id") is not None:
                m["tool_call_id"] = short_id(m["tool_call_id"])
    if fmt.native:
        for m in plain:
            for call in m.get("tool_calls", ()):
                call["function"]["arguments"] = _arguments_value(call["function"]["arguments"])
        return plain, spec.definitions if spec is not None else None
    return _as_text(plain, spec), None


def _as_text(messages: list[dict], spec: Optional[ToolSpec]) -> list[dict]:
    names = {}  # tool_call_id -> function name, for the results
    out: list[dict] = []
    for m in messages:
        if m.get("tool_calls"):
            calls = [(c["function"]["name"], _arguments_text(c["function"]["arguments"])) for c in m["tool_calls"]]
            names.update((c["id"], c["function"]["name"]) for c in m["tool_calls"])
            text = GENERIC.render(calls)
            out.append({"role": "assistant", "content": f"{m['content']}\n{text}" if m["content"] else text})
        elif m["role"] == "tool":
            call_id = m.get("tool_call_id")
            result = f"Result of {names.get(call_id, m.get('name', 'the call'))} ({call_id}): {m['content']}"
            if out and out[-1].get("tool_results"):  # results of one turn's calls: one user message
                out[-1]["content"] += "\n" + result
            else:
                out.append({"role": "user", "content": result, "tool_results": True})
        elif m["role"] == "user" and out and out[-1].get("tool_results"):
            # The next question joins the results' user message: two user turns in a row are refused
            # by templates that insist on alternating roles (Gemma's).
            if m["content"]:
                out[-1]["content"] += "\n\n" + m["content"]
        else:
            out.append({k: v for k, v in m.items() if k in ("role", "content", "name")})
    for m in out:
        m.pop("tool_results", None)
    if spec is not None:
        offer = generic_system_prompt(spec.definitions)
        if out and out[0]["role"] == "system":
            out[0] = {**out[0], "content": f"{out[0]['content']}\n\n{offer}" if out[0]["content"] else offer}
        else:
            out.insert(0, {"role": "system", "content": offer})
    return out
