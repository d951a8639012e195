import pytest
import torch

import fastdecode
from fastdecode import FastDecodeError, GenerationConfig

PROMPTS = ["Hello", "The quick brown fox jumps", "a", "Once upon a time, in a land far away"]


def greedy(llm, prompts, **kw):
    kw.setdefault("max_new_tokens", 24)
    return llm.generate(prompts, temperature=0, **kw)


def test_ragged_batch_equals_single_prompts(tiny_llm):
    batch = greedy(tiny_llm, PROMPTS, ignore_eos=True)
    for prompt, got in zip(PROMPTS, batch):
        alone = greedy(tiny_llm, prompt, ignore_eos=True)[0]
        assert got.token_ids == alone.token_ids
        assert got.text == alone.text


def test_dynamic_cache_equals_static():
    dyn = fastdecode.load("tiny", cache="dynamic")
    stat = fastdecode.load("tiny")
    a = greedy(dyn, PROMPTS, ignore_eos=True)
    b = greedy(stat, PROMPTS, ignore_eos=True)
    assert [c.token_ids for c in a] == [c.token_ids for c in b]


def test_seed_reproduces_and_differs(tiny_llm):
    kw = dict(max_new_tokens=30, temperature=1.0, top_p=0.95, ignore_eos=True)
    a = tiny_llm.generate(PROMPTS[:2], seed=11, **kw)
    b = tiny_llm.generate(PROMPTS[:2], seed=11, **kw)
    c = tiny_llm.generate(PROMPTS[:2], seed=12, **kw)
    assert [x.token_ids for x in a] == [x.token_ids for x in b]
    assert [x.token_ids for x in a] != [x.token_ids for x in c]


def test_max_new_tokens_gives_length(tiny_llm):
    out = greedy(tiny_llm, PROMPTS, max_new_tokens=9, ignore_eos=True)
    assert all(len(c.token_ids) == 9 and c.finish_reason == "length" for c in out)
    assert all(c.completion_tokens == 9 and c.prompt_tokens > 0 for c in out)


def first_tokens(llm, prompt, n=12):
    return greedy(llm, prompt, max_new_tokens=n, ignore_eos=True)[0].token_ids


def test_eos_stops_a_row_and_others_continue(tiny_llm):
    free = [first_tokens(tiny_llm, p) for p in PROMPTS[:2]]
    eos = free[0][3]  # row 0 emits this token at step 3
    assert eos not in free[1], "pick prompts whose outputs do not share the token"
    out = greedy(tiny_llm, PROMPTS[:2], max_new_tokens=12, eos_token_ids={eos})
    assert out[0].finish_reason == "stop" and out[0].token_ids == free[0][:free[0].index(eos)]
    assert out[1].finish_reason == "length" and out[1].token_ids == free[1]


def test_ignore_eos_runs_through(tiny_llm):
    free = first_tokens(tiny_llm, PROMPTS[0])
    out = greedy(tiny_llm, PROMPTS[0], max_new_tokens=12, eos_token_ids={free[2]}, ignore_eos=True)[0]
    assert out.token_ids == free and out.finish_reason == "length"


def test_min_new_tokens_suppresses_eos(tiny_llm):
    free = first_tokens(tiny_llm, PROMPTS[0])
    eos = free[0]
    out = greedy(tiny_llm, PROMPTS[0], max_new_tokens=12, eos_token_ids={eos}, min_new_tokens=4)[0]
    assert len(out.token_ids) >= 4 and eos not in out.token_ids[:4]
    assert greedy(tiny_llm, PROMPTS[0], max_new_tokens=12, eos_token_ids={eos})[0].token_ids == []


def test_stop_string_cuts_text(tiny_llm):
    # Pick a printable run from a free generation as the stop string.
    llm = tiny_llm
    for prompt in PROMPTS:
        free = greedy(llm, prompt, max_new_tokens=40, ignore_eos=True)[0]
        text = free.text
        spots = [i for i in range(2, len(text) - 2) if "\ufffd" not in text[i - 1:i + 3]]
        if spots:
            break
    i = spots[0]
    stop = text[i:i + 2]
    cut = text.find(stop)
    out = greedy(llm, prompt, max_new_tokens=40, stop=[stop, "\x00never"], ignore_eos=True)[0]
    assert out.finish_reason == "stop"
    assert out.text == text[:cut]
    assert len(out.token_ids) < 40
    assert "".join(llm.stream(prompt, max_new_tokens=40, temperature=0, stop=stop, ignore_eos=True)) == out.text


