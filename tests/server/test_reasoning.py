"""A thinking template's reply read as reasoning_content and content: the splitter against a plain
reference over every way a reply can arrive in pieces, and the server on a tiny model whose
vocabulary holds <think> and </think> (as plain and as special tokens), streamed and whole."""

import itertools
import json
import sys
from pathlib import Path

import pytest
from test_tools_models import post

import fastdecode
from fastdecode.cli.keys import load_settings
from fastdecode.server.app import create_app
from fastdecode.server.reasoning import ReasoningSplitter, inside_thinking, thinks
from fastdecode.server.settings import ServeSettings
from fastdecode.server.state import ServerState


def reference(text, thinking):
    """The split, written plainly for the whole reply."""
    if not thinking:
        if not text.lstrip().startswith("<think>"):
            return "", text
        text = text.lstrip()[len("<think>"):]
    if "</think>" in text:
        reasoning, content = text.split("</think>", 1)
        return reasoning.strip(), content.lstrip()
    return text.strip(), ""


REPLIES = ["<think>\nLet me see.\n</think>\n\nParis.", "  <think>a b</think>c", "Plain answer.", "  <thi",
           "<think>\ncut off mid-thought \n", "</think>\n\nanswer after a thought the prompt opened",
           "<think></think>", "a </think> b", "<think>x</thin", "<think> x </think> \n"]


@pytest.mark.parametrize("thinking", [False, True])
@pytest.mark.parametrize("reply", REPLIES)
def test_every_split_into_pieces_adds_up_to_the_reference(reply, thinking):
    want = reference(reply, thinking)
    whole = ReasoningSplitter(thinking)
    assert whole.feed(reply, finished=True) == want
    for cuts in itertools.chain(itertools.combinations(range(1, len(reply)), 1),
                                itertools.combinations(range(1, len(reply)), 2)):
        s = ReasoningSplitter(thinking)
        bounds = [0, *cuts, len(reply)]
        pieces = [reply[a:b] for a, b in zip(bounds, bounds[1:])]
        sent = [s.feed(p, finished=k == len(pieces) - 1) for k, p in enumerate(pieces)]
        assert ("".join(r for r, _ in sent), "".join(c for _, c in sent)) == want, pieces


def test_which_templates_and_prompts_think():
    assert thinks("{{ '<think>' }}...{{ '</think>' }}") and not thinks("plain") and not thinks(None)
    assert inside_thinking("<|im_start|>assistant\n<think>\n")
    assert not inside_thinking("assistant\n<think>\n\n</think>\n\n") and not inside_thinking("assistant\n")


# -- through the server ------------------------------------------------------------------------

# A Qwen-3-like template (it mentions the tags; the reply opens its own <think>) and a DeepSeek-R1-like
# one (the prompt ends inside <think>).
QWEN_STYLE = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}"
              "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
              "{% if enable_thinking is defined and not enable_thinking %}{{ '<think>\\n\\n</think>\\n\\n' }}"
              "{% endif %}{% endif %}")
R1_STYLE = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}"
            "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n<think>\\n' }}{% endif %}"
            "{# the model ends its thinking with </think> #}")
TAGS = ["<think>", "</think>"]


@pytest.fixture(scope="module", params=["plain", "special"])
def thinking_llm(request, tmp_path_factory):
    """The tiny model with <think> and </think> in its vocabulary, as plain or as control tokens."""
    sys.path.insert(0, str(Path(__file__).parents[1] / "checkpoints"))
    from tiny_checkpoints import SPECIALS, byte_level_tokens, gguf_tensors, hf_model, write_gguf

    tokens = byte_level_tokens() + TAGS
    control = (*SPECIALS, *TAGS) if request.param == "special" else tuple(SPECIALS)
    path = write_gguf(tmp_path_factory.mktemp("think") / "t.gguf", gguf_tensors(hf_model(vocab_size=len(tokens))),
                      tokens=tokens, control=control, template=QWEN_STYLE, context=512)
    llm = fastdecode.load(str(path), max_batch_size=2, max_seq_len=512)
    yield llm
    llm.engine.close()


def app_for(llm, template=None, *keys):
    state = ServerState(load_settings(ServeSettings, ["model=tiny", *keys]))
    state.llm = llm
    if template is not None:
        llm.tokenizer.chat_template = template
    return create_app(state)


def whole_and_streamed(app, body):
    """The whole reply's message, checked against the streamed deltas' sums."""
    whole = post(app, body)
    assert whole.status_code == 200, whole.text
    streamed = post(app, {**body, "stream": True})
    fields = {"content": None, "reasoning_content": None}
    for line in streamed.text.split("\n"):
        if line.startswith("data: {"):
            delta = json.loads(line[6:])["choices"][0]["delta"]
            for key in fields:
                if key in delta:
                    fields[key] = (fields[key] or "") + delta[key]
    message = whole.json()["choices"][0]["message"]
    assert (fields["content"] or "") == (message["content"] or "")
    assert fields["reasoning_content"] == message.get("reasoning_content")
    return message


