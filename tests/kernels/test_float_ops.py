"""The float ops the exported step calls where Inductor's code would loop: RoPE's cos and sin, and
the gated products of SwiGLU and GeGLU (GELU's tanh form). Each gives its PyTorch twin's bits, as
the model's eager reference path and the golden numbers need."""

import pytest
import torch
import torch.nn.functional as F

from fastdecode import kernels
from fastdecode.model.args import ModelArgs, RopeScaling
from fastdecode.model.transformer import rope_angles, rope_frequencies

pytestmark = pytest.mark.skipif(not kernels.load_kernels(),
                                reason=f"native kernels unavailable: {kernels.unavailable_reason}")


@pytest.mark.parametrize("theta, head_dim, scaling", [
    (100000.0, 64, None), (500000.0, 64, RopeScaling(factor=32.0)), (10000.0, 128, None), (1000000.0, 256, None),
    (10000.0, 80, RopeScaling(kind="linear", factor=4.0)), (1000000.0, 128, RopeScaling(kind="yarn", factor=4.0))])
def test_rope_equals_rope_angles(theta, head_dim, scaling):
    args = ModelArgs(dim=head_dim * 4, n_layers=1, n_heads=4, vocab_size=32, hidden_dim=64, head_dim=head_dim,
                     rope_theta=theta, rope_scaling=scaling, max_seq_len=1 << 17)
    inv_freq = rope_frequencies(args)
    pos = torch.cat([torch.arange(0, 1 << 17, 7), torch.tensor([(1 << 17) - 1])]).view(1, -1)
    for p in (pos, pos.view(-1, 1), pos[:, :5].repeat(3, 1)):  # one row, rows of one, a batch
        want, got = rope_angles(p, inv_freq), rope_angles(p, inv_freq, native=True)
        for w, g in zip(want, got):
            assert g.shape == w.shape and g.dtype == w.dtype
            assert torch.equal(g, w)


GLUS = {"silu_mul": F.silu, "gelu_tanh_mul": lambda x: F.gelu(x, approximate="tanh")}


@pytest.mark.parametrize("op", GLUS)
@pytest.mark.parametrize("hidden", [1536, 8192, 640, 96, 40, 8, 1])
def test_glu_equals_activation_times_up(op, hidden):
    g = torch.Generator().manual_seed(hidden)
    h = torch.randn(3, 17, 2 * hidden, generator=g) * torch.tensor([1.0, 3.0, 30.0])[:, None, None]
    h[0, 0, :4] = torch.tensor([0.0, -0.0, float("inf"), -float("inf")])[:min(4, hidden)]
    h[0, 2, :1] = float("nan")
    gate, up = h.chunk(2, dim=-1)
    want = GLUS[op](gate) * up
    fn = getattr(torch.ops.fastdecode, op)
    # A strided input (a view) is read as its values.
    for got, w in ((fn(h), want), (fn(h[:, ::2]), want[:, ::2])):
        assert got.shape == w.shape
        assert torch.equal(got.isnan(), w.isnan()) and w.isnan().any()
        assert torch.equal(got.nan_to_num(), w.nan_to_num())
