"""`fastdecode serve` through the official openai client: shapes, streaming, seeds, n,
logprobs, logit_bias, usage, concurrency and cancellation. One server (tiny model,
4 slots) for the module."""

import asyncio
import time

import httpx
import openai
import pytest
from serve_process import NO_EOS, serve

CHAT = [{"role": "user", "content": "Tell me a joke"}]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    s = serve(tmp_path_factory, "max_batch_size=4")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def client(server):
    return server.openai()


def aclient(server):
    return server.openai(asynchronous=True, timeout=60)


def metric(server, name):
    text = httpx.get(server.url + "/metrics").text
    return next((float(line.split()[-1]) for line in text.splitlines() if line.startswith(name + " ")), 0.0)


def test_models_and_health(server, client):
    assert httpx.get(server.url + "/health").json() == {"status": "ok"}
    head = httpx.head(server.url + "/health")  # through uvicorn: the status, no body
    assert head.status_code == 200 and head.content == b""
    models = client.models.list()
    assert [m.id for m in models.data] == ["tiny"]
    assert client.models.retrieve("tiny").id == "tiny"


def test_chat_streamed_text_equals_the_whole_answer(client, tiny_llm):
    whole = client.chat.completions.create(model="tiny", messages=CHAT, max_tokens=12, temperature=0)
    assert whole.id.startswith("chatcmpl-") and whole.object == "chat.completion" and whole.model == "tiny"
    choice = whole.choices[0]
    assert choice.index == 0 and choice.message.role == "assistant" and choice.finish_reason in ("stop", "length")
    prompt = tiny_llm.chat_prompt(CHAT)
    want = tiny_llm.generate([prompt], temperature=0, max_new_tokens=12)[0]
    assert choice.message.content == want.text
    assert whole.usage.prompt_tokens == len(prompt)
    assert whole.usage.completion_tokens == want.completion_tokens
    assert whole.usage.total_tokens == len(prompt) + want.completion_tokens

    chunks = list(client.chat.completions.create(model="tiny", messages=CHAT, max_tokens=12, temperature=0,
                                                 stream=True, stream_options={"include_usage": True}))
    assert len({c.id for c in chunks}) == 1 and chunks[0].id.startswith("chatcmpl-")
    assert {c.object for c in chunks} == {"chat.completion.chunk"}
    assert chunks[0].choices[0].delta.role == "assistant"
    *body, usage = chunks
    # The same prompt again: all but its last token come from the prefix cache.
    assert usage.choices == [] and usage.usage.prompt_tokens_details.cached_tokens == len(prompt) - 1
    assert usage.usage.model_dump(exclude={"prompt_tokens_details"}) == \
        whole.usage.model_dump(exclude={"prompt_tokens_details"})
    assert "".join(c.choices[0].delta.content or "" for c in body) == choice.message.content
    reasons = [c.choices[0].finish_reason for c in body if c.choices[0].finish_reason]
    assert reasons == [choice.finish_reason] and body[-1].choices[0].finish_reason == choice.finish_reason


def test_a_chat_continues_its_final_message_through_the_client(client, tiny_llm):
    """vLLM's continue_final_message through the openai client (extra_body): the reply continues
    the assistant text the client began, as the library renders it."""
    partial = CHAT + [{"role": "assistant", "content": "Why did the"}]
    got = client.chat.completions.create(model="tiny", messages=partial, max_tokens=8, temperature=0,
                                         extra_body={"continue_final_message": True})
    prompt = tiny_llm.chat_prompt(partial, add_generation_prompt=False, continue_final_message=True)
    assert tiny_llm.tokenizer.decode(prompt).endswith("<|assistant|>Why did the")
    assert got.usage.prompt_tokens == len(prompt)
    assert got.choices[0].message.content == tiny_llm.generate([prompt], temperature=0, max_new_tokens=8)[0].text


