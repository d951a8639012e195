"""`Constraint`: validated once when built, one-line errors naming what was wrong."""

import json

import pytest

from fastdecode import FastDecodeError
from fastdecode.sampling import SamplingParams
from fastdecode.structured import MAX_SPEC_CHARS, Constraint, from_options, json_schema_lark


def test_kinds_build_and_hash_by_content():
    a = Constraint.json_schema({"type": "object", "properties": {"b": {"type": "integer"}, "a": {}}})
    # Key order is kept: it is the order the output's properties come in.
    assert json.loads(a.spec) == {"type": "object", "properties": {"b": {"type": "integer"}, "a": {}}}
    assert list(json.loads(a.spec)["properties"]) == ["b", "a"]
    assert a == Constraint.json_schema(json.dumps({"type": "object", "properties": {"b": {"type": "integer"},
                                                                                     "a": {}}}))
    assert a.key == Constraint("json_schema", a.spec).key
    assert a.key != Constraint.json_object().key
    assert Constraint.choice(["x", "y"]).spec == ("x", "y")
    assert Constraint.regex(r"\d{3}").kind == "regex"
    assert Constraint.grammar('start: "a" | "b"').kind == "grammar"
    assert Constraint.grammar('root ::= "a" [0-9]+').kind == "grammar"  # GBNF, converted by llguidance
    assert SamplingParams(constraint=a).constraint is a


def test_a_pydantic_model_is_a_schema():
    pydantic = pytest.importorskip("pydantic")

    class Person(pydantic.BaseModel):
        name: str
        age: int

    c = Constraint.json_schema(Person)
    assert json.loads(c.spec)["required"] == ["name", "age"]


