"""A GGUF file's metadata read into ModelArgs: its architecture and each family's fields as llama.cpp
reads them."""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Optional

import torch

from ..errors import FastDecodeError
from ..model.args import MAX_LAYERS, ModelArgs, RopeScaling, yarn_mscale
from .gguf_file import GGUFFile, number, optional_int

# Architectures whose tensors we can map. llama.cpp writes Mistral as "llama", Ministral 3
# as "mistral3" (Llama's tensors, YaRN and a query scale by position); SmolLM3 and Granite are
# Llama's tensors too (every fourth layer without RoPE; multipliers); OLMo 2 norms after each
# sublayer only (an olmo2 file with a window is OLMo 3), as EXAONE 4 does (QK-norm per head); GLM 4
# has Gemma 3's four norms, half of each head rotated, in pairs; Phi-3 and Phi-4-mini keep q/k/v
# and gate/up each in one tensor (GLM 4 gate/up), which load splits; LFM2 has short convolutions in
# place of attention on the layers whose head_count_kv is 0; Cohere's (command-r, cohere2: Command R7B)
# LayerNorm, attention and MLP in parallel from one norm and scaled logits; Hunyuan's QK-norm comes
# after RoPE. Mixture-of-experts files (Mixtral as "llama", qwen2moe, qwen3moe, olmoe, granitemoe:
# Granite's with experts, lfm2moe: LFM2's after its first dense layers, chosen by sigmoid scores and a
# selection bias) keep each projection of a layer's experts in one 3-D tensor, which load splits per
# expert (gguf_loader.py); gpt-oss adds biases to them (2-D, split too).
# Vision-language files whose text model we run (their image encoder is another file): Qwen 2/2.5-VL's
# and Qwen3-VL's. Their M-RoPE gives every rotary pair one of three position streams, which text
# tokens hold equal, so that it is their text model's RoPE.
_VL_TEXT = {"qwen2vl": "qwen2", "qwen3vl": "qwen3", "qwen3vlmoe": "qwen3moe"}
SUPPORTED_ARCHS = ("llama", "mistral3", "qwen2", "qwen3", "gemma", "gemma2", "gemma3", "smollm3", "granite", "olmo2",
                   "exaone4", "glm4", "lfm2", "lfm2moe", "ernie4_5", "command-r", "cohere2", "hunyuan-dense", "phi3",
                   "qwen2moe", "qwen3moe", "olmoe", "granitemoe", "gpt-oss", *_VL_TEXT)


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
    if arch is None:  # else "unsupported architecture None", as if the file had named one
        raise FastDecodeError(f"{f.path}: missing metadata key general.architecture; supported: "
                              f"{', '.join(SUPPORTED_ARCHS)}")
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
    for key, value in (("embedding_length", dim), ("attention.head_count", n_heads)):
        if value < 1:  # head_dim's default divides by the head count
            raise FastDecodeError(f"{f.path}: {arch}.{key} must be >= 1, got {value}")
    kv, conv_layers = _kv_heads(f, arch)
    n_kv_heads = optional_int(kv, f.path, "head_count_kv") or n_heads
    head_dim = optional_int(f.get(f"{arch}.attention.key_length"), f.path, "key_length") or dim // n_heads
    rot = optional_int(f.get(f"{arch}.rope.dimension_count"), f.path, "rope.dimension_count") or head_dim
    if rot != head_dim and arch not in ("phi3", "glm4"):
        raise FastDecodeError(f"{f.path}: partial rotary embeddings ({rot} of {head_dim} dims) are not supported "
                              f"for {arch}")
    theta = number(f, f"{arch}.rope.freq_base", 10000.0)
    n_layers = need("block_count")
    if not 1 <= n_layers <= MAX_LAYERS:  # before the per-layer lists below are built from it (2**63 of them)
        raise FastDecodeError(f"{f.path}: {arch}.block_count must be 1..{MAX_LAYERS:,}, got {n_layers:,}")
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
    elif arch == "glm4":  # Gemma 3's four norms a layer; gate and up in one tensor (gguf_loader splits it)
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