ASK = [{"role": "user", "content": "hello"}]


def raw_reply(llm, app_none, body):
    """The same request's whole reply with the split off and special tokens kept: what the model wrote."""
    return post(app_none, {**body, "skip_special_tokens": False}).json()["choices"][0]["message"]["content"]


def tag_ids(llm):
    """The ids of <think> and </think>: the vocabulary's last two tokens."""
    n = llm.tokenizer.vocab_size
    assert [llm.tokenizer.decode([i], skip_special_tokens=False) for i in (n - 2, n - 1)] == TAGS
    return n - 2, n - 1


def seeded_reply(llm, template, bias, thinking):
    """A seeded sampled request whose raw reply (biased towards the tags) thinks and then answers,
    and that reply: the first of ten seeds that does (a random model's text has no say in it)."""
    app = app_for(llm, template, "reasoning=none")
    for seed in range(10):
        body = {"messages": ASK, "max_tokens": 40, "temperature": 1.0, "seed": seed, "logit_bias": bias}
        raw = raw_reply(llm, app, body)
        reasoning, content = reference(raw, thinking)
        if (thinking or raw.startswith("<think>")) and "</think>" in raw and content.strip():
            return body, raw
    pytest.fail("no seed gave a reply that thinks and then answers")


def test_a_thought_opened_and_closed_by_the_model(thinking_llm):
    """<think> and </think> made likely by biases: the server's fields are the reference's split
    of the model's own text."""
    open_id, close_id = tag_ids(thinking_llm)
    body, raw = seeded_reply(thinking_llm, QWEN_STYLE, {str(open_id): 6, str(close_id): 4}, False)
    message = whole_and_streamed(app_for(thinking_llm, QWEN_STYLE), body)
    assert (message["reasoning_content"], message["content"]) == reference(raw, False)


def test_a_prompt_that_opens_the_thought(thinking_llm):
    """DeepSeek-R1's templates end the prompt inside <think>: the reply is thinking until </think>."""
    body, raw = seeded_reply(thinking_llm, R1_STYLE, {str(tag_ids(thinking_llm)[1]): 3}, True)
    message = whole_and_streamed(app_for(thinking_llm, R1_STYLE), body)
    assert (message["reasoning_content"], message["content"]) == reference(raw, True)
    # cut off before </think>: all of it is thinking
    body = {"messages": ASK, "max_tokens": 6, "temperature": 1.0, "seed": 0}
    raw = raw_reply(thinking_llm, app_for(thinking_llm, R1_STYLE, "reasoning=none"), body)
    assert "</think>" not in raw and raw.strip()
    message = whole_and_streamed(app_for(thinking_llm, R1_STYLE), body)
    assert message["content"] == "" and message["reasoning_content"] == raw.strip()


def test_thinking_turned_off_by_the_template_or_the_server(thinking_llm):
    body = {"messages": ASK, "max_tokens": 12, "temperature": 0, "chat_template_kwargs": {"enable_thinking": False}}
    message = whole_and_streamed(app_for(thinking_llm, QWEN_STYLE), body)
    assert "reasoning_content" not in message and message["content"]
    message = whole_and_streamed(app_for(thinking_llm, R1_STYLE, "reasoning=none"), {**body, "max_tokens": 6})
    assert "reasoning_content" not in message and message["content"]
    # a constrained reply is its format, never thinking
    schema = {"type": "object", "properties": {"a": {"type": "boolean"}}, "required": ["a"], "additionalProperties": False}
    body = {"messages": ASK, "max_tokens": 40, "temperature": 0,
            "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}}
    message = whole_and_streamed(app_for(thinking_llm, R1_STYLE), body)
    assert "reasoning_content" not in message and json.loads(message["content"])["a"] is not None


def test_calls_from_the_first_token_are_never_thinking(thinking_llm):
    """tool_choice required writes the calls from the reply's first token: with a prompt that
    opened <think>, they are still read as calls, not as thinking."""
    tools = [{"type": "function", "function": {"name": "pick", "parameters": {
        "type": "object", "properties": {"n": {"enum": [1, 2]}}, "required": ["n"], "additionalProperties": False}}}]
    body = {"messages": ASK, "tools": tools, "tool_choice": "required", "max_tokens": 100, "temperature": 0}
    message = whole_and_streamed(app_for(thinking_llm, R1_STYLE), body)
    (call,) = message["tool_calls"]
    assert call["function"]["name"] == "pick" and json.loads(call["function"]["arguments"])["n"] in (1, 2)
    assert "reasoning_content" not in message


def test_a_bad_reasoning_setting_is_one_line():
    from fastdecode.errors import FastDecodeError

    with pytest.raises(FastDecodeError, match="reasoning='maybe' is not valid; accepted: auto, none"):
        load_settings(ServeSettings, ["model=tiny", "reasoning=maybe"])
