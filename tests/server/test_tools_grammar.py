"""The tool grammars, checked with llguidance itself on a byte-level vocabulary (no model):
what each tool_choice accepts and refuses, and random walks through the grammar's masks
(a model that picks any allowed token) that always parse back to calls whose arguments
validate with jsonschema."""

import json
import random

import jsonschema
import pytest

from fastdecode.server.tools.formats import FORMATS, GENERIC, HARMONY, HERMES, LLAMA3_JSON, MISTRAL, MISTRAL_ARGS
from fastdecode.server.tools.grammar import tool_grammar
from fastdecode.server.tools.parse import parse_reply
from fastdecode.server.tools.spec import Function, ToolSpec
from fastdecode.text.harmony import HarmonySplitter

llguidance = pytest.importorskip("llguidance")

EOS = 257
WEATHER = {"type": "object", "properties": {
    "city": {"type": "string", "maxLength": 12},
    "unit": {"enum": ["celsius", "fahrenheit"]},
    "days": {"type": "integer", "minimum": 1, "maximum": 7}},
    "required": ["city", "unit"], "additionalProperties": False}
ADD = {"type": "object", "properties": {"x": {"type": "integer", "minimum": -99, "maximum": 99},
                                        "y": {"type": "boolean"}},
       "required": ["x", "y"], "additionalProperties": False}
FUNCTIONS = (Function("get_weather", WEATHER, {}), Function("add", ADD, {}))
SCHEMAS = {f.name: f.parameters for f in FUNCTIONS}


class _Bytes:
    """Token ids 0-255 are bytes, then <bos> 256, <eos> 257 (the tiny preset's vocabulary)."""

    eos_token_id, bos_token_id = EOS, 256
    tokens = [bytes([i]) for i in range(256)] + [b"<bos>", b"<eos>", b"<pad>", b"<unk>"]
    special_token_ids = [256, 257, 258, 259]

    def __call__(self, text):
        return list(text if isinstance(text, bytes) else text.encode())


@pytest.fixture(scope="module")
def tokenizer():
    return llguidance.LLTokenizer(llguidance.TokenizerWrapper(_Bytes()))


def matcher(tokenizer, fmt, choice="required", named=None, parallel=True):
    grammar = llguidance.LLMatcher.grammar_from_lark(tool_grammar(fmt, ToolSpec(FUNCTIONS, choice, named, parallel)))
    m = llguidance.LLMatcher(tokenizer, grammar, log_level=0)
    assert not m.is_error(), m.get_error()
    return m


def accepts(tokenizer, fmt, text, **kw):
    """Whether the grammar takes all of `text` and may end there."""
    m = matcher(tokenizer, fmt, **kw)
    ids = list(text.encode())
    return m.validate_tokens(ids) == len(ids) and m.consume_tokens(ids) and m.is_accepting()


def call(name, args):
    return name, json.dumps(args)


GOOD = [call("get_weather", {"city": "Paris", "unit": "celsius", "days": 3}), call("add", {"x": -5, "y": True})]


@pytest.mark.parametrize("fmt", FORMATS.values(), ids=FORMATS)
def test_required_named_and_parallel(tokenizer, fmt):
    for args in (json.loads(a) for _, a in GOOD):
        jsonschema.validate(args, SCHEMAS["get_weather"] if "city" in args else ADD)  # the test's own calls are valid
    one, two = fmt.render(GOOD[:1]), fmt.render(GOOD)
    assert accepts(tokenizer, fmt, one) and accepts(tokenizer, fmt, two) is not fmt.one_call  # harmony: one a reply
    assert accepts(tokenizer, fmt, one, parallel=False) and not accepts(tokenizer, fmt, two, parallel=False)
    assert not accepts(tokenizer, fmt, "")  # at least one call
    assert not accepts(tokenizer, fmt, "Sure. " + one)  # no text first
    assert accepts(tokenizer, fmt, fmt.render(GOOD[1:]), choice="function", named="add")
    assert not accepts(tokenizer, fmt, one, choice="function", named="add")  # only the named function
    bad = [call("get_weather", {"city": "Paris", "unit": "kelvin"}),  # not in the enum
           call("get_weather", {"city": "Paris", "unit": "celsius", "days": 9}),  # over the maximum
           call("get_weather", {"city": "Paris"}),  # a required property missing
           call("add", {"x": 1, "y": True, "z": 0}),  # additionalProperties: false
           call("add", {"y": True, "x": 1}),  # properties in another order than the schema's
           call("mul", {"x": 1}),  # not a tool
           ("add", '{"x":1, "y":true}')]  # not the compact separators
    for c in bad:
        assert not accepts(tokenizer, fmt, fmt.render([c])), c


