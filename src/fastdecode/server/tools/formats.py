"""How a model writes a tool call, per family, and which family a chat template belongs to.

A call is always `{"name": "<function>", "<arguments key>": <JSON value>}`; the
families differ in the text around the calls and between them:

- hermes (Qwen 2.5/3, Hermes 2/3, and any template that writes `<tool_call>`):
  `<tool_call>\n{"name": "f", "arguments": {...}}\n</tool_call>`, one block per call,
  blocks separated by a newline;
- llama3_json (Llama 3.1/3.2/3.3 templates, recognised by their `<|python_tag|>` or
  `ipython` role): the reply is `{"name": "f", "parameters": {...}}`, calls joined by `; `;
- mistral (Mistral 7B v0.3, NeMo, Ministral, Small 2409-2501: templates that write
  `[TOOL_CALLS]`): `[TOOL_CALLS][{"name": "f", "arguments": {...}}, ...]` (v0.3's
  template puts a space before the list); call ids are 9 letters and digits, as those
  templates demand;
- mistral_args (Mistral Small 3.x, Magistral, Devstral: templates that write `[ARGS]`):
  `[TOOL_CALLS]f[ARGS]{...}`, once per call;
- granite (Granite 3.x: templates that write `<|tool_call|>`):
  `<|tool_call|>[{"name": "f", "arguments": {...}}, ...]`;
- harmony (gpt-oss: templates that write harmony's channels): one call a reply, a commentary
  message to the function, `<|channel|>commentary to=functions.f <|constrain|>json<|message|>{...}`,
  which `<|call|>` ends (an end of the reply, so not in its text);
- generic (every other template, SmolLM2's included): the template knows nothing of
  tools, so our own system message lists them and asks for
  `{"tool_calls": [{"name": "f", "arguments": {...}}, ...]}`.

The family is read from the template text, never from a file or model name. Where a
format's markers are special tokens of the vocabulary (Mistral's always), the grammar names
them as tokens and the reply's text keeps them (see `special_markers`).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

from ...text.harmony import CALL_HEADER, CHANNEL, END, MESSAGE, START, is_harmony

if TYPE_CHECKING:
    from ...text.tokenizer import Tokenizer


@dataclass(frozen=True)
class ToolFormat:
    """The literal text of a block of calls: begin, call, (separator, call)*, end.

    A call is `call_open + name + args_key + <arguments JSON> + call_close`.
    `trigger` is the text that switches a lazy grammar on (tool_choice=auto): a
    prefix of `begin + call_open`; `anywhere` says whether it may follow free
    text or only open the reply.
    """

    name: str
    begin: str
    call_open: str
    args_key: str
    call_close: str
    separator: str
    end: str
    trigger: str
    anywhere: bool
    native: bool  # the template renders `tools`, tool_calls and tool results itself
    markers: tuple[str, ...] = ()  # texts in the format that a vocabulary may hold as special tokens
    short_ids: bool = False  # call ids of 9 letters and digits (Mistral's templates refuse others)
    one_call: bool = False  # a reply holds one call at most (separator unused)
    # The reply is harmony's messages (text/harmony.py): under tool_choice=auto a call is a message
    # whose header names a function, after any others (grammar.py holds the messages, not free text).
    channels: bool = False

    def __post_init__(self) -> None:
        if not (self.begin + self.call_open).startswith(self.trigger):
            raise ValueError(f"{self.name}: the trigger must open the block of calls")

    def render(self, calls: list[tuple[str, str]]) -> str:
        """The text of (name, arguments JSON text) calls, as the model writes them."""
        body = self.separator.join(f"{self.call_open}{name}{self.args_key}{args}{self.call_close}"
                                   for name, args in calls)
        return self.begin + body + self.end


HERMES = ToolFormat(
    "hermes", begin="<tool_call>\n", call_open='{"name": "', args_key='", "arguments": ', call_close="}",
    separator="\n</tool_call>\n<tool_call>\n", end="\n</tool_call>", trigger="<tool_call>", anywhere=True,
    native=True, markers=("<tool_call>", "</tool_call>"))  # special tokens in some vocabularies
LLAMA3_JSON = ToolFormat(
    "llama3_json", begin="", call_open='{"name": "', args_key='", "parameters": ', call_close="}",
    separator="; ", end="", trigger='{"name": "', anywhere=False, native=True)
GENERIC = ToolFormat(
    "generic", begin='{"tool_calls": [', call_open='{"name": "', args_key='", "arguments": ', call_close="}",
    separator=", ", end="]}", trigger='{"tool_calls": [', anywhere=True, native=False)

MISTRAL = ToolFormat(
    "mistral", begin="[TOOL_CALLS][", call_open='{"name": "', args_key='", "arguments": ', call_close="}",
    separator=", ", end="]", trigger="[TOOL_CALLS]", anywhere=True, native=True, markers=("[TOOL_CALLS]",),
    short_ids=True)
MISTRAL_SPACED = dataclasses.replace(MISTRAL, name="mistral_spaced", begin="[TOOL_CALLS] [")
MISTRAL_ARGS = ToolFormat(
    "mistral_args", begin="[TOOL_CALLS]", call_open="", args_key="[ARGS]", call_close="",
    separator="[TOOL_CALLS]", end="", trigger="[TOOL_CALLS]", anywhere=True, native=True,
    markers=("[TOOL_CALLS]", "[ARGS]"), short_ids=True)

GRANITE = dataclasses.replace(MISTRAL, name="granite", begin="<|tool_call|>[", trigger="<|tool_call|>",
                              markers=("<|tool_call|>",), short_ids=False)
_TO, _ARGS = CALL_HEADER.split("{}")  # the header HarmonySplitter hands on, around the recipient
HARMONY = ToolFormat(
    "harmony", begin=_TO + "functions.", call_open="", args_key=_ARGS, call_close="", separator="", end="",
    trigger=_TO, anywhere=True, native=True, markers=(CHANNEL, "<|constrain|>", MESSAGE, START, END),
    one_call=True, channels=True)

FORMATS = {f.name: f for f in (HERMES, LLAMA3_JSON, MISTRAL, MISTRAL_SPACED, MISTRAL_ARGS, GRANITE, HARMONY,
                               GENERIC)}


def detect(template: Optional[str]) -> ToolFormat:
    """The call format a chat template was written for, from what its text mentions."""
    text = template or ""
    if is_harmony(text):
        return HARMONY
    if "<tool_call>" in text:
        return HERMES
    if "<|python_tag|>" in text or "ipython" in text:
        return LLAMA3_JSON
    if "[TOOL_CALLS]" in text:
        if "[ARGS]" in text:
            return MISTRAL_ARGS
        return MISTRAL_SPACED if "[TOOL_CALLS] [" in text else MISTRAL
    if "<|tool_call|>" in text:
        return GRANITE
    return GENERIC


def special_markers(fmt: ToolFormat, tokenizer: "Tokenizer") -> dict[str, int]:
    """The format's markers that are special tokens of `tokenizer` (text -> id)."""
    return special_tokens(fmt.markers, tokenizer)


def special_tokens(markers: tuple[str, ...], tokenizer: "Tokenizer") -> dict[str, int]:
    """Those of `markers` that are special tokens of `tokenizer` (text -> id): one id that
    decodes to nothing when special tokens are skipped."""
    found = {}
    for marker in markers:
        ids = tokenizer.encode(marker, add_special_tokens=False)
        if len(ids) == 1 and tokenizer.decode(ids) == "" and tokenizer.decode(ids, skip_special_tokens=False) == marker:
            found[marker] = ids[0]
    return found


def generic_system_prompt(tools: list[dict]) -> str:
    """The system message that offers `tools` to a model whose template has no tool support.
    Short, with the tools as compact JSON: small models have small contexts."""
    listed = "\n".join(json.dumps(t["function"], ensure_ascii=False, separators=(",", ":")) for t in tools)
    return ('You can call these functions ("parameters": the JSON Schema of the arguments):\n'
            f"{listed}\n"
            f"To call functions, reply with only: {GENERIC_EXAMPLE}")


GENERIC_EXAMPLE = GENERIC.render([("NAME", "{ARGUMENTS}")])
