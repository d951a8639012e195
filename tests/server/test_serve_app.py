"""The app in-process (httpx's ASGI transport): loading and draining answers, an engine
failure after a stream has started, CORS, and the settings."""

import asyncio
import json

import httpx
import pytest
from serve_process import error_of

import fastdecode
from fastdecode.cli import main as cli
from fastdecode.errors import FastDecodeError
from fastdecode.server.app import create_app
from fastdecode.server.settings import ServeSettings
from fastdecode.server.state import ServerState
from fastdecode.cli.keys import load_settings

USER = [{"role": "user", "content": "hi"}]


def settings(*keys):
    return load_settings(ServeSettings, ["model=tiny", *keys])


def app_serving(llm):
    """The app with `llm` already loaded."""
    state = ServerState(settings())
    state.llm = llm
    return create_app(state)


def call(app, method, path, **kw):
    async def go():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as c:
            return await c.request(method, path, **kw)
    return asyncio.run(go())


def test_loading_and_draining_answer_503():
    state = ServerState(settings())
    app = create_app(state)
    r = call(app, "GET", "/health")
    assert r.status_code == 503 and r.json() == {"status": "loading"}
    assert call(app, "HEAD", "/health").status_code == 503  # probes that send HEAD get the status too
    for method, path, body in (("GET", "/v1/models", None), ("POST", "/v1/chat/completions", {"messages": USER})):
        r = call(app, method, path, json=body)
        assert r.status_code == 503 and error_of(r)["code"] == "loading"
    state.draining = True
    assert call(app, "GET", "/health").json() == {"status": "shutting down"}
    r = call(app, "POST", "/v1/completions", json={"prompt": "a"})
    assert r.status_code == 503 and error_of(r)["code"] == "shutting_down"


@pytest.fixture
def failing_llm():
    llm = fastdecode.load("tiny", max_batch_size=2)

    def boom(*args, **kwargs):
        raise RuntimeError("boom")

    llm.engine.runner.prefill = llm.engine.runner.decode = boom  # the model fails; the engine fails its requests
    yield llm
    llm.engine.close()


def test_an_engine_failure_after_the_stream_started_is_an_error_event(failing_llm):
    app = app_serving(failing_llm)
    r = call(app, "POST", "/v1/chat/completions", json={"messages": USER, "max_tokens": 8, "stream": True})
    assert r.status_code == 200
    events = r.text.strip().split("\n\n")
    assert events[-1] == "data: [DONE]"
    kind, data = events[-2].split("\n")
    assert kind == "event: error"
    err = json.loads(data.removeprefix("data: "))["error"]
    assert err["type"] == "server_error" and "boom" in err["message"]
    assert json.loads(events[0].removeprefix("data: "))["choices"][0]["delta"]["role"] == "assistant"
    r = call(app, "POST", "/v1/chat/completions", json={"messages": USER, "max_tokens": 8})
    assert r.status_code == 500 and "boom" in error_of(r)["message"]


def test_cors_is_off_unless_configured():
    preflight = {"Origin": "http://example.com", "Access-Control-Request-Method": "POST"}
    off = create_app(ServerState(settings()))
    assert "access-control-allow-origin" not in call(off, "OPTIONS", "/v1/models", headers=preflight).headers
    on = create_app(ServerState(settings("cors_origins=http://example.com")))
    r = call(on, "OPTIONS", "/v1/models", headers=preflight)
    assert r.headers["access-control-allow-origin"] == "http://example.com"


def test_settings(monkeypatch, capsys):
    monkeypatch.delenv("FASTDECODE_API_KEY", raising=False)
    s = settings()
    assert (s.host, s.port, s.api_key, s.served_model_name, s.cors_origins) == ("127.0.0.1", 8000, None, "tiny", ())
    monkeypatch.setenv("FASTDECODE_API_KEY", "from-env")
    assert settings().api_key == "from-env" and settings("api_key=given").api_key == "given"
    for bad in ("port=70000", "max_body_bytes=10", "log_level=loud", "api_key= ", "max_tokens_limit=0"):
        with pytest.raises(FastDecodeError):
            settings(bad)
    assert cli.main(["serve", "--help"]) == 0
    out = capsys.readouterr().out
    assert "usage: fastdecode serve" in out and "max_tokens_limit" in out and "shutdown_grace_s" in out


# A Qwen 3 style switch (our own text): the template leaves the thinking block empty when asked to.
THINKING_TEMPLATE = ("{% for m in messages %}<|{{ m.role }}|>{{ m.content }}\n{% endfor %}<|assistant|>"
                     "{% if enable_thinking is defined and not enable_thinking %}<think></think>{% endif %}")


