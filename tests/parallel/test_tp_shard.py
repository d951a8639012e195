"""Tensor parallelism in one process: bad input, split arithmetic, exact quantized slices."""

from __future__ import annotations

import pytest
import torch
from conftest import make_model

import fastdecode
from fastdecode.cli import main as cli
from fastdecode.errors import FastDecodeError
from fastdecode.parallel import check_divisible, valid_tp
from fastdecode.parallel.slices import take_columns, take_rows
from fastdecode.quant.formats import dequantize, layout_of, pack_gguf, quantize
from fastdecode.quant.linear import QuantLinear


def test_tp_without_a_process_group_names_torchrun():
    with pytest.raises(FastDecodeError, match=r"tp=2 needs an initialized torch.distributed process group.*torchrun "
                                              r"--nproc-per-node 2"):
        fastdecode.load("tiny", tp=2)


@pytest.mark.parametrize("tp", [0, -1, 1.5, True, "2"])
def test_bad_tp_values(tp):
    with pytest.raises(FastDecodeError, match="is out of range; accepted: an integer >= 1"):
        fastdecode.load("tiny", tp=tp)


def test_cli_tp_without_a_launcher_shows_the_command(capsys, monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert cli.main(["generate", "model=tiny", "tp=2", "hi"]) == cli.EXIT_USAGE
    err = capsys.readouterr().err.strip()
    assert err == ("fastdecode: error: tp=2 runs one process per rank; launch it with torchrun: "
                   "torchrun --nproc-per-node 2 -m fastdecode generate tp=2 ...")


def test_cli_chat_refuses_tp(capsys):
    assert cli.main(["chat", "model=tiny", "tp=2"]) == cli.EXIT_USAGE
    assert "chat runs in one process" in capsys.readouterr().err


def test_divisibility():
    assert valid_tp(make_model()) == [1, 2]  # 4 heads, 2 kv heads
    with pytest.raises(FastDecodeError, match=r"^tp=3 cannot split layers.0.attention: n_heads=4 and n_kv_heads=2"):
        check_divisible(make_model(), 3)
    # tp larger than the kv heads (n_heads would split): refused, kv heads are not replicated
    with pytest.raises(FastDecodeError, match="n_kv_heads=1 must both be multiples of tp; accepted: tp=1$"):
        check_divisible(make_model(n_kv_heads=1), 2)
    with pytest.raises(FastDecodeError, match="feed_forward.w2: its 160 inputs are not a multiple of tp"):
        check_divisible(make_model(n_heads=6, n_kv_heads=3, head_dim=16), 3)


def _quant_linear(layout: str, n: int, k: int) -> QuantLinear:
    w = torch.randn(n, k, generator=torch.Generator().manual_seed(0))
    packed = quantize(w, layout)
    lin = QuantLinear(k, n, layout)
    for name, t in packed.items():
        setattr(lin, name, t)
    return lin


def _gguf_linear(qtype, n: int, k: int) -> QuantLinear:
    """A QuantLinear over random blocks of a GGUF type (finite float16 scale at byte 0; MXFP4 takes
    its low byte as the exponent, any of which is valid)."""
    import numpy as np
    from gguf import GGML_QUANT_SIZES

    size, nbytes = GGML_QUANT_SIZES[qtype]
    rng = np.random.default_rng(0)
    raw = rng.integers(0, 256, size=(n * k // size, nbytes), dtype=np.uint8)
    raw[:, 0:2] = rng.uniform(0.001, 0.02, size=raw.shape[0]).astype(np.float16).view(np.uint8).reshape(-1, 2)
    packed = pack_gguf(raw.reshape(n, -1), qtype, n, k)
    lin = QuantLinear(k, n, layout_of(packed))
    for name, t in packed.items():
        setattr(lin, name, t)
    return lin


@pytest.mark.parametrize("layout", ["q4", "q8", "q4s", "q4nl", "q4mx"])
def test_quantized_slices_are_exact(layout):
    from gguf import GGMLQuantizationType as T

    # 7 blocks: odd counts and odd offsets re-pair the q4 bytes
    if layout in ("q4", "q8"):
        lin = _quant_linear(layout, 12, 7 * 32)
    else:
        lin = _gguf_linear({"q4s": T.Q4_0, "q4nl": T.IQ4_NL, "q4mx": T.MXFP4}[layout], 12, 7 * 32)
    assert lin.layout == layout
    full = dequantize(lin.packed())
    for start, n in [(0, 96), (96, 128), (32, 32), (64, 160)]:
        part = take_columns(lin, start, n, rank=1, name="w")
        assert (part.in_features, part.out_features) == (n, 12)
        assert torch.equal(dequantize(part.packed()), full[:, start:start + n])
    rows = torch.tensor([0, 5, 6, 11])
    assert torch.equal(dequantize(take_rows(lin, rows).packed()), full[rows])


def test_a_column_split_of_a_k_quant_is_one_line():
    from gguf import GGMLQuantizationType as T

    lin = _gguf_linear(T.Q6_K, 4, 512)
    with pytest.raises(FastDecodeError, match=r"^w: tensor parallelism splits the inputs of q4, q4s, q4nl, q4mx and "
                                              r"q8 matrices, not q6k; run this model with tp=1$"):
        take_columns(lin, 0, 256, rank=0, name="w")


def test_quantized_column_split_off_a_block_boundary_is_refused():
    with pytest.raises(FastDecodeError, match=r"^w: inputs \[16, 48\) do not fall on 32-value blocks"):
        take_columns(_quant_linear("q8", 4, 64), 16, 32, rank=0, name="w")


def test_float_slices_and_the_bias_stays_on_rank_0():
    lin = torch.nn.Linear(8, 6, bias=True)
    assert torch.equal(take_rows(lin, torch.tensor([1, 4])).weight, lin.weight[[1, 4]])
    assert torch.equal(take_columns(lin, 4, 4, rank=0, name="w").bias, lin.bias)
    other = take_columns(lin, 4, 4, rank=1, name="w")
    assert other.bias is None and torch.equal(other.weight, lin.weight[:, 4:])
