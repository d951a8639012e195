"""Hugging Face checkpoint directories: config.json and weights (hf_files.py: safetensors or PyTorch .bin,
single or sharded), under our key names."""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from pathlib import Path
from typing import Any, Optional

import torch

from ..model.args import ModelArgs, RopeScaling, yarn_mscale
from ..errors import FastDecodeError
from ..quant.transform import quantize_state_dict
from . import hf_mxfp4
from .hf_files import tensors, weight_files
from .keys import map_name
from .rope_rows import unpermute_rows

SUPPORTED_ARCHS = ("LlamaForCausalLM", "MistralForCausalLM", "Ministral3ForCausalLM", "Qwen2ForCausalLM",
                   "Qwen3ForCausalLM", "Gemma3ForCausalLM", "SmolLM3ForCausalLM", "GraniteForCausalLM",
                   "Olmo2ForCausalLM", "Olmo3ForCausalLM", "GemmaForCausalLM", "Gemma2ForCausalLM", "Phi3ForCausalLM",
                   "MixtralForCausalLM", "Qwen2MoeForCausalLM", "Qwen3MoeForCausalLM", "OlmoeForCausalLM",
                   "GraniteMoeForCausalLM", "GraniteMoeSharedForCausalLM", "GptOssForCausalLM", "Exaone4ForCausalLM",
                   "Glm4ForCausalLM", "Lfm2ForCausalLM", "Lfm2MoeForCausalLM", "Ernie4_5ForCausalLM",
                   "GraniteMoeHybridForCausalLM", "CohereForCausalLM", "Cohere2ForCausalLM",
                   "HunYuanDenseV1ForCausalLM")
_MODEL_TYPES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "ministral3": "Ministral3ForCausalLM",
                "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM", "gemma3_text": "Gemma3ForCausalLM",
                "smollm3": "SmolLM3ForCausalLM", "granite": "GraniteForCausalLM", "olmo2": "Olmo2ForCausalLM",
                "olmo3": "Olmo3ForCausalLM", "gemma": "GemmaForCausalLM", "gemma2": "Gemma2ForCausalLM",
                "phi3": "Phi3ForCausalLM", "mixtral": "MixtralForCausalLM", "qwen2_moe": "Qwen2MoeForCausalLM",
                "qwen3_moe": "Qwen3MoeForCausalLM", "olmoe": "OlmoeForCausalLM", "granitemoe": "GraniteMoeForCausalLM",
                "granitemoeshared": "GraniteMoeSharedForCausalLM", "gpt_oss": "GptOssForCausalLM",
                "exaone4": "Exaone4ForCausalLM", "glm4": "Glm4ForCausalLM", "lfm2": "Lfm2ForCausalLM",
                "lfm2_moe": "Lfm2MoeForCausalLM", "ernie4_5": "Ernie4_5ForCausalLM",
                "granitemoehybrid": "GraniteMoeHybridForCausalLM", "cohere": "CohereForCausalLM",
                "cohere2": "Cohere2ForCausalLM", "hunyuan_v1_dense": "HunYuanDenseV1ForCausalLM"}
_MINISTRAL3 = "Ministral3ForCausalLM"
_GEMMA = "Gemma3ForCausalLM"
_GEMMA2 = "Gemma2ForCausalLM"  # Gemma 3's block without QK-norm, its scores and logits soft-capped
_GEMMA1 = "GemmaForCausalLM"  # Llama with GeGLU, a scaled embedding and (1 + w) norms
_SMOLLM3 = "SmolLM3ForCausalLM"
_GRANITE = "GraniteForCausalLM"
_OLMO2 = "Olmo2ForCausalLM"
_OLMO3 = "Olmo3ForCausalLM"  # OLMo 2 with three sliding layers in four, RoPE scaling on the others only
_PHI3 = "Phi3ForCausalLM"  # Llama with q/k/v and gate/up each in one tensor, partial rotary, LongRoPE
# OLMo 2's norms after each sublayer, QK-norm per head; with a window, its sliding layers take RoPE
# and the others none
_EXAONE4 = "Exaone4ForCausalLM"
# Gemma 3's four norms a layer (named its own way), biases on q, k and v, gate and up in one tensor, and
# half of each head rotated in interleaved pairs, which load reorders (rope_rows.py)
_GLM4 = "Glm4ForCausalLM"
_ERNIE = "Ernie4_5ForCausalLM"  # Llama with its heads rotated in interleaved pairs, which load reorders
# Cohere's: LayerNorm, attention and MLP in parallel from one norm, scaled logits, heads rotated in pairs;
# Command R7B's (2) with three sliding layers in four, the global ones without RoPE
_COHERE, _COHERE2 = "CohereForCausalLM", "Cohere2ForCausalLM"
# Llama with QK-norm after RoPE, and NTK-alpha RoPE: a base of theta * alpha^(d / (d - 2))
_HUNYUAN = "HunYuanDenseV1ForCausalLM"
# Llama's block with QK-norm where most layers' attention is a gated short convolution (model/short_conv.py)
_LFM2 = "Lfm2ForCausalLM"
_LFM2_MOE = "Lfm2MoeForCausalLM"  # LFM2 with experts after its first dense layers, a sigmoid router
# Mixture of experts: Mistral's, Qwen 2's and 3's, OLMo's (with QK-norm over all heads, as OLMo 2) and
# Granite's blocks with routed experts (Qwen 2's and Granite MoE Shared's with a shared expert too), and
# each config class's defaults for the keys a config may leave out: (experts, used, the experts' size
# key, the shared expert's default size).
_MIXTRAL, _QWEN2_MOE, _QWEN3_MOE = "MixtralForCausalLM", "Qwen2MoeForCausalLM", "Qwen3MoeForCausalLM"
_OLMOE = "OlmoeForCausalLM"
# Granite's shared expert: its size in shared_intermediate_size, not gated
_GRANITE_MOE, _GRANITE_MOE_SHARED = "GraniteMoeForCausalLM", "GraniteMoeSharedForCausalLM"
# Granite 4: Granite's multipliers and a gated shared MLP, in its attention-only models (granite-4.0-micro, -1b,
# -350m) a dense MLP; with experts, loaded as GraniteMoeShared (_architecture); Mamba layers are refused.
_GRANITE_HYBRID = "GraniteMoeHybridForCausalLM"
# gpt-oss: biases on every attention and expert matrix and on the router, clamped SwiGLU experts,
# attention sinks, sliding and global layers in turn
_GPT_OSS = "GptOssForCausalLM"
_MOE = {_MIXTRAL: (8, 2, "intermediate_size", 0), _QWEN2_MOE: (60, 4, "moe_intermediate_size", 5632),
        _QWEN3_MOE: (128, 8, "moe_intermediate_size", 0), _OLMOE: (64, 8, "intermediate_size", 0),
        _GRANITE_MOE: (8, 2, "intermediate_size", 0), _GRANITE_MOE_SHARED: (8, 2, "intermediate_size", 0),
        _GPT_OSS: (128, 4, "intermediate_size", 0), _LFM2_MOE: (32, 4, "moe_intermediate_size", 0)}
