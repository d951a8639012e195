import dataclasses
from dataclasses import dataclass, field
from typing import Optional

import pytest

from fastdecode import FastDecodeError, GenerationConfig, SamplingParams
from fastdecode.cli.keys import (copy_fields, describe_settings, docstring_help, is_override,
                                 load_settings)


@dataclass
class Demo:
    """A settings class with one field of every supported kind."""

    count: int = field(default=3, metadata={"help": "how many"})
    ratio: float = 0.5
    name: str = "x"
    flag: bool = False
    limit: Optional[int] = None
    words: tuple[str, ...] = ()
    ids: Optional[frozenset[int]] = None


def write(tmp_path, text):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    return str(path)


def test_overrides_are_parsed_by_field_type():
    s = load_settings(Demo, ["count=7", "ratio=1e-3", "name=a=b", "flag=yes", "limit=12",
                             "words=p", "words=q", "ids=4", "ids=5"])
    assert s == Demo(count=7, ratio=1e-3, name="a=b", flag=True, limit=12, words=("p", "q"),
                     ids=frozenset({4, 5}))


@pytest.mark.parametrize("text,value", [("true", True), ("1", True), ("On", True),
                                        ("false", False), ("no", False), ("0", False)])
def test_bool_spellings(text, value):
    assert load_settings(Demo, [f"flag={text}"]).flag is value


def test_none_and_empty_list():
    s = load_settings(Demo, ["limit=none", "ids=null", "words="])
    assert s.limit is None and s.ids is None and s.words == ()


def test_overrides_win_over_file_and_replace_lists(tmp_path):
    path = write(tmp_path, "count: 9\nratio: 2\nwords: [a, b]\nlimit: 4\n")
    from_file = load_settings(Demo, [], path)
    assert (from_file.count, from_file.ratio, from_file.words, from_file.limit) == (9, 2.0, ("a", "b"), 4)
    s = load_settings(Demo, ["count=1", "words=c", "limit=none"], path)
    assert (s.count, s.ratio, s.words, s.limit) == (1, 2.0, ("c",), None)


def test_yaml_text_values_use_the_same_parser(tmp_path):
    # YAML 1.1 reads 1e-3 as a string; it must still become a float.
    s = load_settings(Demo, [], write(tmp_path, "ratio: 1e-3\nwords: one\n"))
    assert s.ratio == 1e-3 and s.words == ("one",)


def test_empty_config_file_gives_defaults(tmp_path):
    assert load_settings(Demo, [], write(tmp_path, "# only comments\n")) == Demo()


def test_dashes_in_keys_are_accepted():
    @dataclass
    class Dashed:
        max_new_tokens: int = 1

    assert load_settings(Dashed, ["max-new-tokens=5"]).max_new_tokens == 5


@pytest.mark.parametrize("args,needle", [
    (["cuont=1"], "unknown key 'cuont'"),
    (["count=1.5"], "count='1.5'"),
    (["ratio=fast"], "ratio='fast'"),
    (["flag=maybe"], "true or false"),
    (["limit=x"], "an integer or none"),
    (["count=1", "count=2"], "count was given 2 times"),
    (["justtext"], "expected key=value"),
])
def test_bad_overrides_name_the_key(args, needle):
    with pytest.raises(FastDecodeError) as e:
        load_settings(Demo, args)
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_unknown_key_lists_valid_keys():
    with pytest.raises(FastDecodeError, match="valid keys: count, ratio, name, flag, limit, words, ids"):
        load_settings(Demo, ["nope=1"])


@pytest.mark.parametrize("text,needle", [
    ("count: [1\n", "not valid YAML at line"),
    ("- a\n- b\n", "must hold a mapping"),
    ("cuont: 1\n", "unknown key 'cuont' in config file"),
    ("count: 1.5\n", "count=1.5 is not valid"),
    ("flag: 3\n", "flag=3 is not valid"),
    ("count:\n", "count is empty"),
    ("count: " + "[" * 5000 + "]" * 5000 + "\n", "nested too deeply"),  # PyYAML's RecursionError: exit 1 before
])
def test_bad_config_files_name_the_file_or_key(tmp_path, text, needle):
    with pytest.raises(FastDecodeError) as e:
        load_settings(Demo, [], write(tmp_path, text))
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_missing_config_file_is_named(tmp_path):
    missing = str(tmp_path / "nope.yaml")
    with pytest.raises(FastDecodeError, match="config file .*nope.yaml.* not found"):
        load_settings(Demo, [], missing)
    with pytest.raises(FastDecodeError, match="is a directory"):
        load_settings(Demo, [], str(tmp_path))


def test_range_validation_stays_in_the_dataclass():
    @dataclass
    class Checked:
        n: int = 1

        def __post_init__(self):
            if self.n < 1:
                raise FastDecodeError(f"n={self.n} is out of range")

    with pytest.raises(FastDecodeError, match="n=0 is out of range"):
        load_settings(Checked, ["n=0"])


def test_describe_lists_every_key_with_default_and_help():
    text = describe_settings(Demo)
    for f in dataclasses.fields(Demo):
        assert f"  {f.name} = " in text
    assert "count = 3" in text and "how many" in text and "limit = none" in text and "words = []" in text


def test_copy_fields_keeps_defaults_and_docstring_help():
    copied = {name: (tp, spec) for name, tp, spec in copy_fields(SamplingParams)}
    assert list(copied) == [f.name for f in dataclasses.fields(SamplingParams)]
    for f in dataclasses.fields(SamplingParams):
        assert copied[f.name][1].default == f.default
    assert copied["temperature"][1].metadata["help"] == docstring_help(SamplingParams)["temperature"]
    # a continuation line is joined to its entry
    assert "negative ones multiplied" in docstring_help(SamplingParams)["repetition_penalty"]
    assert set(docstring_help(GenerationConfig)) >= {"max_new_tokens", "stop", "ignore_eos"}


def test_is_override():
    assert is_override("top_k=4") and is_override("max-new-tokens=3") and is_override("stop=")
    assert not is_override("What is 2+2=4?") and not is_override("Tell me a joke") and not is_override("=x")
