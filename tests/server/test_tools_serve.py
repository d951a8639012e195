"""Tool calling through `fastdecode serve` (tiny model, generic format) and the official
openai client: required, named, parallel, auto and none, streamed == whole, a follow-up
turn with the results, and bad tool requests answered 400 while the server keeps serving.
The grammar decides the calls' shape, so the random model's weights only pick among
what the schemas allow; every call is checked with jsonschema."""

import json

import httpx
import jsonschema
import openai
import pytest
from serve_process import EOS, error_of, serve

from fastdecode.server.prepare import prepare_chat
from fastdecode.server.protocol import ChatCompletionRequest
from fastdecode.server.tools.formats import GENERIC

# A bounded schema (a random model cannot run on inside it until max_tokens), and one tool:
# the tiny model's context is 512 byte tokens, and the tools are listed in the prompt.
PICK = {"type": "object", "properties": {"c": {"enum": ["a", "b"]}, "n": {"type": "integer", "minimum": 0, "maximum": 9}},
        "required": ["c", "n"], "additionalProperties": False}
SCHEMAS = {"pick": PICK}
TOOLS = [{"type": "function", "function": {"name": "pick", "parameters": PICK}}]
ASK = [{"role": "user", "content": "Weather in Paris?"}]
ROOM = 105  # tokens left after the prompt with TOOLS; one call is 67
COMMA, CLOSE = str(ord(",")), str(ord("]"))  # the byte tokenizer's ids


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    s = serve(tmp_path_factory, "max_batch_size=4")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def client(server):
    return server.openai(timeout=120)


def valid_calls(message, names=tuple(SCHEMAS)):
    assert message.tool_calls, message
    for c in message.tool_calls:
        assert c.type == "function" and c.id.startswith("call_") and c.function.name in names
        jsonschema.validate(json.loads(c.function.arguments), SCHEMAS[c.function.name])
    assert len({c.id for c in message.tool_calls}) == len(message.tool_calls)
    return message.tool_calls


def test_required_calls_a_listed_function(client):
    for seed in range(3):
        # One call (parallel_tool_calls below): more could run past the tiny context.
        r = client.chat.completions.create(model="tiny", messages=ASK, tools=TOOLS, tool_choice="required",
                                           parallel_tool_calls=False, temperature=1, seed=seed, max_tokens=ROOM)
        choice = r.choices[0]
        valid_calls(choice.message)
        assert choice.finish_reason == "tool_calls" and choice.message.content is None


def test_a_named_function_is_called(client):
    # Two functions do not fit the tiny context: choosing among them is the grammar's test
    # (test_tools_grammar.py) and the default model's (test_tools_models.py).
    for seed in range(3):
        r = client.chat.completions.create(model="tiny", messages=ASK, tools=TOOLS, seed=seed, max_tokens=ROOM,
                                           tool_choice={"type": "function", "function": {"name": "pick"}},
                                           parallel_tool_calls=False)
        assert r.choices[0].finish_reason == "tool_calls"
        assert {c.function.name for c in valid_calls(r.choices[0].message)} == {"pick"}


def test_parallel_tool_calls(client):
    # The bias asks for another call after each one (a comma) rather than the end (a bracket).
    more = {COMMA: 100, CLOSE: -100}
    one = client.chat.completions.create(model="tiny", messages=ASK, tools=TOOLS, tool_choice="required",
                                         parallel_tool_calls=False, logit_bias=more, temperature=0, max_tokens=ROOM)
    assert len(valid_calls(one.choices[0].message)) == 1 and one.choices[0].finish_reason == "tool_calls"
    many = client.chat.completions.create(model="tiny", messages=ASK, tools=TOOLS, tool_choice="required",
                                          logit_bias=more, temperature=0, max_tokens=ROOM)
    calls = many.choices[0].message.tool_calls
    assert len(calls) >= 2 and many.choices[0].finish_reason == "length"  # calls until max_tokens
    for c in calls[:-1]:  # the last one was cut by max_tokens
        jsonschema.validate(json.loads(c.function.arguments), SCHEMAS[c.function.name])


def test_none_offers_no_tools_and_calls_nothing(client, tiny_llm):
    plain = client.chat.completions.create(model="tiny", messages=ASK, temperature=0, max_tokens=16)
    none = client.chat.completions.create(model="tiny", messages=ASK, tools=TOOLS, tool_choice="none",
                                          temperature=0, max_tokens=16)
    assert none.choices[0].message.tool_calls is None
    assert none.choices[0].message.content == plain.choices[0].message.content
    assert none.usage.prompt_tokens == plain.usage.prompt_tokens == len(tiny_llm.chat_prompt(ASK))


