"""Mixture-of-experts MLPs (Mixtral, Qwen 2/3 MoE, OLMoE, Granite MoE): a softmax router picks, per token, the
top k of a layer's gated MLPs and sums their outputs weighted by the router's probabilities.

Which experts run depends on the tokens, so this is an eager-mode module: the build runs MoE
models on the eager steps (api/build.py) and does not export them.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor, nn

from .args import ModelArgs


class MoEFeedForward(nn.Module):
    def __init__(self, args: ModelArgs, expert: Callable[[int], nn.Module]):
        """expert(hidden_dim): one gated MLP of that inner size (transformer.FeedForward)."""
        super().__init__()
        self.gate = nn.Linear(args.dim, args.n_experts, bias=False)  # the router
        self.experts = nn.ModuleList(expert(args.expert_hidden_dim) for _ in range(args.n_experts))
        self.top_k = args.n_experts_used
        self.normalize = args.norm_expert_weights
        shared = args.shared_expert_dim
        self.shared = expert(shared) if shared else None
        self.shared_gate = nn.Linear(args.dim, 1, bias=False) if shared and args.shared_expert_gate else None

    def forward(self, x: Tensor) -> Tensor:
        flat = x.reshape(-1, x.shape[-1])  # [T, dim]
        probs = torch.softmax(self.gate(flat).float(), dim=-1)  # [T, n_experts], in float32 as the references
        weights, chosen = probs.topk(self.top_k, dim=-1)  # [T, k]
        if self.normalize:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        # The (token, expert) pairs grouped by expert: each chosen expert runs once, on one slice of
        # the gathered rows. bincount's list is the one sync (which experts run is data).
        experts = chosen.flatten()  # [T * k]
        order = experts.argsort(stable=True)
        counts = torch.bincount(experts, minlength=len(self.experts)).tolist()
        token = order // self.top_k
        rows = flat[token]  # [T * k, dim]
        ys, start = [], 0
        for e, n in enumerate(counts):
            if n:
                ys.append(self.experts[e](rows[start:start + n]))
                start += n
        if not ys:  # no tokens
            return torch.zeros_like(x)
        y = torch.cat(ys) * weights.flatten()[order, None].to(flat.dtype)
        out = torch.zeros_like(flat).index_add_(0, token, y)
        if self.shared is not None:
            shared = self.shared(flat)
            out = out + (shared if self.shared_gate is None else torch.sigmoid(self.shared_gate(flat)) * shared)
        return out.view_as(x)
