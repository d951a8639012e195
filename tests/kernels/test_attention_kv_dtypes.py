"""The native attention kernel on float16, bfloat16 and q8_0 KV caches: it computes
exactly what its float32 path computes on the same K/V converted to float32 (the
conversions are exact, the operations and their order the same), so it is compared
bit for bit, and within 1e-5 (relative, and absolute as in test_attention_kernel.py)
of the PyTorch twin on those float32 K/V."""

import pytest
import torch

from fastdecode import kernels
from fastdecode.model.kv_cache import KVCache, Q8_0, dequantize_q8_0, quantize_q8_0, to_float
from fastdecode.model.transformer import cache_attention

pytestmark = pytest.mark.skipif(not kernels.load_kernels(),
                                reason=f"native kernels unavailable: {kernels.unavailable_reason}")

KV = {"float16": torch.float16, "bfloat16": torch.bfloat16, "q8_0": Q8_0}
# (B, T, H, Hkv, D, window, slots, S): decode and prefill, ragged positions, GQA, MHA, MQA, windows
SHAPES = [
    (1, 1, 4, 4, 64, 0, 1, 40),
    (3, 1, 9, 3, 64, 0, 4, 700),
    (3, 5, 4, 2, 32, 0, 4, 48),
    (3, 5, 8, 2, 128, 7, 4, 48),
    (2, 3, 6, 1, 256, 0, 3, 64),
    (3, 4, 4, 2, 64, 11, 5, 64),
]


def written_cache(kv, B, T, Hkv, D, slots, S, seed):
    """A cache of kv dtype with every position of every slot written through KVCache.update."""
    g = torch.Generator().manual_seed(seed)
    cache = KVCache(slots, Hkv, S, D, KV[kv])
    k = 2 * torch.randn(slots, S, Hkv, D, generator=g)
    v = torch.randn(slots, S, Hkv, D, generator=g)
    rows = torch.arange(slots)
    pos = torch.arange(S).expand(slots, S)
    return cache.update(rows, pos, k, v)  # [slots, Hkv, S, *] views


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "B{}T{}H{}kv{}D{}w{}".format(*s[:6]))
@pytest.mark.parametrize("kv", list(KV))
def test_kernel_reads_each_kv_dtype_as_its_float32_values(kv, shape):
    B, T, H, Hkv, D, window, slots, S = shape
    g = torch.Generator().manual_seed(1)
    q = torch.randn(B, T, H, D, generator=g)
    k_all, v_all = written_cache(kv, B, T, Hkv, D, slots, S, seed=2)
    assert k_all.dtype == (torch.int8 if kv == Q8_0 else KV[kv])
    ends = torch.randint(T - 1, S, (B,), generator=g)  # each row's last position
    pos = torch.stack([torch.arange(int(e) - T + 1, int(e) + 1) for e in ends])
    rows = torch.randperm(slots, generator=g)[:B]
    kf, vf = to_float(k_all, torch.float32), to_float(v_all, torch.float32)  # the same values in float32
    scale = D ** -0.5
    got = torch.ops.fastdecode.attention(q, k_all, v_all, pos, rows, window, scale)
    assert torch.equal(got, torch.ops.fastdecode.attention(q, kf, vf, pos, rows, window, scale))
    want = cache_attention(q, kf, vf, pos, rows, window=window, scale=scale)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)  # as test_attention_kernel.py: another order


def test_float16_writes_round_to_nearest_even():
    cache = KVCache(1, 1, 4, 8, torch.float16)
    x = torch.tensor([1 + 2 ** -11, 1 + 3 * 2 ** -11, 65504.0, 1e-8, -0.1, 3.14159, 2.0 ** -24, 70000.0])
    k_all, _ = cache.update(torch.tensor([0]), torch.tensor([[2]]), x.view(1, 1, 1, 8), x.view(1, 1, 1, 8))
    assert torch.equal(k_all[0, 0, 2], x.to(torch.float16))


def test_q8_0_matches_llama_cpp_quantization():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(5, 3, 64, generator=g) * torch.rand(5, 3, 1, generator=g) * 10
    x[0, 0, :32] = 0  # an all-zero block: scale 0, values 0
    packed = quantize_q8_0(x)
    assert packed.dtype == torch.int8 and packed.shape == (5, 3, 68)
    blocks = x.view(5, 3, 2, 32)
    d = (blocks.abs().amax(-1) / 127).to(torch.float16)
    got_d = packed.view(5, 3, 2, 34)[..., :2].contiguous().view(torch.float16)[..., 0]
    assert torch.equal(got_d, d)
    back = dequantize_q8_0(packed)
    assert back[0, 0, :32].eq(0).all()
    # Rounded to the nearest step of the block's (float32) scale, then the scale stored as float16.
    err = (back - x).abs().view(5, 3, 2, 32).amax(-1)
    assert (err <= d.float() * 0.5 + blocks.abs().amax(-1) * 2 ** -11 + 1e-6).all()


def test_q8_0_needs_head_dim_in_blocks_of_32():
    with pytest.raises(ValueError, match="multiple of 32"):
        KVCache(1, 1, 4, 48, Q8_0)
    q = torch.randn(1, 1, 2, 64)
    bad = torch.zeros(1, 2, 4, 64, dtype=torch.int8)  # 64 bytes, not 2 x 34
    with pytest.raises(RuntimeError, match="q8_0"):
        torch.ops.fastdecode.attention(q, bad, bad, torch.tensor([[0]]), torch.tensor([0]), 0, 0.125)


@pytest.mark.parametrize("kv", list(KV))
def test_portable_path_converts_at_read(kv):
    """cache_attention (bf16 models, CUDA, no compiler) reads any kv dtype, in the query's dtype."""
    k_all, v_all = written_cache(kv, 2, 3, 2, 64, 3, 16, seed=3)
    q = torch.randn(2, 3, 4, 64, generator=torch.Generator().manual_seed(4))
    pos, rows = torch.tensor([[3, 4, 5], [10, 11, 12]]), torch.tensor([2, 0])
    kf, vf = to_float(k_all, torch.float32), to_float(v_all, torch.float32)
    want = cache_attention(q, kf, vf, pos, rows)
    torch.testing.assert_close(cache_attention(q, k_all, v_all, pos, rows), want, rtol=1e-5, atol=1e-6)
    got = cache_attention(q.bfloat16(), k_all, v_all, pos, rows)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), want, rtol=0.05, atol=0.05)


def test_opcheck_float16_and_q8_0():
    for kv in ("float16", "q8_0"):
        k_all, v_all = written_cache(kv, 2, 3, 2, 64, 3, 16, seed=5)
        q = torch.randn(2, 3, 4, 64)
        torch.library.opcheck(torch.ops.fastdecode.attention,
                              (q, k_all, v_all, torch.tensor([[3, 4, 5], [10, 11, 12]]), torch.tensor([2, 0]),
                               0, 0.125))
