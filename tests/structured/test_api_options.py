"""json_schema=, regex=, choice=, grammar= and constraint= on LLM.generate/stream/chat."""

import json
import re

import jsonschema
import pytest

from fastdecode import FastDecodeError
from fastdecode.structured import Constraint

SCHEMA = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 99},
                                           "tag": {"enum": ["x", "y"]}},
          "required": ["n", "tag"], "additionalProperties": False}


def test_each_option(tiny_llm):
    c = tiny_llm.generate("a", json_schema=SCHEMA, max_new_tokens=40, temperature=0)[0]
    jsonschema.validate(json.loads(c.text), SCHEMA)
    assert tiny_llm.generate("a", json_schema=json.dumps(SCHEMA), max_new_tokens=40, temperature=0)[0].text == c.text
    assert tiny_llm.generate("a", constraint=Constraint.json_schema(SCHEMA), max_new_tokens=40,
                             temperature=0)[0].text == c.text
    assert re.fullmatch("[a-c]{2}[0-9]", tiny_llm.generate("a", regex="[a-c]{2}[0-9]", max_new_tokens=9,
                                                           temperature=0)[0].text)
    assert tiny_llm.chat([{"role": "user", "content": "hi"}], choice=["one", "two"], max_new_tokens=9,
                         temperature=0.7, seed=2).text in ("one", "two")
    assert "".join(tiny_llm.stream("a", grammar='start: "z" "z"', max_new_tokens=9, temperature=0)) == "zz"


@pytest.mark.parametrize("opts, words", [
    (dict(json_schema={"type": "objec"}), ["json_schema", "objec"]),
    (dict(regex="("), ["regex", "does not compile"]),
    (dict(choice=[]), ["choice", "empty"]),
    (dict(choice=[1, 2]), ["choice", "strings"]),
    (dict(grammar="start: ("), ["grammar"]),
    (dict(regex="a", grammar='start: "a"'), ["at most one"]),
    (dict(regex="a", constraint=Constraint.regex("b")), ["constraint=", "not both"]),
    (dict(jsonschema={"type": "object"}), ["unknown option", "jsonschema", "json_schema"]),
])
def test_bad_options_fail_in_one_line(tiny_llm, opts, words):
    with pytest.raises(FastDecodeError) as e:
        tiny_llm.generate("a", max_new_tokens=4, **opts)
    assert "\n" not in str(e.value)
    for w in words:
        assert w in str(e.value), str(e.value)
