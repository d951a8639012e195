"""A Llama-family decoder: RMSNorm, RoPE, grouped-query attention, SwiGLU.

`Transformer.forward(tokens, input_pos)` has two paths:
- `input_pos=None`: full causal attention over `tokens`, no cache. This is the
  reference the cached path is tested against.
- `input_pos` given (after `setup_caches`): K/V are written into the cache at
  slots `input_pos` and attention runs over the cache with a mask.
"""

from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .config import ModelArgs
from .kv_cache import DynamicKVCache, KVCache


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))
        self.native = False  # the fused kernel (fp32 CPU); set at load by quant.transform.apply_kernels

    def forward(self, x: Tensor) -> Tensor:
        if self.native:
            return torch.ops.fastdecode.rms_norm(x, self.weight, self.eps)
        # Normalize in fp32 as the reference implementations do; matters in bf16.
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


def rope_frequencies(args: ModelArgs, device: torch.device | str | None = None) -> Tensor:
    """Inverse frequencies [head_dim // 2], with Llama-3 scaling when configured."""
    D = args.head_dim
    inv_freq = 1.0 / (args.rope_theta ** (torch.arange(0, D, 2, dtype=torch.float64, device=device) / D))
    s = args.rope_scaling
    if s is None:
        return inv_freq.float()
    # Long wavelengths are slowed by `factor`, short ones kept, and the band in
    # between is interpolated smoothly.
    low_wavelen = s.original_max_position_embeddings / s.low_freq_factor
    high_wavelen = s.original_max_position_embeddings / s.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    smooth = (s.original_max_position_embeddings / wavelen - s.low_freq_factor) / (
        s.high_freq_factor - s.low_freq_factor)
    scaled = torch.where(wavelen > low_wavelen, inv_freq / s.factor, inv_freq)
    mid = (wavelen <= low_wavelen) & (wavelen >= high_wavelen)
    scaled = torch.where(mid, (1 - smooth) * inv_freq / s.factor + smooth * inv_freq, scaled)
    return scaled.float()


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate pairs (i, i + D/2), the Hugging Face layout.

    x: [B, T, H, D]; cos, sin: [B or 1, T, 1, D/2].
    """
    x1, x2 = x.chunk(2, dim=-1)
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


class Attention(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = args.n_heads, args.n_kv_heads, args.head_dim
        qkv_out = (args.n_heads + 2 * args.n_kv_heads) * args.head_dim
        # q, k and v share one matmul; checkpoints keep them apart (see _fuse_qkv).
        self.wqkv = nn.Linear(args.dim, qkv_out, bias=args.qkv_bias)
        self.wo = nn.Linear(args.n_heads * args.head_dim, args.dim, bias=False)
        self.kv_cache: Optional[KVCache | DynamicKVCache] = None
        self.native = False  # the cache attention kernel (fp32 CPU); set at load by quant.transform.apply_kernels
        self.register_load_state_dict_pre_hook(_fuse_qkv)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, mask: Optional[Tensor],
                input_pos: Optional[Tensor]) -> Tensor:
        B, T, _ = x.shape
        H, Hkv, D = self.n_heads, self.n_kv_heads, self.head_dim
        # View before splitting: a view of the contiguous matmul output needs no
        # stride reasoning, so compiled graphs do not specialize on B or T == 1.
        qkv = self.wqkv(x).view(B, T, H + 2 * Hkv, D)
        q, k, v = qkv.split([H, Hkv, Hkv], dim=2)
        q = apply_rope(q, cos, sin)  # [B, T, H, D]
        k = apply_rope(k, cos, sin).transpose(1, 2)  # [B, Hkv, T, D]
        v = v.transpose(1, 2)  # [B, Hkv, T, D]

        if input_pos is not None and self.native:
            # Reads only the slots in use, groups heads itself, takes q and
            # returns y in [B, T, H, D]: no folding, transposes or mask repeats.
            k, v = self.kv_cache.update(input_pos, k, v)
            y = torch.ops.fastdecode.attention(q, k, v, mask, input_pos)
            return self.wo(y.view(B, T, H * D))
        q = q.transpose(1, 2)  # [B, H, T, D]
        if input_pos is None:
            # Reference path: plain expanded GQA over the current tokens only.
            k = k.repeat_interleave(H // Hkv, dim=1)
            v = v.repeat_interleave(H // Hkv, dim=1)
            if mask is None:
                y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            else:
                y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        else:
            k, v = self.kv_cache.update(input_pos, k, v)  # [B, Hkv, S, D]
            # Group the n_rep query heads of each kv head along the query axis
            # instead of copying the cache n_rep times.
            n_rep = H // Hkv
            # An explicit copy: reshape would copy or not depending on whether
            # B or T is 1, and compiled graphs would specialize on that.
            q = q.clone(memory_format=torch.contiguous_format).view(B, Hkv, n_rep * T, D)  # row r*T + t is head (kv, r), token t
            if n_rep > 1:
                mask = mask.repeat(1, 1, n_rep, 1)  # [B, 1, n_rep*T, S]
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
            y = y.view(B, H, T, D)
        y = y.transpose(1, 2).clone(memory_format=torch.contiguous_format)  # [B, T, H, D]
        return self.wo(y.view(B, T, H * D))


class FeedForward(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.w13 = nn.Linear(args.dim, 2 * args.hidden_dim, bias=False)  # gate and up, fused
        self.w2 = nn.Linear(args.hidden_dim, args.dim, bias=False)
        self.register_load_state_dict_pre_hook(_fuse_w13)

    def forward(self, x: Tensor) -> Tensor:
        gate, up = self.w13(x).chunk(2, dim=-1)
        return self.w2(F.silu(gate) * up)


class Embedding(nn.Embedding):
    """The token table; `as_linear` is the tied output head (logits = x E^T)."""

    def as_linear(self, x: Tensor) -> Tensor:
        return F.linear(x, self.weight)


class TransformerBlock(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.attention_norm = RMSNorm(args.dim, args.norm_eps)
        self.attention = Attention(args)
        self.ffn_norm = RMSNorm(args.dim, args.norm_eps)
        self.feed_forward = FeedForward(args)

    # A plain call in eager mode. Under torch.compile, Dynamo traces one block
    # and Inductor compiles it once for all n_layers (which share code and
    # shapes): ~3x less compile time than inlining 30 copies.
    @torch.compiler.nested_compile_region
    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, mask: Optional[Tensor],
                input_pos: Optional[Tensor]) -> Tensor:
        x = x + self.attention(self.attention_norm(x), cos, sin, mask, input_pos)
        return x + self.feed_forward(self.ffn_norm(x))


class Transformer(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.args = args
        self.tok_embeddings = Embedding(args.vocab_size, args.dim)
        self.layers = nn.ModuleList(TransformerBlock(args) for _ in range(args.n_layers))
        self.norm = RMSNorm(args.dim, args.norm_eps)
        # Tied models use the embedding table as the head (tok_embeddings.as_linear);
        # a shared Parameter would not survive load_state_dict(assign=True).
        self.output = None if args.tie_embeddings else nn.Linear(args.dim, args.vocab_size, bias=False)
        self.register_buffer("rope_cos", torch.empty(0), persistent=False)
        self.register_buffer("rope_sin", torch.empty(0), persistent=False)
        if self.norm.weight.device.type != "meta":
            self.init_rope()

    @property
    def device(self) -> torch.device:
        return self.norm.weight.device

    @property
    def dtype(self) -> torch.dtype:
        """The activations' dtype (weights may be stored quantized)."""
        return self.norm.weight.dtype

    # -- buffers and caches -------------------------------------------------

    def init_rope(self, device: torch.device | str | None = None) -> None:
        """(Re)build the cos/sin tables [max_seq_len, head_dim/2]; call after loading onto `device`."""
        device = device or self.device
        inv_freq = rope_frequencies(self.args, device)
        angles = torch.outer(torch.arange(self.args.max_seq_len, device=device, dtype=torch.float32), inv_freq)
        self.rope_cos, self.rope_sin = angles.cos(), angles.sin()

    def setup_caches(self, max_batch_size: int, max_seq_len: int, dtype: Optional[torch.dtype] = None,
                     device: torch.device | str | None = None, kind: str = "static") -> None:
        """Give every layer a KV cache of shape [max_batch_size, n_kv_heads, max_seq_len, head_dim].

        kind="static" preallocates (compile-friendly); kind="dynamic" grows by
        concatenation and ignores the sizes.
        """
        if max_seq_len > self.args.max_seq_len:
            raise ValueError(f"cache length {max_seq_len} exceeds the model's max_seq_len {self.args.max_seq_len}")
        dtype = dtype or self.dtype
        device = device or self.device
        a = self.args
        for layer in self.layers:
            if kind == "static":
                cache = KVCache(max_batch_size, a.n_kv_heads, max_seq_len, a.head_dim, dtype, device)
            elif kind == "dynamic":
                cache = DynamicKVCache(dtype, device)
            else:
                raise ValueError(f"unknown cache kind {kind!r}; valid: 'static', 'dynamic'")
            layer.attention.kv_cache = cache

    def reset_caches(self) -> None:
        for layer in self.layers:
            if layer.attention.kv_cache is not None:
                layer.attention.kv_cache.reset()

    def free_caches(self) -> None:
        for layer in self.layers:
            layer.attention.kv_cache = None

    @property
    def kv_cache(self) -> Optional[KVCache | DynamicKVCache]:
        """The first layer's cache (all layers share kind and shape), or None."""
        return self.layers[0].attention.kv_cache if len(self.layers) else None

    # -- forward ------------------------------------------------------------

    def forward(self, tokens: Tensor, input_pos: Optional[Tensor] = None, *,
                left_pad: Optional[Tensor] = None, last_only: bool = False) -> Tensor:
        """tokens: [B, T] -> logits [B, T, V] ([B, 1, V] with last_only).

        input_pos: [T] cache slots for these tokens, or None for the cache-free
            reference path.
        left_pad: [B] count of padding slots at the start of each row. Row b's
            RoPE positions are shifted down by left_pad[b] and its padding slots
            are never attended to, so a padded row computes what it would alone.
        """
        B, T = tokens.shape
        if input_pos is not None and self.kv_cache is None:
            raise RuntimeError("input_pos given but no caches: call setup_caches() first")
        slots = torch.arange(T, device=tokens.device) if input_pos is None else input_pos  # [T]
        rope_pos = slots[None, :]  # [1, T]
        if left_pad is not None:
            rope_pos = (rope_pos - left_pad[:, None]).clamp(min=0)  # [B, T]
        cos = self.rope_cos[rope_pos].unsqueeze(2)  # [B or 1, T, 1, D/2]
        sin = self.rope_sin[rope_pos].unsqueeze(2)

        mask = None
        if input_pos is not None or left_pad is not None:
            S = T if input_pos is None else self.kv_cache.kv_len(input_pos)
            keys = torch.arange(S, device=tokens.device)
            mask = keys[None, None, None, :] <= slots[None, None, :, None]  # [1, 1, T, S]
            if left_pad is not None:
                # Padding keys are hidden; a padding query still sees itself so
                # its (ignored) output stays finite instead of NaN.
                real = keys[None, None, None, :] >= left_pad[:, None, None, None]
                own = keys[None, None, None, :] == slots[None, None, :, None]
                mask = mask & (real | own)  # [B, 1, T, S]
            mask = mask.expand(B, 1, T, S)

        x = self.tok_embeddings(tokens)
        for layer in self.layers:
            x = layer(x, cos, sin, mask, input_pos)
        if last_only:
            x = x[:, -1:]
        x = self.norm(x)
        return self.tok_embeddings.as_linear(x) if self.output is None else self.output(x)


def _fuse(state_dict: dict, prefix: str, parts: tuple[str, ...], fused: str) -> None:
    # Float weights and biases, or the packed tensors of quantized weights
    # (rows of a block-quantized matrix are independent, so they concatenate too).
    for suffix in ("weight", "bias", "qweight", "scales", "mins"):
        keys = [f"{prefix}{p}.{suffix}" for p in parts]
        if all(k in state_dict for k in keys):
            state_dict[f"{prefix}{fused}.{suffix}"] = torch.cat([state_dict.pop(k) for k in keys])


def _fuse_qkv(module, state_dict, prefix, *args) -> None:
    _fuse(state_dict, prefix, ("wq", "wk", "wv"), "wqkv")


def _fuse_w13(module, state_dict, prefix, *args) -> None:
    _fuse(state_dict, prefix, ("w1", "w3"), "w13")


def init_random_weights(model: Transformer, seed: int = 0) -> Transformer:
    """Seeded random weights, scaled so logits are peaked (greedy ties are rare in tests)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
            elif p.dim() == 1:  # biases
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
            else:
                std = 1.0 if "tok_embeddings" in name else p.shape[1] ** -0.5
                p.copy_(std * torch.randn(p.shape, generator=g))
    return model