def test_auto_offers_the_tools(client, tiny_llm):
    r = client.chat.completions.create(model="tiny", messages=ASK, tools=TOOLS, temperature=0, max_tokens=24)
    message = r.choices[0].message
    # The random model writes text; it never writes the format's trigger, so nothing is a call.
    assert message.tool_calls is None and isinstance(message.content, str)
    assert r.choices[0].finish_reason in ("stop", "length")
    assert r.usage.prompt_tokens > len(tiny_llm.chat_prompt(ASK))  # our system message lists the tools


def test_tools_with_a_json_response_format(server, client):
    """OpenAI's Agents SDK sends both for an agent with an output type: the reply is calls or that JSON."""
    import pydantic
    from typing import Literal

    class Answer(pydantic.BaseModel):
        model_config = pydantic.ConfigDict(extra="forbid")
        c: Literal["x", "y"]

    parse = getattr(client.chat.completions, "parse", None) or client.beta.chat.completions.parse
    strict = [{"type": "function", "function": {**TOOLS[0]["function"], "strict": True}}]  # parse() wants them
    # Both ways open with '{"'; the next byte picks: "c" (the answer's key) or "t" ("tool_calls").
    for pick, seed in ((ord("c"), 0), (ord("t"), 0), (ord("c"), 1), (ord("t"), 1)):
        r = parse(model="tiny", messages=ASK, tools=strict, response_format=Answer, parallel_tool_calls=False,
                  logit_bias={str(pick): 50}, temperature=1, seed=seed,
                  max_tokens=ROOM - 16)  # "strict" lengthens the listed tool
        choice = r.choices[0]
        if pick == ord("t"):
            valid_calls(choice.message)
            assert choice.finish_reason == "tool_calls" and choice.message.content is None
        else:
            assert choice.finish_reason == "stop" and choice.message.tool_calls is None
            assert choice.message.parsed.c in ("x", "y")
    # A forced call is the whole reply: the answer's format has nothing to hold.
    r = client.chat.completions.create(model="tiny", messages=ASK, tools=TOOLS, tool_choice="required",
                                       parallel_tool_calls=False, seed=0, max_tokens=ROOM,
                                       response_format={"type": "json_object"})
    valid_calls(r.choices[0].message)
    # Other constraints cannot stand in for free text beside calls.
    r = httpx.post(server.url + "/v1/chat/completions", timeout=60,
                   json={"messages": ASK, "tools": TOOLS, "guided_regex": "[a-z]+", "max_tokens": 4})
    assert r.status_code == 400 and error_of(r)["param"] == "tool_choice" and "cannot be combined" in r.text


def collect(stream):
    """Content, calls [(id, name, arguments)] and the finish reason from a stream's chunks."""
    content, calls, finish = None, {}, None
    for chunk in stream:
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        delta = choice.delta
        if delta.content is not None:  # "" too: an empty reply streams as ""
            content = (content or "") + delta.content
        for t in delta.tool_calls or []:
            if t.index not in calls:
                assert t.id and t.type == "function" and t.function.name, t  # the call's first delta
                calls[t.index] = [t.id, t.function.name, ""]
            else:
                assert t.id is None and t.function.name is None, t  # id and name come once
            calls[t.index][2] += t.function.arguments or ""
        finish = choice.finish_reason or finish
    return content, [tuple(calls[i]) for i in sorted(calls)], finish


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "pick"}}, "auto"])
def test_streamed_equals_whole(client, choice):
    kw = dict(model="tiny", messages=ASK, tools=TOOLS, tool_choice=choice, temperature=0, max_tokens=ROOM)
    whole = client.chat.completions.create(**kw).choices[0]
    content, calls, finish = collect(client.chat.completions.create(**kw, stream=True))
    assert content == whole.message.content and finish == whole.finish_reason
    assert [(n, a) for _, n, a in calls] == [(c.function.name, c.function.arguments)
                                             for c in whole.message.tool_calls or []]  # byte for byte


