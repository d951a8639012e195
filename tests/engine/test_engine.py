"""The continuous-batching engine on the tiny model: seeded invariance, requests
joining and leaving, slot reuse, cancellation, logprobs, memory, bad input."""

import asyncio
import random

import pytest
import torch
from torch._dynamo.utils import counters

import fastdecode
from fastdecode import FastDecodeError, GenerationConfig, SamplingParams

SETTINGS = [
    dict(temperature=0),
    dict(temperature=0.9, seed=1),
    dict(temperature=0.7, top_k=20, seed=2),
    dict(temperature=1.1, top_p=0.8, min_p=0.05, seed=3),
    dict(temperature=0.8, repetition_penalty=1.3, frequency_penalty=0.5, presence_penalty=0.4, seed=4),
    dict(temperature=0, logit_bias={101: 3.0}, min_new_tokens=1),
    dict(temperature=1.0, seed=5, logit_bias={66: -100}),
]


def request(i: int):
    """A prompt and its options, varied with i."""
    rng = random.Random(i)
    prompt = [rng.randrange(3, 256) for _ in range(rng.randint(1, 60))]
    opts = dict(SETTINGS[i % len(SETTINGS)], max_new_tokens=rng.choice([1, 4, 9, 17]), ignore_eos=i % 3 == 0)
    return prompt, opts


def split(opts):
    return fastdecode.api.llm.split_options(opts)


def alone(llm, i):
    prompt, opts = request(i)
    return llm.generate([prompt], **opts)[0].token_ids


def run_mixed(llm, ids):
    """Requests `ids` submitted together, each with its own settings, all
    stepped in one engine; returns their token ids."""
    engine = llm.engine
    reqs = [engine.submit(request(i)[0], *split(request(i)[1])) for i in ids]
    while engine.has_work():
        engine.step()
    return [r.outputs[-1].completion.token_ids for r in reqs]


@pytest.fixture(scope="module")
def eager():
    return fastdecode.load("tiny", max_batch_size=8)


@pytest.fixture(scope="module")
def compiled():
    llm = fastdecode.load("tiny", compile="decode", max_batch_size=8)
    llm.steps.warmup()
    return llm


@pytest.mark.parametrize("which", ["eager", "compiled"])
def test_seeded_and_greedy_outputs_do_not_depend_on_the_batch(which, eager, compiled):
    llm = eager if which == "eager" else compiled
    expected = {i: alone(eager, i) for i in range(14)}
    rng = random.Random(7)
    for size in range(2, 9):
        ids = rng.sample(range(14), size)
        assert run_mixed(llm, ids) == [expected[i] for i in ids], (which, ids)


def test_requests_join_and_leave_a_running_batch(eager):
    engine = eager.engine
    expected = {i: alone(eager, i) for i in range(10)}
    arrivals = {0: [0, 1], 2: [2], 3: [3, 4, 5], 7: [6], 8: [7, 8], 12: [9]}  # step -> requests joining
    reqs, step = {}, 0
    while step <= max(arrivals) or engine.has_work():
        for i in arrivals.get(step, []):
            reqs[i] = engine.submit(request(i)[0], *split(request(i)[1]))
        engine.step()
        step += 1
    assert {i: r.outputs[-1].completion.token_ids for i, r in reqs.items()} == expected
    # Prompts that join running requests are prefilled in their decode steps' forwards.
    assert eager.model.mixes_steps and engine.mixed_steps > 0


def test_prompts_of_different_lengths_share_a_step(eager):
    """Where the model takes rows of one token, prompts of any lengths share one step's budget of
    prefill_chunk tokens (the last cut to what is left), and each gets the tokens it gets alone."""
    llm = fastdecode.load("tiny", max_batch_size=4, prefill_chunk=64)
    engine = llm.engine
    prompts = [list(range(3, 23)), list(range(40, 73)), list(range(80, 130))]  # 20, 33 and 50 tokens
    params, cfg = split(dict(max_new_tokens=6, temperature=0, ignore_eos=True))
    reqs = [engine.submit(p, params, cfg) for p in prompts]
    engine.step()
    assert [r.prefilled for r in reqs] == [20, 33, 11]  # 64 tokens: the third prompt's first 11
    assert [len(r.output_ids) for r in reqs] == [1, 1, 0]
    while engine.has_work():
        engine.step()
    expected = [eager.generate([p], max_new_tokens=6, temperature=0, ignore_eos=True)[0].token_ids for p in prompts]
    assert [r.outputs[-1].completion.token_ids for r in reqs] == expected


