"""What lm-evaluation-harness's local-completions model sends: echo with logprobs for
loglikelihood (text and token-id prompts, max_tokens 0 and 1, batched), vLLM's
prompt_logprobs, the tokenizer endpoints, and the bad inputs around them. The server
runs the tiny preset (random weights, seed 0), as does the in-process reference."""

import httpx
import pytest
import torch
from serve_process import NO_EOS, error_of, serve

PROMPT = "The quick brown fox"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    # float32 KV, as the in-process reference forward keeps k/v (float16 rounding moves logprobs by ~1e-4)
    s = serve(tmp_path_factory, "max_batch_size=4", "prefill_chunk=8", "kv_dtype=float32")
    yield s
    s.stop()


def post(server, path, body):
    return httpx.post(server.url + path, json=body, timeout=60)


def completions(server, **body):
    r = post(server, "/v1/completions", {"model": "tiny", **body})
    assert r.status_code == 200, r.text
    return r.json()


def reference(llm, ids):
    with torch.inference_mode():
        return torch.log_softmax(llm.model(torch.tensor([ids]), None)[0].float(), dim=-1)


def lm_eval_body(prompt, max_tokens=1):
    return {"prompt": prompt, "temperature": 0, "max_tokens": max_tokens, "logprobs": 1, "seed": 1234, "echo": True}


def check_echo(llm, ids, choice, generated):
    lp = choice["logprobs"]
    n = len(ids)
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == len(lp["text_offset"]) \
        == n + generated
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    assert "".join(lp["tokens"]) == choice["text"]
    assert choice["text"].startswith(llm.tokenizer.decode(ids))
    assert lp["text_offset"] == [sum(len(t) for t in lp["tokens"][:i]) for i in range(n + generated)]
    ref = reference(llm, ids)
    for p in range(1, n):
        row = ref[p - 1]
        assert lp["token_logprobs"][p] == pytest.approx(row[ids[p]].item(), abs=1e-4)
        top = lp["top_logprobs"][p]
        assert max(top.values()) == pytest.approx(row.max().item(), abs=1e-4)  # the argmax is there
        assert lp["token_logprobs"][p] in top.values()  # and the chosen token
        # lm-eval's is_greedy: the chosen token's logprob is the top one exactly when it is the argmax
        assert (lp["token_logprobs"][p] == max(top.values())) == (int(row.argmax()) == ids[p])
    for t in lp["top_logprobs"][n:]:
        assert 1 <= len(t) <= 2


@pytest.mark.parametrize("max_tokens", [0, 1])
def test_echo_text_prompt(server, tiny_llm, max_tokens):
    out = completions(server, **lm_eval_body(PROMPT, max_tokens), logit_bias=NO_EOS)
    ids = tiny_llm.tokenizer.encode(PROMPT)
    choice = out["choices"][0]
    check_echo(tiny_llm, ids, choice, max_tokens)
    assert choice["text"].startswith(PROMPT)
    assert out["usage"]["prompt_tokens"] == len(ids) and out["usage"]["completion_tokens"] == max_tokens
    if max_tokens == 0:
        assert choice["text"] == PROMPT and choice["finish_reason"] == "length"


def test_echo_of_a_prompt_filling_the_whole_context(server, tiny_llm):
    """lm-eval's rolling windows are max_length tokens, which may be the server's whole context
    (512 for tiny): echo with max_tokens 0 scores them; max_tokens 1 there does not fit."""
    ids = [(7 * i) % 250 + 1 for i in range(512)]
    check_echo(tiny_llm, ids, completions(server, **lm_eval_body(ids, 0))["choices"][0], 0)
    r = post(server, "/v1/completions", {"model": "tiny", **lm_eval_body(ids, 1)})
    assert r.status_code == 400 and error_of(r)["code"] == "context_length_exceeded"


