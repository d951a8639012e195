"""Hugging Face checkpoint directories: their weights (hf_files.py: safetensors or PyTorch .bin, single
or sharded) under our key names, as hf_config.py's ModelArgs say; fused tensors split."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path
from typing import Optional

import torch

from ..model.args import ModelArgs
from ..errors import FastDecodeError
from ..quant.transform import quantize_state_dict
from . import hf_mxfp4
from .hf_config import (COHERE, COHERE2, ERNIE, EXAONE4, GEMMA1, GEMMA2, GEMMA3, GLM4,
                        GPT_OSS, GRANITE_HYBRID, HUNYUAN, LFM2, LFM2_MOE, OLMO2, OLMO3, architecture, read_config)
from .hf_files import tensors, weight_files
from .keys import map_name
from .rope_rows import unpermute_rows

_IMAGE_PARTS = ("vision_tower.", "multi_modal_projector.", "model.vision_tower.", "model.multi_modal_projector.",
                "visual.", "model.visual.")
# Where such a checkpoint keeps the text model's tensors (the first: its files; the second:
# transformers 5's module names), and the text model's own names for them.
_TEXT_PREFIXES = (("language_model.model.", "model."), ("model.language_model.", "model."),
                  ("language_model.lm_head.", "lm_head."))

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
    post_norm_names = arch in (GEMMA3, GEMMA2, OLMO2, OLMO3, EXAONE4)
    names = (_GEMMA_LAYER_NAMES if post_norm_names else _GPT_OSS_LAYER_NAMES if arch == GPT_OSS
             else _GLM4_LAYER_NAMES if arch == GLM4 else _LFM2_LAYER_NAMES if arch in (LFM2, LFM2_MOE)
             else _GRANITE_HYBRID_LAYER_NAMES if arch == GRANITE_HYBRID
             else _HUNYUAN_LAYER_NAMES if arch == HUNYUAN else _LAYER_NAMES)
    return map_name(hf_name, _GLOBAL_NAMES, _LAYER_RE, names)


def _text_name(name: str) -> Optional[str]:
    """A vision-language checkpoint's tensor under its text model's name; None: an image part."""
    if name.startswith(_IMAGE_PARTS):
        return None
    for prefix, text in _TEXT_PREFIXES:
        if name.startswith(prefix):
            return text + name[len(prefix):]
    return name


def hf_state_dict(directory: Path, args: ModelArgs, dtype: torch.dtype, weights: str = "float",
                  kinds: Optional[Counter] = None) -> dict[str, torch.Tensor]:
    """Read every shard into our key names, converted to `dtype` on CPU. Float matrices stay float, or
    with weights int8/int4 are quantized as they are read (so the float model is never held whole);
    gpt-oss's MXFP4 experts are packed (q4mx) unless weights is "float". `kinds` counts those."""
    config = read_config(directory)
    arch, multimodal = architecture(config, directory / "config.json"), "multimodal" in config
    kinds = Counter() if kinds is None else kinds
    out: dict[str, torch.Tensor] = {}
    mxfp4: dict[str, dict[str, torch.Tensor]] = {}  # a layer's blocks or scales until the other is read
    head = embedding = None  # a tied model's: the files' own head, if any, and the float embedding
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
            t = read()
            if key == "output.weight" and args.tie_embeddings:
                head = t.to(dtype)  # tied: the output reuses the embedding, unless this differs (below)
                continue
            if key.endswith(hf_mxfp4.SUFFIXES):
                base, part = key.rsplit("_", 1)  # layers.N.feed_forward.experts.gate_up_proj, blocks
                pair = mxfp4.setdefault(base, {})
                pair[part] = t
                if len(pair) == 2:
                    del mxfp4[base]
                    out.update(hf_mxfp4.experts(base, pair["blocks"], pair["scales"], args, dtype, weights, kinds,
                                                file))
                continue
            if not t.is_floating_point():  # would become garbage weights in the float cast below
                raise FastDecodeError(f"{file}: tensor {name!r} is {str(t.dtype).removeprefix('torch.')}; "
                                      "expected floating-point weights (float32, float16 or bfloat16)")
            if arch in (GEMMA3, GEMMA1, GEMMA2) and key.endswith("norm.weight"):
                # Gemma's norms scale by (1 + w): fold the 1 in (in float32),
                # so our plain RMSNorm (and its kernel) computes them.
                t = t.float() + 1.0
            if arch in (LFM2, LFM2_MOE) and key.endswith("attention.conv") and t.dim() == 3:
                t = t.squeeze(1)  # [dim, 1, taps] -> [dim, taps]
            if arch in (GLM4, ERNIE, COHERE, COHERE2) and key.endswith(_QK):  # rotary rows in pairs
                heads = args.n_heads if ".wq." in key else args.n_kv_heads
                t = unpermute_rows(t, heads, args.rope_dim)
            parts = _split_fused(key, t.to(dtype), args, file)
            if key == "tok_embeddings.weight" and args.tie_embeddings:
                embedding = parts[key]
            if weights in ("int8", "int4"):
                quantize_state_dict(parts, args, weights, str(directory))
            out.update(parts)
    if head is not None and embedding is not None and not torch.equal(head, embedding):
        # A config that ties the head beside files that hold another one: transformers runs that head
        # (it takes the config to be wrong), and the caller unties args (loader.py).
        parts = {"output.weight": head}
        if weights in ("int8", "int4"):
            quantize_state_dict(parts, args.replace(tie_embeddings=False), weights, str(directory))
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