def test_a_reused_slot_leaks_nothing():
    llm = fastdecode.load("tiny", max_batch_size=1)
    fresh = fastdecode.load("tiny", max_batch_size=1)
    short = dict(max_new_tokens=12, temperature=0, ignore_eos=True)
    llm.generate([[7] * 300], max_new_tokens=150, temperature=0, ignore_eos=True)  # fills the slot far
    assert llm.generate([[9, 8, 7]], **short)[0].token_ids == fresh.generate([[9, 8, 7]], **short)[0].token_ids


def test_cancellation_frees_the_slot_within_one_step():
    llm = fastdecode.load("tiny", max_batch_size=1)
    engine = llm.engine
    params, cfg = split(dict(max_new_tokens=50, temperature=0, ignore_eos=True))
    first = engine.submit([5, 6, 7], params, cfg)
    waiting = engine.submit([8, 9], params, cfg)
    for _ in range(3):
        engine.step()
    assert engine.slots_in_use == 1 and engine.queue_length == 1
    engine.cancel(first)
    engine.step()  # frees the slot, admits the waiting request and prefills it
    assert first.outputs[-1].finish_reason == "abort" and first.outputs[-1].completion.completion_tokens == 3
    assert waiting.slot == 0 and len(waiting.output_ids) == 1
    while engine.has_work():
        engine.step()
    assert waiting.outputs[-1].completion.token_ids == \
        llm.generate([[8, 9]], max_new_tokens=50, temperature=0, ignore_eos=True)[0].token_ids


def test_abandoned_stream_is_cancelled(eager):
    stream = eager.stream("abandon me", max_new_tokens=100, temperature=0, ignore_eos=True)
    next(stream)
    stream.close()
    eager.engine.step()
    assert eager.engine.slots_in_use == 0


def test_zero_recompiles_over_fifty_mixed_requests(compiled):
    engine = compiled.engine
    run_mixed(compiled, [0, 1])  # warm: sampling and both prompt shapes seen
    graphs = counters["stats"]["unique_graphs"]
    rng = random.Random(3)
    pending = list(range(50))
    while pending or engine.has_work():
        for _ in range(rng.randint(0, 3)):  # 0-3 requests join before each step
            if pending:
                i = pending.pop()
                engine.submit(request(100 + i)[0], *split(request(100 + i)[1]))
        engine.step()
    assert counters["stats"]["unique_graphs"] == graphs


def test_logprobs_match_the_reference_forward():
    # float32 K/V, as the cache-free reference forward holds them (the CPU default, float16,
    # rounds them: logprobs within ~1e-3).
    eager = fastdecode.load("tiny", kv_dtype="float32")
    prompt = [10, 20, 30, 40]
    out = eager.generate([prompt], max_new_tokens=6, temperature=0.9, seed=3, logprobs=5, ignore_eos=True)[0]
    ids = prompt + out.token_ids
    with torch.no_grad():
        ref = torch.log_softmax(eager.model(torch.tensor([ids]), None)[0].float(), dim=-1)
    assert len(out.logprobs) == len(out.token_ids) == 6
    for k, lp in enumerate(out.logprobs):
        row = ref[len(prompt) - 1 + k]
        assert lp.token_id == out.token_ids[k]
        assert lp.logprob == pytest.approx(row[lp.token_id].item(), abs=1e-4)
        top = row.topk(5)
        assert [i for i, _ in lp.top] == top.indices.tolist()
        assert [v for _, v in lp.top] == pytest.approx(top.values.tolist(), abs=1e-4)


def test_the_cache_is_allocated_once_and_memory_stays_flat():
    llm = fastdecode.load("tiny", max_batch_size=4)
    cache = llm.model.kv_cache.k_cache
    ptr = cache.data_ptr()

    def rss():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * 4096

    prompts = [[3 + i % 200] * (1 + i % 17) for i in range(500)]
    for start in range(0, 100, 4):
        llm.generate(prompts[start:start + 4], max_new_tokens=2, temperature=0.8, seed=start)
    before = rss()
    for start in range(100, 500, 4):
        llm.generate(prompts[start:start + 4], max_new_tokens=2, temperature=0.8, seed=start)
    grown = rss() - before
    assert llm.model.kv_cache.k_cache.data_ptr() == ptr
    assert grown < 8 * 2**20, f"RSS grew by {grown / 2**20:.1f} MiB over 400 requests"