def test_echo_batch_of_id_prompts(server, tiny_llm):
    prompts = [tiny_llm.tokenizer.encode(t) for t in ("Hello world, this is a longer prompt", "ab", "ünïcödé ✓")]
    out = completions(server, **lm_eval_body(prompts, 1))
    choices = sorted(out["choices"], key=lambda c: c["index"])
    assert [c["index"] for c in choices] == [0, 1, 2]
    for ids, c in zip(prompts, choices):
        check_echo(tiny_llm, ids, c, 1)
        alone = completions(server, **lm_eval_body(ids, 1))["choices"][0]
        assert alone["logprobs"] == c["logprobs"] and alone["text"] == c["text"]


def test_echo_without_logprobs(server):
    out = completions(server, prompt=PROMPT, echo=True, max_tokens=3, temperature=0, logit_bias=NO_EOS)
    c = out["choices"][0]
    assert c["text"].startswith(PROMPT) and len(c["text"]) > len(PROMPT) and c["logprobs"] is None


def test_vllm_prompt_logprobs(server, tiny_llm):
    ids = tiny_llm.tokenizer.encode(PROMPT)
    ref = reference(tiny_llm, ids)
    out = completions(server, prompt=ids, max_tokens=1, temperature=0, prompt_logprobs=2)
    pl = out["choices"][0]["prompt_logprobs"]
    assert len(pl) == len(ids) and pl[0] is None
    for p in range(1, len(ids)):
        row, entry = ref[p - 1], pl[p]
        assert entry[str(ids[p])]["logprob"] == pytest.approx(row[ids[p]].item(), abs=1e-4)
        assert entry[str(ids[p])]["rank"] == int((row > row[ids[p]]).sum()) + 1
        assert entry[str(int(row.argmax()))]["rank"] == 1
        assert 2 <= len(entry) <= 3
    chat = post(server, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1,
                                                 "prompt_logprobs": 0})
    assert chat.status_code == 200
    pl = chat.json()["choices"][0]["prompt_logprobs"]
    assert pl[0] is None and all(len(e) == 1 for e in pl[1:])
    # vLLM's chat response carries them at its top level (its clients read them there): the same list.
    assert chat.json()["prompt_logprobs"] == pl


def test_streamed_logprobs_match_whole_with_a_stop_string(server):
    body = {"model": "tiny", "prompt": "Hello", "max_tokens": 24, "temperature": 0, "logprobs": 2,
            "logit_bias": NO_EOS}
    full = completions(server, **body)["choices"][0]
    text = full["text"]
    assert len(text) > 6
    stop = text[4:6]  # cuts mid-completion; bytes are tokens, so the stop spans tokens
    whole = completions(server, **body, stop=[stop])["choices"][0]
    assert whole["text"] == text[:text.index(stop)] and whole["finish_reason"] == "stop"
    assert "".join(whole["logprobs"]["tokens"]) == whole["text"]
    with httpx.stream("POST", server.url + "/v1/completions", json={**body, "stop": [stop], "stream": True},
                      timeout=60) as r:
        lines = [line[6:] for line in r.iter_lines() if line.startswith("data: ") and line != "data: [DONE]"]
    import json
    chunks = [json.loads(line)["choices"][0] for line in lines]
    tokens = [t for c in chunks if c["logprobs"] for t in c["logprobs"]["tokens"]]
    lps = [t for c in chunks if c["logprobs"] for t in c["logprobs"]["token_logprobs"]]
    assert "".join(c["text"] for c in chunks) == whole["text"]
    assert tokens == whole["logprobs"]["tokens"] and lps == whole["logprobs"]["token_logprobs"]


