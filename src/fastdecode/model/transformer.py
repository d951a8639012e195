"""One decoder for every family we load: RMSNorm, RoPE, grouped-query attention,
a gated MLP, with each family's differences as `ModelArgs` fields (QK-norm,
sliding-window layers, a second RoPE base, GeGLU, a scaled embedding, Gemma's
post-norms, OLMo 2's post-norms alone, layers without RoPE, Granite's multipliers,
Gemma 2's soft-capping, Phi-3's partial rotary and LongRoPE, gpt-oss's attention sinks and clamped
SwiGLU, LFM2's short convolutions in place of attention on some layers) and a small named branch
where each applies.

`Transformer.forward(tokens, input_pos, rows=...)` has two paths:
- `input_pos=None`: full causal attention over `tokens`, no cache. This is the
  reference the cached path is tested against.
- `input_pos` given (after `setup_caches`): batch row b works on cache slot
  `rows[b]`; its K/V are written at positions `input_pos[b]` ([B, T], one
  position per token and row) and its queries attend to that slot's keys at
  positions <= their own. Rows at different lengths share one step.
"""

from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .args import ModelArgs, RopeScaling
from .kv_cache import DynamicKVCache, KVCache, KvDtype, kv_name, to_float
from .moe import MoEFeedForward
from .short_conv import ShortConv


