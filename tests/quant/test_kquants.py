"""The layouts q4k, q5k, q6k (Q4_K, Q5_K, Q6_K kept in their own bytes), q5s and q5 (Q5_0, Q5_1),
q4nl, q4xs and q4mx (IQ4_NL, IQ4_XS, MXFP4), and SplitLinear; and every layout's 512-bit tiles and
grouped calls (tests/quant/test_mxfp4.py has q4mx's own).

The gguf package cannot quantize K-quants or the IQ4 types, so their blocks are random bytes of
the right structure (any byte pattern is a valid block) with float16 d/dmin set
to sane values (MXFP4's: random bytes too, every nibble, with exponent bytes of weights near
2^-6); Q4_0/Q4_1/Q8_0/Q5_0/Q5_1 blocks come from `gguf.quants.quantize`. The reference
weights are `gguf.quants.dequantize` of the same bytes.
Native kernels == the PyTorch twin bit for bit on every instruction set; the
twin == dequantize-then-matmul with the same int8 activations, to float32 rounding.
"""

import numpy as np
import pytest
import torch
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as T
from gguf import quants as gq

from fastdecode import kernels
from fastdecode.checkpoints import dequant
from fastdecode.quant import formats, reference
from fastdecode.quant.linear import QuantLinear, SplitLinear, packed_linear

KTYPES = [T.Q4_K, T.Q5_K, T.Q6_K, T.Q5_0, T.Q5_1, T.IQ4_NL, T.IQ4_XS, T.MXFP4]
LAYOUT = {T.Q4_K: "q4k", T.Q5_K: "q5k", T.Q6_K: "q6k", T.Q5_0: "q5s", T.Q5_1: "q5", T.IQ4_NL: "q4nl", T.IQ4_XS: "q4xs",
          T.MXFP4: "q4mx"}
_D_AT = {T.Q4_K: (0, 2), T.Q5_K: (0, 2), T.Q6_K: (208,), T.IQ4_NL: (0,), T.IQ4_XS: (0,)}  # byte offsets of the fp16 d (and dmin)
from isa_fixture import ISAS, isa  # noqa: F401  (fixture)
MS = (1, 2, 3, 5, 8, 12, 16, 17, 64)


