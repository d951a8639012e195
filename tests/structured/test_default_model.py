"""End to end on the default model (SmolLM2-135M-Instruct): the API's json_schema=, regex=,
choice= and grammar= options give outputs that validate, and finish with "stop"."""

import json
import re

import jsonschema
import pytest

import fastdecode


@pytest.fixture(scope="module")
def llm():
    return fastdecode.load(max_batch_size=4)


def ask(text):
    return [{"role": "user", "content": text}]


CAT = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 30},
                                        "age": {"type": "integer", "minimum": 0, "maximum": 30},
                                        "colors": {"type": "array", "items": {"enum": ["black", "white", "orange",
                                                                                        "grey", "brown"]},
                                                   "minItems": 1, "maxItems": 3}},
       "required": ["name", "age", "colors"], "additionalProperties": False}


def test_json_schema_chat_validates(llm):
    for opts in (dict(temperature=0), dict(temperature=0.8, seed=1)):
        c = llm.chat(ask("Describe a cat as JSON with its name, age and colors."), json_schema=CAT,
                     max_new_tokens=80, **opts)
        assert c.finish_reason == "stop", c.text
        jsonschema.validate(json.loads(c.text), CAT)


def test_pydantic_model_as_schema(llm):
    pydantic = pytest.importorskip("pydantic")

    class City(pydantic.BaseModel):
        name: str = pydantic.Field(max_length=40)
        country: str = pydantic.Field(max_length=40)

    c = llm.chat(ask("Name a big city and its country, as JSON."), json_schema=City, max_new_tokens=60,
                 temperature=0)
    assert c.finish_reason == "stop"
    City.model_validate_json(c.text)


def test_regex_choice_and_grammar(llm):
    c = llm.chat(ask("When did the Apollo 11 landing happen? Answer as YYYY-MM-DD."),
                 regex=r"[0-9]{4}-[0-9]{2}-[0-9]{2}", max_new_tokens=20, temperature=0)
    assert re.fullmatch(r"[0-9]{4}-[0-9]{2}-[0-9]{2}", c.text) and c.finish_reason == "stop"
    options = ["positive", "negative"]
    for review in ("I loved this film, wonderful!", "Terrible, a waste of time."):
        c = llm.chat(ask(f"Is this review positive or negative? {review}"), choice=options, max_new_tokens=10,
                     temperature=0)
        assert c.text in options and c.finish_reason == "stop"
    gbnf = 'root ::= num " + " num " = " num\nnum ::= [0-9] | [1-9] [0-9]'
    c = llm.chat(ask("Write one addition of two small numbers with its result."), grammar=gbnf,
                 max_new_tokens=20, temperature=0)
    assert re.fullmatch(r"[0-9]{1,2} \+ [0-9]{1,2} = [0-9]{1,2}", c.text), c.text
    assert "".join(llm.stream(llm.chat_prompt(ask("Write one addition.")), grammar=gbnf, max_new_tokens=20,
                              temperature=0)) == \
        llm.generate([llm.chat_prompt(ask("Write one addition."))], grammar=gbnf, max_new_tokens=20,
                     temperature=0)[0].text
