"""The engine's seams: built once from explicit parts, the only writer of request
state, one validator of requests and one output stream (issue 24)."""

import ast
import asyncio
import threading
from pathlib import Path

import pytest
import torch

import fastdecode
from fastdecode import FastDecodeError, GenerationConfig, SamplingParams
from fastdecode.compile.strategies import eager_steps
from fastdecode.engine import Engine, EngineThread
from fastdecode.engine.draft import DraftModel
from fastdecode.engine.stream import RequestStream
from fastdecode.model.args import get_preset
from fastdecode.model.transformer import Transformer, init_random_weights
from fastdecode.text.tokenizer import ByteTokenizer

SRC = Path(fastdecode.__file__).parent
GREEDY = SamplingParams(temperature=0)


def tiny_model():
    m = init_random_weights(Transformer(get_preset("tiny")), seed=0).eval().requires_grad_(False)
    m.init_rope(torch.device("cpu"))
    return m


def engine(**kwargs) -> Engine:
    m = tiny_model()
    return Engine(m, ByteTokenizer(m.args.vocab_size), eager_steps(m), max_batch_size=2, max_seq_len=64, **kwargs)


def test_an_engine_built_from_parts_generates_what_load_does(tiny_llm):
    e = engine()
    prompt = [5, 6, 7, 8]
    req = e.submit(prompt, GREEDY, GenerationConfig(max_new_tokens=6, ignore_eos=True))
    while e.has_work():
        e.step()
    want = tiny_llm.generate([prompt], max_new_tokens=6, temperature=0, ignore_eos=True)[0].token_ids
    assert req.output_ids == want


def test_the_draft_and_the_seed_policy_are_parts_of_the_engine():
    draft = tiny_model()
    e = engine(draft=DraftModel("tiny", draft, eager_steps(draft)), speculative="draft:tiny",
               seed_policy=iter(range(100, 200)).__next__)
    assert e.draft.name == "tiny" and e.draft.model is draft
    assert draft.kv_cache is not None and draft.kv_cache.batch_size == 2  # slots mirror the target's
    req = e.submit([5, 6, 7], SamplingParams(temperature=0.9), GenerationConfig(max_new_tokens=3))
    assert req.params.seed == 100  # an unseeded request draws from the policy
    with pytest.raises(FastDecodeError, match="needs the draft model 'other' passed as draft="):
        engine(speculative="draft:other")


def test_the_runner_returns_outputs_and_leaves_request_state_to_the_engine():
    e = engine()
    req = e.submit(list(range(3, 13)), GREEDY, GenerationConfig(max_new_tokens=4, ignore_eos=True))
    e.scheduler.add(e._inbox.popleft())
    plan = e.scheduler.schedule()
    e.runner.assign(req)
    out, = e.runner.prefill(plan.prefill, plan.chunks[0])
    assert (req.pos, req.prefilled, req.forwards, req.output_ids) == (0, 0, 0, [])  # untouched by the runner
    assert (out.request, out.written, out.prefilled, out.forwards, len(out.tokens)) == (req, 10, 10, 1, 1)
    e._apply(out, 0.0)
    assert (req.pos, req.prefilled, req.forwards, req.output_ids) == (10, 10, 1, out.tokens)
    out, = e.runner.decode([req], [([], 0)])
    assert req.pos == 10 and out.written == 1 and len(out.tokens) == 1


def test_compile_imports_nothing_from_the_engine():
    for path in (SRC / "compile").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level:
                assert not (node.module or "").startswith("engine"), (path.name, node.module)


def test_one_check_names_the_prompt_as_the_caller_does():
    e = engine()
    cfg = GenerationConfig(max_new_tokens=4)
    for prompt, words in (([], "prompt 2 is empty"), ([5, 999], "prompt 2 has token id 999, outside"),
                          ([5, True], "prompt 2 has True, which is not a token id"),
                          ([5] * 62, "prompt 2 has 62 tokens; with max_new_tokens=4 it needs 65 cache positions "
                                     "> max_seq_len=64")):
        with pytest.raises(FastDecodeError, match=words):
            e.check(prompt, GREEDY, cfg, "prompt 2")
    import numpy as np

    assert e.check(np.array([5, 6]), GREEDY, cfg) == [5, 6] and type(e.check(np.array([5]), GREEDY, cfg)[0]) is int
    assert len(e.check([5] * 61, GREEDY, cfg)) == 61  # the 4th new token is never fed back: 64 positions


def test_a_stream_queues_all_of_its_requests_or_none():
    e = engine()
    cfg = GenerationConfig(max_new_tokens=3, ignore_eos=True)
    with pytest.raises(FastDecodeError, match="prompt 1 has token id 300"):
        RequestStream(e).submit([[5, 6], [300]], GREEDY, cfg, names=["prompt 0", "prompt 1"])
    assert not e.has_work()  # the first one was never queued
    s = RequestStream(e).submit([[5, 6], [7]], GREEDY, cfg)
    got = {0: [], 1: []}
    while not all(r.finished for r in s.requests):
        for i, out in s.next_step():
            got[i] += out.token_ids
    assert [got[0], got[1]] == [r.output_ids for r in s.requests] and all(len(v) == 3 for v in got.values())


def test_the_async_stream_and_generate_async_read_the_same_outputs():
    e = engine()
    cfg = GenerationConfig(max_new_tokens=5, ignore_eos=True)

    async def both():
        s = RequestStream(e, asyncio.get_running_loop()).submit([[5, 6, 7]], GREEDY, cfg)
        e.start()
        streamed = [t async for _, out in s.outputs() for t in out.token_ids]
        single = [t async for out in e.generate_async([5, 6, 7], GREEDY, cfg) for t in out.token_ids]
        return streamed, single

    try:
        streamed, single = asyncio.run(both())
    finally:
        e.close()
    assert streamed == single and len(streamed) == 5


def test_engine_thread_reports_loading_then_runs_the_loop(tiny_llm):
    seen = []
    done = threading.Event()

    def on_loaded(llm, error):
        seen.append((llm, error))
        done.set()

    t = EngineThread(lambda: fastdecode.load("tiny", max_batch_size=1), on_loaded=on_loaded)
    t.start()
    llm = t.wait(120)
    assert done.wait(5) and seen == [(llm, None)]
    assert llm.generate([[5, 6]], max_new_tokens=3, temperature=0)[0].token_ids == \
        tiny_llm.generate([[5, 6]], max_new_tokens=3, temperature=0)[0].token_ids
    llm.engine.close()
    failed = EngineThread(lambda: fastdecode.load("no-such-model"), on_loaded=lambda llm, e: seen.append((llm, e)))
    failed.start()
    with pytest.raises(FastDecodeError, match="no-such-model"):
        failed.wait(60)
    failed.join(5)
    assert seen[-1][0] is None and isinstance(seen[-1][1], FastDecodeError)
