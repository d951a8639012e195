"""Speculative decoding with a draft model: greedy output identical to plain
decoding, sampled output distributed as plain decoding's, stopping inside
accepted drafts, and the settings it refuses."""

import pytest
import torch

import fastdecode
from fastdecode import FastDecodeError, GenerationConfig, SamplingParams

TEXT = "the cat sat on the mat and the dog sat on the log. " * 3
PROMPTS = [TEXT, "abc", TEXT[:40], "x" * 30]


@pytest.fixture(scope="module")
def gemma_draft():
    """The tiny model drafted by another architecture with the same vocabulary."""
    return fastdecode.load("tiny", max_batch_size=4, speculative="draft:tiny-gemma3")


def perturb(model) -> None:
    """The same perturbation of the output head every time."""
    g = torch.Generator().manual_seed(0)
    w = model.output.weight
    w.add_(torch.randn(w.shape, generator=g) * w.std() * 0.5)


@pytest.fixture(scope="module")
def near_draft():
    """The tiny model drafted by a perturbed copy of itself: q close to p but not equal."""
    llm = fastdecode.load("tiny", max_batch_size=32, speculative="draft:tiny")
    perturb(llm.draft.model)
    return llm


@pytest.fixture(scope="module")
def compiled_draft():
    llm = fastdecode.load("tiny", compile="decode", max_batch_size=4, speculative="draft:tiny-gemma3")
    llm.steps.warmup()
    return llm


@pytest.mark.parametrize("which", ["gemma_draft", "near_draft", "compiled_draft"])
@pytest.mark.parametrize("opts", [dict(temperature=0), dict(temperature=0, repetition_penalty=1.2, min_new_tokens=12,
                                                              logit_bias={101: 2.0})])
def test_greedy_tokens_are_identical(which, opts, request):
    llm = request.getfixturevalue(which)
    for prompts in (PROMPTS[:1], PROMPTS):  # batch 1, and a mixed batch
        plain = llm.generate(prompts, max_new_tokens=40, ignore_eos=True, speculative="none", **opts)
        spec = llm.generate(prompts, max_new_tokens=40, ignore_eos=True, **opts)
        assert [c.token_ids for c in spec] == [c.token_ids for c in plain]
    assert sum(c.draft_tokens for c in spec) > 0
    if which == "near_draft":  # a close draft is mostly accepted: fewer target forwards than tokens
        assert spec[0].accepted_tokens > 0 and spec[0].target_forwards < spec[0].completion_tokens


def test_mixed_batch_with_plain_and_lookup_rows(gemma_draft):
    """Rows with other modes decode in the same steps as draft-model rows."""
    llm = gemma_draft
    modes = ["draft:tiny-gemma3", "none", "prompt-lookup", "draft:tiny-gemma3"]
    cfg = dict(max_new_tokens=30, ignore_eos=True)
    reqs = [llm.engine.submit(llm.tokenizer.encode(p), SamplingParams(temperature=0),
                              GenerationConfig(speculative=m, **cfg)) for p, m in zip(PROMPTS, modes)]
    while llm.engine.has_work():
        llm.engine.step()
    plain = llm.generate(PROMPTS, temperature=0, speculative="none", **cfg)
    assert [r.output_ids for r in reqs] == [c.token_ids for c in plain]


def sample_tokens(llm, n: int, first_seed: int, **mode) -> list[list[int]]:
    """n seeded requests (seeds first_seed, first_seed + 1, ...) of 3 tokens each, through the engine."""
    eng = llm.engine
    cfg = GenerationConfig(max_new_tokens=3, ignore_eos=True, **mode)
    prompt = llm.tokenizer.encode(TEXT[:60])
    reqs = [eng.submit(prompt, SamplingParams(temperature=1.0, top_k=8, seed=first_seed + s), cfg)
            for s in range(n)]
    while eng.has_work():
        eng.step()
    return [r.output_ids for r in reqs], reqs


