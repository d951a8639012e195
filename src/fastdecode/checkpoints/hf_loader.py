"""Hugging Face checkpoint directories: config.json + safetensors (single or sharded)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Optional

import torch
from safetensors import SafetensorError, safe_open

from ..config import ModelArgs, RopeScaling
from ..errors import FastDecodeError
from .keys import map_name

SUPPORTED_ARCHS = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM")
_MODEL_TYPES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM"}

_GLOBAL_NAMES = {
    "model.embed_tokens.weight": "tok_embeddings.weight",
    "model.norm.weight": "norm.weight",
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
}
_LAYER_RE = re.compile(r"model\.layers\.(\d+)\.(.+)")


def our_name(hf_name: str) -> Optional[str]:
    return map_name(hf_name, _GLOBAL_NAMES, _LAYER_RE, _LAYER_NAMES)


def read_config(directory: Path) -> dict[str, Any]:
    path = directory / "config.json"
    if not path.is_file():
        raise FastDecodeError(
            f"{directory}: no config.json; a Hugging Face checkpoint directory needs config.json "
            "and model.safetensors (or model.safetensors.index.json)")
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise FastDecodeError(f"{path}: cannot read JSON ({e})") from None
    if not isinstance(config, dict):
        raise FastDecodeError(f"{path}: expected a JSON object")
    return config


def _architecture(config: dict[str, Any], path: Path) -> str:
    archs = config.get("architectures") or [_MODEL_TYPES.get(config.get("model_type", ""), "")]
    arch = archs[0] if isinstance(archs, list) and archs else None
    if arch not in SUPPORTED_ARCHS:
        found = arch or config.get("model_type")
        raise FastDecodeError(
            f"{path}: unsupported architecture {found!r}; supported: {', '.join(SUPPORTED_ARCHS)}")
    return arch


def _rope(config: dict[str, Any], path: Path) -> tuple[float, Optional[RopeScaling]]:
    # transformers 5 folds theta and scaling into "rope_parameters".
    params = config.get("rope_parameters") or config.get("rope_scaling") or {}
    kind = params.get("rope_type", params.get("type", "default"))
    if kind not in ("default", "llama3"):
        raise FastDecodeError(f"{path}: RoPE scaling {kind!r} is not supported; supported: default, llama3")
    try:
        theta = float(params.get("rope_theta", config.get("rope_theta", 10000.0)))
        if kind == "default":
            return theta, None
        return theta, RopeScaling(
            factor=float(params["factor"]),
            low_freq_factor=float(params["low_freq_factor"]),
            high_freq_factor=float(params["high_freq_factor"]),
            original_max_position_embeddings=int(params["original_max_position_embeddings"]),
        )
    except KeyError as e:
        raise FastDecodeError(f"{path}: rope scaling is missing {e.args[0]!r}") from None
    except (TypeError, ValueError) as e:
        raise FastDecodeError(f"{path}: bad rope settings ({e})") from None


def hf_model_args(config: dict[str, Any], directory: Path) -> ModelArgs:
    path = directory / "config.json"
    arch = _architecture(config, path)
    if config.get("hidden_act", "silu") != "silu":
        raise FastDecodeError(f"{path}: hidden_act {config['hidden_act']!r} is not supported; supported: silu")
    if config.get("mlp_bias") or (arch != "Qwen2ForCausalLM" and config.get("attention_bias")):
        raise FastDecodeError(f"{path}: attention_bias/mlp_bias are not supported for {arch}")
    theta, scaling = _rope(config, path)
    try:
        n_heads = int(config["num_attention_heads"])
        dim = int(config["hidden_size"])
        max_seq_len = int(config.get("max_position_embeddings", 2048))
        # Our attention is global. Capping the context at the window keeps it exact
        # for Mistral-style sliding-window models.
        window = config.get("sliding_window")
        if window and (arch == "MistralForCausalLM" or config.get("use_sliding_window")):
            max_seq_len = min(max_seq_len, int(window))
        return ModelArgs(
            dim=dim,
            n_layers=int(config["num_hidden_layers"]),
            n_heads=n_heads,
            n_kv_heads=int(config.get("num_key_value_heads") or n_heads),
            head_dim=int(config.get("head_dim") or dim // n_heads),
            vocab_size=int(config["vocab_size"]),
            hidden_dim=int(config["intermediate_size"]),
            norm_eps=float(config.get("rms_norm_eps", 1e-6)),
            rope_theta=theta,
            rope_scaling=scaling,
            max_seq_len=max_seq_len,
            tie_embeddings=bool(config.get("tie_word_embeddings", False)),
            qkv_bias=arch == "Qwen2ForCausalLM",
        )
    except KeyError as e:
        raise FastDecodeError(f"{path}: missing key {e.args[0]!r}") from None
    except FastDecodeError as e:
        raise FastDecodeError(f"{path}: {e}") from None
    except (TypeError, ValueError) as e:
        raise FastDecodeError(f"{path}: bad value ({e})") from None


def _weight_files(directory: Path) -> list[Path]:
    single = directory / "model.safetensors"
    index = directory / "model.safetensors.index.json"
    if single.is_file():
        return [single]
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError) as e:
            raise FastDecodeError(f"{index}: not a safetensors index ({e})") from None
        files = [directory / name for name in sorted(set(weight_map.values()))]
        missing = [f for f in files if not f.is_file()]
        if missing:
            raise FastDecodeError(f"{index}: shard {missing[0].name} is missing")
        return files
    raise FastDecodeError(
        f"{directory}: no model.safetensors or model.safetensors.index.json "
        "(only safetensors weights are supported)")


def hf_state_dict(directory: Path, args: ModelArgs, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Read every shard into our key names, converted to `dtype` on CPU."""
    out: dict[str, torch.Tensor] = {}
    for file in _weight_files(directory):
        try:
            with safe_open(str(file), framework="pt") as f:
                for name in f.keys():
                    key = our_name(name)
                    if key is None:
                        if name.endswith("rotary_emb.inv_freq"):  # a buffer some old exports include
                            continue
                        raise FastDecodeError(f"{file}: unexpected tensor {name!r}")
                    if key == "output.weight" and args.tie_embeddings:
                        continue  # tied: the output reuses the embedding
                    out[key] = f.get_tensor(name).to(dtype)
        except (SafetensorError, OSError) as e:
            raise FastDecodeError(f"{file}: cannot read safetensors ({e})") from None
    return out
