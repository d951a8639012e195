"""Render a checkpoint's Jinja chat template the way transformers' `apply_chat_template` does.

Templates come from downloaded files, so they run in jinja2's immutable
sandbox: no attribute access to Python internals and no mutation of the
messages passed in. The environment options and helpers (`raise_exception`,
`strftime_now`, a `tojson` that does not HTML-escape) match transformers, so a
template renders to the same text in both.
"""

from __future__ import annotations

import functools
import json
from datetime import datetime
from typing import TYPE_CHECKING, Any, Optional

import jinja2
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

from ..errors import FastDecodeError

if TYPE_CHECKING:
    from .tokenizer import Tokenizer


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(value: Any, ensure_ascii: bool = False, indent: Optional[int] = None,
            separators: Optional[tuple[str, str]] = None, sort_keys: bool = False) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


class _Generation(Extension):
    """`{% generation %}...{% endgeneration %}`: marks the assistant's text for training masks in
    transformers, which renders the body as it is; so do we (SmolLM3's and other templates use it)."""

    tags = {"generation"}

    def parse(self, parser: Any) -> Any:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller: Any) -> str:
        return caller()


# A message's reasoning under the names clients send it; transformers fills both template names
# (`reasoning_content`, and `thinking` that gpt-oss's template reads) from the first one present.
_REASONING = ("reasoning_content", "thinking", "reasoning")


def _with_reasoning_names(messages: list) -> list:
    out = []
    for m in messages:
        text = next((m[k] for k in _REASONING if m.get(k) is not None), None)
        out.append(m if text is None else {"thinking": text, **m, "reasoning_content": text})
    return out


@functools.lru_cache(maxsize=16)
def compile_template(source: str) -> jinja2.Template:
    """Compile once per template text; a syntax error is reported as bad input."""
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols, _Generation])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    try:
        return env.from_string(source)
    except jinja2.TemplateSyntaxError as e:
        raise FastDecodeError(f"chat template has a syntax error on line {e.lineno}: {e.message}") from None


def _check_messages(messages: Any) -> None:
    if not isinstance(messages, (list, tuple)) or not messages:
        raise FastDecodeError("messages must be a non-empty list of {'role': ..., 'content': ...} dicts")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or "content" not in m:
            raise FastDecodeError(
                f"messages[{i}] must be a dict with a str 'role' and a 'content', got {m!r:.80}")


def special_token_strings(tokenizer: "Tokenizer") -> dict[str, str]:
    """bos_token, eos_token, ... as templates expect them; empty names are left out."""
    mapping = getattr(tokenizer, "special_tokens_map", None)
    if mapping is None:  # tokenizers without named specials: spell the ids out
        mapping = {}
        if tokenizer.bos_id is not None:
            mapping["bos_token"] = tokenizer.decode([tokenizer.bos_id], skip_special_tokens=False)
        if tokenizer.eos_ids:
            mapping["eos_token"] = tokenizer.decode([min(tokenizer.eos_ids)], skip_special_tokens=False)
    return {k: v for k, v in mapping.items() if v is not None}


# Stands in for an empty final message when a chat continues it (where its text would go):
# private-use characters that no template writes.
_CONTINUED = "\ue000fastdecode:continued\ue001"


def render_chat_template(tokenizer: "Tokenizer", messages: list[dict], *, add_generation_prompt: bool = True,
                         continue_final_message: bool = False, template: Optional[str] = None,
                         variables: Optional[dict[str, Any]] = None, **extra: Any) -> str:
    """The prompt text for `messages`, ending with the assistant header when `add_generation_prompt`,
    or, with `continue_final_message`, cut right after the final message's text (no end of turn),
    so that the reply continues it (a partly written assistant answer): as transformers cuts it,
    after the text's last appearance, with its trailing whitespace where the template kept it.

    `template` overrides the tokenizer's; `variables` (a caller's, e.g. enable_thinking) and
    then `extra` (e.g. `tools=[...]`) reach the template as variables, as in transformers.
    """
    source = template if template is not None else tokenizer.chat_template
    if source is None:
        raise FastDecodeError("this model has no chat template; use plain prompts instead")
    _check_messages(messages)
    if continue_final_message and add_generation_prompt:
        raise FastDecodeError("continue_final_message continues the final message, so it needs "
                              "add_generation_prompt false: give one of them")
    taken = sorted({"messages", "add_generation_prompt"} & set(variables or {}))
    if taken:
        raise FastDecodeError(f"template variables may not set {', '.join(taken)}: they are arguments of their own")
    variables = {"tools": None, "documents": None, **special_token_strings(tokenizer), **(variables or {}), **extra}
    template = compile_template(source)  # its syntax errors are one line of their own
    final = messages[-1].get("content")
    if continue_final_message:
        if not isinstance(final, str):
            raise FastDecodeError("continue_final_message needs the final message's content as text, "
                                  f"got {type(final).__name__}")
        if not final.strip():  # nothing to find: the stand-in marks where the reply starts
            messages = [*messages[:-1], {**messages[-1], "content": _CONTINUED}]
    try:
        text = template.render(messages=_with_reasoning_names(messages), add_generation_prompt=add_generation_prompt,
                               **variables)
    except jinja2.TemplateError as e:
        raise FastDecodeError(f"chat template failed: {e.message or type(e).__name__}") from None
    except (TypeError, ValueError, KeyError, IndexError, AttributeError, ArithmeticError, RecursionError) as e:
        # The template's own expressions on these messages (a model's template is data, not our code):
        # also a division by zero, the sandbox's refusal of a huge range (OverflowError), a macro that
        # calls itself.
        detail = " ".join(str(e).split())
        raise FastDecodeError(f"chat template failed on these messages: {type(e).__name__}: {detail}") from None
    if not continue_final_message:
        return text
    key = final.strip() or _CONTINUED
    at = text.rfind(key)
    if at < 0:
        raise FastDecodeError(f"the chat template does not write the final {messages[-1]['role']} message's text "
                              "as given, so continue_final_message cannot continue it")
    if key is _CONTINUED:
        return text[:at]
    kept = final.lstrip()
    return text[:at + (len(kept) if text.startswith(kept, at) else len(key))]
