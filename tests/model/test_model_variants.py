"""The per-family ModelArgs fields (sliding windows, QK-norm, two RoPE bases, GeGLU,
scaled embedding, post-norms, linear RoPE scaling, layers without RoPE, Granite's multipliers,
OLMo 2's norms, Gemma 2's soft-capping, Phi-3's partial rotary and LongRoPE): the cached path equals the cache-free reference forward, on the portable path
and on the native kernels."""

import dataclasses
import json

import pytest
import torch

from fastdecode import kernels
from fastdecode.model.args import ModelArgs, get_preset
from fastdecode.errors import FastDecodeError
from fastdecode.model.transformer import Transformer, init_random_weights
from fastdecode.quant import apply_kernels

ATOL = 1e-4
GEMMA3 = {f.name: getattr(get_preset("tiny-gemma3"), f.name) for f in dataclasses.fields(ModelArgs)}
VARIANTS = {
    "gemma3": GEMMA3,
    "mistral": dict(sliding_window=6),  # every layer sliding, one RoPE base
    "qwen3": dict(qk_norm=True, head_dim=24),
    "geglu-scaled-embedding": dict(activation="gelu_tanh", embed_scale=8.0, post_norms=True),
    "linear-rope": dict(rope_scaling=dict(kind="linear", factor=4.0), attn_scale=0.1),
    "smollm3-nope": dict(nope_layers=(1,)),
    "granite": dict(embed_scale=3.0, residual_scale=0.5, logits_scaling=4.0, attn_scale=0.3),
    "olmo2": dict(qk_norm=True, qk_norm_full=True, pre_norms=False, post_norms=True),
    # scores and logits capped low enough that most are bent
    "gemma2": dict(activation="gelu_tanh", embed_scale=8.0, post_norms=True, sliding_window=6,
                   layer_types=("sliding", "global"), attn_scale=0.5, attn_softcap=2.0, logit_softcap=3.0),
    # 12 of 16 dims rotated; LongRoPE over the caches' 64 positions (its short factors, the
    # long ones past the original context are the GGUF and HF tests')
    "phi3": dict(rope_dim=12, rope_scaling=dict(kind="longrope", factor=8.0, original_max_position_embeddings=64,
                                                short_factor=(1.0, 1.5, 2.0, 3.0, 1.2, 1.1),
                                                long_factor=(4.0, 5.0, 6.0, 7.0, 8.0, 9.0))),
}
PATHS = ["portable", "native"]


def make(changes, path):
    args = get_preset("tiny").replace(**changes)
    model = init_random_weights(Transformer(args), seed=0).eval()
    if path == "native":
        if not kernels.load_kernels():
            pytest.skip(f"native kernels unavailable: {kernels.unavailable_reason}")
        assert "attention" in apply_kernels(model, gemv=False).ops
    return model


def positions(B, start, n):
    return torch.arange(start, start + n).expand(B, n)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("kind", ["static", "dynamic"])
@pytest.mark.parametrize("name", VARIANTS)
def test_cache_past_the_window_equals_the_reference(name, kind, path):
    """A prompt longer than the window, then decode steps well past it."""
    model = make(VARIANTS[name], path)
    tokens = torch.randint(0, 256, (2, 45), generator=torch.Generator().manual_seed(1))
    ref = model(tokens, None)
    model.setup_caches(2, 64, kind=kind)
    out = [model(tokens[:, :20], positions(2, 0, 20))]
    for i in range(20, 45):
        out.append(model(tokens[:, i:i + 1], positions(2, i, 1)))
    torch.testing.assert_close(torch.cat(out, dim=1), ref, atol=ATOL, rtol=0)