def test_an_empty_reply_streams_as_it_answers_whole(client):
    """A reply that may call tools but ends at once (EOS first) has content "" whole; its stream
    assembles to "" too, not to None (no content delta at all)."""
    kw = dict(model="tiny", messages=ASK, tools=TOOLS, logit_bias={str(EOS): 100}, temperature=0, max_tokens=5)
    whole = client.chat.completions.create(**kw).choices[0]
    content, calls, finish = collect(client.chat.completions.create(**kw, stream=True))
    assert whole.message.content == "" and whole.message.tool_calls is None and whole.finish_reason == "stop"
    assert (content, calls, finish) == ("", [], "stop")


def test_a_follow_up_turn_with_the_results(client, tiny_llm):
    first = client.chat.completions.create(model="tiny", messages=ASK, tools=TOOLS, tool_choice="required",
                                           parallel_tool_calls=False, temperature=0, max_tokens=ROOM)
    message = first.choices[0].message
    calls = valid_calls(message)
    turn = ASK + [message] + [{"role": "tool", "tool_call_id": c.id, "content": "22 C and sunny"} for c in calls]
    second = client.chat.completions.create(model="tiny", messages=turn, tools=TOOLS, tool_choice="none",
                                            temperature=0, max_tokens=8)
    assert isinstance(second.choices[0].message.content, str) and second.choices[0].message.tool_calls is None
    # The next turn's prompt holds the calls, as the model wrote them, and their results.
    sent = [m if isinstance(m, dict) else m.model_dump(exclude_none=True) for m in turn]
    req = ChatCompletionRequest.model_validate({"messages": sent, "tools": TOOLS, "tool_choice": "none"})
    prompt = tiny_llm.tokenizer.decode(prepare_chat(req, tiny_llm, None).prompts[0])
    assert GENERIC.render([(c.function.name, c.function.arguments) for c in calls]) in prompt
    assert f"Result of {calls[0].function.name} ({calls[0].id}): 22 C and sunny" in prompt
    assert second.usage.prompt_tokens == len(tiny_llm.tokenizer.encode(prompt, add_special_tokens=False))


BAD = [
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice", "not in tools"),
    ({"tools": [{"type": "retrieval"}]}, "tools[0].type", "function"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": "abc"}}]},
     "tools[0].function.parameters", "JSON Schema object"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "frobnicate"}}}]},
     "tools[0].function.parameters", "not a valid JSON Schema"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"a": {"type": "array", "uniqueItems": True}}}}}]},
     "tools[0].function.parameters", "uniqueItems"),  # a keyword the grammar compiler does not implement
    ({"tool_choice": "required"}, "tool_choice", "no tools"),
    ({"tool_choice": {"type": "function", "function": {"name": "pick"}}}, "tool_choice", "no tools"),
    ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice", "accepted"),
    ({"tools": TOOLS * 2}, "tools[1].function.name", "twice"),
    ({"tools": [{"type": "function", "function": {"name": "has space"}}]}, "tools[0].function.name", "letters"),
    ({"tools": []}, "tools", "empty"),
    ({"messages": [{"role": "tool", "content": "5"}]}, "messages[0]", "tool_call_id"),
]


@pytest.mark.parametrize("fields, param, words", BAD, ids=[b[1] + ":" + b[2] for b in BAD])
def test_bad_tool_requests_are_400s(server, client, fields, param, words):
    r = httpx.post(server.url + "/v1/chat/completions", json={"messages": ASK, "max_tokens": 4, **fields}, timeout=60)
    assert r.status_code == 400, r.text
    err = error_of(r)
    assert err["type"] == "invalid_request_error" and err["param"] == param and words in err["message"], err
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="tiny", **{"messages": ASK, "max_tokens": 4, **fields})
    ok = client.chat.completions.create(model="tiny", messages=ASK, max_tokens=2)  # still serving
    assert ok.choices[0].finish_reason in ("stop", "length")


def test_tokenize_renders_tools_and_calls_as_chat_does(server, client):
    turn = ASK + [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "pick", "arguments": '{"c": "a", "n": 1}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "ok"}]
    for messages, tools in ((ASK, TOOLS), (turn, None)):  # both at once do not fit the tiny context
        r = httpx.post(server.url + "/tokenize", json={"messages": messages, "tools": tools}, timeout=60)
        chat = client.chat.completions.create(model="tiny", messages=messages, tools=tools, max_tokens=1)
        assert r.status_code == 200 and r.json()["count"] == chat.usage.prompt_tokens
