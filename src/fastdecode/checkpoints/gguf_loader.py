"""GGUF (llama.cpp) checkpoints: metadata -> `ModelArgs`, tensors -> our state dict."""

from __future__ import annotations

import dataclasses
import functools
import math
import re
from collections import Counter
from typing import Any, Callable, Iterator, Optional

import torch

from ..model.args import ModelArgs, RopeScaling, yarn_mscale
from ..errors import FastDecodeError
from ..quant.formats import GGUF_LAYOUTS, REQUANTIZED, pack_gguf, requantize_gguf
from ..quant.transform import quantize_state_dict
from . import dequant
from .keys import expected_shapes, map_name
from .gguf_file import GGUFFile, number, optional_int
from .rope_rows import unpermute_rows

# Architectures whose tensors we can map. llama.cpp writes Mistral as "llama", Ministral 3
# as "mistral3" (Llama's tensors, YaRN and a query scale by position); SmolLM3 and Granite are
# Llama's tensors too (every fourth layer without RoPE; multipliers); OLMo 2 norms after each
# sublayer only (an olmo2 file with a window is OLMo 3), as EXAONE 4 does (QK-norm per head); GLM 4
# has Gemma 3's four norms, half of each head rotated, in pairs; Phi-3 and Phi-4-mini keep q/k/v
# and gate/up each in one tensor (GLM 4 gate/up), which load splits; LFM2 has short convolutions in
# place of attention on the layers whose head_count_kv is 0; Cohere's (command-r, cohere2: Command R7B)
# LayerNorm, attention and MLP in parallel from one norm and scaled logits; Hunyuan's QK-norm comes after
# RoPE. Mixture-of-experts files (Mixtral as
# "llama", qwen2moe, qwen3moe, olmoe, granitemoe: Granite's with experts, lfm2moe: LFM2's after its
# first dense layers, chosen by sigmoid scores and a selection bias) keep each projection of a layer's
# experts in one 3-D tensor, which load splits per expert; gpt-oss adds biases to them (2-D, split too).
# Vision-language files whose text model we run (their image encoder is another file): Qwen 2/2.5-VL's
# and Qwen3-VL's. Their M-RoPE gives every rotary pair one of three position streams, which text
# tokens hold equal, so that it is their text model's RoPE.
_VL_TEXT = {"qwen2vl": "qwen2", "qwen3vl": "qwen3", "qwen3vlmoe": "qwen3moe"}
SUPPORTED_ARCHS = ("llama", "mistral3", "qwen2", "qwen3", "gemma", "gemma2", "gemma3", "smollm3", "granite", "olmo2",
                   "exaone4", "glm4", "lfm2", "lfm2moe", "ernie4_5", "command-r", "cohere2", "hunyuan-dense", "phi3",
                   "qwen2moe", "qwen3moe", "olmoe", "granitemoe", "gpt-oss", *_VL_TEXT)
# These architectures' Q/K rows come in pairs: the converter permutes Llama's so, ERNIE 4.5's, Cohere's and
# GLM 4's are so from training (GLM 4's rotary dims only; a glm4 file with M-RoPE sections has them in halves,
# as the converter wrote it).
PERMUTED = ("llama", "mistral3", "smollm3", "granite", "granitemoe", "ernie4_5", "command-r", "cohere2")