def test_completion_streamed_text_equals_the_whole_answer(client, tiny_llm):
    whole = client.completions.create(model="tiny", prompt="Once upon a time", max_tokens=10, temperature=0)
    assert whole.id.startswith("cmpl-") and whole.object == "text_completion"
    want = tiny_llm.generate(["Once upon a time"], temperature=0, max_new_tokens=10)[0]
    assert whole.choices[0].text == want.text
    assert whole.usage.prompt_tokens == len("Once upon a time") + 1  # bytes, and <bos>
    chunks = list(client.completions.create(model="tiny", prompt="Once upon a time", max_tokens=10,
                                            temperature=0, stream=True))
    assert len({c.id for c in chunks}) == 1
    assert "".join(c.choices[0].text for c in chunks) == whole.choices[0].text
    assert [c.choices[0].finish_reason for c in chunks if c.choices[0].finish_reason] == [
        whole.choices[0].finish_reason]


def test_default_max_tokens_and_prompt_forms(client):
    out = client.completions.create(model="tiny", prompt=[[65, 66], [97, 98, 99]], temperature=0,
                                    logit_bias=NO_EOS)
    assert [c.index for c in out.choices] == [0, 1]
    assert out.usage.completion_tokens == 2 * 16  # OpenAI's default max_tokens for completions
    assert out.usage.prompt_tokens == 2 + 3
    out = client.completions.create(model="tiny", prompt=["a", "bc"], max_tokens=2, logit_bias=NO_EOS)
    assert out.usage.prompt_tokens == 2 + 3 and out.usage.completion_tokens == 4  # each with <bos>
    assert client.completions.create(model="tiny", prompt=[66, 67], max_tokens=1).usage.prompt_tokens == 2
    assert all(c.finish_reason == "length" for c in out.choices)
    parts = [{"type": "text", "text": "Tell me"}, {"type": "text", "text": "a joke"}]
    chat = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": parts}],
                                          max_completion_tokens=3, logit_bias=NO_EOS, temperature=0)
    assert chat.usage.completion_tokens == 3


def test_seed_gives_the_same_text_alone_and_alongside_others(server):
    async def run():
        async with aclient(server) as c:
            def ask(seed, prompt="The cat"):
                return c.completions.create(model="tiny", prompt=prompt, max_tokens=24, temperature=1.0,
                                            seed=seed, logit_bias=NO_EOS)

            alone = await ask(7)
            crowd = await asyncio.gather(ask(7), ask(None, "a longer, different prompt"), ask(8, "x"), ask(9))
            other = await ask(8)
            return alone, crowd, other

    alone, crowd, other = asyncio.run(run())
    assert crowd[0].choices[0].text == alone.choices[0].text
    assert other.choices[0].text != alone.choices[0].text


@pytest.mark.parametrize("n", [2, 3])
def test_n_choices_whole_and_streamed(client, n):
    out = client.chat.completions.create(model="tiny", messages=CHAT, n=n, max_tokens=5, seed=1,
                                         logit_bias=NO_EOS)
    assert [c.index for c in out.choices] == list(range(n))
    assert out.usage.completion_tokens == 5 * n and out.usage.prompt_tokens > 0
    texts = {}
    reasons = {}
    for chunk in client.chat.completions.create(model="tiny", messages=CHAT, n=n, max_tokens=5, seed=1,
                                                logit_bias=NO_EOS, stream=True):
        for c in chunk.choices:
            texts[c.index] = texts.get(c.index, "") + (c.delta.content or "")
            if c.finish_reason:
                reasons.setdefault(c.index, []).append(c.finish_reason)
    assert sorted(texts) == list(range(n)) and reasons == {i: ["length"] for i in range(n)}
    assert [texts[i] for i in range(n)] == [c.message.content for c in out.choices]  # seed + i per choice
    comp = client.completions.create(model="tiny", prompt="hi", n=n, max_tokens=4, logit_bias=NO_EOS)
    assert [c.index for c in comp.choices] == list(range(n)) and comp.usage.completion_tokens == 4 * n


