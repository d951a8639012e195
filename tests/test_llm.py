import pytest
import torch

import fastdecode
from fastdecode import FastDecodeError
from fastdecode.llm import DEFAULT_CACHE_BUDGET, default_max_seq_len


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
    from fastdecode.config import get_preset
    from fastdecode.kv_cache import cache_bytes

    args = get_preset("random-smollm2-135m")
    for batch in (1, 8, 64):
        S = default_max_seq_len(args, batch, torch.float32)
        assert S == args.max_seq_len or cache_bytes(args.n_layers, batch, args.n_kv_heads, S, args.head_dim,
                                                    torch.float32) <= DEFAULT_CACHE_BUDGET
    assert default_max_seq_len(args, 8, torch.float32) == 2048  # 8 x 2048 positions: 0.75 GB in fp32
    llm = fastdecode.load("tiny", max_batch_size=3, max_seq_len=100)
    assert llm.model.kv_cache.k_cache.shape[:2] == (3, 100)