def random_blocks(qtype: T, n: int, k: int, seed: int) -> tuple[np.ndarray, torch.Tensor]:
    """(raw bytes [n, row bytes], their dequantization by the gguf package)."""
    rng = np.random.default_rng(seed)
    if qtype in (T.Q4_0, T.Q4_1, T.Q8_0, T.Q5_0, T.Q5_1):
        raw = gq.quantize(rng.standard_normal((n, k), dtype=np.float32), qtype)
        return raw, torch.from_numpy(gq.dequantize(raw, qtype).reshape(n, k).copy())
    size, nbytes = GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, size=(n * k // size, nbytes), dtype=np.uint8)
    if qtype == T.MXFP4:  # exponent bytes: block scales 2^-16..2^-6, weights up to 12 times that
        raw[:, 0] = rng.integers(112, 123, size=raw.shape[0])
    for at in _D_AT.get(qtype, ()):
        d = rng.uniform(0.001, 0.02, size=raw.shape[0]).astype(np.float16)
        raw[:, at:at + 2] = d.view(np.uint8).reshape(-1, 2)
    raw = raw.reshape(n, -1)
    return raw, torch.from_numpy(gq.dequantize(raw, qtype).reshape(n, k).copy())


@pytest.mark.parametrize("qtype", KTYPES, ids=lambda t: t.name)
def test_packing_is_exact_and_compact(qtype):
    n, k = 7, 768
    raw, ref = random_blocks(qtype, n, k, seed=1)
    p = formats.pack_gguf(raw, qtype, n, k)
    assert formats.layout_of(p) == LAYOUT[qtype]
    assert torch.equal(formats.dequantize(p), ref)
    assert torch.equal(dequant.dequantize(raw, qtype, (n, k), torch.float32), ref)
    nbytes = sum(t.numel() * t.element_size() for t in p.values())
    bpw = {T.Q4_K: 4.625, T.Q5_K: 5.625, T.Q6_K: 6.5625, T.Q5_0: 5.5, T.Q5_1: 6.0, T.IQ4_NL: 4.5, T.IQ4_XS: 4.3125,
           T.MXFP4: 4.25}[qtype]
    assert nbytes * 8 / (n * k) == bpw == formats.bits_per_weight(LAYOUT[qtype])
    if qtype == T.Q6_K:  # the file's low nibbles, regrouped into the lane order
        ql = raw.reshape(-1, 210)[:, :128]
        assert sorted(np.concatenate([ql & 15, ql >> 4]).ravel().tolist()) == \
            sorted(torch.cat([p["qweight"] & 15, p["qweight"] >> 4]).ravel().tolist())


@pytest.mark.parametrize("qtype", KTYPES, ids=lambda t: t.name)
def test_twin_matches_dequantized_matmul(qtype):
    """The twin against checkpoints/dequant.py: dequantize, then an fp64 matmul with the
    same int8-quantized activations; the only differences are float32 roundings."""
    n, k = 37, 512
    raw, _ = random_blocks(qtype, n, k, seed=2)
    w = dequant.dequantize(raw, qtype, (n, k), torch.float32).double()
    p = formats.pack_gguf(raw, qtype, n, k)
    x = torch.randn(9, k, generator=torch.Generator().manual_seed(2))
    q, d = reference.quantize_activations(x, per256=LAYOUT[qtype] in reference.PER256)
    xh = (q * d[..., None]).reshape(9, k).double()
    exact = xh @ w.T
    y = reference.klinear(x, p).double()
    scale = (xh.abs() @ w.abs().T)  # the magnitude the float32 sums run at
    assert ((y - exact).abs() <= 2e-6 * scale + 1e-6).all(), ((y - exact).abs() / scale).max()


@pytest.mark.parametrize("qtype", KTYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("n", [1, 7, 301])  # odd row counts and tile remainders
def test_native_equals_twin(isa, qtype, n):
    k = 256 if n == 301 else 512
    raw, _ = random_blocks(qtype, n, k, seed=n)
    p = formats.pack_gguf(raw, qtype, n, k)
    lay = LAYOUT[qtype]
    g = torch.Generator().manual_seed(n)
    for m in MS:
        x = torch.randn(m, k, generator=g)
        assert torch.equal(packed_linear(x, lay, p, native=True), packed_linear(x, lay, p, native=False)), m


@pytest.mark.parametrize("qtype", [T.Q4_K, T.Q5_K, T.Q6_K], ids=lambda t: t.name)
def test_group_sums_past_2_24_round_as_the_twin(isa, qtype):
    """The K-quants' integer sums over a group of 8 blocks exceed 2^24 at extreme values
    (every nibble and scale at its maximum, activations near their block maximum), so their
    conversion to float rounds; the kernels and the twin must round alike."""
    n, k = 48, 1024
    raw, _ = random_blocks(qtype, n, k, seed=11)
    blocks = raw.reshape(-1, GGML_QUANT_SIZES[qtype][1])
    if qtype in (T.Q4_K, T.Q5_K):  # the first n / 2 rows: scale and min bytes (6-bit 63s), values 15 (Q5_K: 31)
        blocks[:n * 2, 4:] = 0xFF
    else:
        blocks[:n * 2, :192] = 0xFF  # values 63 (q - 32 = 31)
        blocks[:n * 2, 192:208] = 0x7F  # scales 127
    p = formats.pack_gguf(raw, qtype, n, k)
    lay = LAYOUT[qtype]
    x = 1 + 0.02 * torch.randn(8, k, generator=torch.Generator().manual_seed(1))
    ref = packed_linear(x, lay, p, native=False)
    q, _ = reference.quantize_activations(x, per256=True)
    # so I_g >= 8 x 32 x 100 x (q4k: 15 x 63; q5k: 31 x 63; q6k: 31 x 127) > 2^24 in the first rows
    assert q.min() >= 100
    for m in (1, 3, 8):
        assert torch.equal(packed_linear(x[:m], lay, p, native=True), ref[:m]), m


@pytest.mark.parametrize("qtype", KTYPES, ids=lambda t: t.name)
def test_row_result_does_not_depend_on_m(isa, qtype):
    n, k = 70, 512
    raw, _ = random_blocks(qtype, n, k, seed=3)
    p = formats.pack_gguf(raw, qtype, n, k)
    lay = LAYOUT[qtype]
    x = torch.randn(64, k, generator=torch.Generator().manual_seed(0))
    full = packed_linear(x, lay, p, native=True)
    for m in (1, 2, 3, 5, 8, 17, 63):
        assert torch.equal(packed_linear(x[:m], lay, p, native=True), full[:m])
    alone = torch.cat([packed_linear(x[i:i + 1], lay, p, native=True) for i in range(64)])
    assert torch.equal(alone, full)


def test_instruction_sets_agree_bitwise():
    if len(ISAS) < 2:
        pytest.skip(f"this CPU runs only {ISAS}")
    x = torch.randn(9, 512)
    for qtype in KTYPES:
        raw, _ = random_blocks(qtype, 40, 512, seed=5)
        p = formats.pack_gguf(raw, qtype, 40, 512)
        outs = []
        for name in ISAS:
            kernels.set_isa(name)
            outs.append(packed_linear(x, LAYOUT[qtype], p, native=True))
        kernels.set_isa(None)
        assert all(torch.equal(o, outs[0]) for o in outs), qtype.name


WIDE_LAYOUT = {T.Q4_0: "q4s", T.Q4_1: "q4", T.Q8_0: "q8", **LAYOUT}


@pytest.mark.parametrize("qtype", list(WIDE_LAYOUT), ids=lambda t: t.name)
def test_wide_tiles_give_the_same_bits(qtype):
    """The 512-bit tiles (two groups a register: 4 x 4; on by default on Zen 5) against the
    256-bit path and the twin: rows of one and several pairs of groups, a group left over, a
    partial last group, at M from 2 (from 4 the wide path also takes the one-row and pair tiles'
    shapes, in tiles of 4 activation rows and a remainder). The layouts in panels (Q4_0, Q4_1,
    Q8_0, Q4_K, Q5_K, Q6_K) have no wide tiles: both settings must still give the twin's bits."""
    if "avx512-vnni" not in ISAS:
        pytest.skip("no AVX-512 VNNI here: the matmuls have one path")
    lay = WIDE_LAYOUT[qtype]
    ks = (512, 768, 1280) if lay in ("q4k", "q5k", "q6k", "q4xs") else (512, 576, 800, 1312)
    g = torch.Generator().manual_seed(11)
    try:
        kernels.set_isa("avx512-vnni")
        for k in ks:
            raw, _ = random_blocks(qtype, 13, k, seed=k)
            p = formats.pack_gguf(raw, qtype, 13, k)
            for m in (2, 5, 16, 17):
                x = torch.randn(m, k, generator=g)
                outs = []
                for wide in (False, True):
                    assert kernels.set_wide(wide) == wide
                    outs.append(packed_linear(x, lay, p, native=True))
                twin = packed_linear(x, lay, p, native=False)
                assert torch.equal(outs[0], twin) and torch.equal(outs[1], twin), (k, m)
    finally:
        kernels.set_isa(None)
        kernels.set_wide(None)


@pytest.mark.parametrize("k", [96, 288, 576])  # fewer than 8 blocks in the last group (and its high bits)
@pytest.mark.parametrize("qtype", [T.Q5_0, T.Q5_1, T.IQ4_NL, T.MXFP4], ids=lambda t: t.name)
def test_partial_last_groups(isa, qtype, k):
    raw, ref = random_blocks(qtype, 11, k, seed=k)
    p = formats.pack_gguf(raw, qtype, 11, k)
    assert torch.equal(formats.dequantize(p), ref)
    for m in MS:
        x = torch.randn(m, k)
        assert torch.equal(packed_linear(x, LAYOUT[qtype], p, True), packed_linear(x, LAYOUT[qtype], p, False)), m


def test_bad_shapes_raise():
    if not ISAS:
        pytest.skip(f"native kernels unavailable: {kernels.unavailable_reason}")
    raw, _ = random_blocks(T.Q6_K, 8, 512, seed=0)
    p = formats.pack_gguf(raw, T.Q6_K, 8, 512)
    with pytest.raises(RuntimeError, match="multiple of 256"):
        torch.ops.fastdecode.q6k_linear(torch.randn(2, 96), p["qweight"], p["qhigh"], p["sc"], p["d"])
    with pytest.raises(RuntimeError, match="qhigh must be"):
        torch.ops.fastdecode.q6k_linear(torch.randn(2, 512), p["qweight"], p["qhigh"][:, :64], p["sc"], p["d"])


def _linear(p: dict, native: bool) -> QuantLinear:
    lay = formats.layout_of(p)
    ql = QuantLinear(formats.packed_k(lay, p), p["qweight"].shape[0], lay)
    for name, t in p.items():
        setattr(ql, name, t)
    ql.native = native
    return ql


@pytest.mark.parametrize("qtype", [T.IQ4_NL, T.IQ4_XS, T.MXFP4], ids=lambda t: t.name)
def test_table_layouts_embed_without_constants(qtype):
    """A token table in q4nl, q4xs or q4mx exported (as a package's step is): its lookup holds no tensor
    constant, which the package would then ask the model for as a weight (and be exported again)."""
    from fastdecode.quant.linear import QuantEmbedding

    n, k = 16, 256
    p = formats.pack_gguf(random_blocks(qtype, n, k, seed=4)[0], qtype, n, k)
    emb = QuantEmbedding(n, k, LAYOUT[qtype])
    for name, t in p.items():
        setattr(emb, name, t)
    tokens = torch.tensor([[1, 7, 15]])
    ep = torch.export.export(emb, (tokens,))
    assert not ep.constants
    assert torch.equal(ep.module()(tokens), formats.dequantize(p)[tokens])


@pytest.mark.parametrize("native", [True, False], ids=["native", "twin"])
def test_split_linear_equals_separate_matmuls(native):
    """A Q4_K_M wqkv: q and k Q4_K, v Q6_K; each part on its own kernel, outputs concatenated."""
    if native and not ISAS:
        pytest.skip(f"native kernels unavailable: {kernels.unavailable_reason}")
    k = 512
    qk = formats.pack_gguf(random_blocks(T.Q4_K, 48, k, seed=7)[0], T.Q4_K, 48, k)
    v = formats.pack_gguf(random_blocks(T.Q6_K, 16, k, seed=8)[0], T.Q6_K, 16, k)
    split = SplitLinear([_linear(qk, native), _linear(v, native)])
    for m in (1, 3, 17):
        x = torch.randn(m, k)
        y = split(x)
        assert y.shape == (m, 64)
        assert torch.equal(y, torch.cat([packed_linear(x, "q4k", qk, native), packed_linear(x, "q6k", v, native)], 1))


@pytest.mark.parametrize("qtype", list(WIDE_LAYOUT), ids=lambda t: t.name)
def test_grouped_linear_equals_each_matmul(isa, qtype):
    """grouped_linear (an MoE layer's chosen experts in one call): each matmul's rows as the single op
    gives them, bit for bit; matrices of different sizes, 1 to 40 activation rows each (AMX from 32)."""
    lay = WIDE_LAYOUT[qtype]
    k = 512
    packs = [formats.pack_gguf(random_blocks(qtype, n, k, seed=n)[0], qtype, n, k) for n in (48, 7, 301)]
    g = torch.Generator().manual_seed(5)
    xs = [torch.randn(m, k, generator=g) for m in (1, 3, 40)]
    tensors = [p[name] for p in packs for name in formats.LAYOUT_TENSORS[lay]]
    ys = torch.ops.fastdecode.grouped_linear(lay, xs, tensors)
    for x, p, y in zip(xs, packs, ys):
        assert torch.equal(y, packed_linear(x, lay, p, native=True))
    with pytest.raises(RuntimeError, match=f"2 inputs need {2 * len(packs[0])} packed tensors"):
        torch.ops.fastdecode.grouped_linear(lay, xs[:2], tensors[:-1])
