"""The Lark grammar (llguidance's dialect) that holds a reply to a tool call format.

One rule per callable function writes its call's fixed text around the
function's own `parameters` schema (`%json`), so the name is one of the
listed ones and the arguments validate against that function's schema:

- tool_choice=required or a named function: the reply is the block of calls from
  its first token;
- tool_choice=auto: free text until the format's trigger (`<tool_call>`, ...), then
  the block of calls (a lazy lexeme: the grammar constrains nothing before it; a
  trigger that is a special token, as Mistral's `[TOOL_CALLS]`, needs none, since
  free text cannot contain it); formats whose calls open the reply (llama3_json)
  take text that does not start with `{` instead; harmony's reply is messages on
  channels, whose headers the grammar holds, a call being one whose header names a
  function;
- parallel_tool_calls=false: exactly one call, otherwise one or more.

Markers that the vocabulary holds as special tokens are written as those tokens
(`<[id]>`), never as their text spelled in ordinary tokens.

JSON inside a call is structured outputs' own (`json_schema_lark`): compact,
with `", "` and `": "` separators, as the templates write calls, so there is
no whitespace a model could run on with until max_tokens.
"""

from __future__ import annotations

import json
import re
from typing import Mapping, Optional, Sequence

from ...errors import FastDecodeError
from ...structured import Constraint, json_schema_lark, vocab_for
from ...structured.compiler import CACHE
from ...text.harmony import CHANNEL, END, MESSAGE, START
from ...text.tokenizer import Tokenizer
from ..errors import APIError
from .formats import ToolFormat
from .spec import Function, ToolSpec


def _lit(text: str, specials: Mapping[str, int]) -> str:
    """`text` as Lark items: string literals (JSON's escapes are Lark's), and the special
    tokens in it by id (`<[id]>`: their text is not the vocabulary's way to write them)."""
    items = []
    while text:
        at, marker = min(((text.find(m), m) for m in specials if m in text), default=(-1, ""))
        if at < 0:
            items.append(json.dumps(text))
            break
        if at:
            items.append(json.dumps(text[:at]))
        items.append(f"<[{specials[marker]}]>")
        text = text[at + len(marker):]
    return " ".join(items)


def _seq(*items: str) -> str:
    return " ".join(i for i in items if i)


def _calls(fmt: ToolFormat, functions: Sequence[Function], parallel: bool, skip: int,
           specials: Mapping[str, int]) -> list[str]:
    """Rules for `calls`: the block of calls, less its first `skip` characters (a matched trigger)."""
    opening = (fmt.begin + fmt.call_open)[skip:]
    rules = []
    names = []
    for i, f in enumerate(functions):
        # The first call's opening (maybe cut by the trigger) is written by `calls`, the next ones' by `more`.
        rules.append(f"fn_{i}: " + _seq(_lit(f.name + fmt.args_key, specials), f"args_{i}",
                                        _lit(fmt.call_close, specials)))
        rules.append(f"args_{i}: {json_schema_lark(f.parameters)}")
        names.append(f"fn_{i}")
    rules.append("call: " + " | ".join(names))
    more = f"({_lit(fmt.separator + fmt.call_open, specials)} call)*" if parallel and not fmt.one_call else ""
    rules.insert(0, "calls: " + _seq(_lit(opening, specials), "call", more, _lit(fmt.end, specials)))
    return rules


def tool_grammar(fmt: ToolFormat, spec: ToolSpec, specials: Optional[Mapping[str, int]] = None,
                 answer: Optional[str] = None) -> str:
    """The grammar for a request's tool_choice (auto, required or a named function);
    `specials`: the format's markers that are special tokens (`formats.special_markers`);
    `answer`: under auto, what a reply that calls nothing must be instead of free text (a Lark
    rule's body, e.g. `json_schema_lark(...)` for a response_format)."""
    functions = spec.callable
    specials = specials or {}
    head = ["%llguidance {}"]
    if spec.choice != "auto":
        return "\n".join(head + ["start: calls"] + _calls(fmt, functions, spec.parallel, 0, specials)) + "\n"
    if answer is not None:
        if fmt.channels:
            raise ValueError(f"{fmt.name}: an answer format is not supported with tool_choice auto")
        lines = head + ["start: answer | calls", f"answer: {answer}"]
        if (fmt.begin + fmt.call_open).startswith("{"):
            # llguidance's lexer cannot tell a literal that opens like the answer's JSON from it: the calls
            # are written as JSON too (the same text, compact).
            return "\n".join(lines + _json_calls(fmt, functions, spec.parallel)) + "\n"
        return "\n".join(lines + _calls(fmt, functions, spec.parallel, 0, specials)) + "\n"
    if fmt.channels and set(fmt.markers) <= set(specials):
        return "\n".join(head + _messages(fmt, functions, specials)) + "\n"
    if fmt.trigger in specials:
        # A special token cannot occur in free text, so the text needs no lazy match to stop at it.
        lines = head + [f"start: TEXT | TEXT {_lit(fmt.trigger, specials)} calls", "TEXT: /(.|\\n)*/"]
        return "\n".join(lines + _calls(fmt, functions, spec.parallel, len(fmt.trigger), specials)) + "\n"
    if fmt.anywhere:
        lines = head + ["start: text | trigger calls",
                        "text: /(.|\\n)*/",
                        f"trigger[lazy]: /(.|\\n)*/ {_lit(fmt.trigger, specials)}"]
        return "\n".join(lines + _calls(fmt, functions, spec.parallel, len(fmt.trigger), specials)) + "\n"
    if not fmt.trigger.startswith("{"):
        raise ValueError(f"{fmt.name}: a reply-opening trigger must start with '{{'")
    lines = head + ["start: TEXT | calls", "TEXT: /([^{](.|\\n)*)?/"]  # text, or a call from the first character
    return "\n".join(lines + _calls(fmt, functions, spec.parallel, 0, specials)) + "\n"


