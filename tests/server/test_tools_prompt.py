"""Tools and earlier calls in the prompt (no model): templates with tool support render them
as transformers renders the same conversation, and write calls in exactly the text of the
format we parse; templates without get our system message and the calls as text."""

import json

import pytest

from fastdecode.text.chat_template import render_chat_template
from fastdecode.server.protocol import ChatCompletionRequest
from fastdecode.server.tools.formats import (GENERIC, GENERIC_EXAMPLE, GRANITE, HERMES, LLAMA3_JSON, MISTRAL, MISTRAL_ARGS,
                                             detect)
from fastdecode.server.tools.parse import short_id
from fastdecode.server.tools.prompt import template_input
from fastdecode.server.tools.spec import tool_spec
from fastdecode.text.tokenizer import BYTE_CHAT_TEMPLATE, Tokenizer

transformers_chat = pytest.importorskip("transformers.utils.chat_template_utils")

# Templates of our own in the two families' styles (the checkpoints' own are not shipped here).
HERMES_STYLE = """
{%- if tools %}<|im_start|>system
{% if messages[0].role == 'system' %}{{ messages[0].content }}

{% endif %}# Tools
<tools>
{% for tool in tools %}{{ tool | tojson }}
{% endfor %}</tools>
Call as:
<tool_call>
{"name": <function-name>, "arguments": <args-json-object>}
</tool_call><|im_end|>
{% elif messages[0].role == 'system' %}<|im_start|>system
{{ messages[0].content }}<|im_end|>
{% endif %}
{%- for m in messages %}
{%- if m.role == 'user' %}<|im_start|>user
{{ m.content }}<|im_end|>
{% elif m.role == 'assistant' %}<|im_start|>assistant
{{ m.content or '' }}
{%- for c in m.tool_calls or [] %}{% if m.content or not loop.first %}{{ '\\n' }}{% endif %}<tool_call>
{"name": "{{ c.function.name }}", "arguments": {{ c.function.arguments | tojson }}}
</tool_call>{% endfor %}<|im_end|>
{% elif m.role == 'tool' %}<|im_start|>user
<tool_response>
{{ m.content }}
</tool_response><|im_end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""

LLAMA3_STYLE = """{{- bos_token }}
{%- if tools %}<|start_header_id|>system<|end_header_id|>

Environment: ipython
To call a function, answer with {"name": function name, "parameters": its arguments}:
{% for t in tools %}{{ t | tojson(indent=2) }}
{% endfor %}<|eot_id|>
{%- endif %}
{%- for m in messages %}
{%- if m.role == 'assistant' and m.tool_calls %}
{%- if m.tool_calls | length != 1 %}{{ raise_exception('This model only supports one call per turn') }}{% endif %}
<|start_header_id|>assistant<|end_header_id|>

{"name": "{{ m.tool_calls[0].function.name }}", "parameters": {{ m.tool_calls[0].function.arguments | tojson }}}<|eot_id|>
{%- elif m.role == 'tool' %}<|start_header_id|>ipython<|end_header_id|>

{{ m.content }}<|eot_id|>
{%- else %}<|start_header_id|>{{ m.role }}<|end_header_id|>

{{ m.content }}<|eot_id|>
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>