def chi_square_p(a: list[int], b: list[int]) -> float:
    """Two-sample chi-square test of homogeneity on categorical samples a and b
    (categories with fewer than 10 pooled draws merged); returns the p-value."""
    cats = sorted(set(a) | set(b))
    counts = {c: (a.count(c), b.count(c)) for c in cats}
    rare = [c for c in cats if sum(counts[c]) < 10]
    table = [counts[c] for c in cats if c not in rare]
    merged = (sum(counts[c][0] for c in rare), sum(counts[c][1] for c in rare))
    if sum(merged) > 0:
        table.append(merged)
    t = torch.tensor(table, dtype=torch.float64)  # [K, 2]
    expected = t.sum(1, keepdim=True) * t.sum(0, keepdim=True) / t.sum()
    stat = ((t - expected) ** 2 / expected).sum()
    df = t.shape[0] - 1
    return torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64), stat / 2).item()


ALPHA = 1e-3  # significance of each test


def test_seeded_sampling_follows_the_plain_distribution(near_draft):
    """Tokens 2 and 3 (the first ones speculation produces; token 1 comes from the
    prefill) over 2000 seeds, against plain decoding's over 2000 other seeds:
    independent samples (with the same seeds, the draft's draws would track the
    plain run's and hide differences)."""
    n = 2000
    plain, _ = sample_tokens(near_draft, n, 0, speculative="none")
    spec, reqs = sample_tokens(near_draft, n, n)
    drafted = sum(r.spec.drafted for r in reqs)
    accepted = sum(r.spec.accepted for r in reqs)
    assert 0.2 * drafted < accepted < drafted  # both accepting and resampling ran
    for i in (1, 2):
        p = chi_square_p([t[i] for t in plain], [t[i] for t in spec])
        assert p > ALPHA, (i, p)
    # Control: the draft model's own samples differ from the target's, and the test sees it
    # (the draft is a model and its steps, not an LLM: the same perturbed model, loaded alone).
    draft_alone = fastdecode.load("tiny", max_batch_size=32)
    perturb(draft_alone.model)
    assert torch.equal(draft_alone.model.output.weight, near_draft.draft.model.output.weight)
    alone, _ = sample_tokens(draft_alone, n, 2 * n, speculative="none")
    assert min(chi_square_p([t[i] for t in plain], [t[i] for t in alone]) for i in (1, 2)) < ALPHA


def test_eos_and_stop_inside_accepted_drafts(near_draft):
    llm = near_draft
    free = llm.generate([TEXT], max_new_tokens=40, temperature=0, ignore_eos=True, speculative="none")[0]
    for cut in range(2, 30, 4):
        for opts in (dict(eos_token_ids=[free.token_ids[cut]]), dict(stop=[free.text[cut:cut + 2]], ignore_eos=True)):
            plain = llm.generate([TEXT], max_new_tokens=40, temperature=0, speculative="none", **opts)[0]
            spec = llm.generate([TEXT], max_new_tokens=40, temperature=0, **opts)[0]
            assert (spec.text, spec.token_ids, spec.finish_reason) == (plain.text, plain.token_ids,
                                                                       plain.finish_reason)
    for n in (1, 2, 3, 7, 19):
        for t in (0, 0.9):
            c = llm.generate([TEXT], max_new_tokens=n, temperature=t, seed=1, ignore_eos=True)[0]
            assert len(c.token_ids) == n


def test_bad_draft_settings(gemma_draft):
    with pytest.raises(FastDecodeError, match="vocabulary has 49152 tokens but the target's has 260") as e:
        fastdecode.load("tiny", max_batch_size=1, max_seq_len=64, speculative="draft:random-smollm2-135m")
    assert "\n" not in str(e.value)
    with pytest.raises(FastDecodeError, match="names no draft model"):
        fastdecode.load("tiny", speculative="draft:")
    with pytest.raises(FastDecodeError, match="draft model 'no-such-model'"):
        fastdecode.load("tiny", speculative="draft:no-such-model")
    with pytest.raises(FastDecodeError, match="needs that draft model loaded"):
        gemma_draft.generate("x", speculative="draft:tiny")
    plain = fastdecode.load("tiny", max_batch_size=1)
    with pytest.raises(FastDecodeError, match="was loaded with 'none'"):
        plain.generate("x", speculative="draft:tiny")