_GLOBAL_NAMES = {
    "token_embd.weight": "tok_embeddings.weight",
    "output_norm.weight": "norm.weight",
    "token_embd_norm.weight": "norm.weight",  # LFM2's final norm, as llama.cpp names it
    "output.weight": "output.weight",
}
_LAYER_NAMES = {
    "attn_norm.weight": "attention_norm.weight",
    "attn_q.weight": "attention.wq.weight",
    "attn_k.weight": "attention.wk.weight",
    "attn_v.weight": "attention.wv.weight",
    "attn_q.bias": "attention.wq.bias",
    "attn_k.bias": "attention.wk.bias",
    "attn_v.bias": "attention.wv.bias",
    "attn_output.weight": "attention.wo.weight",
    "ffn_norm.weight": "ffn_norm.weight",
    "ffn_gate.weight": "feed_forward.w1.weight",
    "ffn_down.weight": "feed_forward.w2.weight",
    "ffn_up.weight": "feed_forward.w3.weight",
    "attn_qkv.weight": "attention.wqkv.weight",  # phi3's q, k and v in one tensor (_fused_rows)
    "attn_q_norm.weight": "attention.q_norm.weight",  # QK-norm (qwen3, gemma3)
    "attn_k_norm.weight": "attention.k_norm.weight",
    "post_attention_norm.weight": "post_attention_norm.weight",  # gemma2/3's post-norms
    "post_ffw_norm.weight": "post_ffn_norm.weight",
    "ffn_gate_inp.weight": "feed_forward.gate.weight",  # an MoE layer's router
    "ffn_gate_exps.weight": "feed_forward.experts.w1.weight",  # [experts, rows, cols]: split (_fused_rows)
    "ffn_down_exps.weight": "feed_forward.experts.w2.weight",
    "ffn_up_exps.weight": "feed_forward.experts.w3.weight",
    "ffn_gate_shexp.weight": "feed_forward.shared.w1.weight",  # qwen2moe's shared expert
    "ffn_down_shexp.weight": "feed_forward.shared.w2.weight",
    "ffn_up_shexp.weight": "feed_forward.shared.w3.weight",
    "ffn_gate_inp_shexp.weight": "feed_forward.shared_gate.weight",  # a vector in the file, a row for us
    "shortconv.in_proj.weight": "attention.in_proj.weight",  # LFM2's convolution layers (model/short_conv.py)
    "shortconv.conv.weight": "attention.conv",
    "shortconv.out_proj.weight": "attention.out_proj.weight",
    "exp_probs_b.bias": "feed_forward.selection_bias",  # lfm2moe's: added to the router's scores to choose
}
# gpt-oss's: its post_attention_norm is the MLP's input norm; biases on the attention's output, the
# router and the experts; the attention sinks.
_GPT_OSS_NAMES = {
    **_LAYER_NAMES,
    "post_attention_norm.weight": "ffn_norm.weight",
    "attn_output.bias": "attention.wo.bias",
    "attn_sinks.weight": "attention.sinks",
    "ffn_gate_inp.bias": "feed_forward.gate.bias",
    "ffn_gate_exps.bias": "feed_forward.experts.w1.bias",  # [experts, rows]: split (_expert_biases)
    "ffn_down_exps.bias": "feed_forward.experts.w2.bias",
    "ffn_up_exps.bias": "feed_forward.experts.w3.bias",
}
_LAYER_RE = re.compile(r"blk\.(\d+)\.(.+)")
# Tensors that carry nothing our model needs as weights: RoPE tables (read into ModelArgs).
_SKIPPED = {"rope_freqs.weight", "rope_factors_long.weight", "rope_factors_short.weight"}


def our_name(gguf_name: str, arch: Optional[str] = None) -> Optional[str]:
    """Our state-dict key for a GGUF tensor name of architecture `arch`, or None if we do not map it."""
    return map_name(gguf_name, _GLOBAL_NAMES, _LAYER_RE, _GPT_OSS_NAMES if arch == "gpt-oss" else _LAYER_NAMES)