# Families whose rope_parameters may be given per layer type (transformers 5), the global layers'
# scaled, the sliding layers' never.
_PER_LAYER_TYPE_ROPE = (_GEMMA, _OLMO3)
# The RoPE base a config that names none gets: its transformers config class's default (10,000 for
# the others).
_DEFAULT_THETA = {_GEMMA: 1_000_000.0, _OLMO3: 500_000.0, _SMOLLM3: 2_000_000.0, _LFM2: 1_000_000.0,
                  _LFM2_MOE: 1_000_000.0, _ERNIE: 500_000.0, _COHERE: 500_000.0}
# Vision-language checkpoints whose text model we run, the image side left out: the text model's
# architecture (by text_config's model_type), and the values its `text_config` may leave to the
# config class's defaults (Gemma 3 4B's names five keys and takes the rest from Gemma3TextConfig).
_MULTIMODAL = {
    "Gemma3ForConditionalGeneration": ({"gemma3_text": _GEMMA}, dict(
        vocab_size=262208, num_attention_heads=8, num_key_value_heads=4, head_dim=256, rms_norm_eps=1e-6,
        query_pre_attn_scalar=256, max_position_embeddings=131072, sliding_window=4096,
        hidden_activation="gelu_pytorch_tanh")),
    # Mistral Small 3.1 / 3.2 (Mistral's text model), Ministral 3 (its own)
    "Mistral3ForConditionalGeneration": ({"mistral": "MistralForCausalLM", "ministral3": _MINISTRAL3}, {}),
    # Qwen's: on text alone their M-RoPE is RoPE (the three position streams are one), so the text
    # model is Qwen 2's or Qwen 3's. Qwen 2/2.5-VL's own configs keep the text model's keys at the
    # top level, without text_config.
    "Qwen2VLForConditionalGeneration": ({"qwen2_vl_text": "Qwen2ForCausalLM", "qwen2_vl": "Qwen2ForCausalLM"}, {}),
    "Qwen2_5_VLForConditionalGeneration": ({"qwen2_5_vl_text": "Qwen2ForCausalLM",
                                            "qwen2_5_vl": "Qwen2ForCausalLM"}, {}),
    "Qwen3VLForConditionalGeneration": ({"qwen3_vl_text": "Qwen3ForCausalLM"}, {}),
}
_IMAGE_PARTS = ("vision_tower.", "multi_modal_projector.", "model.vision_tower.", "model.multi_modal_projector.",
                "visual.", "model.visual.")
# Where such a checkpoint keeps the text model's tensors (the first: its files; the second:
# transformers 5's module names), and the text model's own names for them.
_TEXT_PREFIXES = (("language_model.model.", "model."), ("model.language_model.", "model."),
                  ("language_model.lm_head.", "lm_head."))