@pytest.mark.parametrize("build, words", [
    (lambda: Constraint.json_schema({"type": "strin"}), ["json_schema", "strin"]),
    (lambda: Constraint.json_schema("{not json"), ["json_schema", "not valid JSON"]),
    # nested past Python's recursion limit: json's RecursionError, which left the CLI with exit 1
    (lambda: Constraint.json_schema("[" * 100_000 + "]" * 100_000), ["json_schema", "nested too deeply"]),
    (lambda: Constraint("json_schema", "[" * 100_000 + "]" * 100_000), ["json_schema", "nested too deeply"]),
    (lambda: Constraint.json_schema([1, 2]), ["json_schema", "list"]),
    (lambda: Constraint.json_schema(False), ["json_schema is false", "no value", "true for any JSON value"]),
    (lambda: Constraint.json_schema("false"), ["json_schema is false"]),
    (lambda: json_schema_lark(False), ["json_schema is false"]),
    (lambda: Constraint.json_schema({"type": "integer", "minimum": "a"}), ["json_schema", "minimum"]),
    # Invalid against its metaschema, though llguidance compiles it (and ignores the bad multipleOf).
    (lambda: Constraint.json_schema({"type": "number", "multipleOf": -2}),
     ["json_schema is not a valid JSON Schema", "-2", "at multipleOf"]),
    (lambda: Constraint.json_schema({"$schema": "http://json-schema.org/draft-07/schema#",
                                     "properties": {"a": {"type": "integer", "exclusiveMinimum": True}}}),
     ["not a valid JSON Schema", "True is not of type 'number'", "at properties/a/exclusiveMinimum"]),
    # A keyword llguidance does not implement is refused, never ignored.
    (lambda: Constraint.json_schema({"type": "array", "uniqueItems": True}), ["json_schema", "uniqueItems"]),
    (lambda: Constraint.json_schema({"type": "string", "pattern": "(?=a)b"}), ["json_schema", "look-around"]),
    (lambda: Constraint.regex("a(b"), ["regex", "'a(b'", "unclosed group"]),
    (lambda: Constraint.regex(""), ["regex", "empty"]),
    (lambda: Constraint.grammar('start: "a" x\nx: /[0-9]+/ )'), ["grammar", "expecting"]),
    (lambda: Constraint.grammar('root ::= "a" [0-9+'), ["grammar", "GBNF", "end of input"]),
    (lambda: Constraint.choice([]), ["choice", "empty"]),
    (lambda: Constraint.choice(["a", 1]), ["choice", "strings", "1"]),
    (lambda: Constraint.choice(["a", None]), ["choice", "strings", "None"]),
    (lambda: Constraint.choice([True]), ["choice", "strings", "True"]),
    (lambda: Constraint.choice("ab"), ["choice", "list of strings"]),
    (lambda: Constraint("yaml", "x"), ["yaml", "json_schema, json_object, regex, choice, grammar"]),
    (lambda: Constraint.grammar("start: " + " | ".join(f'"{i}"' for i in range(40000))), ["grammar", "characters"]),
    (lambda: Constraint.json_schema({"enum": ["x" * 100] * (MAX_SPEC_CHARS // 100)}), ["json_schema", "at most"]),
    (lambda: from_options(regex="a", choice=["a"]), ["at most one", "regex", "choice"]),
    (lambda: SamplingParams(constraint={"type": "object"}), ["constraint", "dict"]),
])
def test_bad_specs_fail_in_one_line_naming_what_was_wrong(build, words):
    with pytest.raises(FastDecodeError) as e:
        build()
    message = str(e.value)
    assert "\n" not in message
    for w in words:
        assert w in message, (w, message)


def test_patterns_are_llguidances_to_judge_not_pythons():
    """The metaschema check leaves `pattern` alone: ECMA-262's \\p{L} is no Python regex, and
    llguidance compiles it."""
    assert Constraint.json_schema({"type": "string", "pattern": "^\\p{L}+$"}).kind == "json_schema"


def test_the_schema_true_takes_any_json_value():
    """JSON Schema's `true` matches every value, as `{}` does: llguidance takes neither boolean,
    so `true` compiles as `{}`."""
    import llguidance
    from fastdecode.structured.constraint import _grammar
    from fastdecode.structured.vocab import vocab_for
    from fastdecode.text.tokenizer import ByteTokenizer

    assert Constraint.json_schema(True).spec == "true"
    assert _grammar("json_schema", "true") == _grammar("json_schema", "{}")
    assert json_schema_lark(True) == json_schema_lark({})
    tok = vocab_for(ByteTokenizer()).ll
    for text in ('{"a": [1, "x", null]}', "[true, 2.5]", '"s"', "-3"):
        m = llguidance.LLMatcher(tok, _grammar("json_schema", "true"), log_level=0)
        ids = list(text.encode())
        assert m.consume_tokens(ids) and m.is_accepting(), text


def test_formats_llguidance_does_not_know_are_annotations():
    """A format llguidance does not implement is an annotation, as JSON Schema takes any format
    by default (it refused pydantic's SecretStr "password", bytes "binary"); one it implements
    is still enforced, and a property named "format" is a property, not the keyword."""
    import llguidance
    from fastdecode.structured.constraint import _grammar
    from fastdecode.structured.vocab import vocab_for
    from fastdecode.text.tokenizer import ByteTokenizer

    def takes(schema, text):
        spec = Constraint.json_schema(schema).spec
        m = llguidance.LLMatcher(vocab_for(ByteTokenizer()).ll, _grammar("json_schema", spec), log_level=0)
        return m.consume_tokens(list(text.encode())) and m.is_accepting()

    for fmt in ("password", "binary", "uri-reference", "path"):
        nested = {"type": "object", "properties": {"format": {"$ref": "#/$defs/s"}, "t": {"type": "array", "items": {
            "anyOf": [{"type": "string", "format": fmt}, {"type": "null"}]}}}, "required": ["format", "t"],
            "additionalProperties": False, "$defs": {"s": {"type": "string", "format": fmt}}}
        assert takes(nested, '{"format": "x y", "t": ["z", null]}'), fmt
        assert json_schema_lark(nested).startswith("%json ")
    assert takes({"type": "string", "format": "date"}, '"2024-02-03"')
    assert not takes({"type": "string", "format": "date"}, '"x y"')  # enforced
    assert not takes({"type": "object", "properties": {"format": {"type": "string"}}, "required": ["format"]},
                     '{"format": 5}')


def test_a_schema_nested_past_the_parser_limit_is_refused():
    deep = json.loads('{"type": "array", "items": ' * 200 + "{}" + "}" * 200)
    with pytest.raises(FastDecodeError, match="json_schema: recursion limit") as e:
        Constraint.json_schema(deep)
    assert "\n" not in str(e.value)


def test_from_options_and_the_lark_embedding():
    assert from_options() is None
    assert from_options(choice=["a"]) == Constraint.choice(["a"])
    assert from_options(json_schema={"type": "object"}).kind == "json_schema"
    embedded = json_schema_lark({"type": "object", "properties": {"x": {"type": "integer"}}})
    assert embedded.startswith("%json ")
    assert json.loads(embedded[len("%json "):])["x-guidance"]["whitespace_flexible"] is False
    Constraint.grammar(f'start: "<call>" args "</call>"\nargs: {embedded}')