def test_async_interface_streams_and_cancels(eager):
    async def main():
        engine = eager.engine
        params, cfg = split(dict(max_new_tokens=8, temperature=0.9, seed=2, ignore_eos=True))

        async def collect(prompt):
            text, ids = "", []
            async for out in engine.generate_async(prompt, params, cfg):
                text += out.text
                ids += out.token_ids
            return out, text, ids

        results = await asyncio.gather(*(collect([40 + i, 41, 42]) for i in range(3)))
        for i, (last, text, ids) in enumerate(results):
            assert last.finished and last.completion.text == text and ids == last.completion.token_ids
            assert ids == eager.generate([[40 + i, 41, 42]], max_new_tokens=8, temperature=0.9, seed=2,
                                         ignore_eos=True)[0].token_ids
        long_cfg = GenerationConfig(max_new_tokens=200, ignore_eos=True)
        stream = engine.generate_async([1, 2, 3], params, long_cfg)
        await stream.__anext__()
        await stream.aclose()
        for _ in range(100):
            if engine.slots_in_use == 0:
                break
            await asyncio.sleep(0.01)
        assert engine.slots_in_use == 0

    asyncio.run(main())


def test_a_request_may_fill_the_whole_cache(eager):
    """The last new token is never fed back, so prompt + max_new_tokens may be max_seq_len + 1:
    a prompt of 509 tokens gets 4 on a 512-position cache, beside another request, and they are
    the cache-free forward's greedy tokens."""
    engine = eager.engine
    prompt = [random.Random(3).randrange(1, 250) for _ in range(509)]
    params, cfg = split(dict(max_new_tokens=4, temperature=0, ignore_eos=True))
    full = engine.submit(prompt, params, cfg)
    other = engine.submit([1, 2, 3], params, cfg)
    while engine.has_work():
        engine.step()
    ids = list(prompt)
    with torch.inference_mode():
        for _ in range(4):
            ids.append(int(eager.model(torch.tensor([ids]), None)[0, -1].argmax()))
    assert full.outputs[-1].completion.token_ids == ids[509:]
    assert len(other.outputs[-1].completion.token_ids) == 4
    with pytest.raises(FastDecodeError, match="needs 513 cache positions > max_seq_len=512"):
        engine.submit(prompt, params, GenerationConfig(max_new_tokens=5))


def test_bad_requests_are_refused_at_submit_and_running_ones_continue(eager):
    engine = eager.engine
    params, cfg = split(dict(max_new_tokens=10, temperature=0, ignore_eos=True))
    running = engine.submit([1, 2, 3], params, cfg)
    engine.step()
    with pytest.raises(FastDecodeError, match=r"has 500 tokens.*needs 529 cache positions > max_seq_len=512") as e:
        engine.submit([5] * 500, params, GenerationConfig(max_new_tokens=30))
    assert "\n" not in str(e.value)
    with pytest.raises(FastDecodeError, match="logit_bias has token id 300, outside the vocabulary"):
        engine.submit([1], SamplingParams(logit_bias={300: 1.0}), cfg)
    with pytest.raises(FastDecodeError, match="logprobs=21 is out of range"):
        eager.generate("x", logprobs=21)
    while engine.has_work():
        engine.step()
    assert running.outputs[-1].completion.token_ids == \
        eager.generate([[1, 2, 3]], max_new_tokens=10, temperature=0, ignore_eos=True)[0].token_ids


def test_closed_engine_refuses_and_aborts():
    llm = fastdecode.load("tiny")
    params, cfg = split(dict(max_new_tokens=10, temperature=0))
    r = llm.engine.submit([1, 2], params, cfg)
    llm.engine.close()
    assert r.outputs[-1].finish_reason == "abort"
    with pytest.raises(FastDecodeError, match="engine is closed"):
        llm.generate("x")


def test_a_cache_that_cannot_fit_is_refused_at_load():
    with pytest.raises(FastDecodeError, match=r"needs [\d,]+ bytes, but [\d,]+ are available") as e:
        fastdecode.load("tiny", max_batch_size=10**7)
    assert "\n" not in str(e.value)