@pytest.mark.parametrize("fmt", [HERMES, GENERIC], ids=["hermes", "generic"])
def test_auto_is_free_text_until_the_trigger(tokenizer, fmt):
    text = "The weather? Let me check {braces} and <tags>.\n"
    assert accepts(tokenizer, fmt, text, choice="auto")
    assert accepts(tokenizer, fmt, "", choice="auto")
    assert accepts(tokenizer, fmt, text + fmt.render(GOOD), choice="auto")
    assert not accepts(tokenizer, fmt, text + fmt.render(GOOD) + " and more text", choice="auto")
    m = matcher(tokenizer, fmt, choice="auto")
    ids = list((text + fmt.trigger).encode())
    assert m.consume_tokens(ids)  # once the trigger is written, the call's syntax is forced
    assert m.validate_tokens(list(b"some text")) == 0


def test_auto_llama3_calls_open_the_reply(tokenizer):
    assert accepts(tokenizer, LLAMA3_JSON, "It is sunny.", choice="auto")
    assert accepts(tokenizer, LLAMA3_JSON, LLAMA3_JSON.render(GOOD), choice="auto")
    assert not accepts(tokenizer, LLAMA3_JSON, '{"not": "a call"}', choice="auto")


def walk(m, rng, limit=3000, prefix=b""):
    """Any allowed token, uniformly (EOS when allowed, half the time), until the grammar ends."""
    assert m.consume_tokens(list(prefix))
    out = bytearray(prefix)
    for _ in range(limit):
        mask = m.compute_bitmask()
        allowed = [t for t in range(len(_Bytes.tokens)) if mask[t // 8] >> (t % 8) & 1]
        if EOS in allowed and (len(allowed) == 1 or rng.random() < 0.5):
            return out.decode()
        token = rng.choice([t for t in allowed if t != EOS])
        assert m.consume_token(token)
        out.append(token)
    raise AssertionError(f"no end after {limit} tokens: {out!r}")


@pytest.mark.parametrize("fmt", FORMATS.values(), ids=FORMATS)
def test_random_walks_parse_to_valid_calls(tokenizer, fmt):
    rng = random.Random(0)
    for choice, named, parallel in (("required", None, True), ("required", None, False), ("function", "add", True)):
        for _ in range(15):
            text = walk(matcher(tokenizer, fmt, choice=choice, named=named, parallel=parallel), rng)
            reply = parse_reply(fmt, SCHEMAS, text)
            assert reply.content is None and reply.calls, text
            assert len(reply.calls) == 1 or parallel
            for c in reply.calls:
                assert named in (None, c.name)
                jsonschema.validate(json.loads(c.arguments), SCHEMAS[c.name])
    if fmt.anywhere:  # auto after the model wrote the trigger itself
        for _ in range(15):
            text = walk(matcher(tokenizer, fmt, choice="auto"), rng, prefix=("Checking. " + fmt.trigger).encode())
            reply = parse_reply(fmt, SCHEMAS, text)
            assert reply.content == "Checking." and reply.calls
            for c in reply.calls:
                jsonschema.validate(json.loads(c.arguments), SCHEMAS[c.name])


# -- markers that are special tokens (Mistral's [TOOL_CALLS] and [ARGS], <tool_call> in some) -------

SPECIALS = {"[TOOL_CALLS]": 260, "[ARGS]": 261, "<tool_call>": 262, "</tool_call>": 263,
            **{m: 264 + i for i, m in enumerate(HARMONY.markers)}}


class _WithMarkers(_Bytes):
    """The byte vocabulary with the formats' markers as special tokens 260-263."""

    tokens = _Bytes.tokens + [m.encode() for m in SPECIALS]
    special_token_ids = _Bytes.special_token_ids + list(SPECIALS.values())


def marked_matcher(fmt, choice="required"):
    tokenizer = llguidance.LLTokenizer(llguidance.TokenizerWrapper(_WithMarkers()))
    specials = {m: SPECIALS[m] for m in fmt.markers}
    grammar = llguidance.LLMatcher.grammar_from_lark(tool_grammar(fmt, ToolSpec(FUNCTIONS, choice, None, True),
                                                                  specials))
    m = llguidance.LLMatcher(tokenizer, grammar, log_level=0)
    assert not m.is_error(), m.get_error()
    return m


def marked_ids(text):
    """`text` as ids of the vocabulary with markers: each marker one special token."""
    ids = []
    while text:
        at, marker = min(((text.find(m), m) for m in SPECIALS if m in text), default=(len(text), ""))
        ids += list(text[:at].encode()) + ([SPECIALS[marker]] if marker else [])
        text = text[at + len(marker):]
    return ids


@pytest.mark.parametrize("fmt", [MISTRAL, MISTRAL_ARGS, HERMES], ids=["mistral", "mistral_args", "hermes"])
def test_special_markers_are_tokens_not_text(fmt):
    two = fmt.render(GOOD)
    for choice in ("required", "auto"):
        m = marked_matcher(fmt, choice)
        ids = marked_ids(("Let me check. " if choice == "auto" else "") + two)
        assert m.validate_tokens(ids) == len(ids) and m.consume_tokens(ids) and m.is_accepting()
    spelled = list(two.encode())  # the marker's text in ordinary tokens is not the marker
    assert marked_matcher(fmt).validate_tokens(spelled) < len(spelled)
    m = marked_matcher(fmt, "auto")
    assert m.consume_tokens(list(b"Plain text, no calls.")) and m.is_accepting()
    # Random walks: decoded with the markers' text, every walk parses back to valid calls.
    rng = random.Random(3)
    for _ in range(15):
        text = marked_walk(marked_matcher(fmt), rng)
        reply = parse_reply(fmt, SCHEMAS, text)
        assert reply.content is None and reply.calls, text
        for c in reply.calls:
            jsonschema.validate(json.loads(c.arguments), SCHEMAS[c.name])


def marked_walk(m, rng, prefix=""):
    """walk() on the vocabulary with markers: the reply's text, markers included."""
    ids = marked_ids(prefix)
    assert m.consume_tokens(ids)
    out = ids
    while True:
        mask = m.compute_bitmask()
        allowed = [t for t in range(len(_WithMarkers.tokens)) if mask[t // 8] >> (t % 8) & 1]
        if EOS in allowed and (len(allowed) == 1 or rng.random() < 0.5):
            return b"".join(_WithMarkers.tokens[t] for t in out).decode()
        token = rng.choice([t for t in allowed if t != EOS])
        assert m.consume_token(token)
        out.append(token)


ANALYSIS = "<|channel|>analysis<|message|>Need {the} weather <b>.<|end|><|start|>assistant"


def test_harmony_auto_holds_a_call_after_any_messages():
    """gpt-oss under tool_choice auto: messages on any channel, their bodies free, and a message to a
    function held to its name and schema; the markers are the vocabulary's special tokens."""
    one = HARMONY.render(GOOD[:1])
    preamble = "<|channel|>commentary<|message|>Checking.<|end|><|start|>assistant"
    for text in (one, ANALYSIS + one, ANALYSIS + preamble + one, "<|channel|>final<|message|>It is sunny.",
                 ANALYSIS + "<|channel|>final<|message|>Sunny, 20 {C}."):
        ids = marked_ids(text)
        m = marked_matcher(HARMONY, "auto")
        assert m.validate_tokens(ids) == len(ids) and m.consume_tokens(ids) and m.is_accepting(), text
    bad = [call("get_weather", {"city": "Paris", "unit": "kelvin"}), call("mul", {"x": 1}),
           ("add", '{"x":1, "y":true}')]
    for text in [ANALYSIS + HARMONY.render([c]) for c in bad] + ["It is sunny.", one + one]:
        ids = marked_ids(text)
        assert marked_matcher(HARMONY, "auto").validate_tokens(ids) < len(ids), text
    # Random walks from a message to a function: the splitter hands the call parser a valid call.
    rng = random.Random(5)
    for _ in range(15):
        text = marked_walk(marked_matcher(HARMONY, "auto"), rng, ANALYSIS + "<|channel|>commentary to=")
        reasoning, content = HarmonySplitter(keep_calls=True).feed(text, finished=True)
        reply = parse_reply(HARMONY, SCHEMAS, content)
        assert reasoning == "Need {the} weather <b>." and reply.content is None and len(reply.calls) == 1, text
        jsonschema.validate(json.loads(reply.calls[0].arguments), SCHEMAS[reply.calls[0].name])


def test_arguments_are_always_an_object(tokenizer):
    """Tool arguments are a JSON object (OpenAI's): a function without parameters takes only `{}`,
    a schema that leaves the type open still takes only objects, and one of another type is a 400."""
    from fastdecode.server.errors import APIError
    from fastdecode.server.protocol import ToolDefinition
    from fastdecode.server.tools.spec import tool_spec

    def grammar_accepts(function, arguments):
        spec = tool_spec([ToolDefinition.model_validate({"type": "function", "function": function})], "required", False)
        g = llguidance.LLMatcher.grammar_from_lark(tool_grammar(GENERIC, spec))
        m = llguidance.LLMatcher(tokenizer, g, log_level=0)
        ids = list(GENERIC.render([(function["name"], arguments)]).encode())
        return m.validate_tokens(ids) == len(ids) and m.consume_tokens(ids) and m.is_accepting()

    assert grammar_accepts({"name": "now"}, "{}")
    assert not grammar_accepts({"name": "now"}, '{"tz": "UTC"}')
    for open_schema in ({}, {"properties": {"a": {"type": "integer"}}}):
        fn = {"name": "f", "parameters": open_schema}
        assert grammar_accepts(fn, '{"a": 1}')
        for not_object in ("5", '"x"', "[1]", "null"):
            assert not grammar_accepts(fn, not_object), (open_schema, not_object)
    # A type list that admits objects (zod-to-json-schema writes ["object", "null"] for a nullable
    # object) describes named arguments too; the arguments are then the object alone.
    for types in (["object"], ["object", "null"]):
        fn = {"name": "f", "parameters": {"type": types, "properties": {"a": {"type": "integer"}}}}
        assert grammar_accepts(fn, '{"a": 1}') and not grammar_accepts(fn, "null"), types
    with pytest.raises(APIError) as e:
        grammar_accepts({"name": "f", "parameters": {"type": "string"}}, '"x"')
    assert e.value.status == 400 and e.value.param == "tools[0].function.parameters" and "object" in str(e.value)
    with pytest.raises(APIError):
        grammar_accepts({"name": "f", "parameters": {"type": ["string", "null"]}}, '"x"')


@pytest.mark.parametrize("fmt", [GENERIC, HERMES, LLAMA3_JSON, MISTRAL, MISTRAL_ARGS],
                         ids=["generic", "hermes", "llama3_json", "mistral", "mistral_args"])
def test_auto_with_a_json_answer_is_calls_or_that_json(tokenizer, fmt):
    """tools with a response_format (OpenAI's Agents SDK sends both for an agent with an output type):
    under auto the reply is calls, or JSON valid against the answer's schema, never free text."""
    from fastdecode.structured import json_schema_lark

    answer_schema = {"type": "object", "properties": {"temp": {"type": "integer"}}, "required": ["temp"],
                     "additionalProperties": False}
    grammar = tool_grammar(fmt, ToolSpec(FUNCTIONS, "auto", None, True), answer=json_schema_lark(answer_schema))

    def takes(text):
        m = llguidance.LLMatcher(tokenizer, llguidance.LLMatcher.grammar_from_lark(grammar), log_level=0)
        assert not m.is_error(), m.get_error()
        ids = list(text.encode())
        return m.validate_tokens(ids) == len(ids) and m.consume_tokens(ids) and m.is_accepting()

    assert takes('{"temp": 21}') and takes(fmt.render(GOOD))
    for bad in ('{"temp": "warm"}', '{"temp": 21, "x": 1}', "It is warm.", "", "Sure. " + fmt.render(GOOD)):
        assert not takes(bad), bad
    reply = parse_reply(fmt, SCHEMAS, '{"temp": 21}')
    assert reply.calls == [] and reply.content == '{"temp": 21}'  # the answer reads back as content
    rng = random.Random(1)
    for _ in range(10):  # a model that picks any allowed token: calls, or the answer
        m = llguidance.LLMatcher(tokenizer, llguidance.LLMatcher.grammar_from_lark(grammar), log_level=0)
        reply = parse_reply(fmt, SCHEMAS, walk(m, rng))
        if reply.calls:
            for c in reply.calls:
                jsonschema.validate(json.loads(c.arguments), SCHEMAS[c.name])
        else:
            jsonschema.validate(json.loads(reply.content), answer_schema)


@pytest.mark.parametrize("fmt", [GENERIC, LLAMA3_JSON], ids=["generic", "llama3_json"])
def test_json_answer_keeps_each_tools_references(tokenizer, fmt):
    """Calls written as JSON beside the answer: a tool's `#/$defs/...` still means its own $defs."""
    from fastdecode.structured import json_schema_lark

    tree = {"$defs": {"N": {"type": "object", "properties": {"v": {"type": "integer"}, "kids": {
        "type": "array", "items": {"$ref": "#/$defs/N"}, "maxItems": 2}}, "required": ["v"], "additionalProperties": False}},
        "type": "object", "properties": {"root": {"$ref": "#/$defs/N"}}, "required": ["root"],
        "additionalProperties": False}
    answer = {"$defs": {"N": {"type": "string"}}, "type": "object", "properties": {"n": {"$ref": "#/$defs/N"}},
              "required": ["n"], "additionalProperties": False}
    spec = ToolSpec((Function("tree", tree, {}), FUNCTIONS[1]), "auto", None, False)
    grammar = llguidance.LLMatcher.grammar_from_lark(tool_grammar(fmt, spec, answer=json_schema_lark(answer)))

    def takes(text):
        m = llguidance.LLMatcher(tokenizer, grammar, log_level=0)
        ids = list(text.encode())
        return m.validate_tokens(ids) == len(ids) and m.consume_tokens(ids) and m.is_accepting()

    good = fmt.render([call("tree", {"root": {"v": 1, "kids": [{"v": 2}]}})])
    assert takes(good) and takes('{"n": "x"}') and takes(fmt.render(GOOD[1:]))
    assert not takes(fmt.render([call("tree", {"root": {"v": "x"}})]))  # N is the tool's, not the answer's
    assert not takes('{"n": 1}')
    assert not takes(fmt.render([GOOD[1], GOOD[1]]))  # parallel_tool_calls false: one call
