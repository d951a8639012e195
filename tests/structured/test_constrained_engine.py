"""Constrained decoding in the engine, on the tiny random model: whatever the weights,
the output must match. Outputs are checked with jsonschema, re.fullmatch and membership;
the languages used are finite, so every output ends (finish_reason "stop")."""

import json
import re

import jsonschema
import pytest
from torch._dynamo.utils import counters

import fastdecode
from fastdecode.engine import GenerationConfig
from fastdecode.sampling import SamplingParams
from fastdecode.structured import Constraint

EOS = 257  # the byte tokenizer's
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 8},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "minItems": 1, "maxItems": 3},
        "ok": {"type": "boolean"},
        "score": {"type": "number", "minimum": -1, "maximum": 1},
    },
    "required": ["name", "age", "tags", "ok"],
    "additionalProperties": False,
}
PROMPTS = ["Describe a person:", "x", "The JSON is", "1 2 3 4 5 6 7 8 9"]
WHITESPACE_BIAS = {32: 100.0, 10: 100.0, 9: 100.0, 13: 100.0}


@pytest.fixture(scope="module")
def eager():
    return fastdecode.load("tiny", max_batch_size=4)


def whitespace_outside_strings(text: str) -> list[tuple[str, str]]:
    """(previous char, whitespace char) for each whitespace character outside JSON strings."""
    found, in_string, escaped, prev = [], False, False, ""
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch.isspace():
            found.append((prev, ch))
        prev = ch
    return found


def check_json(c, schema=PERSON):
    assert c.finish_reason == "stop", c.text
    jsonschema.validate(json.loads(c.text), schema)
    # Only json.dumps's separators: ", " and ": ".
    assert all(prev in ",:" and ws == " " for prev, ws in whitespace_outside_strings(c.text)), c.text


@pytest.mark.parametrize("opts", [dict(temperature=0), dict(temperature=1.0, seed=3),
                                  dict(temperature=1.5, top_k=50, seed=11, repetition_penalty=1.3)])
def test_json_schema_outputs_validate(eager, opts):
    for c in eager.generate(PROMPTS, constraint=Constraint.json_schema(PERSON), max_new_tokens=200, **opts):
        check_json(c)


def test_whitespace_cannot_run_on(eager):
    # Whitespace made as likely as it can be: the grammar still allows none but ", " and ": ".
    for seed in range(3):
        c = eager.generate(["{"], constraint=Constraint.json_schema(PERSON), max_new_tokens=200,
                           temperature=0.7, seed=seed, logit_bias=WHITESPACE_BIAS)[0]
        check_json(c)
    c = eager.generate(["{"], constraint=Constraint.json_object(), max_new_tokens=12, temperature=0,
                       logit_bias=WHITESPACE_BIAS)[0]
    assert c.text.startswith("{")
    assert all(prev in ",:" and ws == " " for prev, ws in whitespace_outside_strings(c.text)), c.text


def test_regex_and_choice(eager):
    pattern = r"[A-Z][a-z]{2,5}-[0-9]{3}"
    for opts in (dict(temperature=0), dict(temperature=1.0, seed=5)):
        for c in eager.generate(PROMPTS, constraint=Constraint.regex(pattern), max_new_tokens=30, **opts):
            assert re.fullmatch(pattern, c.text) and c.finish_reason == "stop", c.text
    options = ["yes", "yesterday", "no", "maybe so"]
    seen = set()
    for seed in range(8):
        for c in eager.generate(PROMPTS, constraint=Constraint.choice(options), max_new_tokens=30,
                                temperature=1.0, seed=seed):
            assert c.text in options and c.finish_reason == "stop", c.text
            seen.add(c.text)
    assert len(seen) > 1  # sampled, not forced to one


def test_grammars_with_a_known_output(eager):
    lark = 'start: greeting " " NAME\ngreeting: "hello"\nNAME: /w[o]rl[d]/'
    gbnf = 'root ::= word word\nword ::= [f] "a" [s] [t] | "decode"'
    for spec, want in ((lark, "hello world"), (gbnf, None)):
        for c in eager.generate(PROMPTS[:2], constraint=Constraint.grammar(spec), max_new_tokens=30,
                                temperature=1.0, seed=1):
            assert c.finish_reason == "stop"
            if want is not None:
                assert c.text == want and c.completion_tokens == len(want)  # no EOS after a complete grammar
            else:
                assert c.text in ("fastfast", "fastdecode", "decodefast", "decodedecode"), c.text


