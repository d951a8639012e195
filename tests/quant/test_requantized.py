"""The GGUF types without a kernel of their own (formats.REQUANTIZED: Q2_K, Q3_K, the IQ1-IQ3
types, TQ1_0, TQ2_0): decoded by the `gguf` package, then rounded to q8 at load."""

import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as T
from gguf import quants

from fastdecode.checkpoints import dequant, load_checkpoint
from fastdecode.quant import formats

sys.path.insert(0, str(Path(__file__).parents[1] / "checkpoints"))
from tiny_checkpoints import VOCAB, private_cache, write_gguf  # noqa: E402,F401  (autouse fixture)


def valid_blocks(qtype: T, rows: int, k: int, seed: int = 0) -> np.ndarray:
    """[rows, k / block_size * block_bytes] random blocks whose values gguf decodes to finite
    numbers of moderate size (random scale bytes can make inf, NaN, 1e30 or 1e-9)."""
    rng = np.random.default_rng(seed)
    block_size, block_bytes = GGML_QUANT_SIZES[qtype]
    n = rows * k // block_size
    out = np.empty((n, block_bytes), np.uint8)
    filled = 0
    while filled < n:
        cand = rng.integers(0, 256, size=(4 * n, block_bytes), dtype=np.uint8)
        with np.errstate(all="ignore"):
            v = quants.dequantize(cand, qtype)
        peaks = np.abs(v).reshape(len(v), -1, 32).max(-1)  # per q8 block; above 1e-2 its float16 scale is normal
        ok = np.isfinite(v).all(-1) & (peaks < 1e3).all(-1) & (peaks > 1e-2).all(-1)
        take = cand[ok][: n - filled]
        out[filled:filled + len(take)] = take
        filled += len(take)
    return out.reshape(rows, -1)


@pytest.mark.parametrize("qtype", [T.Q2_K, T.Q3_K, T.IQ2_XXS, T.IQ3_S, T.IQ1_M, T.TQ2_0], ids=lambda t: t.name)
def test_requantized_is_q8_of_gguf_values(qtype):
    """The packed q8 holds exactly `quantize(gguf's values, "q8")`, chunked or not, and each value
    is within half a q8 step (plus the float16 scale's rounding) of gguf's."""
    assert qtype in formats.REQUANTIZED
    k = 512
    rows = 16 * (formats._PACK_BYTES // (16 * 4 * k)) + 21  # more than one chunk, a part panel last
    raw = valid_blocks(qtype, rows, k)
    packed = formats.requantize_gguf(raw, qtype, rows, k, dequant.decoder(qtype))
    ref = torch.from_numpy(quants.dequantize(raw, qtype)).reshape(rows, k)
    expected = formats.quantize(ref, "q8")
    assert packed.keys() == expected.keys()
    for name in packed:
        assert torch.equal(packed[name], expected[name]), name
    got = formats.dequantize(packed)
    step = ref.reshape(rows, -1, 32).abs().amax(-1, keepdim=True) / 127
    err = (got.reshape(rows, -1, 32) - ref.reshape(rows, -1, 32)).abs()
    assert (err <= step * 0.51 + step * 127 * 2e-3).all()  # half a step, and float16's 2^-11 of absmax


def test_a_requantized_gguf_loads_packed_and_says_so(tmp_path):
    """A one-layer model of 256-wide rows (these types' blocks are 256 values) whose matrices are
    Q2_K, the tied embedding too: every matrix becomes q8, the summary names the type, and the
    logits follow the float load's."""
    from fastdecode.quant import build_model

    dim, heads, kv_heads, head_dim = 256, 4, 2, 64
    shapes = {"token_embd": (VOCAB, dim), "blk.0.attn_q": (heads * head_dim, dim),
              "blk.0.attn_k": (kv_heads * head_dim, dim), "blk.0.attn_v": (kv_heads * head_dim, dim),
              "blk.0.attn_output": (dim, heads * head_dim), "blk.0.ffn_gate": (dim, dim), "blk.0.ffn_up": (dim, dim),
              "blk.0.ffn_down": (dim, dim)}
    raws = {f"{n}.weight": valid_blocks(T.Q2_K, *shape, seed=i) for i, (n, shape) in enumerate(shapes.items())}
    norms = {f"{n}.weight": np.ones(dim, dtype=np.float32) for n in ("output_norm", "blk.0.attn_norm", "blk.0.ffn_norm")}
    path = write_gguf(tmp_path / "q2k.gguf", {**norms, **raws}, quant={n: T.Q2_K for n in raws}, n_layers=1,
                      head_dim=head_dim, dim=dim, hidden_dim=dim, n_heads=heads, n_kv_heads=kv_heads)
    packed = load_checkpoint(path, dtype=torch.float32, use_cache=False, weights="auto")
    floats = load_checkpoint(path, dtype=torch.float32, use_cache=False, weights="float")
    assert f"Q2_K->q8 (requantized: no native kernel for Q2_K) x{len(raws)}" in packed.weights_summary
    assert not any(k.endswith(".weight") and v.ndim == 2 for k, v in packed.state_dict.items())
    tokens = torch.tensor([[1, 5, 9, 2, 7]])
    with torch.no_grad():
        a = build_model(packed.args, packed.state_dict, torch.float32)[0].eval()(tokens)
        b = build_model(floats.args, floats.state_dict, torch.float32)[0].eval()(tokens)
    cos = torch.nn.functional.cosine_similarity(a.flatten(), b.flatten(), dim=0)
    assert cos > 0.999, cos
