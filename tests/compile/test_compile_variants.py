"""Compiled steps and exported packages of a model with sliding-window layers and the
other Gemma 3 differences (the `tiny-gemma3` preset), against eager.

Sliding and global blocks differ in a constant (the window) and in their RoPE
tables, so Dynamo traces the nested block region once per kind; after warm-up no
request, of any length or batch, compiles again.
"""

import random

import pytest
from torch._dynamo.utils import counters

import fastdecode

MAX_BATCH = 3


@pytest.fixture(scope="module")
def eager():
    return fastdecode.load("tiny-gemma3", max_batch_size=MAX_BATCH, compiled=None)


def requests(n=8):
    """Prompts of 1..60 tokens (the window is 16) with up to 24 new tokens, greedy and sampled."""
    rng = random.Random(0)
    out = []
    for i in range(n):
        prompts = [[rng.randrange(3, 256) for _ in range(rng.randint(1, 60))] for _ in range(1 + i % MAX_BATCH)]
        opts = dict(temperature=0) if i % 2 else dict(temperature=0.8, top_p=0.9, seed=i)
        out.append((prompts, dict(max_new_tokens=rng.choice([3, 24]), **opts)))
    return out


def ids(completions):
    return [c.token_ids for c in completions]


def test_compiled_equals_eager_without_recompiles(eager):
    llm = fastdecode.load("tiny-gemma3", compile="decode", max_batch_size=MAX_BATCH, compiled=None)
    llm.steps.warmup()
    after_warmup = counters["stats"]["unique_graphs"]
    for i, (prompts, opts) in enumerate(requests()):
        assert ids(llm.generate(prompts, **opts)) == ids(eager.generate(prompts, **opts)), i
    assert counters["stats"]["unique_graphs"] == after_warmup


def test_exported_package_equals_eager(eager, tmp_path):
    from fastdecode.compile.aot import export_package

    path = tmp_path / "gemma.pt2"
    meta = export_package(eager.model, path)
    assert "attention" in meta["kernels"].split(",") or not eager.kernels.ops
    llm = fastdecode.load("tiny-gemma3", compiled=str(path), max_batch_size=MAX_BATCH)
    for i, (prompts, opts) in enumerate(requests(6)):
        assert ids(llm.generate(prompts, **opts)) == ids(eager.generate(prompts, **opts)), i
    with pytest.raises(fastdecode.FastDecodeError, match=r"different model: .*sliding_window=16 \(this model: None\)"):
        fastdecode.load("tiny", compiled=str(path))