@pytest.mark.parametrize("path", PATHS)
def test_rows_at_different_positions_share_a_step(path):
    """Sequences of 9, 40 and 25 tokens (window 16) in slots 2, 0 and 3, chunked prefill
    of several tokens per step: each gets what it gets alone."""
    model = make(GEMMA3, path)
    g = torch.Generator().manual_seed(3)
    seqs = [torch.randint(0, 256, (1, n), generator=g) for n in (9, 40, 25)]
    model.setup_caches(4, 64)
    rows = torch.tensor([2, 0, 3])
    for row, seq in zip(rows, seqs):
        n = seq.shape[1] - 3
        model(seq[:, :n], positions(1, 0, n), rows=row[None])
    # The last three tokens of every row in one step of T=3.
    last = torch.cat([seq[:, -3:] for seq in seqs])
    pos = torch.stack([torch.arange(seq.shape[1] - 3, seq.shape[1]) for seq in seqs])
    got = model(last, pos, rows=rows)
    for b, seq in enumerate(seqs):
        torch.testing.assert_close(got[b], model(seq, None)[0, -3:], atol=ATOL, rtol=0)


def test_sliding_layers_use_their_own_rope_base_and_window():
    model = make(GEMMA3, "portable")
    assert [layer.attention.window for layer in model.layers] == [16, 0]
    assert model.rope_local_inv_freq.shape == model.rope_inv_freq.shape
    assert not torch.equal(model.rope_local_inv_freq, model.rope_inv_freq)
    # A window as long as the sequence changes nothing: layer 0 then sees every key.
    tokens = torch.randint(0, 256, (1, 16))
    wide = init_random_weights(Transformer(get_preset("tiny-gemma3").replace(sliding_window=512)), seed=0).eval()
    torch.testing.assert_close(model(tokens, None), wide(tokens, None), atol=0, rtol=0)


# --- ModelArgs -------------------------------------------------------------------------------

def test_the_model_holds_nothing_per_declared_position():
    """A file declares its context (Llama-3.2-1B: 131,072 positions), the engine's cache holds
    fewer; no buffer of the model may grow with the declaration (RoPE tables of every position
    were 34 MB of Llama-3.2-1B's 1.1x memory budget)."""
    def buffer_bytes(max_seq_len):
        m = Transformer(get_preset("tiny-gemma3").replace(max_seq_len=max_seq_len))
        return sum(b.numel() * b.element_size() for b in m.buffers())

    assert buffer_bytes(1 << 20) == buffer_bytes(64)


@pytest.mark.parametrize("changes, words", [
    (dict(sliding_window=600), "sliding window of 600 positions is larger than the context of 512"),
    (dict(sliding_window=0), "sliding_window must be an integer >= 1"),
    (dict(layer_types=("sliding",)), "layer_types must name 2 layers"),
    (dict(layer_types=("sliding", "local")), "each one of global, sliding"),
    (dict(layer_types=("sliding", "global")), "sliding layers but sliding_window is not set"),
    (dict(activation="relu"), "activation must be one of silu, gelu_tanh"),
    (dict(attn_scale=0.0), "attn_scale must be > 0"),
    (dict(rope_scaling=dict(kind="dynamic")), "rope_scaling.kind must be one of llama3, linear, yarn"),
    (dict(rope_scaling=dict(kind="yarn", beta_fast=1.0, beta_slow=32.0)), "needs 0 < beta_slow <= beta_fast"),
])
def test_bad_args_are_one_line(changes, words):
    with pytest.raises(FastDecodeError, match=words) as info:
        get_preset("tiny").replace(**changes)
    assert "\n" not in str(info.value)


def test_args_survive_json():
    """Exported packages and cached conversions store args as JSON (lists, not tuples)."""
    args = get_preset("tiny-gemma3")
    again = ModelArgs(**json.loads(json.dumps(dataclasses.asdict(args))))
    assert again == args and again.layer_types == ("sliding", "global")
    assert [args.window(i) for i in range(2)] == [16, 0]
    assert get_preset("tiny").replace(sliding_window=8).window(1) == 8  # no layer types: every layer
