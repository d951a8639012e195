"""LFM2's token mixer on its convolution layers: a gated short convolution in place of attention.

x [B, T, dim] -> in_proj -> b, c, h (each [B, T, dim]); u = b * h runs through a causal depthwise
convolution of `conv_kernel` taps over the positions; y = c * conv(u) -> out_proj.

Its state per cache slot is the last conv_kernel - 1 values of u, [slots, dim, conv_kernel - 1],
read and written at `rows` as the attention layers' KV caches are. A row whose chunk starts at
position 0 is a new request: it reads zeros, whatever its slot held. The state holds no positions,
so it cannot be rewound or shared: the engine runs such a model without prefix reuse or drafts.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .args import ModelArgs


class ShortConv(nn.Module):
    # What the decoder asks of a layer's token mixer besides forward(): no sliding window, no KV
    # cache, no native attention kernel.
    window = 0
    kv_cache = None
    native = False

    def __init__(self, args: ModelArgs):
        super().__init__()
        self.dim, self.taps = args.dim, args.conv_kernel
        self.in_proj = nn.Linear(args.dim, 3 * args.dim, bias=False)  # b, c, h
        self.conv = nn.Parameter(torch.empty(args.dim, args.conv_kernel))  # one filter [taps] per channel
        self.out_proj = nn.Linear(args.dim, args.dim, bias=False)
        self.state: Optional[Tensor] = None  # [slots, dim, taps - 1]; setup_state allocates it

    def setup_state(self, slots: int, dtype: torch.dtype, device: torch.device | str) -> None:
        self.state = torch.zeros(slots, self.dim, self.taps - 1, dtype=dtype, device=device)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, input_pos: Optional[Tensor],
                rows: Optional[Tensor], q_scale: Optional[Tensor] = None) -> Tensor:
        """The attention layers' signature; cos, sin and q_scale are unused. input_pos None: the
        cache-free path (every row starts at position 0, no state kept)."""
        B, T, D = x.shape
        b, c, h = self.in_proj(x).split(D, dim=-1)
        u = (b * h).transpose(1, 2)  # [B, dim, T]
        if input_pos is None or self.state is None:
            past = u.new_zeros(B, D, self.taps - 1)
        else:
            fresh = (input_pos[:, :1] == 0)[:, :, None]  # [B, 1, 1]: a request's first chunk
            past = torch.where(fresh, 0.0, self.state[rows].to(u.dtype))
        seq = torch.cat([past, u], dim=-1)  # [B, dim, taps - 1 + T]
        # [B, dim, T]: output t takes tap k on position t - taps + 1 + k
        y = F.conv1d(seq, self.conv[:, None, :].to(u.dtype), groups=D)
        if input_pos is not None and self.state is not None:
            self.state[rows] = seq[:, :, -(self.taps - 1):].to(self.state.dtype)
        return self.out_proj(c * y.transpose(1, 2))