{% endif %}"""

# Mistral's shape (our own text): tools offered before the last user turn, the calls of a turn
# as one JSON list after [TOOL_CALLS], results in [TOOL_RESULTS] naming their call, and the
# ids checked as Mistral's templates check them.
MISTRAL_STYLE = """{{- bos_token }}
{%- for m in messages %}
{%- if m.role == 'user' %}
{%- if tools and loop.last %}[AVAILABLE_TOOLS]{{ tools | tojson }}[/AVAILABLE_TOOLS]{% endif %}
{{- '[INST]' + m.content + '[/INST]' }}
{%- elif m.role == 'assistant' and m.tool_calls %}[TOOL_CALLS][
{%- for c in m.tool_calls %}
{%- if c.id | length != 9 %}{{ raise_exception('call ids must be 9 letters and digits') }}{% endif %}
{{- '{"name": "' + c.function.name + '", "arguments": ' + c.function.arguments | tojson + ', "id": "' + c.id + '"}' }}
{%- if not loop.last %}, {% endif %}
{%- endfor %}]{{ eos_token }}
{%- elif m.role == 'assistant' %}{{ m.content + eos_token }}
{%- elif m.role == 'tool' %}
{%- if m.tool_call_id | length != 9 %}{{ raise_exception('call ids must be 9 letters and digits') }}{% endif %}
{{- '[TOOL_RESULTS]{"content": ' + m.content | tojson + ', "call_id": "' + m.tool_call_id + '"}[/TOOL_RESULTS]' }}
{%- elif m.role == 'system' %}{{ '[SYSTEM_PROMPT]' + m.content + '[/SYSTEM_PROMPT]' }}
{%- endif %}
{%- endfor %}"""

# Granite 3.x's shape: the tools in an available_tools turn, calls as <|tool_call|> and a JSON list.
GRANITE_STYLE = """
{%- if tools %}{{ '<|start_of_role|>available_tools<|end_of_role|>' + tools | tojson + '<|end_of_text|>\n' }}{% endif %}
{%- for m in messages %}
{%- if m.role == 'assistant' and m.tool_calls %}
{{- '<|start_of_role|>assistant<|end_of_role|><|tool_call|>' + m.tool_calls | map(attribute='function') | list | tojson }}
{{- '<|end_of_text|>\n' }}
{%- elif m.role == 'tool' %}{{ '<|start_of_role|>tool_response<|end_of_role|>' + m.content + '<|end_of_text|>\n' }}
{%- else %}{{ '<|start_of_role|>' + m.role + '<|end_of_role|>' + m.content + '<|end_of_text|>\n' }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{ '<|start_of_role|>assistant<|end_of_role|>' }}{% endif %}"""

# The later shape: each call as [TOOL_CALLS]name[ARGS]{arguments}.
MISTRAL_ARGS_STYLE = MISTRAL_STYLE.replace(
    """[TOOL_CALLS][
{%- for c in m.tool_calls %}""", """
{%- for c in m.tool_calls %}""").replace(
    """{{- '{"name": "' + c.function.name + '", "arguments": ' + c.function.arguments | tojson + ', "id": "' + c.id + '"}' }}
{%- if not loop.last %}, {% endif %}
{%- endfor %}]{{ eos_token }}""", """{{- '[TOOL_CALLS]' + c.function.name + '[ARGS]' + c.function.arguments | tojson }}
{%- endfor %}{{ eos_token }}""")

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather now, by city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
ARGS = {"city": "Paris", "when": ["now", 1]}


def conversation(calls=1):
    return [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": f"call_{i}", "type": "function", "function": {"name": "get_weather", "arguments": json.dumps(ARGS)}}
            for i in range(calls)]},
        *({"role": "tool", "tool_call_id": f"call_{i}", "content": f"{20 + i} C, sunny"} for i in range(calls)),
    ]


class Stub(Tokenizer):
    def __init__(self, template):
        self.chat_template = template
        self.special_tokens_map = {"bos_token": "<s>", "eos_token": "</s>"}


def ours(template, messages, tools=TOOLS, tool_choice=None):
    req = ChatCompletionRequest.model_validate({"messages": messages, "tools": tools, "tool_choice": tool_choice})
    fmt = detect(template)
    plain, offered = template_input(req.messages, fmt, tool_spec(req.tools, req.tool_choice, None))
    return render_chat_template(Stub(template), plain, tools=offered)


def reference(template, messages, tools):
    hf = json.loads(json.dumps(messages))
    for m in hf:  # transformers' callers pass a call's arguments as an object
        for c in m.get("tool_calls") or []:
            c["function"]["arguments"] = json.loads(c["function"]["arguments"])
    rendered, _ = transformers_chat.render_jinja_template(
        conversations=[hf], chat_template=template, tools=tools, add_generation_prompt=True,
        bos_token="<s>", eos_token="</s>")
    return rendered[0]


@pytest.mark.parametrize("template, fmt", [(HERMES_STYLE, HERMES), (LLAMA3_STYLE, LLAMA3_JSON),
                                           (GRANITE_STYLE, GRANITE)], ids=["hermes", "llama3_json", "granite"])
def test_templates_with_tools_render_as_transformers_does(template, fmt):
    assert detect(template) is fmt
    prompt = ours(template, conversation())
    assert prompt == reference(template, conversation(), TOOLS)
    assert '"name": "get_weather"' in prompt and "Weather now, by city" in prompt  # the tools are offered
    # The template writes an earlier call in exactly the text our grammar makes the model write.
    assert fmt.render([("get_weather", json.dumps(ARGS))]) in prompt
    assert "20 C, sunny" in prompt
    none = ours(template, conversation(), tool_choice="none")
    assert none == reference(template, conversation(), None) and "Weather now, by city" not in none


def test_hermes_parallel_calls_and_results():
    prompt = ours(HERMES_STYLE, conversation(calls=2))
    assert prompt == reference(HERMES_STYLE, conversation(calls=2), TOOLS)
    assert HERMES.render([("get_weather", json.dumps(ARGS))] * 2) in prompt
    assert "20 C, sunny" in prompt and "21 C, sunny" in prompt


@pytest.mark.parametrize("template, fmt", [(MISTRAL_STYLE, MISTRAL), (MISTRAL_ARGS_STYLE, MISTRAL_ARGS)],
                         ids=["mistral", "mistral_args"])
def test_mistral_templates_get_9_character_ids(template, fmt):
    """Mistral's templates refuse other call ids: a client's ids become 9 letters and digits,
    the same for a call and its result, and the prompt is then what transformers renders."""
    assert detect(template) is fmt
    prompt = ours(template, conversation(calls=2))
    short = [short_id(f"call_{i}") for i in range(2)]
    assert all(len(i) == 9 and i.isalnum() for i in short) and short[0] != short[1]
    theirs = conversation(calls=2)
    for c in theirs[2]["tool_calls"]:
        c["id"] = short_id(c["id"])
    for m in theirs[3:]:
        m["tool_call_id"] = short_id(m["tool_call_id"])
    assert prompt == reference(template, theirs, TOOLS)
    assert '"call_id": "%s"' % short[1] in prompt and "[AVAILABLE_TOOLS]" not in prompt  # no user turn last
    ask = [{"role": "user", "content": "Weather in Paris?"}]
    assert ours(template, ask).startswith("<s>[AVAILABLE_TOOLS]")
    calls = fmt.render([("get_weather", json.dumps(ARGS))])
    assert calls.startswith("[TOOL_CALLS]")  # the text our grammar makes the model write
    assert short_id("abcDEF123") == "abcDEF123"  # already an id these templates take


def test_a_template_that_refuses_two_calls_says_so():
    from fastdecode.errors import FastDecodeError

    with pytest.raises(FastDecodeError, match="one call per turn"):
        ours(LLAMA3_STYLE, conversation(calls=2))


def test_generic_templates_get_the_tools_and_calls_as_text():
    assert detect(BYTE_CHAT_TEMPLATE) is GENERIC
    prompt = ours(BYTE_CHAT_TEMPLATE, conversation(calls=2))
    assert prompt.startswith("<|system|>Be brief.\n\n")  # the offer follows the client's system message
    assert json.dumps(TOOLS[0]["function"], separators=(",", ":")) in prompt  # name, description, parameters
    assert GENERIC_EXAMPLE in prompt  # the shape to reply with
    calls = GENERIC.render([("get_weather", json.dumps(ARGS))] * 2)
    # Both results in one user message (templates that insist on alternating roles accept it).
    assert prompt.endswith("\n<|user|>Weather in Paris?\n<|assistant|>" + calls + "\n"
                           "<|user|>Result of get_weather (call_0): 20 C, sunny\n"
                           "Result of get_weather (call_1): 21 C, sunny\n<|assistant|>")


def test_generic_without_tools_adds_nothing():
    messages = [{"role": "user", "content": "Hi"}]
    assert ours(BYTE_CHAT_TEMPLATE, messages, tools=None) == "<|user|>Hi\n<|assistant|>"
    assert ours(BYTE_CHAT_TEMPLATE, messages, tool_choice="none") == "<|user|>Hi\n<|assistant|>"


# Gemma's way: the system message goes first, then roles must alternate or the template raises.
ALTERNATING = """{%- if messages[0].role == 'system' %}<system>{{ messages[0].content }}
{% endif -%}
{%- for m in messages if m.role != 'system' -%}
{%- if (m.role == 'user') != (loop.index0 % 2 == 0) -%}{{ raise_exception('Conversation roles must alternate') }}{%- endif -%}
<{{ m.role }}>{{ m.content }}
{% endfor -%}<assistant>"""


def test_a_question_after_tool_results_keeps_roles_alternating():
    assert detect(ALTERNATING) is GENERIC
    turn = [m for m in conversation(calls=2) if m["role"] != "system"] + [{"role": "user", "content": "And Rome?"}]
    prompt = ours(ALTERNATING, turn)
    assert prompt.endswith("<user>Result of get_weather (call_0): 20 C, sunny\n"
                           "Result of get_weather (call_1): 21 C, sunny\n\nAnd Rome?\n<assistant>")
    assert prompt.startswith("<system>You can call these functions")