def test_logprobs_token_strings_join_to_the_text(client):
    out = client.completions.create(model="tiny", prompt="Hello", max_tokens=16, logprobs=5, seed=3,
                                    logit_bias=NO_EOS)
    lp = out.choices[0].logprobs
    assert "".join(lp.tokens) == out.choices[0].text
    assert len(lp.tokens) == len(lp.token_logprobs) == out.usage.completion_tokens == 16
    assert all(v <= 0 for v in lp.token_logprobs) and all(5 <= len(t) <= 6 for t in lp.top_logprobs)
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(len(lp.tokens))]

    chat = client.chat.completions.create(model="tiny", messages=CHAT, max_tokens=12, logprobs=True,
                                          top_logprobs=3, seed=3, logit_bias=NO_EOS)
    content = chat.choices[0].logprobs.content
    assert "".join(t.token for t in content) == chat.choices[0].message.content
    assert len(content) == chat.usage.completion_tokens and all(len(t.top_logprobs) == 3 for t in content)
    streamed = list(client.chat.completions.create(model="tiny", messages=CHAT, max_tokens=12, logprobs=True,
                                                   top_logprobs=3, seed=3, logit_bias=NO_EOS, stream=True))
    tokens = [t for c in streamed if c.choices and c.choices[0].logprobs for t in c.choices[0].logprobs.content]
    assert "".join(t.token for t in tokens) == chat.choices[0].message.content
    assert [t.logprob for t in tokens] == pytest.approx([t.logprob for t in content])
    for bad in (dict(logprobs=True, top_logprobs=21), dict(top_logprobs=2)):
        with pytest.raises(openai.BadRequestError):
            client.chat.completions.create(model="tiny", messages=CHAT, max_tokens=2, **bad)
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model="tiny", prompt="a", max_tokens=2, logprobs=21)
    # top_logprobs 0 asks for nothing: accepted without logprobs (vLLM's default value, which clients send)
    plain = client.chat.completions.create(model="tiny", messages=CHAT, max_tokens=2, top_logprobs=0)
    assert plain.choices[0].logprobs is None


def test_logit_bias_keeps_tokens_out(client):
    allowed = {ord("a"), ord("b")}
    ban = {str(i): -100 for i in range(256) if i not in allowed} | NO_EOS
    out = client.completions.create(model="tiny", prompt="xyz", max_tokens=40, temperature=1.5, seed=5,
                                    logit_bias=ban)
    assert set(out.choices[0].text) <= {"a", "b"} and out.choices[0].finish_reason == "length"
    free = client.completions.create(model="tiny", prompt="xyz", max_tokens=40, temperature=1.5, seed=5)
    assert not set(free.choices[0].text) <= {"a", "b"}  # the bias, not the model, kept them out


def test_sixty_four_concurrent_streams_three_rounds(server):
    async def one(c, i):
        stream = await c.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": f"request {i}"}], max_tokens=4 + i % 5,
            stream=True, stream_options={"include_usage": True}, logit_bias=NO_EOS)
        reasons, usage = [], None
        async for chunk in stream:
            reasons += [c.finish_reason for c in chunk.choices if c.finish_reason]
            if chunk.usage is not None:
                assert chunk.choices == []
                usage = chunk.usage
        return i, reasons, usage

    async def run():
        async with aclient(server) as c:
            results = []
            for _ in range(3):
                results += await asyncio.gather(*(one(c, i) for i in range(64)))
            return results

    results = asyncio.run(run())
    assert len(results) == 192
    for i, reasons, usage in results:
        assert reasons == ["length"] and usage is not None and usage.completion_tokens == 4 + i % 5


def wait_idle(server, timeout=10):
    """Seconds until the engine holds no request (slots and queue empty)."""
    t0 = time.monotonic()
    while metric(server, "fastdecode_slots_in_use") or metric(server, "fastdecode_queue_length"):
        assert time.monotonic() - t0 < timeout, "slots still in use"
        time.sleep(0.05)
    return time.monotonic() - t0


