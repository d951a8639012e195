"""The native cache attention kernel against its PyTorch twin (`model.cache_attention`),
with sliding windows, softmax scales and Gemma 2's soft-capped scores, and proof that it visits
only the window."""

import pytest
import torch

from fastdecode import kernels
from fastdecode.model.transformer import cache_attention

pytestmark = pytest.mark.skipif(not kernels.load_kernels(),
                                reason=f"native kernels unavailable: {kernels.unavailable_reason}")


def inputs(seed=0, B=3, T=5, H=4, Hkv=2, D=16, slots=4, S=48):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, T, H, D, generator=g)
    k = torch.randn(slots, S, Hkv, D, generator=g).transpose(1, 2)  # the cache's [slots, Hkv, S, D] view
    v = torch.randn(slots, S, Hkv, D, generator=g).transpose(1, 2)
    pos = torch.stack([torch.arange(p, p + T) for p in (10, 0, 40)])  # [B, T]: ragged rows
    rows = torch.tensor([2, 0, 3])
    return q, k, v, pos, rows


@pytest.mark.parametrize("window", [0, 1, 3, 8, 11, 64])
@pytest.mark.parametrize("scale", [None, 0.2])
@pytest.mark.parametrize("D", [16, 256])
@pytest.mark.parametrize("softcap", [0.0, 1.5])
def test_kernel_equals_twin(window, scale, D, softcap):
    q, k, v, pos, rows = inputs(D=D)
    q = q * 2  # scores of a few units, which a cap of 1.5 bends
    got = torch.ops.fastdecode.attention(q, k, v, pos, rows, window, D ** -0.5 if scale is None else scale, softcap)
    want = cache_attention(q, k, v, pos, rows, window=window, scale=scale, softcap=softcap)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    if softcap and window != 1:  # one key has weight 1 whatever its score
        uncapped = cache_attention(q, k, v, pos, rows, window=window, scale=scale)
        assert (uncapped - want).abs().max() > 1e-2


def test_kernel_reads_nothing_outside_the_window():
    """Keys before the window are NaN: a read would poison the result, so the cost of
    a sliding layer is its window, whatever the position."""
    q, k, v, pos, rows = inputs()
    window = 6
    clean = torch.ops.fastdecode.attention(q, k, v, pos, rows, window, 0.25)
    for b, slot in enumerate(rows.tolist()):
        first = int(pos[b].min()) - window + 1  # the earliest key any query of row b sees
        if first > 0:
            k[slot, :, :first] = float("nan")
            v[slot, :, :first] = float("nan")
    poisoned = torch.ops.fastdecode.attention(q, k, v, pos, rows, window, 0.25)
    assert torch.equal(poisoned, clean)


def test_opcheck_with_a_window():
    """The fake (shape-only) registration agrees with the kernel, for torch.compile and torch.export."""
    q, k, v, pos, rows = inputs()
    torch.library.opcheck(torch.ops.fastdecode.attention, (q, k, v, pos, rows, 4, 0.25))
    torch.library.opcheck(torch.ops.fastdecode.attention, (q, k, v, pos, rows, 0, 0.25))
    torch.library.opcheck(torch.ops.fastdecode.attention, (q, k, v, pos, rows, 0, 0.25, 30.0))


def test_negative_window_is_refused():
    q, k, v, pos, rows = inputs()
    with pytest.raises(RuntimeError, match="window must be >= 0"):
        torch.ops.fastdecode.attention(q, k, v, pos, rows, -1, 0.25)
    with pytest.raises(RuntimeError, match="softcap must be >= 0"):
        torch.ops.fastdecode.attention(q, k, v, pos, rows, 0, 0.25, -2.0)


@pytest.mark.parametrize("window", [0, 3, 64])
@pytest.mark.parametrize("D", [16, 256])
def test_sinks_equal_twin(window, D):
    """gpt-oss's sinks: each head's logit joins its softmax's sum and takes its share of the weight."""
    q, k, v, pos, rows = inputs(D=D)
    sinks = torch.tensor([-1.0, 0.5, 3.0, 20.0])  # the last takes nearly all of its head's weight
    got = torch.ops.fastdecode.attention_sinks(q, k, v, pos, rows, window, D ** -0.5, 0.0, sinks)
    want = cache_attention(q, k, v, pos, rows, window=window, sinks=sinks)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    plain = torch.ops.fastdecode.attention(q, k, v, pos, rows, window, D ** -0.5)
    assert (got[:, :, 3].abs().max() < 1e-6) and (got - plain).abs().max() > 1e-2
    none = torch.full((4,), float("-inf"))  # no sink at all: attention's own bits
    assert torch.equal(torch.ops.fastdecode.attention_sinks(q, k, v, pos, rows, window, D ** -0.5, 0.0, none), plain)


def test_sinks_opcheck_and_bad_shape():
    q, k, v, pos, rows = inputs()
    sinks = torch.randn(4)
    torch.library.opcheck(torch.ops.fastdecode.attention_sinks, (q, k, v, pos, rows, 4, 0.25, 0.0, sinks))
    with pytest.raises(RuntimeError, match=r"sinks must be \[4\]"):
        torch.ops.fastdecode.attention_sinks(q, k, v, pos, rows, 0, 0.25, 0.0, torch.zeros(2))
