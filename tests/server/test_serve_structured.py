"""Structured outputs through the server: OpenAI's response_format (with the official
client's create and parse), vLLM's structured_outputs / guided_*, llama.cpp's json_schema
and grammar, and each bad input answered with a 400 in OpenAI's shape. Tiny model: the
output is constrained, so its random weights do not matter; the languages are finite,
so every answer ends with finish_reason "stop"."""

import json
import re
from typing import Literal

import httpx
import jsonschema
import pydantic
import pytest
from serve_process import error_of, serve

USER = [{"role": "user", "content": "Describe a person as JSON"}]
PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 8},
                   "age": {"type": "integer", "minimum": 0, "maximum": 120},
                   "kind": {"enum": ["a", "b"]}},
    "required": ["name", "age", "kind"],
    "additionalProperties": False,
}


class Person(pydantic.BaseModel):
    name: str = pydantic.Field(max_length=8)
    age: int = pydantic.Field(ge=0, le=120)
    kind: Literal["a", "b"]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    s = serve(tmp_path_factory, "max_batch_size=4")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def client(server):
    return server.openai()


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.url, timeout=60) as c:
        yield c


def response_format(schema=PERSON, strict=True):
    return {"type": "json_schema", "json_schema": {"name": "person", "schema": schema, "strict": strict}}


