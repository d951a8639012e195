"""The quantized matmul kernels against references nobody here wrote.

Weights are quantized by the `gguf` package's own quantizers (Q4_0, Q4_1, Q5_0,
Q8_0) or, for Q4_K, which it cannot quantize, built as random blocks; the
reference weights are `gguf.quants.dequantize` of the same bytes. Every
instruction set this CPU has is checked, and the PyTorch reference path too.

Tolerance: activations are quantized to int8 blocks of 32 (scale d = amax/127),
so each activation is off by at most d/2 and a dot product by at most
sum_blocks d_b/2 * sum_{i in b} |w_i|. That bound (plus float32 rounding) is
what the kernels are held to against the float64 product. Against the PyTorch
twin (quant/reference.py), which repeats their arithmetic, they agree bit for bit.
"""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as T
from gguf import quants as gq

from fastdecode import kernels
from fastdecode.quant import formats, reference
from fastdecode.quant.linear import packed_linear, qlinear

TYPES = [T.Q4_0, T.Q4_1, T.Q5_0, T.Q8_0, T.Q4_K]
from isa_fixture import ISAS, isa  # noqa: F401  (fixture)


def gguf_weight(qtype: T, n: int, k: int, seed: int) -> tuple[np.ndarray, torch.Tensor]:
    """(raw GGUF bytes [n, row bytes], their dequantization by the gguf package)."""
    rng = np.random.default_rng(seed)
    if qtype in (T.Q4_K, T.Q5_K):  # no quantizer in gguf: random blocks with small d, dmin
        raw = rng.integers(0, 256, size=(n * k // 256, GGML_QUANT_SIZES[qtype][1]), dtype=np.uint8)
        raw[:, 0:2] = np.frombuffer(np.float16(0.011).tobytes(), np.uint8)  # d
        raw[:, 2:4] = np.frombuffer(np.float16(0.007).tobytes(), np.uint8)  # dmin
        raw = raw.reshape(n, -1)
    else:
        raw = gq.quantize(rng.standard_normal((n, k), dtype=np.float32), qtype)
    return raw, torch.from_numpy(gq.dequantize(raw, qtype).reshape(n, k).copy())


def act_bound(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """[M, N] bound on |y_kernel - x w^T| from int8 activation rounding."""
    xb = x.double().reshape(x.shape[0], -1, 32)
    half_step = xb.abs().amax(-1) / 127 / 2  # [M, nb]
    wabs = w.double().abs().reshape(w.shape[0], -1, 32).sum(-1)  # [N, nb]
    return half_step @ wabs.T


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_repacking_is_exact(qtype):
    n, k = 13, 512
    raw, ref = gguf_weight(qtype, n, k, seed=1)
    packed = formats.pack_gguf(raw, qtype, n, k)
    assert torch.equal(formats.dequantize(packed), ref)


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("n", [1, 7, 64, 301])  # odd row counts and tile remainders
def test_kernel_matches_dequantized_matmul(isa, qtype, n):
    # K of 3, 7, 18 and 33 blocks: a last group of 3, 7, 2 or 1 (0, 0, 2 and 4 full groups before
    # it). On VNNI the q4/q5 layouts take the 4 x 4 tiles for all M > 1 up to K = 768, the one-row
    # tiles at M = 2..16 past it (K = 1056).
    k = 256 if qtype == T.Q4_K else {7: 224, 64: 576, 301: 1056}.get(n, 96)
    raw, w = gguf_weight(qtype, n, k, seed=n)
    packed = formats.pack_gguf(raw, qtype, n, k)
    g = torch.Generator().manual_seed(n)
    for m in (1, 2, 3, 5, 8, 12, 16, 17, 64):  # 12, 16: the 1-row tiles in passes (VNNI)
        x = torch.randn(m, k, generator=g)
        y = packed_linear(x, formats.layout_of(packed), packed, native=True)
        exact = x.double() @ w.double().T
        bound = act_bound(x, w) * 1.001 + 1e-4 * (1 + exact.abs())
        assert ((y.double() - exact).abs() <= bound).all(), (m, (y.double() - exact).abs().max())
        ref = packed_linear(x, formats.layout_of(packed), packed, native=False)
        assert torch.equal(y, ref)


@pytest.mark.parametrize("qtype", [T.Q4_0, T.Q4_1, T.Q8_0, T.Q4_K], ids=lambda t: t.name)
def test_row_result_does_not_depend_on_m(isa, qtype):
    """A row's output is bit-identical whether it is computed alone or in a batch (M = 1..64)."""
    n, k = 70, 512
    raw, _ = gguf_weight(qtype, n, k, seed=3)
    p = formats.pack_gguf(raw, qtype, n, k)
    x = torch.randn(64, k, generator=torch.Generator().manual_seed(0))
    lay = formats.layout_of(p)
    full = packed_linear(x, lay, p, native=True)
    for m in (1, 2, 3, 5, 12, 16, 63):
        part = packed_linear(x[:m], lay, p, native=True)
        assert torch.equal(part, full[:m])
    alone = torch.cat([packed_linear(x[i:i + 1], lay, p, native=True) for i in range(64)])
    assert torch.equal(alone, full)


def test_instruction_sets_agree_bitwise():
    """AVX2 and VNNI sum the same int32 products in the same float order."""
    if len(ISAS) < 2:
        pytest.skip(f"this CPU runs only {ISAS}")
    raw, _ = gguf_weight(T.Q4_1, 40, 256, seed=5)
    p = formats.pack_gguf(raw, T.Q4_1, 40, 256)
    x = torch.randn(9, 256)
    outs = []
    for name in ISAS:
        kernels.set_isa(name)
        outs.append(qlinear(x, p["qweight"], p["scales"], p["mins"], native=True))
    kernels.set_isa(None)
    assert all(torch.equal(o, outs[0]) for o in outs)


_AMX_RUN = """
import sys, torch
from fastdecode import kernels
from fastdecode.quant import formats
from fastdecode.quant.linear import packed_linear
kernels.load_kernels()
kernels.set_isa("avx512-vnni")
cases = torch.load(sys.argv[1])
torch.save({name: packed_linear(x, formats.layout_of(p), p, native=True) for name, (p, x) in cases.items()}, sys.argv[2])
"""


def test_amx_tiles_give_the_vnni_tiles_bits(tmp_path):
    """Where the CPU has AMX, q4, q4s, q8, q4k and q5k matmuls of 32+ rows take AMX tile products
    (45 rows: 2 tiles of 16 and 13 rows on the VNNI tiles; 37 weight rows: a pair of panels, then a
    padded last panel alone; K = 1056: 33 blocks, so groups of 8 and a last block without a pair;
    the K-quants: K = 1280, 5 groups). Each block's integer sums are exact either way and the float steps
    the same, so the output equals the VNNI tiles' (FASTDECODE_NO_AMX=1) and the twin's bit for
    bit. Run in subprocesses: whether AMX is used is settled once a process."""
    if "avx512-vnni" not in ISAS or "amx_int8" not in Path("/proc/cpuinfo").read_text():
        pytest.skip("no AMX (or no AVX-512 VNNI) on this CPU")
    cases = {}
    for qtype, k in ((T.Q4_0, 1056), (T.Q4_1, 1056), (T.Q8_0, 1056), (T.Q4_K, 1280), (T.Q5_K, 1280)):
        raw, _ = gguf_weight(qtype, 37, k, seed=7)
        cases[qtype.name] = (formats.pack_gguf(raw, qtype, 37, k),
                             torch.randn(45, k, generator=torch.Generator().manual_seed(2)))
    torch.save(cases, tmp_path / "cases.pt")
    outs = []
    for off in ("0", "1"):
        path = tmp_path / f"out{off}.pt"
        env = {**os.environ, "FASTDECODE_NO_AMX": off}
        subprocess.run([sys.executable, "-c", _AMX_RUN, str(tmp_path / "cases.pt"), str(path)], env=env, check=True,
                       timeout=600)
        outs.append(torch.load(path))
    for name, (packed, x) in cases.items():
        ref = packed_linear(x, formats.layout_of(packed), packed, native=False)
        assert torch.equal(outs[0][name], outs[1][name]), name
        assert torch.equal(outs[0][name], ref), name


def test_fused_rows_equal_separate_matmuls(isa):
    """QKV and gate/up are one matrix: concatenated rows give the parts' outputs."""
    parts = [formats.pack_gguf(*gguf_weight(T.Q4_1, n, 128, seed=n)[:1], T.Q4_1, n, 128) for n in (64, 16, 16)]
    fused = {s: torch.cat([p[s] for p in parts]) for s in formats.LAYOUT_TENSORS["q4"]}
    x = torch.randn(3, 128)
    y = qlinear(x, fused["qweight"], fused["scales"], fused["mins"], native=True)
    sep = torch.cat([qlinear(x, p["qweight"], p["scales"], p["mins"], native=True) for p in parts], dim=1)
    assert torch.equal(y, sep)


@pytest.mark.parametrize("layout", ["q4", "q8"])
def test_quantize_float_weights(layout):
    """weights=int4/int8: the packed form dequantizes to within half a step of the input. 1,000 rows
    of 1,056 are quantized in three chunks of whole panels, the last one partial, to the same bits
    as all the rows at once."""
    w = torch.randn(1000, 1056)
    p = formats.quantize(w, layout)
    whole = formats._quantize_rows(w, layout)
    assert p.keys() == whole.keys() and all(torch.equal(p[k], whole[k]) for k in p)
    deq = formats.dequantize(p)
    scales = formats.from_panels(layout, p)[1]["scales"]  # in row order
    step = scales.float().repeat_interleave(32, dim=1)
    assert ((deq - w).abs() <= step / 2 + 1e-3 * w.abs() + 1e-6).all()
    with pytest.raises(formats.BlockSizeError):
        formats.quantize(torch.randn(4, 48), layout)


@pytest.mark.parametrize("per256", [False, True])
def test_reference_activation_quantization_matches_definition(per256):
    x = torch.randn(4, 512)
    q, d = reference.quantize_activations(x, per256=per256)
    xb = x.reshape(4, 16, 32)
    amax = x.reshape(4, 2, 256).abs().amax(-1).repeat_interleave(8, 1) if per256 else xb.abs().amax(-1)
    assert torch.equal(d, amax / 127)
    assert q.abs().max() <= 127 and torch.equal(q, torch.round(q))
    assert ((q * d[..., None] - xb).abs() <= d[..., None] / 2 + 1e-7).all()


def test_bad_shapes_raise():
    if not ISAS:
        pytest.skip(f"native kernels unavailable: {kernels.unavailable_reason}")
    raw, _ = gguf_weight(T.Q4_1, 8, 64, seed=0)
    p = formats.pack_gguf(raw, T.Q4_1, 8, 64)
    with pytest.raises(RuntimeError, match="qweight has"):
        torch.ops.fastdecode.q4_linear(torch.randn(2, 96), p["qweight"], p["scales"], p["mins"])


def test_q8_minus_128_weights(isa):
    """A crafted Q8_0 block may hold -128, which VNNI's w + 128 and AVX2's |w| must still take exactly."""
    v = torch.randint(-128, 128, (40, 96), generator=torch.Generator().manual_seed(4))
    v[:, :7] = -128
    p = formats.to_panels("q8", v, {"scales": torch.rand(40, 3).half()})
    x = torch.randn(5, 96)
    y = qlinear(x, p["qweight"], p["scales"], None, native=True)
    assert torch.equal(y, qlinear(x, p["qweight"], p["scales"], None, native=False))
    exact = x.double() @ formats.dequantize(p).double().T
    assert ((y.double() - exact).abs() <= act_bound(x, formats.dequantize(p)) * 1.001 + 1e-4 * (1 + exact.abs())).all()
