"""Compiled strategies against eager, on the tiny model.

Each Inductor compile costs seconds on a small CPU, so the module compiles one
`generate`-strategy LLM; the `decode` strategy is the same compiled step
without the chunk decoder, so it reuses those graphs.
"""

import dataclasses
import random

import pytest
import torch
from torch._dynamo.utils import counters

import fastdecode
from fastdecode.errors import FastDecodeError

MAX_BATCH = 4
SAMPLED = dict(temperature=0.9, top_k=40, top_p=0.9, min_p=0.02, repetition_penalty=1.2,
               frequency_penalty=0.3, presence_penalty=0.2, seed=11)


@pytest.fixture(scope="module")
def eager():
    return fastdecode.load("tiny", max_batch_size=MAX_BATCH)


@pytest.fixture(scope="module")
def compiled():
    llm = fastdecode.load("tiny", compile="generate", max_batch_size=MAX_BATCH)
    llm.steps.warmup()
    return llm


def graphs() -> int:
    return counters["stats"]["unique_graphs"]


def ids(completions):
    return [c.token_ids for c in completions]


def requests(n: int = 20):
    """n mixed requests: batch sizes 1..MAX_BATCH, prompt lengths 1..40 with
    1..19 new tokens (two chunks and a tail), and every fifth prompt longer than
    a prefill chunk; odd requests greedy, even ones sampled with every option."""
    rng = random.Random(0)
    out = []
    for i in range(n):
        B = 1 + i % MAX_BATCH
        lengths = (250, 300) if i % 5 == 4 else (1, 40)
        prompts = [[rng.randrange(3, 256) for _ in range(rng.randint(*lengths))] for _ in range(B)]
        opts = dict(temperature=0) if i % 2 else dict(SAMPLED)
        out.append((prompts, dict(max_new_tokens=rng.choice([1, 3, 9, 19]), **opts)))
    return out


@pytest.fixture(scope="module")
def expected(eager):
    """Eager outputs of requests(), computed once for both strategies."""
    return [ids(eager.generate(prompts, **opts)) for prompts, opts in requests()]


def eos_inside(eager, prompts, max_new):
    """An EOS id that row 0 emits part-way (so row 0 finishes early, inside a chunk)."""
    free = eager.generate(prompts, max_new_tokens=max_new, temperature=0, ignore_eos=True)
    row0 = free[0].token_ids
    return row0[min(5, len(row0) - 1)]


@pytest.mark.parametrize("strategy", ["decode", "generate"])
def test_compiled_equals_eager_without_recompiles(eager, expected, compiled, strategy, monkeypatch):
    llm = compiled
    if strategy == "decode":  # what make_steps(model, "decode") builds, on the same graphs
        monkeypatch.setattr(llm.engine.runner, "steps", dataclasses.replace(llm.steps, chunk=None))
    after_warmup = graphs()

    for i, (prompts, opts) in enumerate(requests()):
        assert ids(llm.generate(prompts, **opts)) == expected[i], (i, strategy)

    # Rows that finish early, an EOS inside a chunk, and min_new_tokens holding EOS back.
    prompts = [[5, 6, 7], [40, 41, 42, 43, 44, 45], [9] * 20]
    eos = eos_inside(eager, prompts, 20)
    for opts in (dict(temperature=0), dict(SAMPLED), dict(temperature=0, min_new_tokens=12)):
        a = eager.generate(prompts, max_new_tokens=20, eos_token_ids=[eos], **opts)
        b = llm.generate(prompts, max_new_tokens=20, eos_token_ids=[eos], **opts)
        assert ids(a) == ids(b)
        assert [c.finish_reason for c in a] == [c.finish_reason for c in b]
    assert len(a[0].token_ids) >= 12  # min_new_tokens was honoured
    first = eager.generate(prompts, max_new_tokens=20, eos_token_ids=[eos], temperature=0)
    assert first[0].finish_reason == "stop" and len(first[0].token_ids) < 20

    assert graphs() == after_warmup  # counted by Dynamo: no recompiles after warm-up


def test_one_graph_serves_every_shape():
    # No prefix reuse: the prompts share prefixes, and this counts the shapes each step gets.
    llm = fastdecode.load("tiny", compile="decode", max_batch_size=MAX_BATCH, prefix_cache=False)
    before = graphs()
    llm.steps.warmup()
    assert graphs() == before + 1  # each model's step has code of its own (compile.own_code)
    compiled = llm.steps.step.__self__  # the CompiledSteps behind the engine's step
    real, calls = compiled._step, []
    compiled._step = lambda *args: calls.append(args[0].shape) or real(*args)
    for B, T in ((1, 1), (3, 1), (1, 30), (4, 7)):
        llm.generate([[5] * T] * B, max_new_tokens=3, temperature=0)
    assert graphs() == before + 1
    # Every step ran through the compiled graph: prefill [B, T], then decode [B, 1] twice.
    assert calls == [s for B, T in ((1, 1), (3, 1), (1, 30), (4, 7))
                     for s in (torch.Size([B, T]), torch.Size([B, 1]), torch.Size([B, 1]))]


def test_decode_strategy_builds_steps_without_chunks():
    from fastdecode.compile.strategies import make_steps

    llm = fastdecode.load("tiny")
    steps = make_steps(llm.model, "decode")  # compiles lazily: nothing runs here
    assert steps.chunk is None and callable(steps.step)
    assert make_steps(llm.model, "generate").chunk is not None


def test_unknown_strategy_is_rejected():
    with pytest.raises(FastDecodeError, match="unknown compile strategy 'fast'"):
        fastdecode.load("tiny", compile="fast")


def test_compiled_needs_static_cache():
    with pytest.raises(FastDecodeError, match="cache='static'"):
        fastdecode.load("tiny", compile="decode", cache="dynamic")


def test_gemv_kernel_matches_linear():
    from fastdecode.kernels import load_kernels
    from fastdecode.kernels.linear import gemv_linear
    from fastdecode.quant.transform import native_ops, set_gemv

    if not load_kernels():
        pytest.skip("native kernel unavailable here (no compiler or no AVX2)")
    g = torch.Generator().manual_seed(0)
    for M, K, N in ((1, 64, 37), (3, 72, 16), (8, 576, 5), (12, 40, 9)):
        x, w, b = torch.randn(M, K, generator=g), torch.randn(N, K, generator=g), torch.randn(N, generator=g)
        torch.testing.assert_close(gemv_linear(x, w, b), torch.nn.functional.linear(x, w, b))

    llm = fastdecode.load("tiny")
    set_gemv(llm.model, False)
    ref = ids(llm.generate([[1, 2, 3], [4, 5]], max_new_tokens=12, temperature=0))
    set_gemv(llm.model, True)
    assert "gemv" in native_ops(llm.model)
    assert ids(llm.generate([[1, 2, 3], [4, 5]], max_new_tokens=12, temperature=0)) == ref
    set_gemv(llm.model, False)
    assert "gemv" not in native_ops(llm.model)