def test_response_format_json_schema_streamed_equals_whole(client):
    whole = client.chat.completions.create(model="tiny", messages=USER, max_tokens=100, temperature=0,
                                           response_format=response_format())
    choice = whole.choices[0]
    assert choice.finish_reason == "stop"
    jsonschema.validate(json.loads(choice.message.content), PERSON)
    chunks = list(client.chat.completions.create(model="tiny", messages=USER, max_tokens=100, temperature=0,
                                                 response_format=response_format(), stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == choice.message.content
    assert [c.choices[0].finish_reason for c in chunks if c.choices[0].finish_reason] == ["stop"]
    # Sampled, several choices: each valid.
    many = client.chat.completions.create(model="tiny", messages=USER, max_tokens=100, temperature=1.0, seed=3,
                                          n=3, response_format=response_format(strict=False))
    for c in many.choices:
        jsonschema.validate(json.loads(c.message.content), PERSON)


def test_parse_with_a_pydantic_model(client):
    parse = getattr(client.chat.completions, "parse", None) or client.beta.chat.completions.parse
    done = parse(model="tiny", messages=USER, max_tokens=100, temperature=0, response_format=Person)
    person = done.choices[0].message.parsed
    assert isinstance(person, Person) and 0 <= person.age <= 120 and person.kind in ("a", "b")


def test_json_object(client):
    done = client.chat.completions.create(model="tiny", messages=USER, max_tokens=30, temperature=0,
                                          response_format={"type": "json_object"})
    text = done.choices[0].message.content
    assert text.startswith("{")
    if done.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(text), dict)
    text_format = client.chat.completions.create(model="tiny", messages=USER, max_tokens=5, temperature=0,
                                                 response_format={"type": "text"})
    plain = client.chat.completions.create(model="tiny", messages=USER, max_tokens=5, temperature=0)
    assert text_format.choices[0].message.content == plain.choices[0].message.content


@pytest.mark.parametrize("body, check", [
    ({"structured_outputs": {"regex": "[a-z]{3}-[0-9]{2}"}}, lambda t: re.fullmatch("[a-z]{3}-[0-9]{2}", t)),
    ({"structured_outputs": {"choice": ["red", "green", "blue"]}}, lambda t: t in ("red", "green", "blue")),
    ({"structured_outputs": {"json": PERSON}}, lambda t: jsonschema.validate(json.loads(t), PERSON) is None),
    ({"structured_outputs": {"grammar": 'start: "ok " NUM\nNUM: /[0-9]{2}/'}},
     lambda t: re.fullmatch("ok [0-9]{2}", t)),
    ({"guided_choice": ["yes", "no"]}, lambda t: t in ("yes", "no")),
    ({"guided_regex": "[0-9]{4}"}, lambda t: re.fullmatch("[0-9]{4}", t)),
    ({"json_schema": PERSON}, lambda t: jsonschema.validate(json.loads(t), PERSON) is None),  # llama.cpp
    ({"grammar": 'root ::= "x" [0-9] [0-9]'}, lambda t: re.fullmatch("x[0-9]{2}", t)),  # llama.cpp GBNF
    ({"response_format": {"type": "json_object", "schema": PERSON}},  # llama.cpp's form
     lambda t: jsonschema.validate(json.loads(t), PERSON) is None),
])
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_every_way_of_asking(http, path, body, check):
    base = {"messages": USER} if "chat" in path else {"prompt": "Describe a person:"}
    r = http.post(path, json={**base, "max_tokens": 100, "temperature": 0.8, "seed": 1, **body})
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    text = choice["message"]["content"] if "chat" in path else choice["text"]
    assert check(text), text
    assert choice["finish_reason"] == "stop"


BAD = {
    "invalid schema": ({"response_format": response_format({"type": "strin"})},
                       "response_format.json_schema.schema", "strin"),
    "invalid against its metaschema": ({"response_format": response_format({"type": "number", "multipleOf": -1})},
                                       "response_format.json_schema.schema", "not a valid JSON Schema"),
    "unsupported keyword (strict)": ({"response_format": response_format({"type": "array", "uniqueItems": True})},
                                     "response_format.json_schema.schema", "uniqueItems"),
    "unsupported keyword (not strict)": (
        {"response_format": response_format({"type": "object", "not": {"required": ["a"]}}, strict=False)},
        "response_format.json_schema.schema", "not"),
    "schema not an object": ({"response_format": response_format([1])}, "response_format.json_schema.schema",
                             "list"),
    "no json_schema object": ({"response_format": {"type": "json_schema"}}, "response_format.json_schema",
                              "object"),
    "unknown response_format type": ({"response_format": {"type": "xml"}}, "response_format.type", "'xml'"),
    "response_format not an object": ({"response_format": "json"}, "response_format", "type"),
    "bad regex": ({"structured_outputs": {"regex": "a(b"}}, "structured_outputs.regex", "unclosed"),
    "regex not a string": ({"guided_regex": 5}, "guided_regex", "string"),
    "grammar syntax error": ({"grammar": 'root ::= "a" [0-9+'}, "grammar", "GBNF"),
    "lark syntax error": ({"structured_outputs": {"grammar": "start: x )"}}, "structured_outputs.grammar",
                          "grammar"),
    "unknown special token": ({"structured_outputs": {"grammar": "start: <no_such_token>"}},
                              "structured_outputs.grammar", "no_such_token"),
    "empty choice": ({"structured_outputs": {"choice": []}}, "structured_outputs.choice", "empty"),
    "choice not strings": ({"guided_choice": ["a", 2]}, "guided_choice", "strings"),
    "choice with a null": ({"guided_choice": ["a", None]}, "guided_choice", "strings"),
    "two kinds in structured_outputs": ({"structured_outputs": {"regex": "a", "choice": ["a"]}},
                                        "structured_outputs", "exactly one"),
    "structural_tag": ({"structured_outputs": {"structural_tag": {"x": 1}}}, "structured_outputs.structural_tag",
                       "not supported"),
    "two fields at once": ({"json_schema": PERSON, "grammar": 'root ::= "a"'}, "grammar", "only one"),
    "schema past the size limit": ({"json_schema": {"enum": ["x" * 1000] * 300}}, "json_schema", "at most"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_structured_inputs_are_400s_and_the_server_keeps_serving(http, case):
    body, param, word = BAD[case]
    r = http.post("/v1/chat/completions", json={"messages": USER, "max_tokens": 5, **body})
    assert r.status_code == 400, r.text
    err = error_of(r)
    assert err["type"] == "invalid_request_error" and err["param"] == param, err
    assert word in err["message"], err
    ok = http.post("/v1/chat/completions", json={"messages": USER, "max_tokens": 10,
                                                 "structured_outputs": {"choice": ["fine"]}})
    assert ok.status_code == 200 and ok.json()["choices"][0]["message"]["content"] == "fine"


def test_a_constraint_failing_mid_reply_is_the_request_s_400(http):
    # llguidance builds a regex's lexer lazily: a{1000000} compiles, then its first token runs
    # past the lexer's limits. The request asked for it: a 400 naming the constraint, never a 500.
    body = {"messages": USER, "max_tokens": 5, "guided_regex": "a{1000000}"}
    r = http.post("/v1/chat/completions", json=body)
    assert r.status_code == 400, r.text
    err = error_of(r)
    assert err["type"] == "invalid_request_error" and err["code"] == "constraint_failed", err
    assert "constraint" in err["message"] and "too many expressions" in err["message"], err
    streamed = http.post("/v1/chat/completions", json={**body, "stream": True})
    events = [line for line in streamed.text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "data: [DONE]"
    assert json.loads(events[-2][len("data: "):])["error"]["code"] == "constraint_failed"
    ok = http.post("/v1/chat/completions", json={"messages": USER, "max_tokens": 10,
                                                 "structured_outputs": {"choice": ["fine"]}})
    assert ok.status_code == 200 and ok.json()["choices"][0]["message"]["content"] == "fine"