def _llama3_scaling(f: GGUFFile, head_dim: int, theta: float) -> Optional[RopeScaling]:
    """Recover Llama-3.1 RoPE scaling from the precomputed `rope_freqs` factors.

    llama.cpp stores per-frequency divisors instead of the four parameters. We
    take `factor` from the largest divisor, assume the standard remaining three
    (1, 4, 8192; what every Llama 3.x ships) and check they reproduce the table.
    """
    if "rope_freqs.weight" not in f.tensors:
        return None
    table = f.tensor("rope_freqs.weight", torch.float32).double()
    arch = f.get("general.architecture")
    orig = optional_int(f.get(f"{arch}.rope.scaling.original_context_length", 8192), f.path,
                        "rope.scaling.original_context_length")
    scaling = RopeScaling(factor=float(table.max()), low_freq_factor=1.0, high_freq_factor=4.0,
                          original_max_position_embeddings=orig)
    inv_freq = theta ** -(torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    wavelen = 2 * math.pi / inv_freq
    low_wl = orig / scaling.low_freq_factor
    high_wl = orig / scaling.high_freq_factor
    smooth = (orig / wavelen - scaling.low_freq_factor) / (scaling.high_freq_factor - scaling.low_freq_factor)
    expected = torch.where(wavelen < high_wl, 1.0,
                           torch.where(wavelen > low_wl, scaling.factor, 1 / ((1 - smooth) / scaling.factor + smooth)))
    if table.shape != expected.shape or not torch.allclose(table, expected, rtol=1e-3):
        raise FastDecodeError(f"{f.path}: rope_freqs.weight is not a Llama-3 RoPE scaling table we recognise")
    return scaling


def _gemma3_fields(f: GGUFFile, arch: str, need, dim: int, n_heads: int, head_dim: int, n_layers: int) -> dict:
    """Gemma 3's differences from Llama, from the file's metadata where it has them.

    Files converted by llama.cpp carry the window but not always which layers use
    it, the sliding layers' RoPE base or the attention scale; then the values
    Gemma 3 defines (and llama.cpp and transformers assume) apply: every sixth
    layer global, base 10000, 1/sqrt(head_dim), except the 62-layer 27B model's
    1/sqrt(dim / n_heads). Norm weights need no change: llama.cpp's converter
    stores Gemma's (1 + w) already.
    """
    layer_types = _layer_types(f, arch, n_layers, 6)
    scale = number(f, f"{arch}.attention.scale", (dim / n_heads if n_layers == 62 else head_dim) ** -0.5)
    return dict(
        qk_norm=True, post_norms=True, activation="gelu_tanh", embed_scale=math.sqrt(dim),
        sliding_window=need("attention.sliding_window"), layer_types=layer_types,
        rope_local_theta=number(f, f"{arch}.rope.freq_base_swa", 10000.0), attn_scale=scale,
    )


def _gemma2_fields(f: GGUFFile, arch: str, dim: int, n_heads: int, head_dim: int, n_layers: int) -> dict:
    """Gemma 2: Gemma 3's block without QK-norm, every other layer sliding (the first one),
    and its attention scores and logits soft-capped. Where the file names none, the values
    llama.cpp assumes: window 4,096, caps 50 and 30, one RoPE base, and the attention scale
    1/sqrt(head_dim), or 1/sqrt(dim / n_heads) for the 46-layer 27B model."""
    theta = number(f, f"{arch}.rope.freq_base", 10000.0)
    local_theta = number(f, f"{arch}.rope.freq_base_swa", theta)
    return dict(
        post_norms=True, activation="gelu_tanh", embed_scale=math.sqrt(dim),
        sliding_window=optional_int(f.get(f"{arch}.attention.sliding_window", 4096), f.path, "sliding_window"),
        layer_types=_layer_types(f, arch, n_layers, 2),
        rope_local_theta=None if local_theta == theta else local_theta,
        attn_scale=(dim / n_heads if n_layers == 46 else head_dim) ** -0.5,
        attn_softcap=number(f, f"{arch}.attn_logit_softcapping", 50.0),
        logit_softcap=number(f, f"{arch}.final_logit_softcapping", 30.0),
    )


def _olmo3_fields(f: GGUFFile, arch: str, need, n_layers: int, theta: float) -> dict:
    """OLMo 3 (llama.cpp writes it as olmo2 with a window): sliding layers as the file lists them,
    else three in four (every fourth global); their RoPE base `rope.freq_base_swa` or the global
    one, never scaled (llama.cpp scales the global layers only, as transformers does)."""
    return dict(sliding_window=need("attention.sliding_window"),
                layer_types=_layer_types(f, arch, n_layers, 4),
                rope_local_theta=number(f, f"{arch}.rope.freq_base_swa", theta))


def _layer_types(f: GGUFFile, arch: str, n_layers: int, pattern: int) -> tuple[str, ...]:
    """Which layers slide: `attention.sliding_window_pattern` as a list (True: sliding) or a
    period (every `pattern`-th layer global when the file has none)."""
    pattern = f.get(f"{arch}.attention.sliding_window_pattern", pattern)
    if isinstance(pattern, list):
        if len(pattern) != n_layers:
            raise FastDecodeError(f"{f.path}: {arch}.attention.sliding_window_pattern has {len(pattern)} entries "
                                  f"for {n_layers} layers")
        return tuple("sliding" if p else "global" for p in pattern)
    pattern = optional_int(pattern, f.path, f"{arch}.attention.sliding_window_pattern")
    if pattern < 1:
        raise FastDecodeError(f"{f.path}: {arch}.attention.sliding_window_pattern must be >= 1, got {pattern}")
    return tuple("global" if (i + 1) % pattern == 0 else "sliding" for i in range(n_layers))


def _moe_fields(f: GGUFFile, arch: str, hidden: int) -> dict:
    """An MoE file's experts as llama.cpp reads them for `arch` ({} for a dense model): the experts'
    size when no key gives it is the MLP's (Mixtral, OLMoE) or that over the experts used (Qwen); the
    chosen experts' weights are renormalized except for qwen2moe and olmoe; only qwen2moe gates its shared
    expert."""
    def key(name: str) -> Optional[int]:
        return optional_int(f.get(f"{arch}.{name}"), f.path, name)

    n = key("expert_count") or 0
    if not n:
        return {}
    used = key("expert_used_count") or 0
    kind = _VL_TEXT.get(arch, arch)
    qwen = kind in ("qwen2moe", "qwen3moe")
    shared = (key("expert_shared_feed_forward_length") or hidden) if "blk.0.ffn_gate_shexp.weight" in f.tensors else 0
    dense = key("leading_dense_block_count") or 0
    router = {}
    if kind == "lfm2moe":  # llama.cpp's: the gating function the file names (2: sigmoid), weights renormalized
        gating = key("expert_gating_func")
        if gating not in (1, 2):
            raise FastDecodeError(f"{f.path}: {arch}.expert_gating_func {gating} is not one we run; accepted: 1 "
                                  "(softmax), 2 (sigmoid)")
        router = dict(router="sigmoid" if gating == 2 else "softmax",
                      expert_selection_bias=f"blk.{dense}.exp_probs_b.bias" in f.tensors,
                      routed_scale=number(f, f"{arch}.expert_weights_scale", 0.0) or 1.0)
    return dict(n_experts=n, n_experts_used=used,
                expert_hidden_dim=key("expert_feed_forward_length") or (hidden // used if qwen and used else hidden),
                norm_expert_weights=kind not in ("qwen2moe", "olmoe"), shared_expert_dim=shared,
                shared_expert_gate=kind == "qwen2moe", dense_layers=tuple(range(dense)), **router)


def _granite_fields(f: GGUFFile, arch: str, n_layers: int) -> dict:
    """Granite's multipliers (a scale of 0 or none: 1, as llama.cpp reads them; the logit scale is
    required there), and no RoPE at all when the file says `rope.scaling.finetuned` false."""
    if f.get(f"{arch}.logit_scale") is None:
        raise FastDecodeError(f"{f.path}: missing metadata key {arch}.logit_scale")
    logit = number(f, f"{arch}.logit_scale", 1.0)
    fields = dict(embed_scale=number(f, f"{arch}.embedding_scale", 0.0) or 1.0,
                  residual_scale=number(f, f"{arch}.residual_scale", 0.0) or 1.0,
                  logits_scaling=logit)
    if attn := number(f, f"{arch}.attention.scale", 0.0):
        fields["attn_scale"] = attn
    finetuned = f.get(f"{arch}.rope.scaling.finetuned", True)
    if not isinstance(finetuned, bool):
        raise FastDecodeError(f"{f.path}: {arch}.rope.scaling.finetuned must be true or false, got {finetuned!r:.40}")
    if not finetuned:
        fields["nope_layers"] = tuple(range(n_layers))
    return fields


def _longrope(f: GGUFFile, arch: str, rot: int, context: int) -> Optional[RopeScaling]:
    """Phi-3's LongRoPE: the per-frequency factors llama.cpp's converter stores as tensors, and its
    attention factor (1 where the file has none, as llama.cpp reads it)."""
    names = ("rope_factors_short.weight", "rope_factors_long.weight")
    attention = number(f, f"{arch}.rope.scaling.attn_factor", 1.0)
    if not any(n in f.tensors for n in names):
        if attention == 1.0:
            return None
        ones = (1.0,) * (rot // 2)  # cos and sin scaled, the frequencies not
        return RopeScaling(kind="longrope", short_factor=ones, long_factor=ones, attention_factor=attention)
    missing = [n for n in names if n not in f.tensors]
    if missing:
        raise FastDecodeError(f"{f.path}: {missing[0]} is missing beside {({*names} - {missing[0]}).pop()}")
    short, long = (tuple(f.tensor(n, torch.float32).tolist()) for n in names)
    original = f.get(f"{arch}.rope.scaling.original_context_length", context)
    return RopeScaling(kind="longrope", factor=1.0, attention_factor=attention, short_factor=short, long_factor=long,
                       original_max_position_embeddings=optional_int(original, f.path,
                                                                     "rope.scaling.original_context_length"))


def _rope_scaling(f: GGUFFile, arch: str, head_dim: int, theta: float) -> Optional[RopeScaling]:
    kind = f.get(f"{arch}.rope.scaling.type", "none")
    if kind == "linear":
        factor = number(f, f"{arch}.rope.scaling.factor", 1.0)
        return None if factor == 1.0 else RopeScaling(factor=factor, kind="linear")
    if kind == "yarn":
        return _yarn_scaling(f, arch)
    if kind not in ("none", "llama3"):
        raise FastDecodeError(f"{f.path}: RoPE scaling {kind!r} is not supported; supported: linear, llama3, yarn")
    return _llama3_scaling(f, head_dim, theta)


def _yarn_scaling(f: GGUFFile, arch: str) -> RopeScaling:
    """YaRN from the keys llama.cpp's converter writes. `yarn_attn_factor` is the checkpoint's
    own `attention_factor` (the whole factor on cos and sin, as transformers applies it; the
    llama.cpp we test against reads it only for other architectures), else 0.1 ln(factor) + 1
    over 0.1 L ln(factor) + 1 for a log multiplier L; `attn_factor` multiplies either. A
    partial ramp (`yarn_ext_factor` other than 1) is refused."""
    key = f"{arch}.rope.scaling."
    ext = number(f, key + "yarn_ext_factor", 1.0)
    if ext != 1.0:
        raise FastDecodeError(f"{f.path}: {key}yarn_ext_factor = {ext} is not supported (only 1)")
    factor = number(f, key + "factor", 1.0)
    # A log multiplier L (mscale_all_dim; Ministral 3's is 1) divides by mscale(L), as llama.cpp
    # does for every architecture but DeepSeek's (L = 0 divides by 1).
    log_mul = number(f, key + "yarn_log_multiplier", 0.0)
    attention = number(f, key + "yarn_attn_factor", yarn_mscale(factor) / yarn_mscale(factor, log_mul))
    original = f.get(key + "original_context_length", f.get(f"{arch}.context_length", 2048))
    return RopeScaling(kind="yarn", factor=factor,
                       original_max_position_embeddings=optional_int(original, f.path, key + "original_context_length"),
                       beta_fast=number(f, key + "yarn_beta_fast", 32.0),
                       beta_slow=number(f, key + "yarn_beta_slow", 1.0),
                       attention_factor=attention * number(f, key + "attn_factor", 1.0))


def _kv_heads(f: GGUFFile, arch: str) -> tuple[Any, tuple[int, ...]]:
    """head_count_kv, and LFM2's convolution layers: a list gives one count per layer, 0 on LFM2's
    convolution layers (Granite 4's converter writes a list for its attention-only models too)."""
    kv = f.get(f"{arch}.attention.head_count_kv")
    if not isinstance(kv, list):
        return kv, ()
    lfm2 = arch in ("lfm2", "lfm2moe")
    counts = {n for n in kv if not (lfm2 and n == 0)}
    if len(counts) != 1 or any(isinstance(n, bool) or not isinstance(n, int) or n < 0 for n in counts):
        zero = ", or 0 on a convolution layer" if lfm2 else ""
        raise FastDecodeError(f"{f.path}: {arch}.attention.head_count_kv must give one head count{zero}; "
                              f"got {kv!r:.60}")
    return counts.pop(), tuple(i for i, n in enumerate(kv) if lfm2 and n == 0)


def _cohere_fields(f: GGUFFile, arch: str, n_layers: int, theta: float) -> dict:
    """Cohere's LayerNorm, parallel block and logit scale (llama.cpp: 0 or none, none); cohere2's sliding
    layers (three in four by default), its global ones without RoPE, as llama.cpp runs them."""
    if "blk.0.attn_q_norm.weight" in f.tensors:
        raise FastDecodeError(f"{f.path}: {arch}'s per-head QK-norm is not supported")
    scale = number(f, f"{arch}.logit_scale", 0.0)
    fields = dict(norm="layer", parallel_block=True, logits_scaling=1.0 / scale if scale else 1.0)
    if arch == "cohere2":
        types = _layer_types(f, arch, n_layers, 4)
        swa_theta = number(f, f"{arch}.rope.freq_base_swa", theta)
        fields.update(sliding_window=optional_int(f.get(f"{arch}.attention.sliding_window"), f.path, "sliding_window"),
                      layer_types=types, nope_layers=tuple(i for i, t in enumerate(types) if t == "global"),
                      rope_local_theta=swa_theta if swa_theta != theta else None)
    return fields


def _check_text_mrope(f: GGUFFile, arch: str, rot: int) -> None:
    """M-RoPE runs as RoPE on text when its sections cover every rotary pair with the three streams
    text tokens hold equal (a fourth section would take another position)."""
    sections = f.get(f"{arch}.rope.dimension_sections")
    if sections is None:
        return
    ok = isinstance(sections, list) and all(isinstance(n, int) and n >= 0 for n in sections)
    if not ok or sum(sections[:3]) != rot // 2 or any(sections[3:]):
        raise FastDecodeError(f"{f.path}: {arch}.rope.dimension_sections {sections!r:.60} is not three sections "
                              f"covering the {rot // 2} rotary pairs; only that M-RoPE runs as text")


def gguf_model_args(f: GGUFFile) -> ModelArgs:
    arch = f.get("general.architecture")
    if arch not in SUPPORTED_ARCHS:
        raise FastDecodeError(
            f"{f.path}: unsupported architecture {arch!r}; supported: {', '.join(SUPPORTED_ARCHS)}")

    def need(key: str) -> int:
        value = optional_int(f.get(f"{arch}.{key}"), f.path, key)
        if value is None:
            raise FastDecodeError(f"{f.path}: missing metadata key {arch}.{key}")
        return value

    if "token_embd.weight" not in f.tensors:
        raise FastDecodeError(f"{f.path}: missing tensor token_embd.weight")
    dim, n_heads = need("embedding_length"), need("attention.head_count")
    kv, conv_layers = _kv_heads(f, arch)
    n_kv_heads = optional_int(kv, f.path, "head_count_kv") or n_heads
    head_dim = optional_int(f.get(f"{arch}.attention.key_length"), f.path, "key_length") or dim // n_heads
    rot = optional_int(f.get(f"{arch}.rope.dimension_count"), f.path, "rope.dimension_count") or head_dim
    if rot != head_dim and arch not in ("phi3", "glm4"):
        raise FastDecodeError(f"{f.path}: partial rotary embeddings ({rot} of {head_dim} dims) are not supported "
                              f"for {arch}")
    theta = number(f, f"{arch}.rope.freq_base", 10000.0)
    n_layers = need("block_count")
    context = optional_int(f.get(f"{arch}.context_length", 2048), f.path, "context_length")
    hidden = need("feed_forward_length")
    if arch in _VL_TEXT:
        _check_text_mrope(f, arch, rot)
    family: dict = {}
    if _VL_TEXT.get(arch, arch) in ("qwen3", "qwen3moe"):
        family = dict(qk_norm=True)
    elif arch == "mistral3" and (beta := number(f, f"{arch}.attention.temperature_scale", 0.0)):
        # llama.cpp's period is the YaRN original context (its n_ctx_orig_yarn)
        period = f.get(f"{arch}.rope.scaling.original_context_length", context)
        family = dict(query_scale_beta=beta,
                      query_scale_period=optional_int(period, f.path, "rope.scaling.original_context_length"))
    elif arch == "gemma":  # Gemma 1: Llama with GeGLU (llama.cpp's tanh GELU) and a scaled embedding
        family = dict(activation="gelu_tanh", embed_scale=math.sqrt(dim))
    elif arch == "gemma2":
        family = _gemma2_fields(f, arch, dim, n_heads, head_dim, n_layers)
    elif arch == "gemma3":
        family = _gemma3_fields(f, arch, need, dim, n_heads, head_dim, n_layers)
    elif arch == "smollm3":  # llama.cpp's rule for the architecture: no RoPE on every fourth layer
        family = dict(nope_layers=tuple(i for i in range(n_layers) if (i + 1) % 4 == 0))
    elif arch in ("granite", "granitemoe"):
        family = _granite_fields(f, arch, n_layers)
    elif arch == "olmoe":  # OLMo 2's QK-norm in Llama's pre-norm block
        family = dict(qk_norm=True, qk_norm_full=True)
    elif arch == "gpt-oss":  # llama.cpp's constants for the clamped SwiGLU (gpt-oss's config values)
        family = dict(attn_sinks=True, attn_out_bias="blk.0.attn_output.bias" in f.tensors, expert_bias=True,
                      activation="swiglu_oai", sliding_window=need("attention.sliding_window"),
                      layer_types=_layer_types(f, arch, n_layers, 2))
    elif arch in ("lfm2", "lfm2moe"):
        family = dict(qk_norm=True, conv_layers=conv_layers, conv_kernel=need("shortconv.l_cache"))
        if window := optional_int(f.get(f"{arch}.attention.sliding_window"), f.path, "sliding_window"):
            family["sliding_window"] = window  # every attention layer slides, as llama.cpp runs it
    elif arch == "hunyuan-dense":  # QK-norm after RoPE; the converter wrote NTK-alpha's base as freq_base
        family = dict(qk_norm=True, qk_norm_after_rope=True)
    elif arch in ("command-r", "cohere2"):
        family = _cohere_fields(f, arch, n_layers, theta)
    elif arch == "glm4":  # Gemma 3's four norms a layer, its gate and up in one tensor (_fused_rows)
        family = dict(post_norms=True)
    elif arch == "exaone4":
        family = dict(qk_norm=True, pre_norms=False, post_norms=True)
        if n_layers == 64:
            # llama.cpp's rule: only the 64-layer model (EXAONE 4.0 32B) slides, three layers in four by
            # default, and its global layers run without RoPE; other files run every layer global with RoPE.
            window = optional_int(f.get(f"{arch}.attention.sliding_window", 4096), f.path, "sliding_window")
            types = _layer_types(f, arch, n_layers, 4)
            family.update(sliding_window=window, layer_types=types,
                          nope_layers=tuple(i for i, t in enumerate(types) if t == "global"))
    elif arch == "olmo2":
        family = dict(qk_norm=True, qk_norm_full=True, pre_norms=False, post_norms=True)
        if f.get(f"{arch}.attention.sliding_window"):  # OLMo 3
            family.update(_olmo3_fields(f, arch, need, n_layers, theta))
    try:
        # llama.cpp runs phi3 without its sliding window (the converters' windows are not the models')
        scaling = _longrope(f, arch, rot, context) if arch == "phi3" else _rope_scaling(f, arch, head_dim, theta)
        if arch == "gpt-oss" and scaling is not None and scaling.kind == "yarn":
            # gpt-oss's YaRN ramp runs between the unrounded dims (its config's truncate: false, as OpenAI's
            # reference computes it); llama.cpp rounds them as for other models.
            scaling = dataclasses.replace(scaling, truncate=False)
        return ModelArgs(
            dim=dim,
            n_layers=n_layers,
            n_heads=n_heads,
            n_kv_heads=n_kv_heads,
            head_dim=head_dim,
            rope_dim=None if rot == head_dim else rot,
            vocab_size=int(f.tensors["token_embd.weight"].shape[1]),
            hidden_dim=hidden,
            norm_eps=number(f, f"{arch}.attention.layer_norm_rms_epsilon", 1e-5) if family.get("norm") != "layer"
            else number(f, f"{arch}.attention.layer_norm_epsilon", 1e-5),
            rope_theta=theta,
            rope_scaling=scaling,
            max_seq_len=scaling.context(context) if scaling else context,
            tie_embeddings="output.weight" not in f.tensors,
            qkv_bias="blk.0.attn_q.bias" in f.tensors,
            **family,
            **_moe_fields(f, arch, hidden),
        )
    except FastDecodeError as e:
        if str(e).startswith(str(f.path)):
            raise
        raise FastDecodeError(f"{f.path}: {e}") from None


def gguf_state_dict(f: GGUFFile, args: ModelArgs, dtype: torch.dtype,
                    weights: str = "float") -> tuple[dict[str, torch.Tensor], str]:
    """The file's tensors (on CPU) under our key names, and a one-line summary of what became of each type.

    weights="float" dequantizes everything to `dtype`; "auto" keeps matrices of
    types with a native layout packed (see quant/formats.py) and dequantizes
    the rest; "int8"/"int4" quantize a float file's matrices.
    """
    kinds: Counter[str] = Counter()
    out: dict[str, torch.Tensor] = {}
    for part in gguf_shards(f, args, dtype, weights, kinds):
        out.update(part)
    return out, summarize(kinds, weights)


def summarize(kinds: Counter, weights: str = "auto") -> str:
    """What became of each tensor type, e.g. "F32 x33, Q4_K->q4k x96, Q6_K->q6k x17"."""
    quantized = f"; quantized to {weights} at load" if weights in ("int8", "int4") else ""
    return ", ".join(f"{k} x{n}" for k, n in sorted(kinds.items())) + quantized


def gguf_shards(f: GGUFFile, args: ModelArgs, dtype: torch.dtype, weights: str,
                kinds: Counter) -> Iterator[dict[str, torch.Tensor]]:
    """The file's tensors converted one layer at a time (the layers in file order, then the
    rest), so that a caller writing each part out holds one layer at a time. Counts what
    became of each tensor type in `kinds`. Names and types are all checked before the first
    part is converted. int8/int4 quantize each part's float matrices, so the float model is never
    held whole."""
    f.check_tensor_types()
    names = [n for n in f.tensors if n not in _SKIPPED]
    arch = f.get("general.architecture")
    unknown = [n for n in names if our_name(n, arch) is None]
    if unknown:
        raise FastDecodeError(f"{f.path}: unexpected tensor {unknown[0]!r} for a {arch} model")
    # Shapes against the metadata's before any conversion: un-permuting Q/K rows, for one, reshapes
    # by the head count (check_state_dict checks our converted tensors again later).
    expected = expected_shapes(args)
    for name in names:
        fused = _fused_rows(name, args, arch)
        want = fused[1] if fused else _expert_biases(name, args) or expected.get(our_name(name, arch))
        got = f.raw(name)[2]
        if name.endswith(_SHARED_GATE):
            got = (1, *got)
        if want is not None and tuple(got) != tuple(want):
            raise FastDecodeError(f"{f.path}: tensor {name!r} has shape {list(got)}, but the file's metadata "
                                  f"makes it {list(want)}")
    if weights in ("int8", "int4"):
        for name in names:
            _, qtype, shape = f.raw(name)
            if len(shape) == 2 and qtype.name not in ("F32", "F16", "BF16"):
                raise FastDecodeError(f"{f.path}: weights={weights} quantizes float checkpoints, but {name} is "
                                      f"already {qtype.name}; use weights=auto (keeps the file's quantization) "
                                      "or float")
    groups: dict[Optional[int], list[str]] = {}
    for name in names:
        m = _LAYER_RE.match(name)
        groups.setdefault(int(m.group(1)) if m else None, []).append(name)
    if None in groups:  # the embedding, the final norm and the head last
        groups[None] = groups.pop(None)
    for group in groups.values():
        out: dict[str, torch.Tensor] = {}
        for name in group:
            out.update(_convert(f, name, args, dtype, weights, arch, kinds))
        if weights in ("int8", "int4"):
            quantize_state_dict(out, args, weights, str(f.path))
        yield out
        del out  # the caller has written it out
        f.drop_pages()


_SHARED_GATE = "ffn_gate_inp_shexp.weight"
_EXPERTS = {"ffn_gate_exps.weight": "w1", "ffn_down_exps.weight": "w2", "ffn_up_exps.weight": "w3"}


def _fused_rows(name: str, args: ModelArgs,
                arch: str) -> Optional[tuple[list[tuple[str, int, int]], tuple[int, ...]]]:
    """For a tensor holding several of our matrices: our keys with their row ranges [r0, r1) of
    the tensor's rows (all dims but the last), and the tensor's expected shape; else None. Phi-3's
    attn_qkv holds q, k, v, its ffn_up (and GLM 4's) gate then up; an MoE layer's *_exps each expert's matrix."""
    m = _LAYER_RE.fullmatch(name)
    if m is None:
        return None
    layer, sub = int(m.group(1)), m.group(2)
    p = f"layers.{layer}."
    if sub in _EXPERTS and layer < args.n_layers:
        n, dim, hidden = args.experts(layer), args.dim, args.expert_hidden_dim
        rows, cols = (dim, hidden) if sub == "ffn_down_exps.weight" else (hidden, dim)
        keys = [(f"{p}feed_forward.experts.{e}.{_EXPERTS[sub]}.weight", e * rows, (e + 1) * rows) for e in range(n)]
        return keys, (n, rows, cols)
    fused = ("attn_qkv.weight", "ffn_up.weight") if arch == "phi3" else ("ffn_up.weight",) if arch == "glm4" else ()
    if sub not in fused:
        return None
    if sub == "ffn_up.weight":
        h = args.hidden_dim
        return [(p + "feed_forward.w1.weight", 0, h), (p + "feed_forward.w3.weight", h, 2 * h)], (2 * h, args.dim)
    q, kv = args.n_heads * args.head_dim, args.n_kv_heads * args.head_dim
    return [(p + "attention.wq.weight", 0, q), (p + "attention.wk.weight", q, q + kv),
            (p + "attention.wv.weight", q + kv, q + 2 * kv)], (q + 2 * kv, args.dim)


def _expert_biases(name: str, args: ModelArgs) -> Optional[tuple[int, int]]:
    """The expected shape [experts, rows] of gpt-oss's biases of a layer's experts, else None."""
    m = _LAYER_RE.fullmatch(name)
    sub = m.group(2) if m else ""
    if not sub.endswith(".bias") or sub.removesuffix(".bias") + ".weight" not in _EXPERTS:
        return None
    layer = int(m.group(1))
    rows = args.dim if sub.startswith("ffn_down") else args.expert_hidden_dim
    return (args.experts(layer), rows) if layer < args.n_layers else None


def _convert(f: GGUFFile, name: str, args: ModelArgs, dtype: torch.dtype, weights: str, arch: str,
             kinds: Counter) -> dict[str, torch.Tensor]:
    """One GGUF tensor under our key names: its packed tensors, or one float tensor (a fused
    tensor: each part's)."""
    raw, qtype, shape = f.raw(name)
    permuted = arch in PERMUTED or (arch == "glm4" and f.get(f"{arch}.rope.dimension_sections") is None)
    fused = _fused_rows(name, args, arch)
    if name.endswith(_SHARED_GATE):
        kinds[qtype.name] += 1
        return {our_name(name, arch): f.tensor(name, dtype).reshape(1, -1)}
    if _expert_biases(name, args):
        kinds[qtype.name] += 1
        base, w, _ = our_name(name, arch).rsplit(".", 2)  # layers.N.feed_forward.experts, wK, bias
        return {f"{base}.{e}.{w}.bias": row for e, row in enumerate(f.tensor(name, dtype))}
    if fused is None:
        return _convert_rows(name, our_name(name, arch), raw, qtype, shape, args, weights, permuted, kinds,
                             lambda: f.tensor(name, dtype))
    cols, n_rows = shape[-1], math.prod(shape[:-1])
    # The float path decodes the tensor once for its parts.
    whole = functools.cache(lambda: f.tensor(name, dtype).reshape(n_rows, cols))
    out: dict[str, torch.Tensor] = {}
    for key, r0, r1 in fused[0]:
        rows = raw.reshape(n_rows, -1)[r0:r1].reshape(-1)
        out.update(_convert_rows(name, key, rows, qtype, (r1 - r0, cols), args, weights, permuted, kinds,
                                 lambda r0=r0, r1=r1: whole()[r0:r1]))
    return out


def _convert_rows(name: str, key: str, raw, qtype, shape: tuple[int, ...], args: ModelArgs, weights: str,
                  permuted: bool, kinds: Counter, floats: Callable[[], torch.Tensor]) -> dict[str, torch.Tensor]:
    """Rows of tensor `name` (`raw` their bytes, `floats()` them in the model's dtype) as our `key`."""
    packed = None
    if weights == "auto" and len(shape) == 2:
        # Q and K rows are put back in order before packing (q4 packs rows in panels of 16).
        heads = _qk_heads(name, args) if permuted else None
        order = None if heads is None else unpermute_rows(torch.arange(shape[0]), heads, args.rope_dim).numpy()
        if qtype in REQUANTIZED:
            packed = requantize_gguf(raw, qtype, *shape, dequant.decoder(qtype), order=order)
            became = f"q8 (requantized: no native kernel for {qtype.name})"
        else:
            packed = pack_gguf(raw, qtype, *shape, order=order)
            became = GGUF_LAYOUTS[qtype].layout if packed is not None else ""
    if packed is not None:
        kinds[f"{qtype.name}->{became}"] += 1
        base = key.removesuffix(".weight")
        return {f"{base}.{suffix}": t for suffix, t in packed.items()}
    note = " (dequantized: no native layout)" if weights == "auto" and qtype in GGUF_LAYOUTS else ""
    kinds[f"{qtype.name}->float{note}" if len(shape) == 2 else qtype.name] += 1
    t = floats()
    return {key: (_unpermute(t, name, args) if permuted else t).contiguous()}


def _qk_heads(name: str, args: ModelArgs) -> Optional[int]:
    """The heads whose rows llama.cpp's converter permuted in tensor `name` (Q or K), else None."""
    if ".attn_q." in name:
        return args.n_heads
    if ".attn_k." in name:
        return args.n_kv_heads
    return None


def _unpermute(t: torch.Tensor, name: str, args: ModelArgs) -> torch.Tensor:
    """A float matrix's Q or K rows back to Hugging Face's order."""
    heads = _qk_heads(name, args)
    return t if heads is None else unpermute_rows(t, heads, args.rope_dim).contiguous()
