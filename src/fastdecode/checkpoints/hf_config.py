"""A Hugging Face checkpoint's config.json read into ModelArgs: its architecture (and the text model
of a vision-language wrapper), and each family's fields as transformers reads them."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Optional

from ..errors import FastDecodeError
from ..model.args import MAX_LAYERS, ModelArgs, RopeScaling, yarn_mscale
from . import hf_mxfp4

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
MINISTRAL3 = "Ministral3ForCausalLM"
GEMMA3 = "Gemma3ForCausalLM"
GEMMA2 = "Gemma2ForCausalLM"  # Gemma 3's block without QK-norm, its scores and logits soft-capped
GEMMA1 = "GemmaForCausalLM"  # Llama with GeGLU, a scaled embedding and (1 + w) norms
SMOLLM3 = "SmolLM3ForCausalLM"
GRANITE = "GraniteForCausalLM"
OLMO2 = "Olmo2ForCausalLM"
OLMO3 = "Olmo3ForCausalLM"  # OLMo 2 with three sliding layers in four, RoPE scaling on the others only
PHI3 = "Phi3ForCausalLM"  # Llama with q/k/v and gate/up each in one tensor, partial rotary, LongRoPE
# OLMo 2's norms after each sublayer, QK-norm per head; with a window, its sliding layers take RoPE
# and the others none
EXAONE4 = "Exaone4ForCausalLM"
# Gemma 3's four norms a layer (named its own way), biases on q, k and v, gate and up in one tensor, and
# half of each head rotated in interleaved pairs, which load reorders (rope_rows.py)
GLM4 = "Glm4ForCausalLM"
ERNIE = "Ernie4_5ForCausalLM"  # Llama with its heads rotated in interleaved pairs, which load reorders
# Cohere's: LayerNorm, attention and MLP in parallel from one norm, scaled logits, heads rotated in pairs;
# Command R7B's (2) with three sliding layers in four, the global ones without RoPE
COHERE, COHERE2 = "CohereForCausalLM", "Cohere2ForCausalLM"
# Llama with QK-norm after RoPE, and NTK-alpha RoPE: a base of theta * alpha^(d / (d - 2))
HUNYUAN = "HunYuanDenseV1ForCausalLM"
# Llama's block with QK-norm where most layers' attention is a gated short convolution (model/short_conv.py)
LFM2 = "Lfm2ForCausalLM"
LFM2_MOE = "Lfm2MoeForCausalLM"  # LFM2 with experts after its first dense layers, a sigmoid router
# Mixture of experts: Mistral's, Qwen 2's and 3's, OLMo's (with QK-norm over all heads, as OLMo 2) and
# Granite's blocks with routed experts (Qwen 2's and Granite MoE Shared's with a shared expert too), and
# each config class's defaults for the keys a config may leave out: (experts, used, the experts' size
# key, the shared expert's default size).
MIXTRAL, QWEN2_MOE, QWEN3_MOE = "MixtralForCausalLM", "Qwen2MoeForCausalLM", "Qwen3MoeForCausalLM"
OLMOE = "OlmoeForCausalLM"
# Granite's shared expert: its size in shared_intermediate_size, not gated
GRANITE_MOE, GRANITE_MOE_SHARED = "GraniteMoeForCausalLM", "GraniteMoeSharedForCausalLM"
# Granite 4: Granite's multipliers and a gated shared MLP, in its attention-only models (granite-4.0-micro, -1b,
# -350m) a dense MLP; with experts, loaded as GraniteMoeShared (_architecture); Mamba layers are refused.
GRANITE_HYBRID = "GraniteMoeHybridForCausalLM"
# gpt-oss: biases on every attention and expert matrix and on the router, clamped SwiGLU experts,
# attention sinks, sliding and global layers in turn
GPT_OSS = "GptOssForCausalLM"
_MOE = {MIXTRAL: (8, 2, "intermediate_size", 0), QWEN2_MOE: (60, 4, "moe_intermediate_size", 5632),
        QWEN3_MOE: (128, 8, "moe_intermediate_size", 0), OLMOE: (64, 8, "intermediate_size", 0),
        GRANITE_MOE: (8, 2, "intermediate_size", 0), GRANITE_MOE_SHARED: (8, 2, "intermediate_size", 0),
        GPT_OSS: (128, 4, "intermediate_size", 0), LFM2_MOE: (32, 4, "moe_intermediate_size", 0)}
# Families whose rope_parameters may be given per layer type (transformers 5), the global layers'
# scaled, the sliding layers' never.
_PER_LAYER_TYPE_ROPE = (GEMMA3, OLMO3)
# The RoPE base a config that names none gets: its transformers config class's default (10,000 for
# the others).
_DEFAULT_THETA = {GEMMA3: 1_000_000.0, OLMO3: 500_000.0, SMOLLM3: 2_000_000.0, LFM2: 1_000_000.0,
                  LFM2_MOE: 1_000_000.0, ERNIE: 500_000.0, COHERE: 500_000.0, MIXTRAL: 1_000_000.0,
                  MINISTRAL3: 1_000_000.0, GPT_OSS: 150_000.0}
# Other values a config may leave out, where its transformers config class's default is not the one read
# below (Llama's: rms_norm_eps 1e-6, a context of 2048, SiLU, untied), so that such a config runs as there.
_EPS_1E5 = dict(rms_norm_eps=1e-5)
_CLASS_DEFAULTS = {
    "MistralForCausalLM": dict(max_position_embeddings=131072),
    MINISTRAL3: dict(_EPS_1E5, max_position_embeddings=262144),
    "Qwen2ForCausalLM": dict(max_position_embeddings=32768), "Qwen3ForCausalLM": dict(max_position_embeddings=32768),
    QWEN2_MOE: dict(max_position_embeddings=32768), QWEN3_MOE: dict(max_position_embeddings=32768),
    GEMMA1: dict(max_position_embeddings=8192),
    GEMMA2: dict(max_position_embeddings=8192, hidden_activation="gelu_pytorch_tanh", sliding_window=4096),
    GEMMA3: dict(max_position_embeddings=131072, hidden_activation="gelu_pytorch_tanh", query_pre_attn_scalar=256,
                 sliding_window=4096),
    SMOLLM3: dict(max_position_embeddings=32768, tie_word_embeddings=True),
    PHI3: dict(_EPS_1E5, max_position_embeddings=4096, original_max_position_embeddings=4096),
    MIXTRAL: dict(_EPS_1E5, max_position_embeddings=131072), OLMOE: dict(_EPS_1E5, max_position_embeddings=4096),
    OLMO2: _EPS_1E5, OLMO3: dict(_EPS_1E5, sliding_window=4096), EXAONE4: dict(_EPS_1E5, sliding_window=4096),
    HUNYUAN: _EPS_1E5,
    GPT_OSS: dict(_EPS_1E5, max_position_embeddings=131072, sliding_window=128),
    ERNIE: dict(_EPS_1E5, max_position_embeddings=131072),
    GLM4: dict(rms_norm_eps=1.5625e-07, max_position_embeddings=131072),
    LFM2: dict(max_position_embeddings=128000), LFM2_MOE: dict(max_position_embeddings=128000),
    COHERE: dict(max_position_embeddings=8192), COHERE2: dict(max_position_embeddings=8192, sliding_window=4096),
}
# Vision-language checkpoints whose text model we run, the image side left out: the text model's
# architecture (by text_config's model_type), and the values its `text_config` may leave to the
# config class's defaults (Gemma 3 4B's names five keys and takes the rest from Gemma3TextConfig).
_MULTIMODAL = {
    "Gemma3ForConditionalGeneration": ({"gemma3_text": GEMMA3}, dict(
        vocab_size=262208, num_attention_heads=8, num_key_value_heads=4, head_dim=256, rms_norm_eps=1e-6,
        query_pre_attn_scalar=256, max_position_embeddings=131072, sliding_window=4096,
        hidden_activation="gelu_pytorch_tanh")),
    # Mistral Small 3.1 / 3.2 (Mistral's text model), Ministral 3 (its own)
    "Mistral3ForConditionalGeneration": ({"mistral": "MistralForCausalLM", "ministral3": MINISTRAL3}, {}),
    # Qwen's: on text alone their M-RoPE is RoPE (the three position streams are one), so the text
    # model is Qwen 2's or Qwen 3's. Qwen 2/2.5-VL's own configs keep the text model's keys at the
    # top level, without text_config.
    "Qwen2VLForConditionalGeneration": ({"qwen2_vl_text": "Qwen2ForCausalLM", "qwen2_vl": "Qwen2ForCausalLM"}, {}),
    "Qwen2_5_VLForConditionalGeneration": ({"qwen2_5_vl_text": "Qwen2ForCausalLM",
                                            "qwen2_5_vl": "Qwen2ForCausalLM"}, {}),
    "Qwen3VLForConditionalGeneration": ({"qwen3_vl_text": "Qwen3ForCausalLM"}, {}),
}
_ACTIVATIONS = {"silu": "silu", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu"}
_LAYER_TYPES = {"full_attention": "global", "sliding_attention": "sliding"}

def read_config(directory: Path) -> dict[str, Any]:
    path = directory / "config.json"
    if not path.is_file():
        raise FastDecodeError(
            f"{directory}: no config.json; a Hugging Face checkpoint directory needs config.json "
            "and its weights (model.safetensors, or sharded with model.safetensors.index.json)")
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:  # RecursionError: nesting too deep
        raise FastDecodeError(f"{path}: cannot read JSON ({e})") from None
    if not isinstance(config, dict):
        raise FastDecodeError(f"{path}: expected a JSON object")
    quant = config.get("quantization_config")
    if quant is not None:
        method = quant.get("quant_method") if isinstance(quant, dict) else quant
        gpt_oss = config.get("model_type") == "gpt_oss" or config.get("architectures") == [GPT_OSS]
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


def architecture(config: dict[str, Any], path: Path) -> str:
    archs = config.get("architectures") or [_MODEL_TYPES.get(config.get("model_type", ""), "")]
    arch = archs[0] if isinstance(archs, list) and archs else None
    if arch not in SUPPORTED_ARCHS:
        found = arch or config.get("model_type")
        raise FastDecodeError(
            f"{path}: unsupported architecture {found!r}; supported: {', '.join(SUPPORTED_ARCHS)}, and the text "
            f"model of {', '.join(_MULTIMODAL)}")
    if arch == GRANITE_HYBRID:
        types = config.get("layer_types") or config.get("layers_block_type") or ["mamba"]
        if not isinstance(types, list) or any(t not in ("attention", "full_attention") for t in types):
            raise FastDecodeError(f"{path}: Granite 4's Mamba layers are not supported (its attention-only models "
                                  f"are); layer_types {types!r:.60}")
        if _int(config, "num_local_experts", 0):
            return GRANITE_MOE_SHARED  # experts and a shared expert, as GraniteMoeShared's
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
    if arch in ("MistralForCausalLM", MINISTRAL3, MIXTRAL):
        return (window, None) if window else (None, None)  # every layer, when set
    if arch == QWEN3_MOE:  # every layer, when use_sliding_window
        return (window, None) if window and config.get("use_sliding_window") else (None, None)
    if names is None and arch == QWEN2_MOE and config.get("use_sliding_window"):  # Qwen2MoeConfig's rule
        first = _int(config, "max_window_layers", 28)
        names = ["sliding_attention" if (i + 1) % 2 and i < first else "full_attention" for i in range(n_layers)]
    if arch == PHI3:  # every layer, when shorter than the context (Phi-3.5's 262,144 is not)
        context = _int(config, "max_position_embeddings", 2048)
        return (window, None) if window and window < context else (None, None)
    if arch == SMOLLM3 and not config.get("use_sliding_window"):
        return None, None  # its layer_types name sliding layers that only use_sliding_window turns on
    if names is None and arch in ("Qwen2ForCausalLM", "Qwen3ForCausalLM") and config.get("use_sliding_window"):
        first = _int(config, "max_window_layers", n_layers)
        names = ["sliding_attention" if i >= first else "full_attention" for i in range(n_layers)]
    if arch in (EXAONE4, COHERE2):
        names = _types_by_pattern(config, n_layers)
    if names is None and arch == OLMO3:  # Olmo3Config's default: every fourth layer global
        names = ["full_attention" if (i + 1) % 4 == 0 else "sliding_attention" for i in range(n_layers)]
    if names is None and arch == GPT_OSS:  # GptOssConfig's default: every other layer, the first sliding
        window = window or 128
        names = ["full_attention" if i % 2 else "sliding_attention" for i in range(n_layers)]
    if names is None and arch == GEMMA2:  # Gemma2Config's default: every other layer, the first sliding
        window = window or 4096
        names = ["full_attention" if i % 2 else "sliding_attention" for i in range(n_layers)]
    if names is None and arch == GEMMA3:
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
    if arch in ("Qwen3ForCausalLM", QWEN3_MOE):
        return dict(qk_norm=True)
    if arch == GPT_OSS:
        return dict(attn_sinks=True, attn_out_bias=_attention_bias(config), expert_bias=True,
                    glu_alpha=_number(config, "swiglu_alpha", 1.702), glu_limit=_number(config, "swiglu_limit", 7.0))
    if arch == OLMOE:
        if config.get("clip_qkv") is not None:
            raise FastDecodeError(f"{path}: clip_qkv is not supported")
        return dict(qk_norm=True, qk_norm_full=True)
    if arch == SMOLLM3:
        return dict(nope_layers=_nope_layers(config, _int(config, "num_hidden_layers")))
    if arch == GLM4:
        return dict(post_norms=True)
    if arch in (COHERE, COHERE2):
        return _cohere_fields(config, arch, path)
    if arch == HUNYUAN:
        return dict(qk_norm=True, qk_norm_after_rope=True)
    if arch in (LFM2, LFM2_MOE):
        return _lfm2_fields(config, path)
    if arch == EXAONE4:  # with a window set, every layer that does not slide runs without RoPE
        window = _int(config, "sliding_window", None)
        types = _types_by_pattern(config, _int(config, "num_hidden_layers"))
        return dict(qk_norm=True, pre_norms=False, post_norms=True,
                    nope_layers=tuple(i for i, t in enumerate(types) if t != "sliding_attention") if window else ())
    if arch in (OLMO2, OLMO3):
        olmo = dict(qk_norm=True, qk_norm_full=True, pre_norms=False, post_norms=True)
        return olmo if arch == OLMO2 else {**olmo, "rope_local_theta": _local_theta(config, path, theta)}
    if arch in (GRANITE, GRANITE_MOE, GRANITE_MOE_SHARED, GRANITE_HYBRID):
        n_layers = _int(config, "num_hidden_layers")
        # Granite 4's RoPE where position_embedding_type says "rope"; none otherwise (its Mamba models')
        rope = "position_embedding_type" not in config or config["position_embedding_type"] == "rope"
        return dict(embed_scale=_number(config, "embedding_multiplier", 1.0),
                    residual_scale=_number(config, "residual_multiplier", 1.0),
                    attn_scale=_number(config, "attention_multiplier", 1.0),  # transformers' default too
                    logits_scaling=_number(config, "logits_scaling", 1.0),
                    nope_layers=() if rope else tuple(range(n_layers)))
    if arch == MINISTRAL3:
        rope = _object(config, "rope_scaling") or _object(config, "rope_parameters")
        beta = _number(rope, "llama_4_scaling_beta", 0.0)
        if not beta:
            return {}
        # The original context YaRN read (transformers takes both from the same rope parameters).
        yarn = scaling is not None and scaling.kind == "yarn"
        period = scaling.original_max_position_embeddings if yarn else _int(config, "max_position_embeddings", 2048)
        return dict(query_scale_beta=beta, query_scale_period=period)
    if arch == GEMMA1:
        return dict(embed_scale=math.sqrt(dim))
    if arch == GEMMA2:
        return dict(post_norms=True, embed_scale=math.sqrt(dim), attn_scale=_query_scale(config, 256),
                    attn_softcap=_softcap(config, "attn_logit_softcapping", 50.0),
                    logit_softcap=_softcap(config, "final_logit_softcapping", 30.0))
    if arch != GEMMA3:
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
    if arch == COHERE2 and _int(config, "sliding_window", None):
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
    norm = arch in (MIXTRAL, GRANITE_MOE, GRANITE_MOE_SHARED, GPT_OSS) or config.get(
        "norm_topk_prob", arch == LFM2_MOE)
    if not isinstance(norm, bool):
        raise FastDecodeError(f"norm_topk_prob must be true or false, got {norm!r:.40}")
    shared = _int(config, "shared_intermediate_size" if arch == GRANITE_MOE_SHARED
                  else "shared_expert_intermediate_size", shared_default)
    dense = tuple(i for i in range(n_layers) if i in only or (i + 1) % step)
    sigmoid = {}
    if arch == LFM2_MOE:  # its first num_dense_layers dense; sigmoid scores, chosen with a learned bias
        dense = tuple(range(min(n_layers, _int(config, "num_dense_layers", 2))))
        bias = config.get("use_expert_bias", True)
        if not isinstance(bias, bool):
            raise FastDecodeError(f"use_expert_bias must be true or false, got {bias!r:.40}")
        sigmoid = dict(router="sigmoid", expert_selection_bias=bias,
                       routed_scale=_number(config, "routed_scaling_factor", 1.0))
    return dict(n_experts=n, n_experts_used=_int(config, "num_experts_per_tok", used_default),
                expert_hidden_dim=_int(config, size_key), norm_expert_weights=norm, shared_expert_dim=shared,
                shared_expert_gate=arch == QWEN2_MOE, dense_layers=dense, **sigmoid)


def hf_model_args(config: dict[str, Any], directory: Path) -> ModelArgs:
    path = directory / "config.json"
    arch = architecture(config, path)
    config = {**_CLASS_DEFAULTS.get(arch, {}), **config}
    if arch == GEMMA1:  # transformers 5 reads hidden_act alone for Gemma 1 (its configs also name "gelu")
        act = config.get("hidden_act", "gelu_pytorch_tanh")
    else:
        act = config.get("hidden_activation") or config.get("hidden_act", "silu")
    if not isinstance(act, str) or act not in _ACTIVATIONS:
        raise FastDecodeError(f"{path}: hidden activation {act!r} is not supported; "
                              f"supported: {', '.join(_ACTIVATIONS)}")
    if config.get("mlp_bias") or config.get("use_bias") or (
            arch not in ("Qwen2ForCausalLM", QWEN2_MOE, GPT_OSS, GLM4) and config.get("attention_bias")):
        raise FastDecodeError(f"{path}: attention_bias/mlp_bias/use_bias are not supported for {arch}")
    try:
        params = _object(config, "rope_parameters")
        default_theta = _DEFAULT_THETA.get(arch, 10000.0)
        if arch in _PER_LAYER_TYPE_ROPE and "full_attention" in params:  # per layer type in transformers 5
            theta, scaling = _rope(config, path, params["full_attention"], default_theta=default_theta)
        elif arch == HUNYUAN and (_ntk_alpha := _hunyuan_alpha(config)):
            theta, scaling = _ntk_alpha, None
        else:
            theta, scaling = _rope(config, path, default_theta=default_theta)
        n_heads = _int(config, "num_attention_heads")
        dim = _int(config, "hidden_size")
        n_layers = _int(config, "num_hidden_layers")
        if n_heads < 1:
            raise FastDecodeError(f"num_attention_heads must be >= 1, got {n_heads}")
        if not 1 <= n_layers <= MAX_LAYERS:  # before the per-layer lists below are built from it
            raise FastDecodeError(f"num_hidden_layers must be 1..{MAX_LAYERS:,}, got {n_layers:,}")
        head_dim = _int(config, "head_dim", 0) or dim // n_heads
        partial = _number(config, "partial_rotary_factor",
                          _number(params, "partial_rotary_factor", 0.5 if arch == GLM4 else 1.0))
        if not 0 < partial <= 1:
            raise FastDecodeError(f"partial_rotary_factor must be in (0, 1], got {partial}")
        context = _int(config, "max_position_embeddings", 2048)
        window, layer_types = _sliding(config, arch, n_layers, path)
        max_seq_len = scaling.context(context) if scaling else context
        if window:  # a window past the context (a class default of 4,096 over a short one) attends to it all
            window = min(window, max_seq_len)
        tie = config.get("tie_word_embeddings",
                         config.get("tie_embedding", arch in (GEMMA3, GEMMA1, GEMMA2, LFM2, LFM2_MOE, ERNIE,
                                                              COHERE, COHERE2)))
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
            hidden_dim=(_lfm2_hidden(config) if arch == LFM2 else _int(config, "shared_intermediate_size")
                        if arch == GRANITE_HYBRID else _int(config, "intermediate_size")),
            norm_eps=_number(config, "norm_eps", 1e-5) if arch in (LFM2, LFM2_MOE)
            else _number(config, "layer_norm_eps", 1e-5) if arch in (COHERE, COHERE2)
            else _number(config, "rms_norm_eps", 1e-6),
            rope_theta=theta,
            rope_scaling=scaling,
            max_seq_len=max_seq_len,
            tie_embeddings=tie,
            qkv_bias=arch == "Qwen2ForCausalLM" or (arch == QWEN2_MOE and config.get("qkv_bias", True) is True)
            or (arch in (GPT_OSS, GLM4) and _attention_bias(config)),
            sliding_window=window,
            layer_types=layer_types,
            activation="swiglu_oai" if arch == GPT_OSS else _ACTIVATIONS[act],
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
