"""Prompt logprobs (SamplingParams.prompt_logprobs): computed in the prefill chunks the
engine runs, equal to log_softmax of a cache-free forward of the whole prompt."""

import random

import pytest
import torch

import fastdecode
from fastdecode import FastDecodeError
from fastdecode.sampling import SamplingParams


def tokens(n, seed):
    rng = random.Random(seed)
    return [256] + [rng.randrange(0, 256) for _ in range(n - 1)]


def reference(llm, ids):
    with torch.inference_mode():
        logits = llm.model(torch.tensor([ids]), None)[0]
    return torch.log_softmax(logits.float(), dim=-1)


def check(llm, ids, lps, k):
    assert len(lps) == len(ids) and lps[0] is None
    ref = reference(llm, ids)
    for p in range(1, len(ids)):
        e, row = lps[p], ref[p - 1]
        assert e.token_id == ids[p]
        assert e.logprob == pytest.approx(row[ids[p]].item(), abs=1e-4)
        assert e.rank == int((row > row[ids[p]]).sum()) + 1
        assert len(e.top) == k
        if k:
            assert e.top[0][0] == int(row.argmax()) and e.top[0][1] == pytest.approx(row.max().item(), abs=1e-4)


@pytest.fixture(scope="module")
def chunked():
    # float32 KV: the reference forward keeps k/v in float32, and float16 rounding moves logprobs by ~1e-4
    return fastdecode.load("tiny", prefill_chunk=8, max_batch_size=4, max_seq_len=128, kv_dtype="float32")


@pytest.fixture(scope="module")
def whole():
    return fastdecode.load("tiny", kv_dtype="float32")  # float32 KV, as the reference forward keeps k/v


def test_equal_to_the_reference_forward(whole):
    ids = tokens(12, 0)
    c = whole.generate([ids], temperature=0, max_new_tokens=2, prompt_logprobs=3)[0]
    check(whole, ids, c.prompt_logprobs, 3)
    assert whole.generate([ids], temperature=0, max_new_tokens=2)[0].prompt_logprobs is None


def test_across_chunks_and_in_a_batch(chunked):
    prompts = [tokens(30, 1), tokens(30, 2), tokens(17, 3)]
    alone = [chunked.generate([p], temperature=0, max_new_tokens=1, prompt_logprobs=1)[0] for p in prompts]
    for p, c in zip(prompts, alone):
        check(chunked, p, c.prompt_logprobs, 1)
    batch = chunked.generate(prompts, temperature=0, max_new_tokens=1, prompt_logprobs=1)
    for a, b in zip(alone, batch):
        assert [x and (x.token_id, round(x.logprob, 4), x.top[0][0]) for x in a.prompt_logprobs] == \
               [x and (x.token_id, round(x.logprob, 4), x.top[0][0]) for x in b.prompt_logprobs]
        assert a.token_ids == b.token_ids


def test_mixed_requests_in_one_chunk(whole, monkeypatch):
    # One prefill group holds requests with different k, one without ranks and one not scored:
    # each gets what it asked for (the chunk's logprobs are computed once, for all of them).
    from fastdecode.engine.stream import RequestStream
    from fastdecode.engine import GenerationConfig

    prompts = [tokens(30, 5), tokens(30, 6), tokens(30, 7), tokens(30, 8)]
    params = [SamplingParams(temperature=0, prompt_logprobs=3), SamplingParams(temperature=0, prompt_logprobs=1),
              SamplingParams(temperature=0, prompt_logprobs=0, prompt_logprob_ranks=False),
              SamplingParams(temperature=0)]
    runner = whole.engine.runner
    groups, inner = [], runner._prompt_logprobs
    monkeypatch.setattr(runner, "_prompt_logprobs", lambda reqs, logits: groups.append(len(reqs)) or inner(reqs, logits))
    s = RequestStream(whole.engine).submit(prompts, params, GenerationConfig(max_new_tokens=1))
    while not all(r.finished for r in s.requests):
        s.next_step()
    assert groups == [3]  # the three scored requests in one chunk
    got = [r.prompt_logprobs for r in s.requests]
    check(whole, prompts[0], got[0], 3)
    check(whole, prompts[1], got[1], 1)
    assert got[3] is None
    assert all(e.rank is None for e in got[2][1:])
    ranked = whole.generate([prompts[2]], temperature=0, max_new_tokens=1, prompt_logprobs=0)[0].prompt_logprobs
    assert [(e.token_id, round(e.logprob, 4)) for e in got[2][1:]] == \
           [(e.token_id, round(e.logprob, 4)) for e in ranked[1:]]


def test_without_ranks_the_same_logprobs(whole):
    ids = tokens(40, 9)
    a = whole.generate([ids], temperature=0, max_new_tokens=1, prompt_logprobs=2)[0].prompt_logprobs
    b = whole.generate([ids], temperature=0, max_new_tokens=1, prompt_logprobs=2,
                       prompt_logprob_ranks=False)[0].prompt_logprobs
    assert a[0] is None and b[0] is None
    assert [(e.token_id, e.logprob, e.top) for e in a[1:]] == [(e.token_id, e.logprob, e.top) for e in b[1:]]
    assert all(e.rank is None for e in b[1:]) and all(e.rank >= 1 for e in a[1:])


def test_no_prefix_reuse(chunked):
    ids = tokens(30, 4)
    chunked.generate([ids], temperature=0, max_new_tokens=1)  # leaves the prompt in a slot
    c = chunked.generate([ids], temperature=0, max_new_tokens=1, prompt_logprobs=0)[0]
    assert c.cached_tokens == 0
    check(chunked, ids, c.prompt_logprobs, 0)


def test_validation():
    for bad in (-1, 21, 1.5, True):
        with pytest.raises(FastDecodeError, match="prompt_logprobs"):
            SamplingParams(prompt_logprobs=bad)
    with pytest.raises(FastDecodeError, match="prompt_logprob_ranks"):
        SamplingParams(prompt_logprob_ranks=1)


def test_completion_tokens_count_the_eos(tiny_llm):
    eos = next(iter(tiny_llm.tokenizer.eos_ids))
    c = tiny_llm.generate(["hi"], temperature=0, max_new_tokens=5, logit_bias={eos: 100})[0]
    assert c.token_ids == [] and c.finish_reason == "stop" and c.completion_tokens == 1
