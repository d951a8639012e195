"""Prefix caching (engine/prefix_cache.py): a prompt reuses the KV rows of the longest
prefix a slot holds, and the tokens are exactly those of a cold run.

The model is the tiny preset quantized to int8 at load, so its matmuls run on the
native kernels, whose rows do not depend on the chunk or batch they are computed in
(skipped where those kernels cannot build)."""

import random

import pytest

import fastdecode
from fastdecode import FastDecodeError

CHUNK = 16  # small prefill chunks, so prefixes end mid-chunk


def load(**kw):
    kw = {"max_batch_size": 3, **kw}
    return fastdecode.load("tiny", weights="int8", max_seq_len=512, prefill_chunk=CHUNK, **kw)


@pytest.fixture(scope="module")
def on():
    llm = load()
    if not llm.kernels.quant.startswith("native"):
        pytest.skip(f"needs the native kernels: {llm.kernels.reason}")
    return llm


@pytest.fixture(scope="module")
def off():
    return load(prefix_cache=False)


def tokens(n, seed):
    rng = random.Random(seed)
    return [rng.randrange(3, 256) for _ in range(n)]


OPTIONS = [dict(temperature=0), dict(temperature=0.9, top_p=0.9, seed=7)]


def clear(llm):
    """Forget what the slots hold (fresh requests of unrelated tokens fill every slot)."""
    llm.generate([tokens(5, 1000 + i) for i in range(llm.max_batch_size)], max_new_tokens=1, temperature=0)


@pytest.mark.parametrize("opts", OPTIONS, ids=["greedy", "seeded"])
def test_next_turn_reuses_the_conversation_and_matches_a_cold_run(on, off, opts):
    clear(on)
    first = tokens(41, 1)  # ends mid-chunk
    reply = on.generate([first], max_new_tokens=12, ignore_eos=True, **opts)[0]
    assert reply.cached_tokens == 0
    turn = first + reply.token_ids + tokens(9, 2)
    hit = on.generate([turn], max_new_tokens=16, **opts)[0]
    cold = off.generate([turn], max_new_tokens=16, **opts)[0]
    # The first reply's last token was never fed to the model, so its row is not there.
    assert hit.cached_tokens == len(first) + len(reply.token_ids) - 1
    assert cold.cached_tokens == 0
    assert hit.token_ids == cold.token_ids


def test_full_prompt_hit_still_computes_the_last_token(on, off):
    clear(on)
    prompt = tokens(37, 3)
    a = on.generate([prompt], max_new_tokens=8, temperature=0)[0]
    b = on.generate([prompt], max_new_tokens=8, temperature=0)[0]
    assert b.cached_tokens == len(prompt) - 1
    assert a.token_ids == b.token_ids == off.generate([prompt], max_new_tokens=8, temperature=0)[0].token_ids


def test_near_miss_reuses_exactly_up_to_the_difference(on, off):
    clear(on)
    prompt = tokens(60, 4)
    on.generate([prompt], max_new_tokens=2, temperature=0)
    before = on.engine.prefix.hits
    changed = list(prompt)
    changed[23] = (changed[23] + 1) % 256 or 3
    got = on.generate([changed], max_new_tokens=10, temperature=0.8, seed=2)[0]
    assert got.cached_tokens == 23 and on.engine.prefix.hits - before == 23
    assert got.token_ids == off.generate([changed], max_new_tokens=10, temperature=0.8, seed=2)[0].token_ids


def test_a_running_requests_rows_are_copied(on, off):
    """A new request whose prefix a running request holds copies its rows and matches a cold run."""
    clear(on)
    engine = on.engine
    shared = tokens(50, 5)
    split = fastdecode.api.llm.split_options
    long = engine.submit(shared + [9, 9], *split(dict(max_new_tokens=40, temperature=0)))
    while long.prefilling or not long.output_ids:
        engine.step()
    late = engine.submit(shared + [7, 7, 7], *split(dict(max_new_tokens=12, temperature=0)))
    while engine.has_work():
        engine.step()
    done = late.outputs[-1].completion
    assert done.cached_tokens == 50 and late.slot is None
    assert done.token_ids == off.generate([shared + [7, 7, 7]], max_new_tokens=12, temperature=0)[0].token_ids
    assert long.outputs[-1].completion.token_ids == \
        off.generate([shared + [9, 9]], max_new_tokens=40, temperature=0)[0].token_ids


def test_more_prefixes_than_slots_evicts_lru_and_never_reads_stale_rows(on, off):
    clear(on)
    prompts = [tokens(30, 100 + i) for i in range(7)]  # 7 distinct prefixes, 3 slots
    for p in prompts:
        on.generate([p], max_new_tokens=3, temperature=0)
    # The three most recent are held; the oldest were overwritten by later occupants.
    assert on.generate([prompts[-1]], max_new_tokens=1, temperature=0)[0].cached_tokens == 29
    assert on.generate([prompts[0]], max_new_tokens=1, temperature=0)[0].cached_tokens == 0
    for p in prompts:
        assert on.generate([p + [2]], max_new_tokens=6, temperature=0)[0].token_ids == \
            off.generate([p + [2]], max_new_tokens=6, temperature=0)[0].token_ids