@pytest.mark.parametrize("stream", [False, True])
def test_generated_top_logprobs_hold_the_sampled_token(server, stream):
    body = {"prompt": PROMPT, "max_tokens": 8, "temperature": 1.5, "seed": 7, "logprobs": 0, "logit_bias": NO_EOS}
    if stream:
        with httpx.stream("POST", server.url + "/v1/completions", json={**body, "stream": True}, timeout=60) as r:
            import json
            chunks = [json.loads(line[6:])["choices"][0] for line in r.iter_lines()
                      if line.startswith("data: ") and line != "data: [DONE]"]
        tops = [t for c in chunks if c["logprobs"] for t in c["logprobs"]["top_logprobs"]]
        lps = [t for c in chunks if c["logprobs"] for t in c["logprobs"]["token_logprobs"]]
    else:
        lp = completions(server, **body)["choices"][0]["logprobs"]
        tops, lps = lp["top_logprobs"], lp["token_logprobs"]
    assert len(tops) == 8 and all(list(t.values()) == [v] for t, v in zip(tops, lps))
    echoed = completions(server, **body, echo=True)["choices"][0]["logprobs"]["top_logprobs"][-8:]
    # as echo reports the generated tokens; the values to float32 rounding, as echo's prefill never reuses
    # the cached prefix, and the tiny model's float linears sum a chunk of over 8 rows in BLAS
    assert [list(t) for t in echoed] == [list(t) for t in tops]
    assert [v for t in echoed for v in t.values()] == pytest.approx([v for t in tops for v in t.values()], rel=1e-5)


def test_completion_tokens_count_the_eos(server):
    out = completions(server, prompt="hi", max_tokens=5, temperature=0, logit_bias={"257": 100})
    assert out["choices"][0]["text"] == "" and out["usage"]["completion_tokens"] == 1


@pytest.mark.parametrize("text", ["hello world", "ünïcödé ✓ 日本語 🦊"])
def test_tokenize_round_trip(server, tiny_llm, text):
    r = post(server, "/tokenize", {"prompt": text})
    assert r.status_code == 200
    body = r.json()
    assert body["tokens"] == tiny_llm.tokenizer.encode(text) and body["count"] == len(body["tokens"])
    assert body["max_model_len"] > 0
    raw = post(server, "/tokenize", {"prompt": text, "add_special_tokens": False}).json()["tokens"]
    assert raw == tiny_llm.tokenizer.encode(text, add_special_tokens=False)
    assert post(server, "/detokenize", {"tokens": raw}).json() == {"prompt": text}
    assert post(server, "/detokenize", {"tokens": body["tokens"]}).json() == {"prompt": text}


def test_tokenize_chat(server, tiny_llm):
    messages = [{"role": "user", "content": "Tell me a joke ✓"}]
    body = post(server, "/tokenize", {"messages": messages}).json()
    assert body["tokens"] == tiny_llm.chat_prompt(messages)
    text = post(server, "/detokenize", {"tokens": body["tokens"]}).json()["prompt"]
    assert text == tiny_llm.tokenizer.apply_chat_template(messages, add_generation_prompt=True)


def test_tokenizer_info(server, tiny_llm):
    info = httpx.get(server.url + "/tokenizer_info").json()
    assert info["eos_token"] == "<eos>" and info["bos_token"] == "<bos>"
    assert info["chat_template"] == tiny_llm.tokenizer.chat_template
    assert info["model_max_length"] == info["max_model_len"] > 0 and info["tokenizer_class"] == "ByteTokenizer"


@pytest.mark.parametrize("path,body,param", [
    ("/v1/completions", {"prompt": "hi", "max_tokens": 0}, "max_tokens"),
    ("/v1/completions", {"prompt": "hi", "echo": True, "stream": True}, "echo"),
    ("/v1/completions", {"prompt": "hi", "prompt_logprobs": 21}, "prompt_logprobs"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": -1}, "max_tokens"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "prompt_logprobs": 21},
     "prompt_logprobs"),
    ("/v1/completions", {"prompt": [[1, 2], [3, 99999]], "echo": True, "logprobs": 1, "max_tokens": 0}, "prompt"),
    ("/tokenize", {}, "prompt"),
    ("/tokenize", {"prompt": "a", "messages": [{"role": "user", "content": "x"}]}, "prompt"),
    ("/tokenize", {"prompt": 5}, "prompt"),
    ("/detokenize", {"tokens": [65, 99999]}, "tokens"),
    ("/detokenize", {"tokens": [-1]}, "tokens"),
    ("/detokenize", {"tokens": "abc"}, "tokens"),
])
def test_bad_input_is_a_400(server, path, body, param):
    r = post(server, path, body)
    assert r.status_code == 400, r.text
    assert error_of(r)["param"] == param
    assert httpx.get(server.url + "/health").status_code == 200
