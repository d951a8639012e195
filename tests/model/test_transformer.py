import pytest
import torch

from fastdecode.model.args import get_preset
from fastdecode.model.transformer import rope_frequencies

from conftest import make_model

ATOL = 1e-4


def positions(B, start, n):
    return torch.arange(start, start + n).expand(B, n)  # [B, n]


def incremental_logits(model, tokens, prefill_len, kind="static", rows=None):
    """Prefill `prefill_len` tokens, then feed the rest one at a time through the cache."""
    B, T = tokens.shape
    model.setup_caches(B if rows is None else int(rows.max()) + 1, 64, kind=kind)
    out = [model(tokens[:, :prefill_len], positions(B, 0, prefill_len), rows=rows)]
    for i in range(prefill_len, T):
        out.append(model(tokens[:, i:i + 1], positions(B, i, 1), rows=rows))
    return torch.cat(out, dim=1)


@pytest.mark.parametrize("n_kv_heads", [1, 2, 4])  # MQA, GQA, MHA with n_heads=4
@pytest.mark.parametrize("kind", ["static", "dynamic"])
def test_cache_matches_full_attention(n_kv_heads, kind):
    model = make_model(n_kv_heads=n_kv_heads)
    tokens = torch.randint(0, 256, (2, 27), generator=torch.Generator().manual_seed(1))
    ref = model(tokens, None)
    got = incremental_logits(model, tokens, prefill_len=7, kind=kind)  # prefill + 20 decode steps
    assert got.shape == ref.shape == (2, 27, 260)
    torch.testing.assert_close(got, ref, atol=ATOL, rtol=0)


@pytest.mark.parametrize("changes", [dict(tie_embeddings=True), dict(qkv_bias=True), dict(head_dim=32),
                                     dict(rope_scaling=dict(factor=4.0, original_max_position_embeddings=64))])
def test_cache_matches_full_attention_variants(changes):
    model = make_model(**changes)
    tokens = torch.randint(0, 256, (1, 25), generator=torch.Generator().manual_seed(2))
    torch.testing.assert_close(incremental_logits(model, tokens, 5), model(tokens, None), atol=ATOL, rtol=0)


def test_reference_path_touches_no_cache():
    model = make_model()
    model.setup_caches(1, 32)
    tokens = torch.randint(0, 256, (1, 9))
    model(tokens[:, :4], positions(1, 0, 4))
    before = [layer.attention.kv_cache.k_cache.clone() for layer in model.layers]
    model(tokens, None)
    after = [layer.attention.kv_cache.k_cache for layer in model.layers]
    assert all(torch.equal(a, b) for a, b in zip(before, after))


@pytest.mark.parametrize("kind", ["static", "dynamic"])
def test_rows_at_different_positions_share_a_step(kind):
    """Three sequences in slots 4, 0 and 2, fed at different lengths in one
    batch, compute what each computes alone."""
    model = make_model()
    g = torch.Generator().manual_seed(3)
    seqs = [torch.randint(0, 256, (1, n), generator=g) for n in (9, 14, 6)]
    model.setup_caches(5, 32, kind=kind)
    rows = torch.tensor([4, 0, 2])
    # Ragged prefill, one row at a time, then each row's last token in one decode step.
    for row, seq in zip(rows, seqs):
        model(seq[:, :-1], positions(1, 0, seq.shape[1] - 1), rows=row[None])
    last = torch.cat([seq[:, -1:] for seq in seqs])
    pos = torch.tensor([[seq.shape[1] - 1] for seq in seqs])
    got = model(last, pos, rows=rows)  # [3, 1, V]
    for b, seq in enumerate(seqs):
        torch.testing.assert_close(got[b, 0], model(seq, None)[0, -1], atol=ATOL, rtol=0)


def test_a_reused_slot_hides_its_previous_occupant():
    model = make_model()
    g = torch.Generator().manual_seed(4)
    long, short = torch.randint(0, 256, (1, 30), generator=g), torch.randint(0, 256, (1, 5), generator=g)
    model.setup_caches(1, 32)
    model(long, positions(1, 0, 30))
    got = model(short, positions(1, 0, 5))  # the same slot, from position 0
    torch.testing.assert_close(got, model(short, None), atol=ATOL, rtol=0)