def test_a_slot_taken_by_other_tokens_is_no_longer_matched(on):
    """The index follows each slot's occupant: after another request overwrote the rows, the old
    prefix is gone from it."""
    llm = load(max_batch_size=1)
    a, b = tokens(40, 6), tokens(40, 7)
    llm.generate([a], max_new_tokens=2, temperature=0)
    assert llm.engine.prefix.held[0][:40] == tuple(a)
    llm.generate([b], max_new_tokens=2, temperature=0)
    assert llm.engine.prefix.held[0][:40] == tuple(b)
    assert llm.generate([a], max_new_tokens=2, temperature=0)[0].cached_tokens == 0


def test_cache_salt_isolates(on):
    clear(on)
    prompt = tokens(30, 8)
    on.generate([prompt], max_new_tokens=2, temperature=0, cache_salt="tenant-a")
    assert on.generate([prompt], max_new_tokens=2, temperature=0, cache_salt="tenant-b")[0].cached_tokens == 0
    assert on.generate([prompt], max_new_tokens=2, temperature=0)[0].cached_tokens == 0
    assert on.generate([prompt], max_new_tokens=2, temperature=0, cache_salt="tenant-a")[0].cached_tokens == 29


def test_cancelled_partial_hit_prefill_frees_its_slot_and_keeps_the_prefix(on, off):
    clear(on)
    engine = on.engine
    split = fastdecode.api.llm.split_options
    prefix = tokens(40, 9)
    on.generate([prefix], max_new_tokens=1, temperature=0)
    r = engine.submit(prefix + tokens(100, 10), *split(dict(max_new_tokens=4, temperature=0)))
    engine.step()  # admitted with a hit, one chunk prefilled
    assert r.cached == 40 and r.prefilling
    engine.cancel(r)
    while engine.has_work():
        engine.step()
    assert r.outputs[-1].finish_reason == "abort" and engine.slots_in_use == 0
    again = on.generate([prefix + [5]], max_new_tokens=6, temperature=0)[0]
    assert again.cached_tokens == 40
    assert again.token_ids == off.generate([prefix + [5]], max_new_tokens=6, temperature=0)[0].token_ids


def test_prefix_cache_false_reuses_nothing(off):
    prompt = tokens(30, 11)
    off.generate([prompt], max_new_tokens=2, temperature=0)
    assert off.generate([prompt], max_new_tokens=2, temperature=0)[0].cached_tokens == 0
    assert off.engine.prefix is None


def test_compiled_hit_matches_cold(on):
    compiled = load(compile="decode", compiled=None)
    compiled.steps.warmup()
    clear(compiled)
    prompt = tokens(45, 12)
    first = compiled.generate([prompt], max_new_tokens=5, temperature=0, ignore_eos=True)[0]
    turn = prompt + first.token_ids + [4, 4]
    hit = compiled.generate([turn], max_new_tokens=10, temperature=0.7, seed=1)[0]
    assert hit.cached_tokens == len(prompt) + 4
    assert hit.token_ids == on.generate([turn], max_new_tokens=10, temperature=0.7, seed=1)[0].token_ids


def test_bad_prefix_cache_and_cache_salt_values():
    with pytest.raises(FastDecodeError, match="prefix_cache='yes' is not a boolean"):
        fastdecode.load("tiny", prefix_cache="yes")
    with pytest.raises(FastDecodeError, match="cache_salt must be a string"):
        fastdecode.GenerationConfig(cache_salt=3)


def test_a_shared_prefix_keeps_the_other_conversation(on, off):
    """Two conversations with one system prompt: the second copies the shared rows into a free slot
    rather than taking the first's slot, whose next turn then reuses all of it (the first's rows were
    overwritten past the system prompt while a slot stood free)."""
    clear(on)
    system = tokens(6, 5)
    a, b = system + tokens(20, 6), system + tokens(20, 7)
    reply = on.generate([a], max_new_tokens=4, temperature=0, ignore_eos=True)[0]
    assert on.generate([b], max_new_tokens=4, temperature=0)[0].cached_tokens == len(system)
    turn = a + reply.token_ids + tokens(5, 8)
    got = on.generate([turn], max_new_tokens=6, temperature=0)[0]
    assert got.cached_tokens == len(a) + len(reply.token_ids) - 1
    assert got.token_ids == off.generate([turn], max_new_tokens=6, temperature=0)[0].token_ids


def test_a_next_turn_that_renders_the_reply_otherwise_takes_its_own_slot():
    """A prompt holding the slot's last prompt whole is that conversation's next turn: its slot is
    taken in place even where the history differs from the fed reply (templates that drop the
    thinking), since the old reply is superseded; a prompt branching off inside the last prompt copies
    the shared rows into the least recently used slot instead."""
    from types import SimpleNamespace

    from fastdecode.engine.prefix_cache import PrefixIndex

    def request(prompt, fed=(), slot=None):
        return SimpleNamespace(prompt=list(prompt), slot=slot, config=SimpleNamespace(cache_salt=None),
                               params=SimpleNamespace(prompt_logprobs=None),
                               cached_tokens=lambda: list(prompt) + list(fed))

    system, a = [1, 2, 3], [1, 2, 3, 10, 11, 12]
    index = PrefixIndex(3)
    index.release(request(a, fed=[50, 51, 52], slot=1))  # a's reply, thinking included
    turn = index.place(request(a + [60, 61, 70, 71]), free=[0, 1, 2], active=[])
    assert (turn.slot, turn.reuse, turn.copy_from) == (1, len(a), None)
    index.release(request(a, fed=[50, 51, 52], slot=1))
    other = index.place(request(system + [20, 21]), free=[0, 1, 2], active=[])
    assert (other.slot, other.reuse, other.copy_from) == (0, len(system), 1)
