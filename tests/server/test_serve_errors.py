"""Malformed requests, sent raw with httpx: each gets OpenAI's error shape with a 4xx
(never 422 or 500), and the server keeps serving."""

import json

import httpx
import openai
import pytest
from serve_process import error_of, serve

CHAT_PATH, COMPLETIONS_PATH = "/v1/chat/completions", "/v1/completions"
USER = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    s = serve(tmp_path_factory, "max_batch_size=2", "max_body_bytes=4096", "max_tokens_limit=300")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.url, timeout=30) as c:
        yield c


def post(http, path, body, **kw):
    return http.post(path, content=body if isinstance(body, (bytes, str)) else json.dumps(body), **kw)


BAD_CHAT = {
    "messages null": {"messages": None},
    "messages a string": {"messages": "x"},
    "messages [123]": {"messages": [123]},
    "messages [{}]": {"messages": [{}]},
    "messages empty": {"messages": []},
    "messages missing": {"max_tokens": 3},
    "bad role": {"messages": [{"role": "wizard", "content": "x"}]},
    "user message without content": {"messages": [{"role": "user"}]},
    "system message without content": {"messages": [{"role": "system"}, {"role": "user", "content": "x"}]},
    "user content null": {"messages": [{"role": "user", "content": None}]},
    "system content null": {"messages": [{"role": "system", "content": None}, {"role": "user", "content": "x"}]},
    "tool content null": {"messages": USER + [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": None}]},
    "legacy functions": {"messages": USER, "functions": [{"name": "f", "parameters": {"type": "object"}}]},
    "legacy function_call": {"messages": USER, "function_call": "auto"},
    "legacy function_call in the history": {"messages": USER + [
        {"role": "assistant", "content": None, "function_call": {"name": "f", "arguments": "{}"}}]},
    "image part": {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
    "max_tokens negative": {"messages": USER, "max_tokens": -1},
    "max_tokens zero": {"messages": USER, "max_tokens": 0},
    "max_tokens absurd": {"messages": USER, "max_tokens": 10 ** 12},
    "max_tokens over the limit": {"messages": USER, "max_tokens": 301},
    "max_tokens a string": {"messages": USER, "max_tokens": "5"},
    "temperature < 0": {"messages": USER, "temperature": -0.5},
    "top_p > 1": {"messages": USER, "top_p": 1.5},
    "n = 0": {"messages": USER, "n": 0},
    "stop a number": {"messages": USER, "stop": 5},
    "stop a list of numbers": {"messages": USER, "stop": [1, 2]},
    "stop empty string": {"messages": USER, "stop": [""]},
    "seed beyond int64": {"messages": USER, "seed": 2 ** 63},
    "seed far beyond int64": {"messages": USER, "seed": -(2 ** 70)},
    "stream_options without stream": {"messages": USER, "stream_options": {"include_usage": True}},
    "top_logprobs > 20": {"messages": USER, "logprobs": True, "top_logprobs": 21},
    "logit_bias id outside the vocabulary": {"messages": USER, "logit_bias": {"999": 1}},
    "logit_bias key not an id": {"messages": USER, "logit_bias": {"a": 1}},
    "logit_bias out of range": {"messages": USER, "logit_bias": {"5": 101}},
    "presence_penalty out of range": {"messages": USER, "presence_penalty": 3},
}

BAD_COMPLETIONS = {
    "empty prompt": {"prompt": ""},
    "empty prompt list": {"prompt": []},
    "empty id list": {"prompt": [[1, 2], []]},
    "negative id": {"prompt": [5, -1]},
    "id outside the vocabulary": {"prompt": [5, 260]},
    "mixed prompt list": {"prompt": [[1], "a"]},
    "suffix": {"prompt": "a", "suffix": "b"},
    "best_of": {"prompt": "a", "best_of": 3},
    "prompt null": {"prompt": None},
    "logprobs > 20": {"prompt": "a", "logprobs": 21},
    "echo streamed": {"prompt": "a", "echo": True, "stream": True},
    "max_tokens 0 without echo": {"prompt": "a", "max_tokens": 0},
    "prompt_logprobs > 20": {"prompt": "a", "prompt_logprobs": 21},
}


@pytest.mark.parametrize("name", BAD_CHAT)
def test_bad_chat_requests_get_400(http, name):
    r = post(http, CHAT_PATH, BAD_CHAT[name])
    assert r.status_code == 400, r.text
    error_of(r)


@pytest.mark.parametrize("name", BAD_COMPLETIONS)
def test_bad_completion_requests_get_400(http, name):
    r = post(http, COMPLETIONS_PATH, BAD_COMPLETIONS[name])
    assert r.status_code == 400, r.text
    error_of(r)


def test_a_lone_prompt_and_a_stop_string_are_named_as_the_api_names_them(http):
    # as generate() says it ("prompt 0" read as one of several); the bad stop item, not a tuple
    for prompt in ("", [[]]):
        err = error_of(post(http, COMPLETIONS_PATH, {"prompt": prompt, "max_tokens": 2}))
        assert err["message"] == "the prompt is empty" and err["param"] == "prompt", err
    err = error_of(post(http, COMPLETIONS_PATH, {"prompt": "a", "max_tokens": 2, "stop": ["x", ""]}))
    assert err["message"] == "stop must be non-empty strings, got ''" and err["param"] == "stop", err


def test_the_deprecated_function_fields_name_what_replaced_them(http):
    err = error_of(post(http, CHAT_PATH, BAD_CHAT["legacy functions"]))
    assert err["param"] == "functions" and "tools" in err["message"], err
    err = error_of(post(http, CHAT_PATH, BAD_CHAT["legacy function_call"]))
    assert err["param"] == "function_call" and "tool_choice" in err["message"], err
    err = error_of(post(http, CHAT_PATH, BAD_CHAT["legacy function_call in the history"]))
    assert err["param"] == "messages[1].function_call" and "tool_calls" in err["message"], err
    # an assistant turn's null content stays accepted (a turn of tool calls only)
    body = {"messages": USER + [{"role": "assistant", "content": None}, {"role": "user", "content": "x"}],
            "max_tokens": 2}
    assert post(http, CHAT_PATH, body).status_code == 200


def test_errors_name_the_field(http):
    assert error_of(post(http, CHAT_PATH, BAD_CHAT["bad role"]))["param"] == "messages[0].role"
    assert error_of(post(http, CHAT_PATH, BAD_CHAT["temperature < 0"]))["param"] == "temperature"
    assert error_of(post(http, CHAT_PATH, BAD_CHAT["logit_bias id outside the vocabulary"]))["param"] == "logit_bias"
    assert error_of(post(http, COMPLETIONS_PATH, BAD_COMPLETIONS["negative id"]))["param"] == "prompt"


@pytest.mark.parametrize("body, headers", [
    (b"{not json", {"content-type": "application/json"}),
    (b"a=1&b=2", {"content-type": "application/x-www-form-urlencoded"}),
    (b"", {"content-type": "application/json"}),
    (b"[1, 2]", {"content-type": "application/json"}),
    (b"null", {}),
    ("{\"messages\": [{\"role\": \"user\", \"content\": \"\\ud800\"}]}".encode(), {}),
])
def test_unparseable_bodies_get_400(http, body, headers):
    r = http.post(CHAT_PATH, content=body, headers=headers)
    assert r.status_code == 400, r.text
    error_of(r)


def test_context_overflow_streamed_and_not(http):
    for stream in (False, True):
        r = post(http, COMPLETIONS_PATH, {"prompt": "x" * 600, "max_tokens": 4, "stream": stream})
        assert r.status_code == 400 and "text/event-stream" not in r.headers["content-type"]
        err = error_of(r)
        assert err["code"] == "context_length_exceeded" and "601" in err["message"] and "512" in err["message"]
        r = post(http, CHAT_PATH, {"messages": USER, "max_tokens": 20, "stream": stream,
                                   "messages_pad": "unused"})
        assert r.status_code == 200, r.text  # fits: unknown fields are ignored
        r = post(http, COMPLETIONS_PATH, {"prompt": "x" * 300, "max_tokens": 250, "stream": stream})
        err = error_of(r)
        assert r.status_code == 400 and "301 tokens" in err["message"] and "211" in err["message"]


def test_unknown_model_route_and_method(http):
    r = post(http, CHAT_PATH, {"model": "gpt-4", "messages": USER})
    assert r.status_code == 404 and error_of(r)["code"] == "model_not_found"
    r = post(http, CHAT_PATH, {"model": "/etc/passwd", "messages": USER})
    assert r.status_code == 404 and "root:" not in r.text  # a request field never names a file to read
    assert http.get("/v1/models/gpt-4").status_code == 404
    r = http.get("/v1/nothing")
    assert r.status_code == 404 and error_of(r)["code"] == "not_found"
    r = http.get(CHAT_PATH)
    assert r.status_code == 405 and error_of(r)["code"] == "method_not_allowed"


def test_body_over_the_limit_gets_413(http):
    r = post(http, CHAT_PATH, {"messages": [{"role": "user", "content": "x" * 5000}]})
    assert r.status_code == 413 and error_of(r)["code"] == "body_too_large"

    def chunks():  # no Content-Length: the limit is enforced while reading
        for _ in range(10):
            yield b" " * 1000
    r = http.post(CHAT_PATH, content=chunks(), headers={"content-type": "application/json"})
    assert r.status_code == 413


def test_the_server_keeps_serving(server, http):
    for name in ("messages [{}]", "bad role", "max_tokens absurd"):
        post(http, CHAT_PATH, BAD_CHAT[name])
    client = server.openai()
    out = client.chat.completions.create(model="tiny", messages=USER, max_tokens=3)
    assert out.choices[0].finish_reason in ("stop", "length")
    assert http.get("/health").status_code == 200
    assert "Traceback" not in server.log()
    with pytest.raises(openai.BadRequestError) as e:  # the openai client reads the same shape
        client.chat.completions.create(model="tiny", messages=USER, temperature=-1)
    assert e.value.param == "temperature"


def test_a_client_gone_before_its_body_is_no_server_error(server, http):
    """A client that closes the connection mid-body: logged as 499, no 500, no traceback."""
    import socket
    import time

    before = server.log().count("status=499")
    with socket.create_connection(("127.0.0.1", server.port)) as s:
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 100\r\n\r\n{\"messa")
    deadline = time.monotonic() + 10
    while server.log().count("status=499") == before and time.monotonic() < deadline:
        time.sleep(0.05)
    log = server.log()
    assert log.count("status=499") == before + 1, log[-2000:]
    assert "Traceback" not in log and "status=500" not in log
    assert 'status="500"' not in http.get("/metrics").text
    assert http.get("/health").status_code == 200


def test_a_content_part_that_is_not_text_is_named(http):
    parts = [{"type": "text", "text": "look"}, {"type": "image_url", "image_url": {"url": "x"}}]
    err = error_of(post(http, CHAT_PATH, {"messages": [{"role": "user", "content": parts}]}))
    assert err["param"] == "messages[0].content", err
    assert "part 1" in err["message"] and "'image_url'" in err["message"], err


def test_an_assistant_refusal_part_reads_as_its_text(http):
    # An assistant turn's refusal part (OpenAI's, sent back with the history) reads as its text.
    history = [{"role": "user", "content": "x"},
               {"role": "assistant", "content": [{"type": "refusal", "refusal": "I cannot help with that."}]},
               {"role": "user", "content": "y"}]
    r = post(http, CHAT_PATH, {"messages": history, "max_tokens": 2})
    assert r.status_code == 200, r.text
    r = post(http, "/tokenize", {"messages": history})
    prompt = http.post("/detokenize", json={"tokens": r.json()["tokens"]}).json()["prompt"]
    assert "I cannot help with that." in prompt
    refused_user = [{"role": "user", "content": [{"type": "refusal", "refusal": "no"}]}]
    assert "'refusal'" in error_of(post(http, CHAT_PATH, {"messages": refused_user}))["message"]


def test_max_completion_tokens_errors_name_that_field(http):
    # The client sent max_completion_tokens (OpenAI's current name): its errors must not speak of max_tokens.
    over = error_of(post(http, CHAT_PATH, {"messages": USER, "max_completion_tokens": 301}))
    assert over["param"] == "max_completion_tokens" and "max_completion_tokens=301" in over["message"], over
    long = [{"role": "user", "content": "x" * 400}]
    err = error_of(post(http, CHAT_PATH, {"messages": long, "max_completion_tokens": 200}))
    assert err["code"] == "context_length_exceeded", err
    assert "max_completion_tokens=200" in err["message"] and "max_tokens" not in err["message"].replace(
        "max_completion_tokens", ""), err