def test_eos_is_allowed_exactly_where_the_grammar_accepts(eager):
    digits = Constraint.regex("[0-9]+")
    push_eos = {EOS: 100.0}
    c = eager.generate(["n:"], constraint=digits, max_new_tokens=20, temperature=0, logit_bias=push_eos)[0]
    assert re.fullmatch("[0-9]", c.text) and c.finish_reason == "stop" and c.completion_tokens == 2
    c = eager.generate(["n:"], constraint=digits, max_new_tokens=20, temperature=0, logit_bias=push_eos,
                       min_new_tokens=4)[0]
    assert re.fullmatch("[0-9]{4}", c.text) and c.finish_reason == "stop"
    # Without EOS (ignore_eos) a complete grammar still ends the request.
    c = eager.generate(["n:"], constraint=Constraint.regex("[0-9]{3}"), max_new_tokens=20, temperature=0,
                       ignore_eos=True)[0]
    assert re.fullmatch("[0-9]{3}", c.text) and c.finish_reason == "stop"
    # A grammar may name the EOS token itself: it is allowed there, and ends the request.
    c = eager.generate(["n:"], constraint=Constraint.grammar('start: "ab" <eos>'), max_new_tokens=20,
                       temperature=0)[0]
    assert c.text == "ab" and c.finish_reason == "stop" and c.completion_tokens == 3
    # max_new_tokens still comes first.
    c = eager.generate(["n:"], constraint=Constraint.json_schema(PERSON), max_new_tokens=5, temperature=0)[0]
    assert c.finish_reason == "length" and c.text.startswith('{"')


def test_a_lazy_grammar_is_free_until_its_marker(eager):
    call = Constraint.grammar('start: hd ARGS "</c>"\nhd[lazy]: /[a-z ]{0,12}/ "<c>"\nARGS: /[0-9]{2}/')
    for seed in range(4):
        c = eager.generate(["call:"], constraint=call, max_new_tokens=40, temperature=1.0, seed=seed)[0]
        assert re.fullmatch(r"[a-z ]{0,12}<c>[0-9]{2}</c>", c.text) and c.finish_reason == "stop", c.text


def test_streamed_equals_whole_and_logprobs_are_the_raw_ones(eager):
    constraint = Constraint.json_schema(PERSON)
    whole = eager.generate(["stream:"], constraint=constraint, max_new_tokens=200, temperature=0, logprobs=2)[0]
    check_json(whole)
    assert "".join(eager.stream("stream:", constraint=constraint, max_new_tokens=200, temperature=0)) == whole.text
    free = eager.generate(["stream:"], max_new_tokens=1, temperature=0, logprobs=2)[0]
    # The first token's alternatives are the model's own, not the mask's (renormalised over the
    # allowed tokens they would differ by nats). `free` is a prefix-cache hit, a one-token prefill,
    # whose float order may differ from the cold prompt's in the last bits.
    (ids, values), (free_ids, free_values) = (zip(*c.logprobs[0].top) for c in (whole, free))
    assert ids == free_ids and values == pytest.approx(free_values, abs=1e-5)


def submit(llm, prompt, max_new_tokens, ignore_eos=False, **sampling):
    config = GenerationConfig(max_new_tokens=max_new_tokens, ignore_eos=ignore_eos)
    return llm.engine.submit(llm.encode_prompts(prompt)[0], SamplingParams(**sampling), config)


def drain(llm):
    while llm.engine.has_work():
        llm.engine.step()


def test_seeded_constrained_sampling_does_not_depend_on_the_batch(eager):
    json_c, regex_c = Constraint.json_schema(PERSON), Constraint.regex("[a-z]{4,9}")
    opts = dict(temperature=1.2, top_p=0.95, max_new_tokens=120)
    alone = eager.generate(["alone"], constraint=json_c, seed=42, **opts)[0]
    check_json(alone)
    reqs = [submit(eager, "other", seed=7, **opts), submit(eager, "zzz", constraint=regex_c, seed=9, **opts),
            submit(eager, "alone", constraint=json_c, seed=42, **opts), submit(eager, "more", seed=1, **opts)]
    drain(eager)
    assert reqs[2].outputs[-1].completion.token_ids == alone.token_ids
    assert re.fullmatch("[a-z]{4,9}", reqs[1].outputs[-1].completion.text)


