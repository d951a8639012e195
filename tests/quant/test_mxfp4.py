"""MXFP4 (gpt-oss' experts) kept packed as q4mx: the file's exponent bytes and nibbles, run by the
int8 kernels with MXFP4's 16 values in their byte-shuffle table.

The generic checks of every packed type (twin against a dequantized matmul, M-independence, the
ISAs, 512-bit tiles, partial groups, grouped calls) are test_kquants.py's, MXFP4 among them; here
the exponent byte's whole range, gpt-oss' row length (2880: 11 groups and 2 blocks) and the
largest integer sums.
"""

import math

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as T
from gguf import quants as gq

from fastdecode import kernels
from fastdecode.checkpoints import dequant
from fastdecode.quant import formats
from fastdecode.quant.linear import packed_linear

from isa_fixture import ISAS, isa  # noqa: F401  (fixture)


def mxfp4_blocks(n: int, k: int, exponents, seed: int) -> np.ndarray:
    """[n, k / 32 * 17] random MXFP4 blocks (every nibble), exponent bytes drawn from `exponents`."""
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, size=(n * k // 32, 17), dtype=np.uint8)
    raw[:, 0] = rng.choice(np.asarray(exponents, dtype=np.uint8), size=raw.shape[0])
    return raw.reshape(n, -1)


def bits(a) -> np.ndarray:
    return np.asarray(a, dtype=np.float32).view(np.uint32)


def test_e8m0_half_is_two_to_the_e_minus_128():
    """Every exponent byte, the subnormal 2^-128 and 2^-127 (e = 0, 1) included."""
    e = np.arange(256, dtype=np.uint8)
    ours = formats.e8m0_half(torch.from_numpy(e)).numpy()
    assert np.array_equal(bits(ours), bits(gq.MXFP4.e8m0_to_fp32_half(e)))
    assert np.array_equal(ours.astype(np.float64), [math.ldexp(1.0, int(v) - 128) for v in e])


def test_packing_is_the_files_values_bit_for_bit():
    """Exponents 0, 1, 2 (subnormal and smallest normal scales) to 254 (whose larger values overflow
    to inf, in gguf's decoder as in ours), every nibble in both halves of a byte, a partial group."""
    n, k = 9, 13 * 32
    raw = mxfp4_blocks(n, k, (0, 1, 2, 3, 100, 127, 128, 200, 253, 254), seed=0)
    blocks = raw.reshape(-1, 17)
    blocks[0, 1:] = np.arange(16, dtype=np.uint8) | (np.arange(15, -1, -1, dtype=np.uint8) << 4)
    blocks[:4, 0] = (0, 1, 2, 254)
    with np.errstate(over="ignore"):
        ref = gq.dequantize(raw, T.MXFP4).reshape(n, k)
        ours = dequant.dequantize(raw, T.MXFP4, (n, k), torch.float32).numpy()
    assert np.isinf(ref).any() and (ref[0, :32] != 0).any()
    p = formats.pack_gguf(raw, T.MXFP4, n, k)
    assert formats.layout_of(p) == "q4mx"
    assert np.array_equal(bits(formats.dequantize(p).numpy()), bits(ref))
    assert np.array_equal(bits(ours), bits(ref))
    assert torch.equal(p["e"], torch.from_numpy(blocks[:, 0].reshape(n, -1)))  # the file's bytes, unchanged
    assert sum(t.numel() for t in p.values()) == raw.size  # 17 bytes a block, as the file
    assert formats.bits_per_weight("q4mx") == 4.25
    assert formats.GGUF_LAYOUTS[T.MXFP4] == formats.Mapping("q4mx", True) and T.MXFP4 not in formats.REQUANTIZED


# Exponents of real weights (2^-16..2^-6 scales) and the subnormal and smallest normal ones; not
# the largest, whose products overflow to inf and sums of infs to NaN (which compares unequal).
EXPONENTS = (0, 1, 2, 112, 116, 119, 120, 121, 122)


@pytest.mark.parametrize("n, k", [(1, 32), (7, 96), (33, 352), (301, 512), (20, 2880)])
def test_native_equals_twin(isa, n, k):
    p = formats.pack_gguf(mxfp4_blocks(n, k, EXPONENTS, seed=n), T.MXFP4, n, k)
    g = torch.Generator().manual_seed(k)
    wides = (False, True) if isa == "avx512-vnni" else (None,)  # the 512-bit tiles too
    try:
        for m in (1, 3, 8, 16, 40):
            x = torch.randn(m, k, generator=g)
            twin = packed_linear(x, "q4mx", p, native=False)
            for wide in wides:
                kernels.set_wide(wide)
                assert torch.equal(packed_linear(x, "q4mx", p, native=True), twin), (m, wide)
    finally:
        kernels.set_wide(None)


def test_largest_integer_sums(isa):
    """Every weight +-12 against activations at +-127: block sums of 32 x 12 x 127, which AVX2 adds
    in int16 over 8 sub-steps (8 x 2 x 12 x 127 < 2^15) before widening."""
    n, k = 8, 2880
    raw = mxfp4_blocks(n, k, (118,), seed=1)
    blocks = raw.reshape(-1, 17)
    blocks[: len(blocks) // 2, 1:] = 0x77  # value 12
    blocks[len(blocks) // 2:, 1:] = 0xFF  # value -12
    p = formats.pack_gguf(raw, T.MXFP4, n, k)
    x = torch.ones(5, k)
    x[1] = -1
    y = packed_linear(x, "q4mx", p, native=True)
    assert torch.equal(y, packed_linear(x, "q4mx", p, native=False))
    w = formats.dequantize(p).double()
    assert torch.allclose(y.double(), x.double() @ w.T, rtol=1e-6)  # x quantizes exactly: every value 127


def test_grouped_linear_equals_each_matmul(isa):
    """An MoE layer's chosen experts of gpt-oss' row length in one call, 1 to 40 rows each."""
    k = 2880
    packs = [formats.pack_gguf(mxfp4_blocks(n, k, EXPONENTS[2:], seed=n), T.MXFP4, n, k) for n in (64, 5, 36, 17)]
    g = torch.Generator().manual_seed(3)
    xs = [torch.randn(m, k, generator=g) for m in (1, 3, 16, 40)]
    ys = torch.ops.fastdecode.grouped_linear("q4mx", xs, [p[name] for p in packs for name in ("qweight", "e")])
    for x, p, y in zip(xs, packs, ys):
        assert torch.equal(y, packed_linear(x, "q4mx", p, native=True))


def test_bad_exponents_are_named():
    if not ISAS:
        pytest.skip(f"native kernels unavailable: {kernels.unavailable_reason}")
    p = formats.pack_gguf(mxfp4_blocks(4, 64, (120,), seed=2), T.MXFP4, 4, 64)
    with pytest.raises(RuntimeError, match=r"q4mx_linear: e must be a contiguous Byte CPU tensor \[4, 2\]"):
        torch.ops.fastdecode.q4mx_linear(torch.randn(2, 64), p["qweight"], p["e"].half())


def test_opcheck():
    """The fake (torch.compile, export) agrees with the kernel on shapes, strides and schema."""
    if not ISAS:
        pytest.skip(f"native kernels unavailable: {kernels.unavailable_reason}")
    p = formats.pack_gguf(mxfp4_blocks(6, 96, EXPONENTS, seed=3), T.MXFP4, 6, 96)
    torch.library.opcheck(torch.ops.fastdecode.q4mx_linear, (torch.randn(3, 96), p["qweight"], p["e"]))
