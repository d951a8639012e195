"""Mixture-of-experts MLPs (Mixtral, Qwen 2/3 MoE, OLMoE, Granite MoE, gpt-oss, LFM2-MoE): a router picks, per
token, the top k of a layer's gated MLPs and sums their outputs weighted by the router's probabilities
(softmax), or by each chosen expert's sigmoid score (LFM2-MoE, which chooses by score plus a learned bias).

Which experts run depends on the tokens, so this is an eager-mode module: the build runs MoE
models on the eager steps (api/build.py) and does not export them.
"""

from __future__ import annotations

from typing import Callable, Optional

import torch
from torch import Tensor, nn

from .args import ModelArgs


def gated_mlps(args: ModelArgs, layer: int) -> list[tuple[str, int]]:
    """Layer `layer`'s gated MLPs (w1/w3, w2) as (their prefix under its feed_forward module, inner
    size): the dense MLP's (""), or an MoE layer's experts' ("experts.{e}.") and shared expert's
    ("shared."). Checkpoint keys and the load-time transform follow MoEFeedForward by these."""
    n = args.experts(layer)
    if not n:
        return [("", args.hidden_dim)]
    shared = [("shared.", args.shared_expert_dim)] if args.shared_expert_dim else []
    return [(f"experts.{e}.", args.expert_hidden_dim) for e in range(n)] + shared


def routers(args: ModelArgs, layer: int) -> list[tuple[str, int]]:
    """An MoE layer's other matrices, each [rows, dim], as (name, rows): the router ("gate") and
    Qwen2-MoE's shared expert's gate ("shared_gate"); none for a dense layer."""
    n = args.experts(layer)
    if not n:
        return []
    return [("gate", n)] + ([("shared_gate", 1)] if args.shared_expert_dim and args.shared_expert_gate else [])


class MoEFeedForward(nn.Module):
    def __init__(self, args: ModelArgs, expert: Callable[[int, bool], nn.Module]):
        """expert(hidden_dim, bias): one gated MLP of that inner size (transformer.FeedForward)."""
        super().__init__()
        self.gate = nn.Linear(args.dim, args.n_experts, bias=args.expert_bias)  # the router
        self.experts = nn.ModuleList(expert(args.expert_hidden_dim, args.expert_bias) for _ in range(args.n_experts))
        self.top_k = args.n_experts_used
        self.normalize = args.norm_expert_weights
        self.router, self.routed_scale = args.router, args.routed_scale
        # [n_experts], added to the scores to choose, not to weight (a buffer in the checkpoints that have it)
        self.selection_bias = nn.Parameter(torch.zeros(args.n_experts)) if args.expert_selection_bias else None
        shared = args.shared_expert_dim
        self.shared = expert(shared, False) if shared else None
        self.shared_gate = nn.Linear(args.dim, 1, bias=False) if shared and args.shared_expert_gate else None

    def forward(self, x: Tensor) -> Tensor:
        flat = x.reshape(-1, x.shape[-1])  # [T, dim]
        weights, chosen = self._route(self.gate(flat).float())  # [T, k] each, in float32 as the references
        # The (token, expert) pairs grouped by expert: each chosen expert runs once, on one slice of
        # the gathered rows. bincount's list is the one sync (which experts run is data).
        experts = chosen.flatten()  # [T * k]
        order = experts.argsort(stable=True)
        counts = torch.bincount(experts, minlength=len(self.experts)).tolist()
        token = order // self.top_k
        rows = flat[token]  # [T * k, dim]
        chosen_experts = [self.experts[e] for e, n in enumerate(counts) if n]
        if not chosen_experts:  # no tokens
            return torch.zeros_like(x)
        sizes = [n for n in counts if n]
        h = _grouped([m.w13 for m in chosen_experts], rows, sizes)
        if h is None:
            y = torch.cat([m(part) for m, part in zip(chosen_experts, rows.split(sizes))])
        else:  # every expert's gate/up came from one native call; their down projections take another
            h = chosen_experts[0].glu(h)  # [T * k, expert_hidden_dim]
            y = _grouped([m.w2 for m in chosen_experts], h, sizes)
            if y is None:
                y = torch.cat([m.w2(part) for m, part in zip(chosen_experts, h.split(sizes))])
        y = y * weights.flatten()[order, None].to(flat.dtype)
        out = torch.zeros_like(flat).index_add_(0, token, y)
        if self.shared is not None:
            shared = self.shared(flat)
            out = out + (shared if self.shared_gate is None else torch.sigmoid(self.shared_gate(flat)) * shared)
        return out.view_as(x)

    def _route(self, logits: Tensor) -> tuple[Tensor, Tensor]:
        """The router's logits [T, n_experts] -> each token's expert weights and choices [T, k]."""
        if self.router == "softmax":
            weights, chosen = torch.softmax(logits, dim=-1).topk(self.top_k, dim=-1)
        elif self.selection_bias is None:
            weights, chosen = torch.sigmoid(logits).topk(self.top_k, dim=-1)
        else:
            scores = torch.sigmoid(logits)
            chosen = (scores + self.selection_bias.float()).topk(self.top_k, dim=-1).indices
            weights = scores.gather(-1, chosen)
        if self.normalize:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return weights * self.routed_scale if self.routed_scale != 1.0 else weights, chosen


def _grouped(linears: list[nn.Module], x: Tensor, sizes: list[int]) -> Optional[Tensor]:
    """x's consecutive row slices of `sizes` through linears[i] in one native call (the kernels'
    grouped_linear: one parallel region streams all of the experts' weights), concatenated, plus each
    linear's bias; None unless every linear is a packed one of one layout on the native kernels."""
    first = linears[0]
    layout = getattr(first, "layout", None)
    if not all(getattr(m, "native", False) and getattr(m, "layout", None) == layout and hasattr(m, "packed")
               and (m.bias is None) == (first.bias is None) for m in linears):
        return None
    tensors = [t for m in linears for t in m.packed().values()]
    ys = torch.ops.fastdecode.grouped_linear(layout, list(x.float().split(sizes)), tensors)
    if first.bias is not None:  # gpt-oss's: each expert's rows get its own
        ys = [y + m.bias for y, m in zip(ys, linears)]
    return torch.cat(ys).to(x.dtype)