def test_last_only_returns_final_position():
    model = make_model()
    tokens = torch.randint(0, 256, (2, 8))
    torch.testing.assert_close(model(tokens, None, last_only=True), model(tokens, None)[:, -1:])


def test_the_cached_path_needs_setup_caches():
    model = make_model()
    assert model.kv_cache is None
    with pytest.raises(RuntimeError, match="setup_caches"):
        model(torch.tensor([[1]]), torch.tensor([[0]]))


def test_cache_longer_than_model_context_is_refused():
    model = make_model()
    with pytest.raises(ValueError, match="max_seq_len"):
        model.setup_caches(1, 10_000)


def test_llama3_rope_scaling_matches_transformers():
    rope_utils = pytest.importorskip("transformers.modeling_rope_utils")
    from transformers import LlamaConfig

    scaling = dict(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=8192)
    args = get_preset("tiny").replace(head_dim=128, rope_theta=500000.0, rope_scaling=scaling, max_seq_len=131072)
    cfg = LlamaConfig(hidden_size=args.n_heads * 128, num_attention_heads=args.n_heads, head_dim=128,
                      rope_theta=500000.0, max_position_embeddings=131072,
                      rope_scaling=dict(rope_type="llama3", **scaling))
    ref, _ = rope_utils.ROPE_INIT_FUNCTIONS["llama3"](cfg, "cpu")
    torch.testing.assert_close(rope_frequencies(args), ref.float(), rtol=1e-6, atol=0)


@pytest.mark.parametrize("scaling", [
    dict(factor=4.0, original_max_position_embeddings=32768),  # Qwen's model-card setting
    dict(factor=8.0, original_max_position_embeddings=4096, beta_fast=16.0, beta_slow=2.0, attention_factor=1.3),
    dict(factor=2.0, original_max_position_embeddings=8192, truncate=False),
], ids=["qwen", "explicit", "untruncated"])
def test_yarn_rope_scaling_matches_transformers(scaling):
    rope_utils = pytest.importorskip("transformers.modeling_rope_utils")
    from transformers import Qwen3Config

    args = get_preset("tiny").replace(head_dim=128, rope_theta=1e6, max_seq_len=131072,
                                      rope_scaling=dict(kind="yarn", **scaling))
    cfg = Qwen3Config(hidden_size=args.n_heads * 128, num_attention_heads=args.n_heads, head_dim=128,
                      max_position_embeddings=131072,
                      rope_parameters=dict(rope_type="yarn", rope_theta=1e6, **scaling))
    ref, attention = rope_utils.ROPE_INIT_FUNCTIONS["yarn"](cfg, "cpu")
    torch.testing.assert_close(rope_frequencies(args), ref.float(), rtol=0, atol=0)
    assert args.rope_scaling.cos_sin_scale == pytest.approx(attention, rel=1e-12)
    assert attention != 1.0


@pytest.mark.parametrize("name, ours", [("silu", "silu"), ("gelu_pytorch_tanh", "gelu_tanh"), ("gelu", "gelu")])
def test_feed_forward_activations_are_transformers(name, ours):
    """Each gated MLP activation is the transformers function of that name (gates of a few units,
    where the tanh form and the exact GELU are 1e-3 apart)."""
    activations = pytest.importorskip("transformers.activations")
    from fastdecode.model.transformer import FeedForward

    ff = FeedForward(get_preset("tiny").replace(activation=ours))
    x = 3 * torch.randn(5, ff.w13.in_features, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ff.w13.weight.normal_(0, 0.3)
        gate, up = ff.w13(x).chunk(2, dim=-1)
        want = ff.w2(activations.ACT2FN[name](gate) * up)
        torch.testing.assert_close(ff(x), want, atol=1e-6, rtol=0)
        if ours != "silu":  # the other GELU would not pass
            other = activations.ACT2FN["gelu" if ours == "gelu_tanh" else "gelu_pytorch_tanh"]
            assert (ff.w2(other(gate) * up) - want).abs().max() > 1e-4