class LayerNorm(nn.Module):
    """Mean-centred normalization with a weight and no bias (Cohere's), in fp32 as the references."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        return F.layer_norm(x.float(), x.shape[-1:], self.weight.float(), None, self.eps).to(x.dtype)


def make_norm(args: ModelArgs, dim: int) -> nn.Module:
    """The blocks' and the final norm of `args.norm`'s kind."""
    return LayerNorm(dim, args.norm_eps) if args.norm == "layer" else RMSNorm(dim, args.norm_eps)


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


def rope_frequencies(args: ModelArgs, device: torch.device | str | None = None, *, local: bool = False,
                     context: Optional[int] = None) -> Tensor:
    """Inverse frequencies [rotary_dim // 2], with the configured scaling.

    local=True: the sliding layers' frequencies (base `rope_local_theta`, never scaled).
    context: the positions the caches hold; LongRoPE takes its long factors where that is more
    than the original context, as llama.cpp does (None: the short ones).
    """
    D = args.rotary_dim
    theta = args.rope_local_theta if local else args.rope_theta
    # In float32, as transformers computes them: at theta 1e6, float64 frequencies
    # move the angles enough to show in the logits (Gemma 3, 784 tokens: 8e-4 from
    # transformers' logits with float64, 1e-4 with float32).
    powers = theta ** (torch.arange(0, D, 2, device=device).float() / D)  # theta ** (2i / D)
    inv_freq = 1.0 / powers
    s = None if local else args.rope_scaling
    if s is None:
        return inv_freq
    if s.kind == "linear":
        return inv_freq / s.factor
    if s.kind == "longrope":
        long = context is not None and context > s.original_max_position_embeddings
        factors = torch.tensor(s.long_factor if long else s.short_factor, dtype=torch.float32, device=device)
        return 1.0 / (factors * powers)  # transformers' order of operations
    if s.kind == "yarn":
        return _yarn_frequencies(powers, s, D, theta)
    inv_freq = inv_freq.double()
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


def _yarn_frequencies(powers: Tensor, s: RopeScaling, D: int, theta: float) -> Tensor:
    """YaRN: dims that turn more than `beta_fast` times over the original context keep
    their frequency, those under `beta_slow` turns are divided by `factor`, and a linear
    ramp over the dims between mixes the two. In float32, in transformers' order of
    operations (llama.cpp's is the same)."""

    def dim_of(turns: float) -> float:  # the dim whose wavelength fits `turns` times in the context
        return D * math.log(s.original_max_position_embeddings / (turns * 2 * math.pi)) / (2 * math.log(theta))

    low, high = dim_of(s.beta_fast), dim_of(s.beta_slow)
    if s.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, D - 1)
    ramp = (torch.arange(D // 2, dtype=torch.float32, device=powers.device) - low) / max(high - low, 0.001)
    keep = 1 - ramp.clamp(0, 1)  # 1: the original frequency, 0: divided by factor
    return 1.0 / (s.factor * powers) * (1 - keep) + 1.0 / powers * keep


def rope_angles(pos: Tensor, inv_freq: Tensor, native: bool = False) -> tuple[Tensor, Tensor]:
    """cos and sin [B or 1, T, 1, D/2] of the angles pos x inv_freq, for pos [B or 1, T].

    The angles in float32, as transformers computes them (positions are exact up to
    2**24); their cos and sin in float64, rounded to float32. A float32 cos differs by a
    last bit between ATen and Inductor's code, enough to flip a near-tie between eager
    and compiled steps; rounded float64 values agree. native: the kernel's op, the same
    values computed once a step (Inductor would recompute them inside each layer's rotation).
    """
    if native:
        cos, sin = torch.ops.fastdecode.rope(pos, inv_freq)  # [B or 1, T, D/2]
        return cos.unsqueeze(2), sin.unsqueeze(2)
    angles = (pos.to(torch.float32)[..., None] * inv_freq).double()
    return angles.cos().float().unsqueeze(2), angles.sin().float().unsqueeze(2)


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate pairs (i, i + R/2) of the first R dims, the Hugging Face layout; the rest pass.

    x: [B, T, H, D]; cos, sin: [B or 1, T, 1, R/2], R <= D (the rotated dims, args.rotary_dim).
    """
    R = 2 * cos.shape[-1]
    if R < x.shape[-1]:  # partial rotary (Phi-4): the last D - R dims carry no position
        return torch.cat([apply_rope(x[..., :R], cos, sin), x[..., R:]], dim=-1)
    x1, x2 = x.chunk(2, dim=-1)
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


class Attention(nn.Module):
    def __init__(self, args: ModelArgs, window: int = 0, rope: bool = True):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = args.n_heads, args.n_kv_heads, args.head_dim
        # Keys p - window < j <= p for a query at p; 0: all keys j <= p. A Python int,
        # so compiled graphs hold it as a constant (one variant per window size).
        self.window = window
        self.rope = rope  # False: a NoPE layer, q and k not rotated (a constant to compiled graphs, as window)
        self.scale = args.attn_scale  # None: SDPA's default, head_dim ** -0.5
        self.kernel_scale = args.attn_scale if args.attn_scale is not None else 1.0 / math.sqrt(args.head_dim)
        self.softcap = args.attn_softcap  # Gemma 2: scores capped to (-softcap, softcap); 0: not
        # QK-norm (Qwen3, Gemma 3): RMSNorm over each head's head_dim, before RoPE; OLMo 2's
        # over all heads of q (of k) at once.
        self.qk_norm_full = args.qk_norm_full
        q_span, k_span = (args.n_heads * args.head_dim, args.n_kv_heads * args.head_dim) if args.qk_norm_full \
            else (args.head_dim, args.head_dim)
        self.q_norm = RMSNorm(q_span, args.norm_eps) if args.qk_norm else None
        self.k_norm = RMSNorm(k_span, args.norm_eps) if args.qk_norm else None
        self.norm_after_rope = args.qk_norm_after_rope  # Hunyuan's order: RoPE, then the norms
        qkv_out = (args.n_heads + 2 * args.n_kv_heads) * args.head_dim
        # q, k and v share one matmul; checkpoints keep them apart (see _fuse_qkv).
        self.wqkv = nn.Linear(args.dim, qkv_out, bias=args.qkv_bias)
        self.wo = nn.Linear(args.n_heads * args.head_dim, args.dim, bias=args.attn_out_bias)
        # gpt-oss: each head's sink logit [H], counted in its softmax's sum only; None: none
        self.sinks = nn.Parameter(torch.zeros(args.n_heads)) if args.attn_sinks else None
        self.kv_cache: Optional[KVCache | DynamicKVCache] = None
        self.native = False  # the cache attention kernel (fp32 CPU); set at load by quant.transform.apply_kernels
        self.register_load_state_dict_pre_hook(_fuse_qkv)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, input_pos: Optional[Tensor],
                rows: Optional[Tensor], q_scale: Optional[Tensor] = None) -> Tensor:
        """q_scale: [B or 1, T, 1, 1] factors on the queries after RoPE, or None."""
        B, T, _ = x.shape
        H, Hkv, D = self.n_heads, self.n_kv_heads, self.head_dim
        # View before splitting: a view of the contiguous matmul output needs no
        # stride reasoning, so compiled graphs do not specialize on B or T == 1.
        qkv = self.wqkv(x).view(B, T, H + 2 * Hkv, D)
        q, k, v = qkv.split([H, Hkv, Hkv], dim=2)
        if self.q_norm is not None and self.qk_norm_full:
            q = self.q_norm(q.reshape(B, T, H * D)).view(B, T, H, D)
            k = self.k_norm(k.reshape(B, T, Hkv * D)).view(B, T, Hkv, D)
        elif self.q_norm is not None and not self.norm_after_rope:
            q, k = self.q_norm(q), self.k_norm(k)
        if self.rope:
            q = apply_rope(q, cos, sin)  # [B, T, H, D]
            k = apply_rope(k, cos, sin)  # [B, T, Hkv, D]
        else:  # views into qkv: the attention kernel reads contiguous q and k, as RoPE's outputs are
            q, k = q.contiguous(), k.contiguous()
        if self.norm_after_rope:
            q, k = self.q_norm(q), self.k_norm(k)
        if q_scale is not None:
            q = q * q_scale.to(q.dtype)

        if input_pos is None and self.native:
            # Cache-free causal attention on the native kernel, reading k/v [B, Hkv, T, D]
            # views of this step's tokens: the same arithmetic as the cached path, and
            # unlike SDPA's CPU kernels, the same on every instruction set and length.
            pos = torch.arange(T, device=x.device).expand(B, T)
            rows = torch.arange(B, device=x.device)
            y = self._kernel(q, k.transpose(1, 2), v.contiguous().transpose(1, 2), pos, rows)
            return self.wo(y.view(B, T, H * D))
        if input_pos is None:
            # Reference path: plain expanded causal GQA over the current tokens only.
            q = q.transpose(1, 2)  # [B, H, T, D]
            k = k.transpose(1, 2).repeat_interleave(H // Hkv, dim=1)
            v = v.transpose(1, 2).repeat_interleave(H // Hkv, dim=1)
            if self.window or self.softcap or self.sinks is not None:
                i = torch.arange(T, device=x.device)
                mask = i[None, :] <= i[:, None]  # [T, T]
                if self.window:
                    mask = mask & (i[None, :] > i[:, None] - self.window)
                sinks = None if self.sinks is None else self.sinks.view(1, H, 1, 1)
                y = attend(q, k, v, mask, self.scale, self.softcap, sinks)
            else:
                y = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.scale)
            y = y.transpose(1, 2)  # [B, T, H, D]
        else:
            k_all, v_all = self.kv_cache.update(rows, input_pos, k, v)  # [slots, Hkv, S, D] views
            if self.native:
                # Reads each row's own slot up to its own position (from the window's
                # first key on sliding layers), groups heads itself, and takes q /
                # returns y as [B, T, H, D].
                y = self._kernel(q, k_all, v_all, input_pos, rows)
                return self.wo(y.view(B, T, H * D))
            y = cache_attention(q, k_all, v_all, input_pos, rows, window=self.window, scale=self.scale,
                                softcap=self.softcap, sinks=self.sinks)
        y = y.clone(memory_format=torch.contiguous_format)  # [B, T, H, D]
        return self.wo(y.view(B, T, H * D))

    def _kernel(self, q: Tensor, k: Tensor, v: Tensor, pos: Tensor, rows: Tensor) -> Tensor:
        if self.sinks is None:
            return torch.ops.fastdecode.attention(q, k, v, pos, rows, self.window, self.kernel_scale, self.softcap)
        return torch.ops.fastdecode.attention_sinks(q, k, v, pos, rows, self.window, self.kernel_scale, self.softcap,
                                                    self.sinks)


def cache_attention(q: Tensor, k_all: Tensor, v_all: Tensor, input_pos: Tensor, rows: Tensor, *,
                    window: int = 0, scale: Optional[float] = None, softcap: float = 0.0,
                    sinks: Optional[Tensor] = None) -> Tensor:
    """Attention over cache slots with scaled_dot_product_attention (the
    portable path; the native kernel computes the same on fp32 CPUs).

    q: [B, T, H, D]; k_all, v_all: [B_cache, Hkv, S, D]; input_pos: [B, T];
    rows: [B]. Returns y: [B, T, H, D]. Spans the whole buffer under a mask
    (keys j <= input_pos, and j > input_pos - window when window > 0); softcap > 0
    caps the scores (Gemma 2); sinks [H]: each head's sink logit (gpt-oss).
    """
    B, T, H, D = q.shape
    Hkv, S = k_all.shape[1], k_all.shape[2]
    n_rep = H // Hkv
    k, v = k_all.index_select(0, rows), v_all.index_select(0, rows)  # [B, Hkv, S, D]
    k, v = to_float(k, q.dtype), to_float(v, q.dtype)  # a cache in another kv dtype: convert what is read
    # Group the n_rep query heads of each kv head along the query axis instead
    # of copying the cache n_rep times. An explicit copy: reshape would copy or
    # not depending on whether B or T is 1, and compiled graphs would specialize.
    q = q.transpose(1, 2).clone(memory_format=torch.contiguous_format).view(B, Hkv, n_rep * T, D)
    keys = torch.arange(S, device=q.device)
    mask = keys[None, None, None, :] <= input_pos[:, None, :, None]  # [B, 1, T, S]
    if window:
        mask = mask & (keys[None, None, None, :] > input_pos[:, None, :, None] - window)
    if n_rep > 1:
        mask = mask.repeat(1, 1, n_rep, 1)  # [B, 1, n_rep*T, S]; row r*T + t is head (kv, r), token t
    if sinks is not None:  # [H] -> the grouped query rows' [1, Hkv, n_rep * T, 1]
        sinks = sinks.view(Hkv, n_rep, 1).expand(Hkv, n_rep, T).reshape(1, Hkv, n_rep * T, 1)
    y = attend(q, k, v, mask, scale, softcap, sinks)
    # reshape, not view: SDPA's CUDA kernels lay y out as [B, n_rep*T, Hkv, D] under
    # [B, Hkv, n_rep*T, D] strides, which no view regroups into heads (a copy there).
    return y.reshape(B, H, T, D).transpose(1, 2)


def attend(q: Tensor, k: Tensor, v: Tensor, mask: Tensor, scale: Optional[float], softcap: float,
           sinks: Optional[Tensor] = None) -> Tensor:
    """SDPA over keys where `mask` is True, or its arithmetic written out where SDPA cannot do it:
    with softcap > 0 the scores capped to softcap tanh(s / softcap) before the softmax (Gemma 2);
    with sinks (broadcast to [..., rows, 1]) one more logit per row in the softmax's sum (gpt-oss)."""
    if not softcap and sinks is None:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
    s = ((q @ k.transpose(-2, -1)) * (q.shape[-1] ** -0.5 if scale is None else scale)).float()
    if softcap:
        s = torch.tanh(s / softcap) * softcap
    s = s.masked_fill(~mask, float("-inf"))
    if sinks is None:
        return torch.softmax(s, dim=-1).to(v.dtype) @ v
    s = torch.cat([s, sinks.float().expand(*s.shape[:-1], 1)], dim=-1)
    return torch.softmax(s, dim=-1)[..., :-1].to(v.dtype) @ v


# The activations whose gated product has an op of the kernels: SwiGLU, GeGLU in GELU's tanh form.
GLU_OPS = {"silu": "silu_mul", "gelu_tanh": "gelu_tanh_mul"}


class FeedForward(nn.Module):
    def __init__(self, args: ModelArgs, hidden_dim: Optional[int] = None, bias: bool = False):
        super().__init__()
        hidden_dim = hidden_dim or args.hidden_dim  # an expert's or a shared expert's size in MoE models
        self.w13 = nn.Linear(args.dim, 2 * hidden_dim, bias=bias)  # gate and up, fused
        self.w2 = nn.Linear(hidden_dim, args.dim, bias=bias)
        # SwiGLU, GeGLU (Gemma) with GELU's tanh form or its exact one, or gpt-oss's clamped SwiGLU
        self.activation = args.activation
        self.alpha, self.limit = args.glu_alpha, args.glu_limit
        self.native = False  # the GLU on the kernels' op (fp32 CPU, GLU_OPS); set by quant.transform.apply_kernels
        self.register_load_state_dict_pre_hook(_fuse_w13)

    def forward(self, x: Tensor) -> Tensor:
        return self.w2(self.glu(self.w13(x)))

    def glu(self, h: Tensor) -> Tensor:
        """w13's output [..., 2 * hidden] -> activation(gate) * up [..., hidden]."""
        if self.native:
            return getattr(torch.ops.fastdecode, GLU_OPS[self.activation])(h)
        gate, up = h.chunk(2, dim=-1)
        if self.activation == "swiglu_oai":
            gate, up = gate.clamp(max=self.limit), up.clamp(-self.limit, self.limit)
            return gate * torch.sigmoid(self.alpha * gate) * (up + 1)
        if self.activation == "silu":
            gate = F.silu(gate)
        else:
            gate = F.gelu(gate, approximate="tanh" if self.activation == "gelu_tanh" else "none")
        return gate * up


class Embedding(nn.Embedding):
    """The token table; `as_linear` is the tied output head (logits = x E^T)."""

    def as_linear(self, x: Tensor) -> Tensor:
        return F.linear(x, self.weight)


def _embedding(n: int, dim: int) -> Embedding:
    # load() builds on the meta device, where nn.Embedding's normal_ init goes through
    # torch._refs, whose first use imports Dynamo: 1.5 s of a warm start. Meta needs no init.
    if torch.empty(0).device.type == "meta":
        return Embedding(n, dim, _weight=torch.empty(n, dim))
    return Embedding(n, dim)


class TransformerBlock(nn.Module):
    def __init__(self, args: ModelArgs, layer: int = 0):
        super().__init__()
        # None: OLMo 2, whose sublayers read the residual stream as it is (its norms come after)
        self.attention_norm = make_norm(args, args.dim) if args.pre_norms else None
        # The layer's token mixer: attention, or on LFM2's convolution layers its short convolution.
        self.attention = (ShortConv(args) if layer in args.conv_layers
                          else Attention(args, window=args.window(layer), rope=layer not in args.nope_layers))
        # Cohere's parallel block: the MLP reads the attention's input (attention_norm's)
        self.parallel = args.parallel_block
        self.ffn_norm = make_norm(args, args.dim) if args.pre_norms and not self.parallel else None
        experts = args.experts(layer)
        self.feed_forward = (MoEFeedForward(args, lambda hidden, bias: FeedForward(args, hidden, bias)) if experts
                             else FeedForward(args))
        # Gemma 3's sandwich (OLMo 2's only norms): the attention and MLP outputs are
        # normalized before they join the residual stream.
        self.post_attention_norm = make_norm(args, args.dim) if args.post_norms else None
        self.post_ffn_norm = make_norm(args, args.dim) if args.post_norms else None
        self.residual_scale = args.residual_scale  # Granite's; 1: none

    # A plain call in eager mode. Under torch.compile, Dynamo traces one block
    # and Inductor compiles it once for all n_layers (which share code and
    # shapes): ~3x less compile time than inlining 30 copies.
    @torch.compiler.nested_compile_region
    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, input_pos: Optional[Tensor],
                rows: Optional[Tensor], q_scale: Optional[Tensor] = None) -> Tensor:
        normed = x if self.attention_norm is None else self.attention_norm(x)
        h = self.attention(normed, cos, sin, input_pos, rows, q_scale)
        if self.parallel:
            h = h + self.feed_forward(normed)
            return x + (h * self.residual_scale if self.residual_scale != 1.0 else h)
        if self.post_attention_norm is not None:
            h = self.post_attention_norm(h)
        if self.residual_scale != 1.0:
            h = h * self.residual_scale
        x = x + h
        h = self.feed_forward(x if self.ffn_norm is None else self.ffn_norm(x))
        if self.post_ffn_norm is not None:
            h = self.post_ffn_norm(h)
        if self.residual_scale != 1.0:
            h = h * self.residual_scale
        return x + h


class Transformer(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.args = args
        self.tok_embeddings = _embedding(args.vocab_size, args.dim)
        self.layers = nn.ModuleList(TransformerBlock(args, i) for i in range(args.n_layers))
        self.norm = make_norm(args, args.dim)
        # Tied models use the embedding table as the head (tok_embeddings.as_linear);
        # a shared Parameter would not survive load_state_dict(assign=True).
        self.output = None if args.tie_embeddings else nn.Linear(args.dim, args.vocab_size, bias=False)
        # RoPE's inverse frequencies [D/2]; each step turns its positions into angles.
        # (Tables of every declared position would cost memory: 34 MB for Llama-3.2-1B's
        # 131,072, 5% of its Q4_K_M file.)
        self.register_buffer("rope_inv_freq", torch.empty(0), persistent=False)
        # The sliding layers' frequencies when they have a RoPE base of their own (Gemma 3).
        self.register_buffer("rope_local_inv_freq", torch.empty(0), persistent=False)
        # The KV caches' dtype (see kv_cache.py): None is the model's own; load() sets its kv_dtype.
        self.kv_dtype: Optional[KvDtype] = None
        self.native_rope = False  # cos and sin by the kernels (fp32 CPU); set by quant.transform.apply_kernels
        if self.norm.weight.device.type != "meta":
            self.init_rope()

    @property
    def device(self) -> torch.device:
        return self.norm.weight.device

    @property
    def dtype(self) -> torch.dtype:
        """The activations' dtype (weights may be stored quantized)."""
        return self.norm.weight.dtype

    @property
    def mixes_steps(self) -> bool:
        """Whether a step may carry prompt chunks as rows of one token beside decode rows (the
        engine's mixed steps): the native attention computes a chunk's consecutive rows as one
        row of its tokens (kernels/ops.cpp), where the portable one would gather a slot per row;
        and no layer carries state along a row's tokens (LFM2's convolutions)."""
        return all(isinstance(layer.attention, Attention) and layer.attention.native for layer in self.layers)

    # -- buffers and caches -------------------------------------------------

    def init_rope(self, device: torch.device | str | None = None, context: Optional[int] = None) -> None:
        """(Re)build RoPE's inverse frequencies [rotary_dim/2]; call after loading onto `device`.
        context: the caches' positions (LongRoPE's choice of factors; setup_caches passes it)."""
        device = device or self.device
        inv_freq = rope_frequencies(self.args, device, context=context)
        if self.rope_inv_freq.shape == inv_freq.shape and self.rope_inv_freq.device == inv_freq.device:
            self.rope_inv_freq.copy_(inv_freq)  # in place: a loaded package reads this tensor
        else:
            self.rope_inv_freq = inv_freq
        if self.args.rope_local_theta is not None:
            self.rope_local_inv_freq = rope_frequencies(self.args, device, local=True)

    @property
    def kv_dtype_name(self) -> str:
        """The KV caches' dtype: "float32", "float16", "bfloat16" or "q8_0"."""
        return kv_name(self.kv_dtype or self.dtype)

    def setup_caches(self, max_batch_size: int, max_seq_len: int, dtype: Optional[KvDtype] = None,
                     device: torch.device | str | None = None, kind: str = "static") -> None:
        """Give every layer a KV cache of max_batch_size slots x max_seq_len positions, stored
        as [slots, S, n_kv_heads, head_dim] (see kv_cache.py); the engine does, once.

        kind="static" preallocates (compile-friendly); kind="dynamic" grows
        along the sequence by concatenation. dtype: the caches' kv dtype (a float
        dtype or "q8_0"); default `self.kv_dtype`, else the model's dtype.
        """
        if max_seq_len > self.args.max_seq_len:
            raise ValueError(f"cache length {max_seq_len} exceeds the model's max_seq_len {self.args.max_seq_len}")
        dtype = dtype or self.kv_dtype or self.dtype
        device = device or self.device
        a = self.args
        if a.rope_scaling is not None and a.rope_scaling.kind == "longrope":
            self.init_rope(device, context=max_seq_len)  # LongRoPE's factors follow the context the caches hold
        for layer in self.layers:
            if isinstance(layer.attention, ShortConv):  # its state per slot, in the activations' dtype
                layer.attention.setup_state(max_batch_size, self.dtype, device)
                continue
            if kind == "static":
                cache = KVCache(max_batch_size, a.n_kv_heads, max_seq_len, a.head_dim, dtype, device,
                                zero=not layer.attention.native)
            elif kind == "dynamic":
                cache = DynamicKVCache(max_batch_size, a.n_kv_heads, a.head_dim, dtype, device)
            else:
                raise ValueError(f"unknown cache kind {kind!r}; valid: 'static', 'dynamic'")
            layer.attention.kv_cache = cache

    @property
    def kv_cache(self) -> Optional[KVCache | DynamicKVCache]:
        """The first attention layer's cache (all of them share kind and shape), or None."""
        return next((layer.attention.kv_cache for layer in self.layers if isinstance(layer.attention, Attention)),
                    None)

    # -- forward ------------------------------------------------------------

    def forward(self, tokens: Tensor, input_pos: Optional[Tensor] = None, *,
                rows: Optional[Tensor] = None, last_only: bool = False,
                logits_at: Optional[Tensor] = None) -> Tensor:
        """tokens: [B, T] -> logits [B, T, V] ([B, 1, V] with last_only).

        logits_at: [R, n] indices into the B * T tokens, flat (row b's token t
            is b * T + t): only those get logits, [R, n, V] (a prefill chunk needs
            each row's last, a verify step all; a mixed step, whose rows of one
            token carry prompt chunks, the decode rows' and each prompt's last).

        input_pos: [B, T] cache positions of the tokens, or None for the
            cache-free reference path (positions 0..T-1, causal).
        rows: [B] the cache slot of each batch row; None means slots 0..B-1.
        """
        B, T = tokens.shape
        if input_pos is None:
            pos = torch.arange(T, device=tokens.device)[None, :]  # [1, T]
        elif self.kv_cache is None:
            raise RuntimeError("input_pos given but no caches: call setup_caches() first")
        else:
            pos = input_pos  # [B, T]
            if rows is None:
                rows = torch.arange(B, device=tokens.device)
        cos, sin = rope_angles(pos, self.rope_inv_freq, self.native_rope)  # [B or 1, T, 1, D/2]
        if self.args.rope_scaling is not None and self.args.rope_scaling.cos_sin_scale != 1.0:
            scale = self.args.rope_scaling.cos_sin_scale  # YaRN's attention factor, on q and k alike
            cos, sin = cos * scale, sin * scale
        local = (cos, sin)  # the sliding layers'
        if self.args.rope_local_theta is not None:
            local = rope_angles(pos, self.rope_local_inv_freq, self.native_rope)
        q_scale = None
        if self.args.query_scale_beta:  # in transformers' order of operations
            blocks = torch.floor(pos.to(torch.float32) / self.args.query_scale_period)
            q_scale = (1 + self.args.query_scale_beta * torch.log(1 + blocks))[..., None, None]  # [B or 1, T, 1, 1]

        x = self.tok_embeddings(tokens)
        if self.args.embed_scale != 1.0:
            x = x * self.args.embed_scale  # Gemma: sqrt(dim); Granite: its embedding multiplier
        for layer in self.layers:
            c, s = local if layer.attention.window else (cos, sin)
            x = layer(x, c, s, input_pos, rows, q_scale)
        if last_only:
            x = x[:, -1:]
        elif logits_at is not None:
            R, n = logits_at.shape
            x = x.reshape(B * T, x.shape[-1]).index_select(0, logits_at.reshape(R * n)).view(R, n, -1)
        x = self.norm(x)
        logits = self.tok_embeddings.as_linear(x) if self.output is None else self.output(x)
        if self.args.logits_scaling != 1.0:
            logits = logits / self.args.logits_scaling  # Granite
        if self.args.logit_softcap:  # Gemma 2
            logits = torch.tanh(logits / self.args.logit_softcap) * self.args.logit_softcap
        return logits


# The packed tensors' suffixes (quant.formats.SUFFIXES; not imported: quant imports this module).
PACKED_SUFFIXES = ("qweight", "qhigh", "scales", "mins", "sc", "mn", "d", "dmin", "e")


def _fuse(state_dict: dict, prefix: str, parts: tuple[str, ...], fused: str) -> None:
    # Float weights and biases, or the packed tensors of quantized weights (rows of a
    # block-quantized matrix are independent, so they concatenate too; q4's panels of 16 rows
    # only after parts of whole panels, which quant.transform.build_model sees to).
    for suffix in ("weight", "bias", *PACKED_SUFFIXES):
        keys = [f"{prefix}{p}.{suffix}" for p in parts]
        if all(k in state_dict for k in keys):
            tensors = [state_dict.pop(k) for k in keys]
            view = adjacent_rows(tensors)
            state_dict[f"{prefix}{fused}.{suffix}"] = torch.cat(tensors) if view is None else view


def adjacent_rows(tensors: list[Tensor]) -> Optional[Tensor]:
    """The concatenation of `tensors` along dim 0 as a view, when they already lie
    back to back in one storage (row views of a matrix stored fused, e.g. a
    memory-mapped cache entry); None otherwise, and the caller copies."""
    first = tensors[0]
    offset = first.storage_offset()
    for t in tensors:
        if (not t.is_contiguous() or t.dtype != first.dtype or t.shape[1:] != first.shape[1:]
                or t.untyped_storage().data_ptr() != first.untyped_storage().data_ptr()
                or t.storage_offset() != offset):
            return None
        offset += t.numel()
    rows = sum(t.shape[0] for t in tensors)
    return first.as_strided((rows, *first.shape[1:]), first.stride())


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