_ACTIVATIONS = {"silu": "silu", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu"}
_LAYER_TYPES = {"full_attention": "global", "sliding_attention": "sliding"}

_GLOBAL_NAMES = {
    "model.embed_tokens.weight": "tok_embeddings.weight",
    "model.norm.weight": "norm.weight",
    "model.embedding_norm.weight": "norm.weight",  # LFM2's final norm
    "lm_head.weight": "output.weight",
}
_LAYER_NAMES = {
    "input_layernorm.weight": "attention_norm.weight",
    "self_attn.q_proj.weight": "attention.wq.weight",
    "self_attn.k_proj.weight": "attention.wk.weight",
    "self_attn.v_proj.weight": "attention.wv.weight",
    "self_attn.q_proj.bias": "attention.wq.bias",
    "self_attn.k_proj.bias": "attention.wk.bias",
    "self_attn.v_proj.bias": "attention.wv.bias",
    "self_attn.o_proj.weight": "attention.wo.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "feed_forward.w1.weight",
    "mlp.down_proj.weight": "feed_forward.w2.weight",
    "mlp.up_proj.weight": "feed_forward.w3.weight",
    "self_attn.q_norm.weight": "attention.q_norm.weight",  # QK-norm (Qwen3, Gemma 3)
    "self_attn.k_norm.weight": "attention.k_norm.weight",
    "self_attn.qkv_proj.weight": "attention.wqkv.weight",  # Phi-3's fused tensors, split at load (_split_fused)
    "mlp.gate_up_proj.weight": "feed_forward.w13.weight",
    # MoE layers: the router, each expert ("{}": its number), Qwen2-MoE's shared expert and its gate
    "mlp.gate.weight": "feed_forward.gate.weight",
    "mlp.experts.{}.gate_proj.weight": "feed_forward.experts.{}.w1.weight",
    "mlp.experts.{}.down_proj.weight": "feed_forward.experts.{}.w2.weight",
    "mlp.experts.{}.up_proj.weight": "feed_forward.experts.{}.w3.weight",
    "mlp.shared_expert.gate_proj.weight": "feed_forward.shared.w1.weight",
    "mlp.shared_expert.down_proj.weight": "feed_forward.shared.w2.weight",
    "mlp.shared_expert.up_proj.weight": "feed_forward.shared.w3.weight",
    "mlp.shared_expert_gate.weight": "feed_forward.shared_gate.weight",
    "mlp.experts.gate_up_proj": "feed_forward.experts.w13.weight",  # transformers 5's [experts, rows, cols] form
    "mlp.experts.down_proj": "feed_forward.experts.w2.weight",
    "block_sparse_moe.experts.gate_up_proj": "feed_forward.experts.w13.weight",
    "block_sparse_moe.experts.down_proj": "feed_forward.experts.w2.weight",
    "block_sparse_moe.router.weight": "feed_forward.gate.weight",
    "block_sparse_moe.gate.weight": "feed_forward.gate.weight",  # Mixtral's names
    "block_sparse_moe.experts.{}.w1.weight": "feed_forward.experts.{}.w1.weight",
    "block_sparse_moe.experts.{}.w2.weight": "feed_forward.experts.{}.w2.weight",
    "block_sparse_moe.experts.{}.w3.weight": "feed_forward.experts.{}.w3.weight",
    "block_sparse_moe.router.layer.weight": "feed_forward.gate.weight",  # Granite MoE's names
    "block_sparse_moe.input_linear.weight": "feed_forward.experts.w13.weight",
    "block_sparse_moe.output_linear.weight": "feed_forward.experts.w2.weight",
    "shared_mlp.input_linear.weight": "feed_forward.shared.w13.weight",  # gate and up, split (_split_fused)
    "shared_mlp.output_linear.weight": "feed_forward.shared.w2.weight",
}
# Gemma 2 and 3 name their four norms differently: its post_attention_layernorm is the
# sandwich norm on the attention output, not the MLP's input norm as in Llama (OLMo 2's
# two norms are named so too).
_GEMMA_LAYER_NAMES = {
    **_LAYER_NAMES,
    "post_attention_layernorm.weight": "post_attention_norm.weight",
    "pre_feedforward_layernorm.weight": "ffn_norm.weight",
    "post_feedforward_layernorm.weight": "post_ffn_norm.weight",
}
_LFM2_LAYER_NAMES = {
    "operator_norm.weight": "attention_norm.weight",
    "ffn_norm.weight": "ffn_norm.weight",
    **{f"self_attn.{a}_proj.weight": f"attention.w{a}.weight" for a in "qkv"},
    "self_attn.out_proj.weight": "attention.wo.weight",
    "self_attn.q_layernorm.weight": "attention.q_norm.weight",
    "self_attn.k_layernorm.weight": "attention.k_norm.weight",
    "conv.in_proj.weight": "attention.in_proj.weight",
    "conv.conv.weight": "attention.conv",  # [dim, 1, taps]: squeezed at load
    "conv.out_proj.weight": "attention.out_proj.weight",
    **{f"feed_forward.w{i}.weight": f"feed_forward.w{i}.weight" for i in "123"},
    # LFM2-MoE's: the router, its selection bias, each expert ("{}": its number) or all in one tensor
    "feed_forward.gate.weight": "feed_forward.gate.weight",
    "feed_forward.expert_bias": "feed_forward.selection_bias",
    **{f"feed_forward.experts.{{}}.w{i}.weight": f"feed_forward.experts.{{}}.w{i}.weight" for i in "123"},
    "feed_forward.experts.gate_up_proj": "feed_forward.experts.w13.weight",
    "feed_forward.experts.down_proj": "feed_forward.experts.w2.weight",
}
_GRANITE_HYBRID_LAYER_NAMES = {
    **_LAYER_NAMES,
    "shared_mlp.input_linear.weight": "feed_forward.w13.weight",  # gate and up, split (_split_fused)
    "shared_mlp.output_linear.weight": "feed_forward.w2.weight",
}
_HUNYUAN_LAYER_NAMES = {
    **_LAYER_NAMES,
    "self_attn.query_layernorm.weight": "attention.q_norm.weight",
    "self_attn.key_layernorm.weight": "attention.k_norm.weight",
}
_QK = ("attention.wq.weight", "attention.wq.bias", "attention.wk.weight", "attention.wk.bias")
_GLM4_LAYER_NAMES = {
    **_LAYER_NAMES,
    "post_self_attn_layernorm.weight": "post_attention_norm.weight",
    "post_mlp_layernorm.weight": "post_ffn_norm.weight",
}
_LAYER_RE = re.compile(r"model\.layers\.(\d+)\.(.+)")
# gpt-oss's experts come as [experts, ...] tensors, gate and up interleaved (_split_gpt_oss)
_GPT_OSS_EXPERTS = ("gate_up_proj", "gate_up_proj_bias", "down_proj", "down_proj_bias")
_GPT_OSS_LAYER_NAMES = {
    **_LAYER_NAMES,
    "self_attn.o_proj.bias": "attention.wo.bias",
    "self_attn.sinks": "attention.sinks",
    "mlp.router.weight": "feed_forward.gate.weight",
    "mlp.router.bias": "feed_forward.gate.bias",
    **{f"mlp.experts.{n}": f"feed_forward.experts.{n}" for n in _GPT_OSS_EXPERTS},
    **{f"mlp.experts.{n}{s}": f"feed_forward.experts.{n}{s}"  # OpenAI's MXFP4 (hf_mxfp4.py)
       for n in ("gate_up_proj", "down_proj") for s in hf_mxfp4.SUFFIXES},
}


def our_name(hf_name: str, arch: str = "LlamaForCausalLM") -> Optional[str]:
    post_norm_names = arch in (_GEMMA, _GEMMA2, _OLMO2, _OLMO3, _EXAONE4)
    names = (_GEMMA_LAYER_NAMES if post_norm_names else _GPT_OSS_LAYER_NAMES if arch == _GPT_OSS
             else _GLM4_LAYER_NAMES if arch == _GLM4 else _LFM2_LAYER_NAMES if arch in (_LFM2, _LFM2_MOE)
             else _GRANITE_HYBRID_LAYER_NAMES if arch == _GRANITE_HYBRID
             else _HUNYUAN_LAYER_NAMES if arch == _HUNYUAN else _LAYER_NAMES)
    return map_name(hf_name, _GLOBAL_NAMES, _LAYER_RE, names)


def read_config(directory: Path) -> dict[str, Any]:
    path = directory / "config.json"
    if not path.is_file():
        raise FastDecodeError(
            f"{directory}: no config.json; a Hugging Face checkpoint directory needs config.json "
            "and its weights (model.safetensors, or sharded with model.safetensors.index.json)")
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise FastDecodeError(f"{path}: cannot read JSON ({e})") from None
    if not isinstance(config, dict):
        raise FastDecodeError(f"{path}: expected a JSON object")
    quant = config.get("quantization_config")
    if quant is not None:
        method = quant.get("quant_method") if isinstance(quant, dict) else quant
        gpt_oss = config.get("model_type") == "gpt_oss" or config.get("architectures") == [_GPT_OSS]
        if not (method == hf_mxfp4.METHOD and gpt_oss):
            raise FastDecodeError(f"{path}: weights quantized for transformers ({method!r:.40}) are not supported "
                                  "(only gpt-oss's own mxfp4); use the checkpoint's bfloat16/float16 weights or a "
                                  "GGUF file")
    archs = config.get("architectures")
    wrapper = archs[0] if isinstance(archs, list) and archs and isinstance(archs[0], str) else None
    if wrapper in _MULTIMODAL:
        return _text_config(config, wrapper, path)
    return config


def _text_config(config: dict[str, Any], wrapper: str, path: Path) -> dict[str, Any]:
    """A vision-language config as its text model's: `text_config` over the class's defaults, and
    the top level's tie_word_embeddings over the text part's."""
    archs, defaults = _MULTIMODAL[wrapper]
    try:
        text = _object(config, "text_config")
    except FastDecodeError as e:
        raise FastDecodeError(f"{path}: {e}") from None
    if not text and wrapper.startswith("Qwen2"):  # the text model's keys at the top level (Qwen 2/2.5-VL)
        text = {k: v for k, v in config.items() if k not in ("vision_config", "architectures")}
    if not text:
        raise FastDecodeError(f"{path}: a {wrapper} config needs text_config (its text model's settings)")
    kind = text.get("model_type", next(iter(archs)))
    if kind not in archs:
        raise FastDecodeError(f"{path}: a {wrapper} with a {kind!r:.40} text model is not supported; "
                              f"supported: {', '.join(archs)}")
    arch = archs[kind]
    out = {**defaults, **text, "architectures": [arch], "multimodal": wrapper}
    if "tie_word_embeddings" in config:  # the whole model's, as transformers ties its head
        out["tie_word_embeddings"] = config["tie_word_embeddings"]
    return out


def _text_name(name: str) -> Optional[str]:
    """A vision-language checkpoint's tensor under its text model's name; None: an image part."""
    if name.startswith(_IMAGE_PARTS):
        return None
    for prefix, text in _TEXT_PREFIXES:
        if name.startswith(prefix):
            return text + name[len(prefix):]
    return name


def _architecture(config: dict[str, Any], path: Path) -> str:
    archs = config.get("architectures") or [_MODEL_TYPES.get(config.get("model_type", ""), "")]
    arch = archs[0] if isinstance(archs, list) and archs else None
    if arch not in SUPPORTED_ARCHS:
        found = arch or config.get("model_type")
        raise FastDecodeError(
            f"{path}: unsupported architecture {found!r}; supported: {', '.join(SUPPORTED_ARCHS)}, and the text "
            f"model of {', '.join(_MULTIMODAL)}")
    if arch == _GRANITE_HYBRID:
        types = config.get("layer_types") or config.get("layers_block_type") or ["mamba"]
        if not isinstance(types, list) or any(t not in ("attention", "full_attention") for t in types):
            raise FastDecodeError(f"{path}: Granite 4's Mamba layers are not supported (its attention-only models "
                                  f"are); layer_types {types!r:.60}")
        if _int(config, "num_local_experts", 0):
            return _GRANITE_MOE_SHARED  # experts and a shared expert, as GraniteMoeShared's
    return arch


def _int(config: dict[str, Any], key: str, default: Any = KeyError) -> Any:
    """config[key] as a JSON integer (a missing or null key: `default`, or KeyError without one)."""
    value = config.get(key)
    if value is None:
        if default is KeyError:
            raise KeyError(key)
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise FastDecodeError(f"{key} must be an integer, got {value!r:.40}")
    return value


def _number(config: dict[str, Any], key: str, default: float) -> float:
    """config[key] as a finite float (missing or null: `default`)."""
    value = config.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise FastDecodeError(f"{key} must be a finite number, got {value!r:.40}")
    return float(value)


def _object(config: dict[str, Any], key: str) -> dict[str, Any]:
    """config[key] as a JSON object (missing or null: {})."""
    value = config.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise FastDecodeError(f"{key} must be an object, got {value!r:.40}")
    return value


def _rope(config: dict[str, Any], path: Path, params: Optional[dict] = None,
          default_theta: float = 10000.0) -> tuple[float, Optional[RopeScaling]]:
    # transformers 5 folds theta and scaling into "rope_parameters"; a "rope_scaling" beside it
    # (the older key, which guides tell users to add) wins there, so it wins here too.
    if params is None:
        params = _object(config, "rope_scaling") or _object(config, "rope_parameters")
    if not isinstance(params, dict):
        raise FastDecodeError(f"{path}: rope_parameters must be an object, got {params!r:.40}")
    kind = params.get("rope_type", params.get("type", "default"))
    if not isinstance(kind, str):
        raise FastDecodeError(f"{path}: rope_type must be a string, got {kind!r:.40}")
    if kind == "mrope" and "multimodal" in config:
        kind = "default"  # Qwen-VL's M-RoPE: on text alone, RoPE
    if kind == "su":
        kind = "longrope"  # Phi-3's first configs' name for it
    if kind not in ("default", *RopeScaling.KINDS):
        raise FastDecodeError(f"{path}: RoPE scaling {kind!r} is not supported; "
                              f"supported: default, {', '.join(RopeScaling.KINDS)}")
    try:
        theta = _number(params, "rope_theta", _number(config, "rope_theta", default_theta))
        if kind == "default":
            return theta, None
        if kind == "linear":
            return theta, RopeScaling(factor=float(params["factor"]), kind="linear")
        if kind == "yarn":
            return theta, _yarn(config, params)
        if kind == "longrope":
            return theta, _longrope(config, params)
        return theta, RopeScaling(
            factor=float(params["factor"]),
            low_freq_factor=float(params["low_freq_factor"]),
            high_freq_factor=float(params["high_freq_factor"]),
            original_max_position_embeddings=int(params["original_max_position_embeddings"]),
        )
    except KeyError as e:
        raise FastDecodeError(f"{path}: rope scaling is missing {e.args[0]!r}") from None
    except FastDecodeError as e:
        raise FastDecodeError(f"{path}: {e}") from None
    except (TypeError, ValueError, OverflowError) as e:
        raise FastDecodeError(f"{path}: bad rope settings ({e})") from None


def _yarn(config: dict[str, Any], params: dict[str, Any]) -> RopeScaling:
    """YaRN's settings with transformers' defaults: the original context is the config's
    (a top-level `original_max_position_embeddings` first, as Phi-3 saves it), a missing
    factor is the context's growth over it, and unset betas are 32 and 1."""
    context = _int(config, "max_position_embeddings", 2048)
    original = _int(config, "original_max_position_embeddings", 0) or _int(
        params, "original_max_position_embeddings", 0) or context
    factor = _number(params, "factor", context / original)
    attention = params.get("attention_factor")
    if attention is not None:
        attention = _number(params, "attention_factor", 1.0)
    else:
        mscale, all_dims = _number(params, "mscale", 0.0), _number(params, "mscale_all_dim", 0.0)
        if mscale and all_dims:  # DeepSeek's ratio of two YaRN mscales
            attention = yarn_mscale(factor, mscale) / yarn_mscale(factor, all_dims)
    truncate = params.get("truncate", True)
    if not isinstance(truncate, bool):
        raise FastDecodeError(f"rope truncate must be true or false, got {truncate!r:.40}")
    return RopeScaling(kind="yarn", factor=factor, original_max_position_embeddings=original,
                       beta_fast=_number(params, "beta_fast", 0.0) or 32.0,
                       beta_slow=_number(params, "beta_slow", 0.0) or 1.0,
                       attention_factor=attention, truncate=truncate)


def _longrope(config: dict[str, Any], params: dict[str, Any]) -> RopeScaling:
    """LongRoPE as transformers reads it: the original context a top-level key first (Phi-3's), the
    factor the context's growth over it unless given, and the attention factor ModelArgs derives
    from them unless given."""
    context = _int(config, "max_position_embeddings", 2048)
    original = _int(config, "original_max_position_embeddings", 0) or _int(params, "original_max_position_embeddings")
    attention = params.get("attention_factor")
    return RopeScaling(kind="longrope", factor=_number(params, "factor", context / original),
                       original_max_position_embeddings=original,
                       attention_factor=None if attention is None else _number(params, "attention_factor", 1.0),
                       short_factor=_factors(params, "short_factor"), long_factor=_factors(params, "long_factor"))


def _factors(params: dict[str, Any], key: str) -> tuple[float, ...]:
    values = params[key]
    if not isinstance(values, list) or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        raise FastDecodeError(f"rope {key} must be a list of numbers, got {values!r:.40}")
    return tuple(float(v) for v in values)


def _sliding(config: dict[str, Any], arch: str, n_layers: int,
             path: Path) -> tuple[Optional[int], Optional[tuple[str, ...]]]:
    """(sliding_window, layer_types) as transformers reads them for `arch`."""
    window = _int(config, "sliding_window", None)
    names = config.get("layer_types")
    if arch in ("MistralForCausalLM", _MINISTRAL3, _MIXTRAL):
        return (window, None) if window else (None, None)  # every layer, when set
    if arch == _QWEN3_MOE:  # every layer, when use_sliding_window
        return (window, None) if window and config.get("use_sliding_window") else (None, None)
    if names is None and arch == _QWEN2_MOE and config.get("use_sliding_window"):  # Qwen2MoeConfig's rule
        first = _int(config, "max_window_layers", 28)
        names = ["sliding_attention" if (i + 1) % 2 and i < first else "full_attention" for i in range(n_layers)]
    if arch == _PHI3:  # every layer, when shorter than the context (Phi-3.5's 262,144 is not)
        context = _int(config, "max_position_embeddings", 2048)
        return (window, None) if window and window < context else (None, None)
    if arch == _SMOLLM3 and not config.get("use_sliding_window"):
        return None, None  # its layer_types name sliding layers that only use_sliding_window turns on
    if names is None and arch in ("Qwen2ForCausalLM", "Qwen3ForCausalLM") and config.get("use_sliding_window"):
        first = _int(config, "max_window_layers", n_layers)
        names = ["sliding_attention" if i >= first else "full_attention" for i in range(n_layers)]
    if arch in (_EXAONE4, _COHERE2):
        names = _types_by_pattern(config, n_layers)
    if names is None and arch == _OLMO3:  # Olmo3Config's default: every fourth layer global
        names = ["full_attention" if (i + 1) % 4 == 0 else "sliding_attention" for i in range(n_layers)]
    if names is None and arch == _GPT_OSS:  # GptOssConfig's default: every other layer, the first sliding
        window = window or 128
        names = ["full_attention" if i % 2 else "sliding_attention" for i in range(n_layers)]
    if names is None and arch == _GEMMA2:  # Gemma2Config's default: every other layer, the first sliding
        window = window or 4096
        names = ["full_attention" if i % 2 else "sliding_attention" for i in range(n_layers)]
    if names is None and arch == _GEMMA:
        pattern = _int(config, "sliding_window_pattern", 6)
        if pattern < 1:
            raise FastDecodeError(f"sliding_window_pattern must be >= 1, got {pattern}")
        names = ["full_attention" if (i + 1) % pattern == 0 else "sliding_attention" for i in range(n_layers)]
    if names is None or not window:
        return None, None
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise FastDecodeError(f"layer_types must be a list of strings, got {names!r:.40}")
    unknown = sorted({n for n in names if n not in _LAYER_TYPES})
    if unknown:
        raise FastDecodeError(f"{path}: layer type {unknown[0]!r} is not supported; "
                              f"supported: {', '.join(_LAYER_TYPES)}")
    types = tuple(_LAYER_TYPES[n] for n in names)
    return (window, types) if "sliding" in types else (None, None)


def _family_fields(config: dict[str, Any], arch: str, dim: int, head_dim: int, path: Path,
                   scaling: Optional[RopeScaling], theta: float) -> dict[str, Any]:
    """The ModelArgs fields where Qwen3, Ministral 3, SmolLM3, Granite, OLMo 2/3, EXAONE 4, gpt-oss and Gemma
    1/2/3 differ from Llama."""
    if arch in ("Qwen3ForCausalLM", _QWEN3_MOE):
        return dict(qk_norm=True)
    if arch == _GPT_OSS:
        return dict(attn_sinks=True, attn_out_bias=_attention_bias(config), expert_bias=True,
                    glu_alpha=_number(config, "swiglu_alpha", 1.702), glu_limit=_number(config, "swiglu_limit", 7.0))
    if arch == _OLMOE:
        if config.get("clip_qkv") is not None:
            raise FastDecodeError(f"{path}: clip_qkv is not supported")
        return dict(qk_norm=True, qk_norm_full=True)
    if arch == _SMOLLM3:
        return dict(nope_layers=_nope_layers(config, _int(config, "num_hidden_layers")))
    if arch == _GLM4:
        return dict(post_norms=True)
    if arch in (_COHERE, _COHERE2):
        return _cohere_fields(config, arch, path)
    if arch == _HUNYUAN:
        return dict(qk_norm=True, qk_norm_after_rope=True)
    if arch in (_LFM2, _LFM2_MOE):
        return _lfm2_fields(config, path)
    if arch == _EXAONE4:  # with a window set, every layer that does not slide runs without RoPE
        window = _int(config, "sliding_window", None)
        types = _types_by_pattern(config, _int(config, "num_hidden_layers"))
        return dict(qk_norm=True, pre_norms=False, post_norms=True,
                    nope_layers=tuple(i for i, t in enumerate(types) if t != "sliding_attention") if window else ())
    if arch in (_OLMO2, _OLMO3):
        olmo = dict(qk_norm=True, qk_norm_full=True, pre_norms=False, post_norms=True)
        return olmo if arch == _OLMO2 else {**olmo, "rope_local_theta": _local_theta(config, path, theta)}
    if arch in (_GRANITE, _GRANITE_MOE, _GRANITE_MOE_SHARED, _GRANITE_HYBRID):
        n_layers = _int(config, "num_hidden_layers")
        # Granite 4's RoPE where position_embedding_type says "rope"; none otherwise (its Mamba models')
        rope = "position_embedding_type" not in config or config["position_embedding_type"] == "rope"
        return dict(embed_scale=_number(config, "embedding_multiplier", 1.0),
                    residual_scale=_number(config, "residual_multiplier", 1.0),
                    attn_scale=_number(config, "attention_multiplier", 1.0),  # transformers' default too
                    logits_scaling=_number(config, "logits_scaling", 1.0),
                    nope_layers=() if rope else tuple(range(n_layers)))
    if arch == _MINISTRAL3:
        rope = _object(config, "rope_scaling") or _object(config, "rope_parameters")
        beta = _number(rope, "llama_4_scaling_beta", 0.0)
        if not beta:
            return {}
        # The original context YaRN read (transformers takes both from the same rope parameters).
        yarn = scaling is not None and scaling.kind == "yarn"
        period = scaling.original_max_position_embeddings if yarn else _int(config, "max_position_embeddings", 2048)
        return dict(query_scale_beta=beta, query_scale_period=period)
    if arch == _GEMMA1:
        return dict(embed_scale=math.sqrt(dim))
    if arch == _GEMMA2:
        return dict(post_norms=True, embed_scale=math.sqrt(dim), attn_scale=_query_scale(config, 256),
                    attn_softcap=_softcap(config, "attn_logit_softcapping", 50.0),
                    logit_softcap=_softcap(config, "final_logit_softcapping", 30.0))
    if arch != _GEMMA:
        return {}
    for key in ("final_logit_softcapping", "attn_logit_softcapping"):
        if config.get(key) is not None:
            raise FastDecodeError(f"{path}: {key} is not supported")
    if config.get("use_bidirectional_attention"):
        raise FastDecodeError(f"{path}: use_bidirectional_attention is not supported")
    local_theta = _local_theta(config, path, _number(config, "rope_local_base_freq", 10000.0))
    return dict(qk_norm=True, post_norms=True, embed_scale=math.sqrt(dim), rope_local_theta=local_theta,
                attn_scale=_query_scale(config, head_dim))


def _hunyuan_alpha(config: dict[str, Any]) -> Optional[float]:
    """Hunyuan's NTK-alpha RoPE (rope_type "dynamic" with an alpha, which transformers runs as a fixed
    base): theta * alpha^(d / (d - 2)); None for another rope setting."""
    params = _object(config, "rope_scaling") or _object(config, "rope_parameters")
    if params.get("rope_type", params.get("type")) != "dynamic" or not params.get("alpha"):
        return None
    d = _int(config, "head_dim", 0) or _int(config, "hidden_size") // _int(config, "num_attention_heads")
    theta = _number(params, "rope_theta", _number(config, "rope_theta", 10000.0))
    return theta * _number(params, "alpha", 1.0) ** (d / (d - 2))


def _cohere_fields(config: dict[str, Any], arch: str, path: Path) -> dict[str, Any]:
    """Cohere's LayerNorm, parallel block and logit scale; Command R7B's global layers without RoPE."""
    if config.get("use_qk_norm"):
        raise FastDecodeError(f"{path}: use_qk_norm is not supported (Cohere's per-head QK-norm weights)")
    scale = _number(config, "logit_scale", 0.0625)
    if not scale > 0:
        raise FastDecodeError(f"{path}: logit_scale must be > 0, got {scale}")
    fields = dict(norm="layer", parallel_block=True, logits_scaling=1.0 / scale)
    if arch == _COHERE2 and _int(config, "sliding_window", None):
        types = _types_by_pattern(config, _int(config, "num_hidden_layers"))
        fields["nope_layers"] = tuple(i for i, t in enumerate(types) if t != "sliding_attention")
    return fields


def _lfm2_fields(config: dict[str, Any], path: Path) -> dict[str, Any]:
    """LFM2's convolution layers (layer_types "conv", else those not in full_attn_idxs) and taps."""
    if config.get("conv_bias"):
        raise FastDecodeError(f"{path}: conv_bias is not supported (LFM2's convolutions have no bias)")
    n_layers = _int(config, "num_hidden_layers")
    types = config.get("layer_types")
    if types is None:
        full = config.get("full_attn_idxs")
        types = ["conv" if full is not None and i not in full else "full_attention" for i in range(n_layers)]
    if not isinstance(types, list) or len(types) != n_layers or any(t not in ("conv", "full_attention") for t in types):
        raise FastDecodeError(f"layer_types must name each of the {n_layers} layers conv or full_attention, "
                              f"got {types!r:.60}")
    return dict(qk_norm=True, conv_layers=tuple(i for i, t in enumerate(types) if t == "conv"),
                conv_kernel=_int(config, "conv_L_cache", 3))


def _lfm2_hidden(config: dict[str, Any]) -> int:
    """LFM2's MLP size: block_ff_dim (or intermediate_size), by default taken to 2/3, times
    block_ffn_dim_multiplier and rounded up to block_multiple_of, as transformers sizes it."""
    size = _int(config, "block_ff_dim", None) or _int(config, "intermediate_size")
    if config.get("block_auto_adjust_ff_dim", True):
        size = int(2 * size / 3)
        multiplier = config.get("block_ffn_dim_multiplier", 1.0)
        if multiplier is not None:
            size = int(_number(config, "block_ffn_dim_multiplier", 1.0) * size)
        step = _int(config, "block_multiple_of", 256)
        if step < 1:
            raise FastDecodeError(f"block_multiple_of must be >= 1, got {step}")
        size = step * ((size + step - 1) // step)
    return size


def _types_by_pattern(config: dict[str, Any], n_layers: int) -> list:
    """EXAONE 4's and Command R7B's layer types: `layer_types`, else `sliding_window_pattern` (every n-th
    layer global, or a string such as "LLLG" repeated, as llama.cpp's converter reads it; their configs'
    default 4)."""
    names = config.get("layer_types")
    if names is not None:
        return names
    pattern = config.get("sliding_window_pattern", 4)
    if isinstance(pattern, str) and pattern and set(pattern) <= {"L", "G"}:
        return ["sliding_attention" if pattern[i % len(pattern)] == "L" else "full_attention" for i in range(n_layers)]
    if isinstance(pattern, bool) or not isinstance(pattern, int) or pattern < 1:
        raise FastDecodeError(f"sliding_window_pattern must be an integer >= 1 or a string of L and G, "
                              f"got {pattern!r:.40}")
    return ["full_attention" if (i + 1) % pattern == 0 else "sliding_attention" for i in range(n_layers)]


def _attention_bias(config: dict[str, Any]) -> bool:
    """gpt-oss's and GLM 4's attention_bias (their configs' default: true): biases on q, k, v (and gpt-oss's o)."""
    bias = config.get("attention_bias", True)
    if not isinstance(bias, bool):
        raise FastDecodeError(f"attention_bias must be true or false, got {bias!r:.40}")
    return bias


def _softcap(config: dict[str, Any], key: str, default: float) -> float:
    """A soft-cap as transformers reads it: Gemma2Config's default when the key is missing, none
    (0) when it is null."""
    if key in config and config[key] is None:
        return 0.0
    cap = _number(config, key, default)
    if cap < 0:
        raise FastDecodeError(f"{key} must be >= 0 (or null: none), got {cap}")
    return cap


def _query_scale(config: dict[str, Any], default: float) -> float:
    """Gemma's softmax scale, query_pre_attn_scalar ** -0.5."""
    scalar = _number(config, "query_pre_attn_scalar", default)
    if scalar <= 0:
        raise FastDecodeError(f"query_pre_attn_scalar must be > 0, got {scalar}")
    return scalar ** -0.5


def _local_theta(config: dict[str, Any], path: Path, default: float) -> float:
    """The sliding layers' RoPE base, from rope_parameters given per layer type (they are never scaled)."""
    local = _object(_object(config, "rope_parameters"), "sliding_attention")
    if local.get("rope_type", "default") != "default":
        raise FastDecodeError(f"{path}: RoPE scaling {local['rope_type']!r} on sliding layers is not supported")
    return _number(local, "rope_theta", default)


def _nope_layers(config: dict[str, Any], n_layers: int) -> tuple[int, ...]:
    """SmolLM3's layers without RoPE: `no_rope_layers` holds 1 for a layer that uses RoPE and 0
    for one that does not; without it, every `no_rope_layer_interval`-th layer has none."""
    flags = config.get("no_rope_layers")
    if flags is None:
        every = _int(config, "no_rope_layer_interval", 4)
        if every < 1:
            raise FastDecodeError(f"no_rope_layer_interval must be >= 1, got {every}")
        return tuple(i for i in range(n_layers) if (i + 1) % every == 0)
    if not isinstance(flags, list) or len(flags) != n_layers or any(f not in (0, 1) for f in flags):
        raise FastDecodeError(f"no_rope_layers must list 0 or 1 for each of the {n_layers} layers, got {flags!r:.60}")
    return tuple(i for i, uses_rope in enumerate(flags) if not uses_rope)


def _moe_fields(config: dict[str, Any], arch: str, n_layers: int) -> dict[str, Any]:
    """The experts of Mixtral, Qwen 2/3 MoE, OLMoE, Granite MoE, gpt-oss and LFM2-MoE as transformers reads
    them ({} for a dense model). Qwen's layers in mlp_only_layers, or off every decoder_sparse_step-th one,
    are dense."""
    if arch not in _MOE:
        return {}
    n_default, used_default, size_key, shared_default = _MOE[arch]
    # transformers 5 saves Qwen's num_experts as num_local_experts, Mixtral's name
    n = _int(config, "num_local_experts", None)
    n = _int(config, "num_experts", n_default) if n is None else n
    if n == 0:  # transformers' Qwen MoE with no experts: dense MLPs
        return {}
    step = _int(config, "decoder_sparse_step", 1)
    if step < 1:
        raise FastDecodeError(f"decoder_sparse_step must be >= 1, got {step}")
    only = config.get("mlp_only_layers") or []
    if not isinstance(only, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in only):
        raise FastDecodeError(f"mlp_only_layers must be a list of layer indexes, got {only!r:.40}")
    # Mixtral's, Granite's and gpt-oss's routers softmax the top k logits: the same as renormalizing
    norm = arch in (_MIXTRAL, _GRANITE_MOE, _GRANITE_MOE_SHARED, _GPT_OSS) or config.get(
        "norm_topk_prob", arch == _LFM2_MOE)
    if not isinstance(norm, bool):
        raise FastDecodeError(f"norm_topk_prob must be true or false, got {norm!r:.40}")
    shared = _int(config, "shared_intermediate_size" if arch == _GRANITE_MOE_SHARED
                  else "shared_expert_intermediate_size", shared_default)
    dense = tuple(i for i in range(n_layers) if i in only or (i + 1) % step)
    sigmoid = {}
    if arch == _LFM2_MOE:  # its first num_dense_layers dense; sigmoid scores, chosen with a learned bias
        dense = tuple(range(min(n_layers, _int(config, "num_dense_layers", 2))))
        bias = config.get("use_expert_bias", True)
        if not isinstance(bias, bool):
            raise FastDecodeError(f"use_expert_bias must be true or false, got {bias!r:.40}")
        sigmoid = dict(router="sigmoid", expert_selection_bias=bias,
                       routed_scale=_number(config, "routed_scaling_factor", 1.0))
    return dict(n_experts=n, n_experts_used=_int(config, "num_experts_per_tok", used_default),
                expert_hidden_dim=_int(config, size_key), norm_expert_weights=norm, shared_expert_dim=shared,
                shared_expert_gate=arch == _QWEN2_MOE, dense_layers=dense, **sigmoid)


def hf_model_args(config: dict[str, Any], directory: Path) -> ModelArgs:
    path = directory / "config.json"
    arch = _architecture(config, path)
    if arch == _GEMMA1:  # transformers 5 reads hidden_act alone for Gemma 1 (its configs also name "gelu")
        act = config.get("hidden_act", "gelu_pytorch_tanh")
    else:
        act = config.get("hidden_activation") or config.get("hidden_act", "silu")
    if not isinstance(act, str) or act not in _ACTIVATIONS:
        raise FastDecodeError(f"{path}: hidden activation {act!r} is not supported; "
                              f"supported: {', '.join(_ACTIVATIONS)}")
    if config.get("mlp_bias") or config.get("use_bias") or (
            arch not in ("Qwen2ForCausalLM", _QWEN2_MOE, _GPT_OSS, _GLM4) and config.get("attention_bias")):
        raise FastDecodeError(f"{path}: attention_bias/mlp_bias/use_bias are not supported for {arch}")
    try:
        params = _object(config, "rope_parameters")
        default_theta = _DEFAULT_THETA.get(arch, 10000.0)
        if arch in _PER_LAYER_TYPE_ROPE and "full_attention" in params:  # per layer type in transformers 5
            theta, scaling = _rope(config, path, params["full_attention"], default_theta=default_theta)
        elif arch == _HUNYUAN and (_ntk_alpha := _hunyuan_alpha(config)):
            theta, scaling = _ntk_alpha, None
        else:
            theta, scaling = _rope(config, path, default_theta=default_theta)
        n_heads = _int(config, "num_attention_heads")
        dim = _int(config, "hidden_size")
        n_layers = _int(config, "num_hidden_layers")
        if n_heads < 1:
            raise FastDecodeError(f"num_attention_heads must be >= 1, got {n_heads}")
        head_dim = _int(config, "head_dim", 0) or dim // n_heads
        partial = _number(config, "partial_rotary_factor",
                          _number(params, "partial_rotary_factor", 0.5 if arch == _GLM4 else 1.0))
        if not 0 < partial <= 1:
            raise FastDecodeError(f"partial_rotary_factor must be in (0, 1], got {partial}")
        context = _int(config, "max_position_embeddings", 2048)
        window, layer_types = _sliding(config, arch, n_layers, path)
        tie = config.get("tie_word_embeddings",
                         config.get("tie_embedding", arch in (_GEMMA, _GEMMA1, _GEMMA2, _LFM2, _LFM2_MOE, _ERNIE,
                                                              _COHERE, _COHERE2)))
        if not isinstance(tie, bool):
            raise FastDecodeError(f"tie_word_embeddings must be true or false, got {tie!r:.40}")
        return ModelArgs(
            dim=dim,
            n_layers=n_layers,
            n_heads=n_heads,
            n_kv_heads=_int(config, "num_key_value_heads", 0) or n_heads,
            head_dim=head_dim,
            rope_dim=None if partial == 1 else int(head_dim * partial),
            vocab_size=_int(config, "vocab_size"),
            hidden_dim=(_lfm2_hidden(config) if arch == _LFM2 else _int(config, "shared_intermediate_size")
                        if arch == _GRANITE_HYBRID else _int(config, "intermediate_size")),
            norm_eps=_number(config, "norm_eps", 1e-5) if arch in (_LFM2, _LFM2_MOE)
            else _number(config, "layer_norm_eps", 1e-5) if arch in (_COHERE, _COHERE2)
            else _number(config, "rms_norm_eps", 1e-6),
            rope_theta=theta,
            rope_scaling=scaling,
            max_seq_len=scaling.context(context) if scaling else context,
            tie_embeddings=tie,
            qkv_bias=arch == "Qwen2ForCausalLM" or (arch == _QWEN2_MOE and config.get("qkv_bias", True) is True)
            or (arch in (_GPT_OSS, _GLM4) and _attention_bias(config)),
            sliding_window=window,
            layer_types=layer_types,
            activation="swiglu_oai" if arch == _GPT_OSS else _ACTIVATIONS[act],
            **_family_fields(config, arch, dim, head_dim, path, scaling, theta),
            **_moe_fields(config, arch, n_layers),
        )
    except KeyError as e:
        raise FastDecodeError(f"{path}: missing key {e.args[0]!r}") from None
    except FastDecodeError as e:
        if str(e).startswith(str(path)):
            raise
        raise FastDecodeError(f"{path}: {e}") from None
    except (TypeError, ValueError) as e:
        raise FastDecodeError(f"{path}: bad value ({e})") from None


def hf_state_dict(directory: Path, args: ModelArgs, dtype: torch.dtype, weights: str = "float",
                  kinds: Optional[Counter] = None) -> dict[str, torch.Tensor]:
    """Read every shard into our key names, converted to `dtype` on CPU. Float matrices stay float, or
    with weights int8/int4 are quantized as they are read (so the float model is never held whole);
    gpt-oss's MXFP4 experts are packed (q4mx) unless weights is "float". `kinds` counts those."""
    config = read_config(directory)
    arch, multimodal = _architecture(config, directory / "config.json"), "multimodal" in config
    kinds = Counter() if kinds is None else kinds
    out: dict[str, torch.Tensor] = {}
    mxfp4: dict[str, dict[str, torch.Tensor]] = {}  # a layer's blocks or scales until the other is read
    for file in weight_files(directory):
        for name, read in tensors(file):
            text = _text_name(name) if multimodal else name
            if text is None:
                continue  # the image encoder and its projector: not run
            key = our_name(text, arch)
            if key is None:
                if name.endswith("rotary_emb.inv_freq"):  # a buffer some old exports include
                    continue
                raise FastDecodeError(f"{file}: unexpected tensor {name!r}")
            if key == "output.weight" and args.tie_embeddings:
                continue  # tied: the output reuses the embedding
            t = read()
            if key.endswith(hf_mxfp4.SUFFIXES):
                base, part = key.rsplit("_", 1)  # layers.N.feed_forward.experts.gate_up_proj, blocks
                pair = mxfp4.setdefault(base, {})
                pair[part] = t
                if len(pair) == 2:
                    del mxfp4[base]
                    out.update(hf_mxfp4.experts(base, pair["blocks"], pair["scales"], args, dtype, weights, kinds,
                                                file))
                continue
            if arch in (_GEMMA, _GEMMA1, _GEMMA2) and key.endswith("norm.weight"):
                # Gemma's norms scale by (1 + w): fold the 1 in (in float32),
                # so our plain RMSNorm (and its kernel) computes them.
                t = t.float() + 1.0
            if arch in (_LFM2, _LFM2_MOE) and key.endswith("attention.conv") and t.dim() == 3:
                t = t.squeeze(1)  # [dim, 1, taps] -> [dim, taps]
            if arch in (_GLM4, _ERNIE, _COHERE, _COHERE2) and key.endswith(_QK):  # rotary rows in pairs
                heads = args.n_heads if ".wq." in key else args.n_kv_heads
                t = unpermute_rows(t, heads, args.rope_dim)
            parts = _split_fused(key, t.to(dtype), args, file)
            if weights in ("int8", "int4"):
                quantize_state_dict(parts, args, weights, str(directory))
            out.update(parts)
    for key, pair in mxfp4.items():
        missing = "scales" if "blocks" in pair else "blocks"
        raise FastDecodeError(f"{directory}: {key}'s MXFP4 {next(iter(pair))} have no {missing} "
                              f"(expected a tensor named like it, ending in _{missing})")
    return out


def _split_fused(key: str, t: torch.Tensor, args: ModelArgs, file: Path) -> dict[str, torch.Tensor]:
    """A fused q/k/v or gate/up tensor (Phi-3's), or all of an MoE layer's experts' gate/up or down
    in one, as its parts' row views, which the model fuses back without a copy
    (transformer.adjacent_rows); any other tensor as it is."""
    if ".experts.w" in key:
        return _split_experts(key, t, args, file)
    if key.rsplit(".", 1)[-1] in _GPT_OSS_EXPERTS:
        return _split_gpt_oss(key, t, args, file)
    if key.endswith("attention.wqkv.weight"):
        rows = (args.n_heads * args.head_dim, args.n_kv_heads * args.head_dim, args.n_kv_heads * args.head_dim)
        names = ("wq", "wk", "wv")
    elif key.endswith("w13.weight"):  # Phi-3's MLP, Granite MoE's shared expert
        hidden = args.shared_expert_dim if key.endswith("shared.w13.weight") else args.hidden_dim
        rows, names = (hidden, hidden), ("w1", "w3")
    else:
        return {key: t}
    if t.shape[0] != sum(rows):
        raise FastDecodeError(f"{file}: tensor {key} has {t.shape[0]} rows, but the config makes it {sum(rows)}")
    base = key.rsplit(".", 2)[0]
    return {f"{base}.{n}.weight": part for n, part in zip(names, t.split(rows))}


def _split_experts(key: str, t: torch.Tensor, args: ModelArgs, file: Path) -> dict[str, torch.Tensor]:
    """transformers 5's experts tensor of a layer, [experts, 2 x hidden (gate, then up), dim] or
    [experts, dim, hidden] (down), as each expert's matrices."""
    base = key.rsplit(".", 3)[0]  # layers.N.feed_forward
    n, dim, hidden = args.experts(int(key.split(".")[1])), args.dim, args.expert_hidden_dim
    up = key.endswith("w13.weight")
    want = (n, 2 * hidden, dim) if up else (n, dim, hidden)
    if tuple(t.shape) != want:
        raise FastDecodeError(f"{file}: tensor {key} has shape {list(t.shape)}, but the config makes it {list(want)}")
    if not up:
        return {f"{base}.experts.{e}.w2.weight": t[e] for e in range(n)}
    return {f"{base}.experts.{e}.{w}.weight": t[e, i * hidden:(i + 1) * hidden]
            for e in range(n) for i, w in enumerate(("w1", "w3"))}


def _split_gpt_oss(key: str, t: torch.Tensor, args: ModelArgs, file: Path) -> dict[str, torch.Tensor]:
    """gpt-oss's experts tensors of a layer as each expert's matrices and biases: gate_up_proj
    [experts, dim, 2 x hidden] (x @ w, gate and up in alternate columns), down_proj [experts, hidden,
    dim], their biases [experts, 2 x hidden] and [experts, dim]."""
    base, name = key.rsplit(".", 1)  # layers.N.feed_forward.experts, the tensor
    n, dim, hidden = args.experts(int(key.split(".")[1])), args.dim, args.expert_hidden_dim
    want = {"gate_up_proj": (n, dim, 2 * hidden), "gate_up_proj_bias": (n, 2 * hidden),
            "down_proj": (n, hidden, dim), "down_proj_bias": (n, dim)}[name]
    if tuple(t.shape) != want:
        raise FastDecodeError(f"{file}: tensor {key} has shape {list(t.shape)}, but the config makes it {list(want)}")
    out: dict[str, torch.Tensor] = {}
    for e in range(n):
        if name == "down_proj":
            out[f"{base}.{e}.w2.weight"] = t[e].t().contiguous()
        elif name == "down_proj_bias":
            out[f"{base}.{e}.w2.bias"] = t[e]
        else:
            suffix = "weight" if name == "gate_up_proj" else "bias"
            rows = t[e].t() if name == "gate_up_proj" else t[e]  # [2 x hidden, dim] or [2 x hidden]
            out[f"{base}.{e}.w1.{suffix}"] = rows[0::2].contiguous()
            out[f"{base}.{e}.w3.{suffix}"] = rows[1::2].contiguous()
    return out