@pytest.fixture
def thinking_llm():
    llm = fastdecode.load("tiny", max_batch_size=2)
    llm.tokenizer.chat_template = THINKING_TEMPLATE
    yield llm
    llm.engine.close()


def test_chat_template_kwargs_reach_the_template(thinking_llm):
    app = app_serving(thinking_llm)

    def tokens(**extra):
        body = {"messages": USER, "max_tokens": 1, **extra}
        chat = call(app, "POST", "/v1/chat/completions", json=body)
        counted = call(app, "POST", "/tokenize", json={"messages": USER, **extra})
        assert chat.status_code == 200 and counted.status_code == 200, (chat.text, counted.text)
        assert chat.json()["usage"]["prompt_tokens"] == counted.json()["count"]
        return counted.json()["tokens"]

    plain = tokens()
    off = tokens(chat_template_kwargs={"enable_thinking": False})
    assert thinking_llm.tokenizer.decode(off[len(plain):]) == "<think></think>"
    assert tokens(chat_template_kwargs={"enable_thinking": True}) == plain
    assert tokens(chat_template_kwargs={"template": "x", "tokenizer": 1}) == plain  # any other name is a variable
    # OpenAI's reasoning_effort is the template's variable of that name (gpt-oss's), as if given there
    effort = tokens(reasoning_effort="low")
    assert effort == tokens(chat_template_kwargs={"reasoning_effort": "low"}, reasoning_effort="low")
    thinking_llm.tokenizer.chat_template = THINKING_TEMPLATE + "{{ reasoning_effort | default('') }}"
    assert thinking_llm.tokenizer.decode(tokens(reasoning_effort="high")[len(plain):]) == "high"
    thinking_llm.tokenizer.chat_template = THINKING_TEMPLATE
    assert effort == plain  # a template that does not read it
    for bad in ({"reasoning_effort": "extreme"},
                {"reasoning_effort": "low", "chat_template_kwargs": {"reasoning_effort": "high"}}):
        r = call(app, "POST", "/v1/chat/completions", json={"messages": USER, **bad})
        assert r.status_code == 400 and "reasoning_effort" in error_of(r)["message"], r.text
    r = call(app, "POST", "/v1/chat/completions", json={"messages": USER, "chat_template_kwargs": {"tools": []}})
    assert r.status_code == 400 and "chat_template_kwargs may not set 'tools'" in error_of(r)["message"]
    r = call(app, "POST", "/v1/chat/completions", json={"messages": USER, "chat_template_kwargs": ["x"]})
    assert r.status_code == 400 and "chat_template_kwargs" in error_of(r)["message"]


def test_a_chat_can_continue_its_final_message():
    """vLLM's add_generation_prompt and continue_final_message, on /v1/chat/completions and /tokenize
    alike: the prompt ends after the final message's text, and the reply continues it."""
    llm = fastdecode.load("tiny", max_batch_size=2)
    app = app_serving(llm)
    partial = USER + [{"role": "assistant", "content": "Once upon"}]

    def prompt(messages, **flags):
        chat = call(app, "POST", "/v1/chat/completions", json={"messages": messages, "max_tokens": 2, **flags})
        counted = call(app, "POST", "/tokenize", json={"messages": messages, **flags})
        assert chat.status_code == 200 and counted.status_code == 200, (chat.text, counted.text)
        assert chat.json()["usage"]["prompt_tokens"] == counted.json()["count"]
        return llm.tokenizer.decode(counted.json()["tokens"], skip_special_tokens=False)

    try:
        assert prompt(partial, continue_final_message=True) == "<|user|>hi\n<|assistant|>Once upon"
        assert prompt(partial, continue_final_message=True, add_generation_prompt=False) == \
            "<|user|>hi\n<|assistant|>Once upon"
        assert prompt(partial, continue_final_message=True, add_generation_prompt=None) == \
            "<|user|>hi\n<|assistant|>Once upon"  # null: the default, which continuing turns off
        assert prompt(USER, add_generation_prompt=False) == "<|user|>hi\n"
        assert prompt(partial) == "<|user|>hi\n<|assistant|>Once upon\n<|assistant|>"
        body = {"messages": partial, "continue_final_message": True, "add_generation_prompt": True}
        for path in ("/v1/chat/completions", "/tokenize"):
            r = call(app, "POST", path, json=body)
            assert r.status_code == 400 and error_of(r)["param"] == "continue_final_message", r.text
    finally:
        llm.engine.close()
