import math

import pytest

from fastdecode import FastDecodeError, ModelArgs, get_preset
from fastdecode.model.args import PRESETS, RopeScaling


def test_preset_lookup_is_exact():
    assert get_preset("tiny").dim == 64
    with pytest.raises(FastDecodeError) as e:
        get_preset("Tiny")
    for name in PRESETS:
        assert name in str(e.value)


def test_derived_fields():
    a = ModelArgs(dim=128, n_layers=1, n_heads=8, vocab_size=10, hidden_dim=32)
    assert a.n_kv_heads == 8 and a.head_dim == 16


@pytest.mark.parametrize("changes, word", [
    (dict(n_kv_heads=3), "multiple"),
    (dict(dim=0), "dim"),
    (dict(head_dim=7), "even"),
    (dict(norm_eps=0.0), "norm_eps"),
    (dict(rope_theta=-1.0), "rope_theta"),
    (dict(residual_scale=0.0), "residual_scale must be > 0"),
    (dict(logits_scaling=float("inf")), "logits_scaling must be > 0"),
    (dict(nope_layers=(2,)), "nope_layers must be distinct layer indexes below 2"),
    (dict(nope_layers=(1, 0)), "in order"),
    (dict(attn_softcap=-1.0), "attn_softcap must be >= 0"),
    (dict(logit_softcap=float("nan")), "logit_softcap must be >= 0"),
    (dict(rope_dim=7), "rope_dim must be an even integer from 2 to head_dim"),
    (dict(n_experts=4, n_experts_used=0), "n_experts_used must be from 1 to n_experts"),
    (dict(n_experts=4, n_experts_used=5), "n_experts_used must be from 1 to n_experts"),
    (dict(n_experts_used=2), "need n_experts > 0"),
    (dict(n_experts=-1), "n_experts must be an integer >= 0"),
    (dict(n_experts=4, n_experts_used=2, expert_hidden_dim=0), "expert_hidden_dim must be an integer >= 1"),
    (dict(n_experts=4, n_experts_used=2, dense_layers=(2,)), "dense_layers must be distinct layer indexes below 2"),
    (dict(rope_dim=18), "rope_dim must be an even integer from 2 to head_dim"),
    (dict(rope_scaling=dict(kind="longrope", short_factor=(1.0,) * 8, long_factor=(1.0,) * 7)), "as long as each other"),
    (dict(rope_scaling=dict(kind="longrope", short_factor=(1.0,) * 4, long_factor=(1.0,) * 4)), "one per frequency"),
    (dict(rope_scaling=dict(kind="longrope")), "short_factor must be a list of numbers > 0"),
])
def test_invalid_args(changes, word):
    with pytest.raises(FastDecodeError, match=word):
        get_preset("tiny").replace(**changes)


def test_rope_scaling_from_dict_and_validation():
    given = dict(factor=32.0, low_freq_factor=2.0, high_freq_factor=8.0, original_max_position_embeddings=4096)
    a = get_preset("tiny").replace(rope_scaling=given)
    s = a.rope_scaling
    assert isinstance(s, RopeScaling)
    # every given value kept, the one not given at its default
    assert (s.factor, s.low_freq_factor, s.high_freq_factor, s.original_max_position_embeddings, s.kind) == \
        (32.0, 2.0, 8.0, 4096, "llama3")
    assert get_preset("tiny").replace(rope_scaling=dict(factor=8.0, kind="linear")).rope_scaling.kind == "linear"
    with pytest.raises(FastDecodeError, match="low_freq_factor"):
        RopeScaling(low_freq_factor=4.0, high_freq_factor=1.0)


def test_from_dict_ignores_unknown_keys():
    a = ModelArgs.from_dict(dict(dim=64, n_layers=1, n_heads=4, vocab_size=300, hidden_dim=8, foo=1))
    assert a.dim == 64


def test_nope_layers_from_json_compare_as_tuples():
    a = get_preset("tiny").replace(nope_layers=[1])
    assert a.nope_layers == (1,) and a == get_preset("tiny").replace(nope_layers=(1,))


def test_longrope_from_json_compares_as_tuples():
    """A cache entry's args (JSON: lists) equal the loader's (tuples), so that a package key matches."""
    import dataclasses
    import json

    a = get_preset("tiny").replace(rope_dim=12, rope_scaling=RopeScaling(
        kind="longrope", factor=8.0, original_max_position_embeddings=16, short_factor=(1.0,) * 6,
        long_factor=(2.0,) * 6))
    again = ModelArgs.from_dict(json.loads(json.dumps(dataclasses.asdict(a))))
    assert again == a and hash(again) == hash(a)
    assert abs(a.rope_scaling.cos_sin_scale - (1 + math.log(8) / math.log(16)) ** 0.5) < 1e-12
