"""Speculative decoding by prompt lookup: the same tokens as plain decoding."""

import pytest

import fastdecode
from fastdecode import FastDecodeError
from fastdecode.engine.speculative import PromptLookup

TEXT = "the cat sat on the mat and the dog sat on the log. " * 3
PROMPTS = [TEXT, "abc", TEXT[:40], "x" * 30]


@pytest.fixture(scope="module")
def eager():
    return fastdecode.load("tiny", max_batch_size=4)


@pytest.fixture(scope="module")
def compiled():
    llm = fastdecode.load("tiny", compile="decode", max_batch_size=4)
    llm.steps.warmup()
    return llm


def both(llm, prompts, **opts):
    plain = llm.generate(prompts, **opts)
    spec = llm.generate(prompts, speculative="prompt-lookup", **opts)
    return plain, spec


@pytest.mark.parametrize("which", ["eager", "compiled"])
@pytest.mark.parametrize("opts", [dict(temperature=0), dict(temperature=0.3, top_k=5, seed=7),
                                  dict(temperature=0.5, repetition_penalty=1.1, min_new_tokens=10, seed=3)])
def test_same_tokens_with_and_without_speculation(which, opts, eager, compiled):
    llm = eager if which == "eager" else compiled
    for prompts in (PROMPTS[:1], PROMPTS):  # batch 1, and a mixed batch
        plain, spec = both(llm, prompts, max_new_tokens=40, ignore_eos=True, **opts)
        assert [c.token_ids for c in spec] == [c.token_ids for c in plain]
    if opts["temperature"] == 0:
        assert spec[0].accepted_tokens > 0 and spec[0].target_forwards < spec[0].completion_tokens


def test_seeded_sampling_matches_over_many_seeds(eager):
    """Each token is drawn from the target's distribution with the request's own
    draws in order, so each seed gives the same tokens: stronger than matching
    distributions."""
    drafted = 0
    for seed in range(20):
        plain, spec = both(eager, [TEXT], max_new_tokens=16, temperature=0.4, top_p=0.9, seed=seed, ignore_eos=True)
        assert spec[0].token_ids == plain[0].token_ids, seed
        drafted += spec[0].draft_tokens
    assert drafted > 0  # the verify path ran


def test_eos_and_stop_inside_accepted_drafts_end_at_the_right_token(eager):
    free = eager.generate([TEXT], max_new_tokens=40, temperature=0, ignore_eos=True)[0]
    for cut in range(2, 30, 3):
        eos = free.token_ids[cut]
        plain, spec = both(eager, [TEXT], max_new_tokens=40, temperature=0, eos_token_ids=[eos])
        assert spec[0].token_ids == plain[0].token_ids and spec[0].finish_reason == plain[0].finish_reason
        stop = free.text[cut:cut + 2]
        plain, spec = both(eager, [TEXT], max_new_tokens=40, temperature=0, stop=[stop], ignore_eos=True)
        assert spec[0].text == plain[0].text and spec[0].finish_reason == plain[0].finish_reason
    for n in range(1, 24):
        spec = eager.generate([TEXT], max_new_tokens=n, temperature=0, ignore_eos=True, speculative="prompt-lookup")
        assert len(spec[0].token_ids) == n


def test_prompt_lookup_proposes_the_latest_continuation_and_adapts():
    pl = PromptLookup([1, 2, 3, 9, 1, 2, 3, 7, 5, 1, 2, 3], ngram_size=3, max_k=4)
    assert pl.propose(4) == [7, 5, 1, 2]  # after the latest earlier "1 2 3"
    assert pl.propose(2) == [7, 5]
    pl.update(4, 0)
    assert pl.k == 3
    for drafted in (3, 2, 1):
        pl.update(drafted, 0)
    assert pl.k == 0 and pl.propose(4) == []  # backing off: plain decoding for a while
    for _ in range(10):
        pl.propose(4)
    assert pl.k == 1
    pl.update(1, 1)
    assert pl.k == 2
    assert PromptLookup([4, 5, 6], 3, 4).propose(4) == []  # no earlier occurrence


@pytest.mark.parametrize("opts, match", [
    (dict(speculative="draft:smollm2"), "needs that draft model loaded"),
    (dict(speculative="fast"), "not a mode"),
    (dict(num_draft_tokens=0), "num_draft_tokens"), (dict(num_draft_tokens=17), "num_draft_tokens"),
    (dict(ngram_size=0), "ngram_size"),
])
def test_bad_speculative_settings(eager, opts, match):
    with pytest.raises(FastDecodeError, match=match) as e:
        eager.generate("x", **opts)
    assert "\n" not in str(e.value)
    with pytest.raises(FastDecodeError, match="not a mode"):
        fastdecode.load("tiny", speculative="fast")