def test_stream_pieces_join_to_text(tiny_llm):
    kw = dict(max_new_tokens=40, temperature=1.0, seed=5, ignore_eos=True)
    pieces = list(tiny_llm.stream("Stream me", **kw))
    full = tiny_llm.generate("Stream me", **kw)[0]
    assert "".join(pieces) == full.text
    for p in pieces:
        p.encode("utf-8")  # no lone surrogates


def test_completion_reports_timing_and_memory(tiny_llm):
    c = greedy(tiny_llm, "timing", max_new_tokens=8, ignore_eos=True)[0]
    assert c.time_to_first_token_s > 0 and c.decode_tokens_per_s > 0 and c.peak_memory_bytes > 0


def test_more_prompts_than_slots_wait_their_turn():
    llm = fastdecode.load("tiny", max_batch_size=2)
    prompts = [f"prompt number {i}" for i in range(5)]
    out = greedy(llm, prompts, max_new_tokens=6, ignore_eos=True)
    assert [c.token_ids for c in out] == [greedy(llm, p, max_new_tokens=6, ignore_eos=True)[0].token_ids
                                          for p in prompts]
    assert llm.engine.slots_in_use == 0 and llm.engine.queue_length == 0


@pytest.mark.parametrize("prompts, options, match", [
    ("", {}, "the prompt is empty"),
    ([], {}, "non-empty"),
    (["ok", ""], {}, "prompt 1 is empty"),
    ([[1, 2], []], {}, "prompt 1 is empty"),
    ([5, 999], {}, "outside the vocabulary"),
    ([-1], {}, "outside the vocabulary"),
    ([[1], 2], {}, "prompt 1 has type int"),
    ("x" * 500, {"max_new_tokens": 20}, "max_seq_len"),
    ([[]], {}, "the prompt is empty"),
    ("x", {"max_new_tokens": 0}, "max_new_tokens"),
    ("x", {"max_new_tokens": -3}, "max_new_tokens"),
    ("x", {"min_new_tokens": 50, "max_new_tokens": 10}, "min_new_tokens"),
    ("x", {"top_k": 0}, "top_k"),
    ("x", {"temprature": 1.0}, "unknown option"),
    ("x", {"stop": [""]}, "stop"),
    ("a\ud800b", {}, r"lone surrogate '\\ud800' at character 1, which is not Unicode text"),
    ("x", {"seed": 2**64}, r"seed=18446744073709551616 is out of range; accepted: an integer in \[-2\*\*63"),
    ("x", {"ignore_eos": "yes"}, "ignore_eos must be true or false"),
])
def test_bad_input_is_refused_before_work(tiny_llm, prompts, options, match):
    with pytest.raises(FastDecodeError, match=match) as e:
        tiny_llm.generate(prompts, **options)
    assert "\n" not in str(e.value)


def test_generation_config_validation():
    assert GenerationConfig(stop="x").stop == ("x",)
    with pytest.raises(FastDecodeError):
        GenerationConfig(max_new_tokens=True)


def test_iterating_a_run_does_not_leak_inference_mode(tiny_llm):
    run = tiny_llm.start("leak", fastdecode.SamplingParams(temperature=0),
                         GenerationConfig(max_new_tokens=4, ignore_eos=True))
    next(iter(run))  # suspended mid-generation
    assert not torch.is_inference_mode_enabled()
    for _ in run:
        assert not torch.is_inference_mode_enabled()


def test_chat_continues_the_final_message(tiny_llm):
    partial = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Once upon"}]
    prompt = tiny_llm.chat_prompt(partial, add_generation_prompt=False, continue_final_message=True)
    assert tiny_llm.tokenizer.decode(prompt) == "<|user|>hi\n<|assistant|>Once upon"
    got = tiny_llm.chat(partial, continue_final_message=True, temperature=0, max_new_tokens=6)
    assert got.text == tiny_llm.generate([prompt], temperature=0, max_new_tokens=6)[0].text
    # without it the final message is a finished turn, and a new one opens
    assert tiny_llm.tokenizer.decode(tiny_llm.chat_prompt(partial)).endswith("Once upon\n<|assistant|>")