def aborted(server):
    return metric(server, 'fastdecode_choices_finished_total{finish_reason="abort"}')


def test_cut_streams_free_their_slots(server, client):
    # 30 x 400 tokens on 4 slots would take seconds; hanging up must free them at once.
    async def cut(c, i):
        stream = await c.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": f"long {i}"}], max_tokens=400, stream=True,
            logit_bias=NO_EOS)
        async for _ in stream:
            break  # the first chunk, then hang up
        await stream.close()

    async def run():
        async with aclient(server) as c:
            await asyncio.gather(*(cut(c, i) for i in range(30)))

    before = aborted(server)
    asyncio.run(run())
    assert wait_idle(server) < 5
    assert aborted(server) - before >= 25  # the queued ones at least never ran to the end
    out = client.chat.completions.create(model="tiny", messages=CHAT, max_tokens=3, logit_bias=NO_EOS)
    assert out.choices[0].finish_reason == "length"


def test_a_client_leaving_a_whole_response_cancels_it(server):
    before = aborted(server)
    body = {"prompt": "x", "n": 16, "max_tokens": 480, "logit_bias": NO_EOS}  # 16 choices on 4 slots
    with pytest.raises(httpx.TimeoutException):
        httpx.post(server.url + "/v1/completions", json=body, timeout=0.5)
    assert wait_idle(server) < 5
    assert aborted(server) - before >= 8


def test_metrics_and_request_log(server):
    text = httpx.get(server.url + "/metrics").text
    for name in ("fastdecode_requests_total", "fastdecode_prompt_tokens_total", "fastdecode_generation_tokens_total",
                 "fastdecode_slots_in_use", "fastdecode_queue_length", "fastdecode_time_to_first_token_seconds_bucket",
                 "fastdecode_inter_token_latency_seconds_bucket"):
        assert name in text
    assert 'route="/v1/chat/completions",status="200"' in text
    lines = [line for line in server.log().splitlines() if "POST /v1/completions status=200" in line]
    assert lines and all(line.split()[1].startswith("cmpl-") and "prompt_tokens=" in line and "ttft=" in line
                         and "total=" in line for line in lines)


def test_prefix_cache_counts_cached_tokens_in_usage_and_metrics(server, client):
    prompt = [(7 * i + 11) % 200 + 3 for i in range(40)]
    queries, hits = metric(server, "fastdecode_prefix_cache_queries_total"), \
        metric(server, "fastdecode_prefix_cache_hits_total")
    first = client.completions.create(model="tiny", prompt=prompt, max_tokens=3, temperature=0)
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    again = client.completions.create(model="tiny", prompt=prompt + [5, 6], max_tokens=3, temperature=0)
    assert again.usage.prompt_tokens_details.cached_tokens == 40
    chunks = list(client.completions.create(model="tiny", prompt=prompt + [5, 6, 9], max_tokens=3, temperature=0,
                                            stream=True, stream_options={"include_usage": True}))
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens == 42
    salted = client.completions.create(model="tiny", prompt=prompt + [5, 6], max_tokens=3, temperature=0,
                                       extra_body={"cache_salt": "other"})
    assert salted.usage.prompt_tokens_details.cached_tokens == 0
    assert metric(server, "fastdecode_prefix_cache_queries_total") - queries == 40 + 42 + 43 + 42
    assert metric(server, "fastdecode_prefix_cache_hits_total") - hits == 40 + 42


def test_cache_salt_must_be_a_string(server):
    r = httpx.post(server.url + "/v1/completions", json={"prompt": "hi", "max_tokens": 1, "cache_salt": 5})
    assert r.status_code == 400 and r.json()["error"]["param"] == "cache_salt"
    assert httpx.get(server.url + "/health").status_code == 200
