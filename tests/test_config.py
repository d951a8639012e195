"""LoadOptions: load()'s options, checked once, with the one set of defaults the CLI, serve and YAML read."""

import dataclasses
import inspect
from pathlib import Path

import pytest
import torch

import fastdecode
from fastdecode.cli.keys import ModelKeys
from fastdecode.cli.main import GenerateSettings
from fastdecode.config import DEFAULT_MODEL, LoadOptions
from fastdecode.errors import FastDecodeError
from fastdecode.server.settings import ServeSettings

DEFAULTS = {f.name: f.default for f in dataclasses.fields(LoadOptions)}


def test_load_signature_shows_the_options_and_their_defaults():
    params = inspect.signature(fastdecode.load).parameters
    assert {name: p.default for name, p in params.items()} == DEFAULTS
    assert params["model"].kind is inspect.Parameter.POSITIONAL_OR_KEYWORD
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for name, p in params.items() if name != "model")


@pytest.mark.parametrize("keys", [GenerateSettings, ServeSettings, ModelKeys])
def test_command_keys_take_the_defaults_and_help_from_load_options(keys):
    fields = {f.name: f for f in dataclasses.fields(keys)}
    # generate's speculative key is GenerationConfig's, per request (a draft model is loaded from it)
    shared = [name for name in DEFAULTS if name in fields and not (keys is GenerateSettings and name == "speculative")]
    assert {"model", "device", "dtype", "weights"} <= set(shared)
    for name in shared:
        assert fields[name].default == DEFAULTS[name], name
        assert fields[name].metadata["help"], name
    if keys is not ModelKeys:
        assert {"compile", "compiled", "max_seq_len", "kv_dtype", "tp", "prefix_cache"} <= set(shared)


def test_serve_has_every_engine_option():
    names = {f.name for f in dataclasses.fields(ServeSettings)}
    assert {"max_batch_size", "prefill_chunk", "speculative"} <= names


def test_values_are_normalized():
    o = LoadOptions(model=None, device=torch.device("cpu"), dtype=torch.bfloat16, kv_dtype=torch.float16)
    assert (o.model, o.device, o.dtype, o.kv_dtype) == (DEFAULT_MODEL, "cpu", "bfloat16", "float16")
    assert o.torch_dtype == torch.bfloat16 and o.torch_device == torch.device("cpu")
    assert LoadOptions(dtype="fp16").dtype == "float16" and LoadOptions(kv_dtype=" Q8_0 ").kv_dtype == "q8_0"
    assert LoadOptions(model=Path("a/b")).model == "a/b"
    assert LoadOptions().torch_dtype == torch.float32  # none: float32 on CPU


@pytest.mark.parametrize("kwargs, words", [
    (dict(device="tpu"), ["device", "'tpu'", "cpu, cuda"]),
    (dict(dtype="int8"), ["dtype", "'int8'", "float32, bfloat16, float16"]),
    (dict(weights="int3"), ["weights", "'int3'", "auto"]),
    (dict(kv_dtype="int3"), ["kv_dtype", "'int3'", "q8_0"]),
    (dict(cache="paged"), ["cache", "'paged'", "static, dynamic"]),
    (dict(compile="fast"), ["compile", "'fast'", "none, decode, generate"]),
    (dict(compile="decode", cache="dynamic"), ["compile='decode'", "cache='static'"]),
    (dict(speculative="lookup"), ["speculative='lookup'", "prompt-lookup"]),
    (dict(speculative="draft:"), ["names no draft model"]),
    (dict(speculative="draft:tiny", tp=2), ["tp=2", "prompt-lookup"]),
    (dict(tp=0), ["tp=0", ">= 1"]),
    (dict(prefix_cache="yes"), ["prefix_cache='yes'", "true or false"]),
    (dict(prefill_chunk=0), ["prefill_chunk=0", ">= 1"]),
    (dict(max_batch_size=0), ["max_batch_size=0", ">= 1"]),
    (dict(max_batch_size=True), ["max_batch_size=True", "an integer"]),
    (dict(max_seq_len=-5), ["max_seq_len=-5", ">= 1"]),
    (dict(compiled="x.pt2", compile="generate"), ["compiled='x.pt2'", "compile='generate'", "none, decode"]),
    (dict(compiled="x.pt2", tp=2), ["compiled='x.pt2'", "collectives"]),
    (dict(compiled="no-such.pt2"), ["'no-such.pt2' does not exist", "fastdecode export"]),
    (dict(model=3), ["model=3", "preset"]),
])
def test_a_bad_option_is_one_line_naming_it_and_what_is_accepted(kwargs, words):
    with pytest.raises(FastDecodeError) as e:
        LoadOptions(**kwargs)
    text = str(e.value)
    assert "\n" not in text
    for w in words:
        assert w in text, (w, text)


def test_auto_means_no_package_where_none_applies(monkeypatch):
    monkeypatch.delenv("FASTDECODE_NO_PACKAGE", raising=False)
    assert LoadOptions().package == "auto"
    assert LoadOptions(compile="decode").package == "auto"
    for kwargs in (dict(compile="generate"), dict(cache="dynamic"), dict(compiled=None), dict(compiled="none")):
        assert LoadOptions(**kwargs).package is None, kwargs
    monkeypatch.setenv("FASTDECODE_NO_PACKAGE", "1")
    assert LoadOptions().package is None


def test_unknown_options_fail_in_load_before_loading_anything():
    with pytest.raises(FastDecodeError, match=r"unknown option\(s\) max_batch, temp for load\(\); accepted: device, "):
        fastdecode.load("no-such-model", max_batch=2, temp=1)


def test_from_settings_reads_the_fields_a_settings_object_has():
    s = GenerateSettings(model="tiny", max_seq_len=64, temperature=0.5)
    o = LoadOptions.from_settings(s, max_batch_size=3)
    assert (o.model, o.max_seq_len, o.max_batch_size, o.compile) == ("tiny", 64, 3, "none")
    assert o == dataclasses.replace(LoadOptions(model="tiny", max_seq_len=64), max_batch_size=3)