def test_a_constrained_prompt_joining_constrained_decode_rows_keeps_its_tokens(eager):
    """A prompt that joins running requests is prefilled in their decode step's forward (a mixed
    step, where the model takes one): its first token's mask (the grammar's start) and the running
    rows' masks go into one pick, and each request gets the tokens it gets alone."""
    json_c, regex_c = Constraint.json_schema(PERSON), Constraint.regex("[a-z]{4,9}")
    opts = dict(temperature=1.2, top_p=0.95, max_new_tokens=120)
    alone = [eager.generate([p], constraint=c, seed=s, logprobs=l, **opts)[0]
             for p, c, s, l in (("zzz", regex_c, 9, None), ("alone", json_c, 42, 2), ("more", None, 1, None))]
    mixed = eager.engine.mixed_steps
    first = submit(eager, "zzz", constraint=regex_c, seed=9, **opts)
    for _ in range(2):
        eager.engine.step()
    late = [submit(eager, "alone", constraint=json_c, seed=42, logprobs=2, **opts),
            submit(eager, "more", seed=1, **opts)]
    drain(eager)
    assert eager.engine.mixed_steps > mixed or not eager.model.mixes_steps
    for r, a in zip([first, *late], alone):
        assert r.outputs[-1].completion.token_ids == a.token_ids
    # The tiny model's float32 matmuls round a row's last bits by the rows beside it (the
    # quantized kernels do not): the logprobs agree to float32's precision.
    got, want = late[0].outputs[-1].completion.logprobs, alone[1].logprobs
    assert [(x.token_id, [i for i, _ in x.top]) for x in got] == [(x.token_id, [i for i, _ in x.top]) for x in want]
    assert [x.logprob for x in got] == pytest.approx([x.logprob for x in want], abs=1e-5)


def test_unconstrained_rows_build_no_masks(eager):
    masks = eager.engine.runner.masks
    before = masks.built
    eager.generate(PROMPTS, max_new_tokens=8, temperature=0)
    assert masks.built == before
    eager.generate(PROMPTS[:1], constraint=Constraint.regex("[0-9]{3}"), max_new_tokens=8, temperature=0)
    assert masks.built == before + 3


def test_a_prompt_prefilled_in_chunks_is_masked_from_its_first_token():
    llm = fastdecode.load("tiny", max_batch_size=2, prefill_chunk=8)
    c = llm.generate(["a prompt longer than one chunk of eight"], constraint=Constraint.regex("[0-9]{2}x"),
                     max_new_tokens=10, temperature=0)[0]
    assert re.fullmatch("[0-9]{2}x", c.text)


SPEC_TEXT = '{"name": "ab", "age": 7, "tags": ["a"], "ok": true} ' * 4


@pytest.mark.parametrize("opts", [dict(temperature=0), dict(temperature=0.8, seed=4)])
def test_speculation_gives_the_same_tokens_under_a_constraint(eager, opts):
    constraint = Constraint.json_schema(PERSON)
    for prompts in ([SPEC_TEXT], [SPEC_TEXT, "x", SPEC_TEXT[:30]]):
        plain = eager.generate(prompts, constraint=constraint, max_new_tokens=150, **opts)
        spec = eager.generate(prompts, constraint=constraint, max_new_tokens=150, speculative="prompt-lookup", **opts)
        assert [c.token_ids for c in spec] == [c.token_ids for c in plain]
        for c in spec:
            check_json(c)
    assert sum(c.draft_tokens for c in spec) > 0  # drafts were proposed and verified


@pytest.mark.parametrize("opts", [dict(temperature=0), dict(temperature=0.9, seed=2)])
def test_draft_model_speculation_under_a_constraint(opts):
    llm = fastdecode.load("tiny", max_batch_size=4, speculative="draft:tiny-gemma3")
    constraint = Constraint.json_schema(PERSON)
    plain = llm.generate(PROMPTS, constraint=constraint, max_new_tokens=150, speculative="none", **opts)
    spec = llm.generate(PROMPTS, constraint=constraint, max_new_tokens=150, **opts)
    for c in spec:
        check_json(c)
    if opts["temperature"] == 0:  # greedy: the same tokens (sampled: the same distribution)
        assert [c.token_ids for c in spec] == [c.token_ids for c in plain]
    assert sum(c.draft_tokens for c in spec) > 0


@pytest.mark.parametrize("strategy", ["decode", "generate"])
def test_mixing_constrained_rows_never_recompiles(eager, strategy):
    llm = fastdecode.load("tiny", compile=strategy, max_batch_size=4, compiled=None)
    llm.steps.warmup()
    graphs = counters["stats"]["unique_graphs"]
    constraint = Constraint.json_schema(PERSON)
    for opts in (dict(temperature=0), dict(temperature=0.9, seed=8)):
        free = dict(opts, max_new_tokens=40, ignore_eos=True)
        reqs = [submit(llm, p, **(dict(free, constraint=constraint) if i % 2 else free))
                for i, p in enumerate(PROMPTS)]
        drain(llm)
        for i, (p, r) in enumerate(zip(PROMPTS, reqs)):
            want = eager.generate([p], **(dict(free, constraint=constraint) if i % 2 else free))[0]
            assert r.outputs[-1].completion.token_ids == want.token_ids, (strategy, i)
    assert counters["stats"]["unique_graphs"] == graphs