def _json_key(text: str) -> str:
    """The key a format's literal text names (`{"tool_calls": [` -> tool_calls)."""
    return re.search(r'"(\w+)": ', text).group(1)


def _call_schema(fmt: ToolFormat, f: Function, i: int) -> dict:
    # Its own $id keeps the parameters' `#/$defs/...` references pointing into the parameters.
    parameters = f.parameters if "$id" in f.parameters else {"$id": f"urn:fastdecode:tool:{i}", **f.parameters}
    return {"type": "object", "properties": {"name": {"const": f.name}, _json_key(fmt.args_key): parameters},
            "required": ["name", _json_key(fmt.args_key)], "additionalProperties": False}


def _json_calls(fmt: ToolFormat, functions: Sequence[Function], parallel: bool) -> list[str]:
    """Rules for `calls` as JSON values, for the formats whose calls open with `{`."""
    calls = {"anyOf": [_call_schema(fmt, f, i) for i, f in enumerate(functions)]}
    if fmt.begin:  # the block is one JSON object: {"tool_calls": [call, ...]}
        items = {"type": "array", "items": calls, "minItems": 1, **({} if parallel else {"maxItems": 1})}
        block = {"type": "object", "properties": {_json_key(fmt.begin): items}, "required": [_json_key(fmt.begin)],
                 "additionalProperties": False}
        if fmt.render([("f", "{}")]) != json.dumps({_json_key(fmt.begin): [{"name": "f", _json_key(fmt.args_key): {}}]}):
            raise ValueError(f"{fmt.name}: its block of calls is not compact JSON")
        return [f"calls: {json_schema_lark(block)}"]
    more = f"({json.dumps(fmt.separator)} call)*" if parallel else ""
    return [f"calls: call {more}", f"call: {json_schema_lark(calls)}"]


def _messages(fmt: ToolFormat, functions: Sequence[Function], specials: Mapping[str, int]) -> list[str]:
    """harmony under tool_choice=auto: messages, each a channel's name and either a body of free text
    (which holds no special token, so it ends at the next marker) then the next message or the reply's
    end, or a call: the recipient after the channel's name, as the model writes it, and the arguments.
    The reply opens with a header: its prompt ends at `<|start|>assistant`."""
    skip = fmt.begin.index(" to=")  # the call's text after `<|channel|>commentary`
    body, next_message = _lit(MESSAGE, specials), _lit(END + START + "assistant", specials)
    return ["start: message",
            f"message: {_lit(CHANNEL, specials)} NAME ({body} TEXT ({next_message} message)? | calls)",
            "NAME: /[a-z]+/", "TEXT: /(.|\\n)*/"] + _calls(fmt, functions, False, skip, specials)


def tool_constraint(fmt: ToolFormat, spec: ToolSpec, tokenizer: Tokenizer,
                    specials: Mapping[str, int], answer: Optional[str] = None) -> Constraint:
    """The constraint, compiled for `tokenizer` now (prepare runs in a worker thread, so the
    engine finds it cached); a schema llguidance cannot take is a 400 naming its tool.
    `specials`: `formats.special_markers(fmt, tokenizer)`; `answer`: as tool_grammar's."""
    for i, f in enumerate(spec.functions):
        if f in spec.callable:
            try:
                Constraint.json_schema(f.parameters)  # alone first, so that an error names its tool
            except FastDecodeError as e:
                raise APIError(400, f"tools[{i}].function.parameters: {e}",
                               param=f"tools[{i}].function.parameters") from None
    try:
        constraint = Constraint.grammar(tool_grammar(fmt, spec, specials, answer))
        CACHE.matcher(constraint, vocab_for(tokenizer))
        return constraint
    except FastDecodeError as e:
        raise APIError(400, f"the tools' grammar does not compile: {e}", param="tools") from None
