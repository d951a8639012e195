import pytest
import torch

import fastdecode
from fastdecode import FastDecodeError
from fastdecode.api.build import DEFAULT_CACHE_BUDGET, default_max_seq_len


def test_load_validation():
    for kwargs, match in [(dict(dtype="int8"), "dtype"), (dict(device="tpu"), "device"),
                          (dict(max_seq_len=10**6), "max_seq_len"), (dict(max_batch_size=0), "max_batch_size"),
                          (dict(cache="paged"), "cache"), (dict(compile="fast"), "compile")]:
        with pytest.raises(FastDecodeError, match=match):
            fastdecode.load("tiny", **kwargs)
    with pytest.raises(FastDecodeError, match="tiny"):
        fastdecode.load("no-such-model")


def test_load_accepts_dtype_objects_and_names():
    assert fastdecode.load("tiny", dtype=torch.bfloat16).dtype == torch.bfloat16
    assert fastdecode.load("tiny", dtype="float32").dtype == torch.float32


def test_a_near_miss_name_suggests_the_checkpoint():
    with pytest.raises(FastDecodeError, match="did you mean 'smollm2-135m-instruct'"):
        fastdecode.load("smollm2-135m")


def test_load_rejects_a_compiled_strategy_on_a_dynamic_cache():
    with pytest.raises(FastDecodeError, match="cache='static'"):
        fastdecode.load("tiny", compile="generate", cache="dynamic")


def test_default_max_seq_len_keeps_the_cache_in_budget():
    from fastdecode.model.args import get_preset
    from fastdecode.model.kv_cache import cache_bytes

    args = get_preset("random-smollm2-135m")
    for batch in (1, 8, 64):
        S = default_max_seq_len(args, batch, torch.float32)
        assert S == args.max_seq_len or cache_bytes(args.n_layers, batch, args.n_kv_heads, S, args.head_dim,
                                                    torch.float32) <= DEFAULT_CACHE_BUDGET
    assert default_max_seq_len(args, 8, torch.float32) == 2048  # 8 x 2048 positions: 0.75 GB in fp32
    llm = fastdecode.load("tiny", max_batch_size=3, max_seq_len=100)
    assert llm.model.kv_cache.k_cache.shape[:2] == (3, 100)


def test_the_cache_budget_counts_the_kv_dtype_bytes():
    """DEFAULT_CACHE_BUDGET is bytes: a float16 cache fits twice the positions of a float32 one
    (capped by the model's context), q8_0 (34 bytes per 32 values) four times."""
    from fastdecode.model.args import get_preset

    args = get_preset("random-smollm2-135m")
    assert default_max_seq_len(args, 8, torch.float16) == 4096
    assert default_max_seq_len(args, 8, "q8_0") == 8192 == args.max_seq_len
    assert default_max_seq_len(args, 1, torch.float16) == args.max_seq_len


def test_an_unknown_kv_dtype_is_one_line_listing_the_accepted():
    with pytest.raises(FastDecodeError) as e:
        fastdecode.load("tiny", kv_dtype="int3")
    assert str(e.value) == "unknown kv_dtype 'int3'; accepted: auto, float32, float16, bfloat16, q8_0"


@pytest.fixture
def tiny_d32(monkeypatch):
    """The tiny preset with head_dim 32 (q8_0 blocks are 32 values of head_dim; tiny's is 16)."""
    from fastdecode.model.args import PRESETS

    monkeypatch.setitem(PRESETS, "tiny-d32", PRESETS["tiny"].replace(head_dim=32))
    return "tiny-d32"


def test_q8_0_on_a_head_dim_not_in_blocks_of_32_is_one_line():
    with pytest.raises(FastDecodeError, match="^kv_dtype=q8_0 needs head_dim a multiple of 32; this model's is 16"):
        fastdecode.load("tiny", kv_dtype="q8_0")


@pytest.mark.parametrize("kv, storage", [("float32", torch.float32), ("float16", torch.float16),
                                         ("bfloat16", torch.bfloat16), ("q8_0", torch.int8)])
def test_each_kv_dtype_loads_and_generates(kv, storage, tiny_d32):
    llm = fastdecode.load(tiny_d32, kv_dtype=kv, max_batch_size=2, max_seq_len=64)
    assert llm.engine.kv_dtype == kv and llm.model.kv_cache.k_cache.dtype == storage
    a, b = llm.generate(["hello there", "hi"], max_new_tokens=8, temperature=0, ignore_eos=True)
    assert len(a.token_ids) == len(b.token_ids) == 8
    # A row's tokens do not depend on its batch: the kernel reads each format the same way at any size.
    assert llm.generate(["hi"], max_new_tokens=8, temperature=0, ignore_eos=True)[0].token_ids == b.token_ids


def test_auto_is_float16_on_the_native_kernel_and_the_models_dtype_elsewhere():
    from fastdecode import kernels

    llm = fastdecode.load("tiny", max_seq_len=32)
    assert llm.engine.kv_dtype == ("float16" if kernels.load_kernels() else "float32")
    assert fastdecode.load("tiny", dtype="bfloat16", max_seq_len=32).engine.kv_dtype == "bfloat16"


@pytest.mark.parametrize("kv", ["float16", "q8_0"])
def test_portable_path_runs_any_kv_dtype(kv, tiny_d32):
    """A bfloat16 model runs on the portable SDPA path, which converts what it reads."""
    llm = fastdecode.load(tiny_d32, dtype="bfloat16", kv_dtype=kv, max_seq_len=32)
    assert not llm.model.layers[0].attention.native
    ref = fastdecode.load(tiny_d32, dtype="bfloat16", kv_dtype="bfloat16", max_seq_len=32)
    got = llm.generate(["hello"], max_new_tokens=6, temperature=0, ignore_eos=True)[0].token_ids
    assert len(got) == 6
    if kv == "float16":  # tiny's values are exact enough in float16 to keep bf16's greedy tokens
        assert got == ref.generate(["hello"], max_new_tokens=6, temperature=0, ignore_eos=True)[0].token_ids
