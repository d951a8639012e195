"""Tiny checkpoints written by the tests themselves: GGUF files and HF directories.

The model is a random Hugging Face Llama/Mistral/Qwen2/Qwen3/Gemma 3/SmolLM3/Granite/OLMo 2/OLMo 3 from transformers; the
GGUF writer applies llama.cpp's Q/K row permutation (as llama.cpp's converter
does) so the loader's un-permute is tested against an independent reference.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional, Union

import gguf
import numpy as np
import pytest
import torch

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGES = [("h", "e"), ("l", "l"), ("Ġ", "t"), ("he", "ll"), ("Ġt", "h"), ("o", "r"), ("Ġ", "w")]
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def byte_level_tokens() -> list[str]:
    """Specials, the 256 byte-alphabet characters, then one token per merge."""
    from fastdecode.checkpoints.gguf_tokenizer import byte_alphabet

    return [*SPECIALS, *byte_alphabet().values(), *(a + b for a, b in MERGES)]


VOCAB = len(byte_level_tokens())  # 266


def _spell(text: str) -> str:
    """`text` in the byte alphabet, as a byte-level vocabulary writes its tokens."""
    from fastdecode.checkpoints.gguf_tokenizer import byte_alphabet

    alphabet = byte_alphabet()
    return "".join(alphabet[b] for b in text.encode("utf-8"))


# Merges that cross the boundaries where split regexes differ: digits alone, in threes or in
# runs, after a space or a sign or a letter; a lower-to-upper case change; a contraction on its
# word or not; runs of spaces and newlines; punctuation before a letter; a CJK character before a
# Latin one. Two tokens no merge reaches ("zzq", " zzq") tell the vocabularies that take a whole
# piece before merging (ignore_merges).
BOUNDARY_MERGES = [
    (_spell(" "), "1"), ("1", "2"), (_spell(" 1"), "2"), ("12", "3"), ("a", "B"), ("aB", "c"), ("'", "s"),
    ("x", "'s"), ("?", "/"), (_spell("\n"), _spell("\n")), (_spell(" "), _spell(" ")),
    (_spell("  "), _spell("  ")), (".", "a"), (_spell(" "), "."), (_spell("中")[0], _spell("中")[1]),
    (_spell("中")[:2], _spell("中")[2]), (_spell("中"), "a"), ("$", "1"), ("a", "1"), (_spell(" "), _spell("\n")),
]


def boundary_tokens() -> list[str]:
    from fastdecode.checkpoints.gguf_tokenizer import byte_alphabet

    return ["<|endoftext|>", *byte_alphabet().values(), *(a + b for a, b in BOUNDARY_MERGES), "zzq", _spell(" zzq")]


BOUNDARY_TEXTS = ["a 123 1234 aBc x's X'S", "HelloWorld ?/\nz", "12345678 ab1c", "aBaB'saB", " .a.a  $1 a1",
                  "中a 中文\n\n\n  x   \n y", "é, ü; 🤖!", "line\r\nnext\ttab     end   ", "zzq zzq,zzq"]


def write_vocab(path: Path, tokens: list[str], merges: list[tuple[str, str]], pre: Optional[str]) -> Path:
    """A GGUF holding only a byte-level vocabulary: `tokens` (the first one a control token, the
    end of text), `merges`, and the split named `pre` (None: no name)."""
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_tokenizer_model("gpt2")
    if pre is not None:
        w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types([3] + [1] * (len(tokens) - 1))
    w.add_token_merges([f"{a} {b}" for a, b in merges])
    w.add_eos_token_id(0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def hf_config(arch: str = "llama", tie: bool = True, vocab_size: int = VOCAB, window: int = 64):
    """A tiny config; `window` is the sliding window of Mistral and of Gemma 3's sliding layers."""
    import transformers

    common = dict(vocab_size=vocab_size, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                  rms_norm_eps=1e-5, tie_word_embeddings=tie, bos_token_id=1, eos_token_id=2)
    if arch == "llama":
        return transformers.LlamaConfig(**common, rope_theta=10000.0)
    if arch == "mistral":
        return transformers.MistralConfig(**common, rope_theta=10000.0, sliding_window=window)
    if arch == "qwen2":
        return transformers.Qwen2Config(**common, rope_theta=10000.0)
    if arch == "ministral3":
        # YaRN over an original context of 16 and the query scale by position (floors at 16, 32, ...;
        # beta 0.5, not the real 0.1, so that the scale shows in a tiny model's logits).
        return transformers.Ministral3Config(**common, head_dim=16, rope_parameters={
            "rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 16,
            "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0, "llama_4_scaling_beta": 0.5})
    if arch == "qwen3":
        return transformers.Qwen3Config(**common, head_dim=24, rope_theta=10000.0)
    if arch == "smollm3":  # four layers, so that the last has no RoPE (every fourth, as llama.cpp assumes)
        return transformers.SmolLM3Config(**{**common, "num_hidden_layers": 4}, rope_theta=10000.0, pad_token_id=0)
    if arch == "olmo2":
        return transformers.Olmo2Config(**common, rope_theta=10000.0, pad_token_id=0)
    if arch == "olmo3":  # four layers: three sliding, the last global
        return transformers.Olmo3Config(**{**common, "num_hidden_layers": 4}, pad_token_id=0, sliding_window=window,
                                        rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1e4},
                                                         "sliding_attention": {"rope_type": "default",
                                                                               "rope_theta": 1e4}})
    if arch == "lfm2":  # four layers, the third attending, the others LFM2's short convolutions; its MLP 2/3 of 96
        return transformers.Lfm2Config(**{**common, "num_hidden_layers": 4}, norm_eps=1e-5, block_multiple_of=32,
                                       layer_types=["conv", "conv", "full_attention", "conv"], pad_token_id=0,
                                       rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    if arch == "lfm2moe":  # LFM2's layers, the first MLP dense, the others 4 experts of 32 (2 chosen by sigmoid)
        return transformers.Lfm2MoeConfig(**{**common, "num_hidden_layers": 4}, norm_eps=1e-5, moe_intermediate_size=32,
                                          num_experts=4, num_experts_per_tok=2, num_dense_layers=1,
                                          layer_types=["conv", "conv", "full_attention", "conv"], pad_token_id=0,
                                          rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    if arch.startswith("granite4"):
        # Granite 4's attention-only models: Granite's multipliers, a gated shared MLP (48), RoPE
        # ("granite4-nope": none, as its Mamba models' attention layers), and "granite4-moe" 4 experts of 32
        experts = dict(num_local_experts=4 if arch == "granite4-moe" else 0)
        if arch == "granite4-moe":
            experts["num_experts_per_tok"] = 2
        return transformers.GraniteMoeHybridConfig(
            **{**common, "intermediate_size": 32}, shared_intermediate_size=48, layer_types=["attention"] * 2,
            position_embedding_type=None if arch == "granite4-nope" else "rope", pad_token_id=0,
            embedding_multiplier=3.0, residual_multiplier=0.5, attention_multiplier=0.3, logits_scaling=4.0,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, **experts)
    if arch == "hunyuan":  # QK-norm after RoPE; NTK-alpha RoPE (a base of 10,000 x 1000^(16/14))
        return transformers.HunYuanDenseV1Config(**common, head_dim=16, pad_token_id=0,
                                                 rope_parameters={"rope_type": "dynamic", "rope_theta": 10000.0,
                                                                  "alpha": 1000.0, "factor": 1.0})
    if arch in ("cohere", "cohere2"):
        # LayerNorm, parallel block, a logit scale far from 1; Cohere 2 with three sliding layers, then a
        # global one without RoPE
        if arch == "cohere":
            return transformers.CohereConfig(**common, logit_scale=0.5, pad_token_id=0,
                                             rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
        return transformers.Cohere2Config(**{**common, "num_hidden_layers": 4}, logit_scale=0.5, pad_token_id=0,
                                          sliding_window=window,
                                          rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    if arch == "ernie4_5":  # Llama's block, its heads rotated in interleaved pairs
        return transformers.Ernie4_5Config(**common, head_dim=16, pad_token_id=0,
                                           rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    if arch == "glm4":  # half of each head (8 of 16 dims) rotated, in interleaved pairs; biases on q, k, v
        return transformers.Glm4Config(**common, head_dim=16, pad_token_id=0, attention_bias=True,
                                       rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                                        "partial_rotary_factor": 0.5})
    if arch in ("exaone4", "exaone4-global"):
        # Four layers, three sliding and the last global without RoPE ("exaone4-global": no window, every
        # layer global with RoPE, as llama.cpp runs every EXAONE 4 file but a 64-layer one).
        sliding = arch == "exaone4"
        return transformers.Exaone4Config(**{**common, "num_hidden_layers": 4}, rope_theta=10000.0, pad_token_id=0,
                                          sliding_window=window if sliding else None,
                                          layer_types=None if sliding else ["full_attention"] * 4)
    if arch == "granite":  # multipliers far from 1, so that a missing one shows in the logits
        return transformers.GraniteConfig(**common, rope_theta=10000.0, pad_token_id=0, embedding_multiplier=3.0,
                                          residual_multiplier=0.5, attention_multiplier=0.3, logits_scaling=4.0)
    if arch == "gemma3":
        # Three layers, the middle one global; a softmax scale and a local RoPE base
        # that differ from the defaults, so that a mix-up shows in the logits.
        return transformers.Gemma3TextConfig(
            **{**common, "num_hidden_layers": 3}, head_dim=16, query_pre_attn_scalar=24, sliding_window=window,
            layer_types=["sliding_attention", "full_attention", "sliding_attention"], pad_token_id=0,
            rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 10000.0},
                             "sliding_attention": {"rope_type": "default", "rope_theta": 100.0}})
    if arch == "gemma":  # Gemma 1; its GELU in the tanh form that llama.cpp runs (the exact one: test_hf_loader)
        return transformers.GemmaConfig(**common, head_dim=16, hidden_act="gelu_pytorch_tanh", pad_token_id=0,
                                        rope_theta=10000.0)
    if arch == "gemma2":
        # Four layers, sliding and global in turn; caps low enough for a tiny random model's scores
        # and logits (a tenth or so) to be bent by them, so that a missing cap shows. The softmax scale
        # 1/sqrt(head_dim), which llama.cpp assumes for a GGUF. Eager attention: the one transformers
        # applies the cap in.
        config = transformers.Gemma2Config(
            **{**common, "num_hidden_layers": 4}, head_dim=16, query_pre_attn_scalar=16, sliding_window=window,
            attn_logit_softcapping=0.05, final_logit_softcapping=1.0, pad_token_id=0, rope_theta=10000.0)
        config._attn_implementation = "eager"
        return config
    if arch == "phi3":
        # Phi-4-mini's shape of RoPE: 3/4 of each head rotated (12 of 16 dims), LongRoPE over an
        # original context of 16 with short and long factors far enough apart to show.
        return transformers.Phi3Config(
            **common, partial_rotary_factor=0.75, original_max_position_embeddings=16, pad_token_id=0,
            rope_scaling={"type": "longrope", "short_factor": [1.0, 1.2, 1.5, 2.0, 1.1, 1.3],
                          "long_factor": [3.0, 5.0, 8.0, 4.0, 6.0, 7.0]})
    # Mixture of experts: 4 experts of 32, 2 chosen per token; Qwen 2's with a shared expert, the chosen
    # experts' weights not renormalized ("qwen2moe-dense": its last layer dense, by mlp_only_layers).
    if arch == "mixtral":
        return transformers.MixtralConfig(**{**common, "intermediate_size": 32}, num_local_experts=4,
                                          num_experts_per_tok=2, rope_theta=10000.0)
    if arch in ("qwen2moe", "qwen2moe-dense"):
        return transformers.Qwen2MoeConfig(**common, moe_intermediate_size=32, shared_expert_intermediate_size=48,
                                           num_experts=4, num_experts_per_tok=2, rope_theta=10000.0,
                                           mlp_only_layers=[1] if arch.endswith("dense") else [])
    if arch in ("granitemoe", "granitemoeshared"):  # Granite's multipliers (as "granite" above) with experts
        cls = transformers.GraniteMoeSharedConfig if arch.endswith("shared") else transformers.GraniteMoeConfig
        shared = dict(shared_intermediate_size=48) if arch.endswith("shared") else {}
        return cls(**{**common, "intermediate_size": 32}, num_local_experts=4, num_experts_per_tok=2, rope_theta=1e4,
                   pad_token_id=0, embedding_multiplier=3.0, residual_multiplier=0.5, attention_multiplier=0.3,
                   logits_scaling=4.0, **shared)
    if arch == "olmoe":  # as many K/V heads as query heads: llama.cpp's OLMoE assumes so (OLMoE-1B-7B's 16 and 16)
        return transformers.OlmoeConfig(**{**common, "intermediate_size": 32, "num_key_value_heads": 4},
                                        num_experts=4, num_experts_per_tok=2,
                                        rope_theta=10000.0, pad_token_id=0)
    if arch == "gptoss":
        # Sliding and global layers in turn (a window of 8, short of the tests' prompts); YaRN over an
        # original context of 16 without truncation, as gpt-oss's; eager attention, the one with sinks.
        config = transformers.GptOssConfig(
            **{**common, "intermediate_size": 32}, head_dim=16, num_local_experts=4, num_experts_per_tok=2,
            sliding_window=8, layer_types=["sliding_attention", "full_attention"], pad_token_id=0,
            rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 8.0, "beta_fast": 32.0,
                             "beta_slow": 1.0, "original_max_position_embeddings": 16, "truncate": False})
        config._attn_implementation = "eager"
        return config
    if arch == "qwen3moe":
        return transformers.Qwen3MoeConfig(**common, head_dim=24, moe_intermediate_size=32, num_experts=4,
                                           num_experts_per_tok=2, norm_topk_prob=True, rope_theta=10000.0)
    raise ValueError(arch)


def hf_model(arch: str = "llama", tie: bool = True, seed: int = 0, vocab_size: int = VOCAB, window: int = 64,
             head_dim: Optional[int] = None):
    """head_dim: instead of the config's (hidden 64 / 4 heads for most families)."""
    import transformers

    torch.manual_seed(seed)
    cls = {"llama": transformers.LlamaForCausalLM, "mistral": transformers.MistralForCausalLM,
           "qwen2": transformers.Qwen2ForCausalLM, "qwen3": transformers.Qwen3ForCausalLM,
           "ministral3": transformers.Ministral3ForCausalLM, "smollm3": transformers.SmolLM3ForCausalLM,
           "granite": transformers.GraniteForCausalLM, "olmo2": transformers.Olmo2ForCausalLM,
           "olmo3": transformers.Olmo3ForCausalLM,
           "gemma": transformers.GemmaForCausalLM, "gemma2": transformers.Gemma2ForCausalLM, "gemma3": transformers.Gemma3ForCausalLM,
           "phi3": transformers.Phi3ForCausalLM, "mixtral": transformers.MixtralForCausalLM,
           "qwen2moe": transformers.Qwen2MoeForCausalLM, "qwen3moe": transformers.Qwen3MoeForCausalLM,
           "qwen2moe-dense": transformers.Qwen2MoeForCausalLM, "olmoe": transformers.OlmoeForCausalLM,
           "granitemoe": transformers.GraniteMoeForCausalLM,
           "granitemoeshared": transformers.GraniteMoeSharedForCausalLM, "gptoss": transformers.GptOssForCausalLM,
           "exaone4": transformers.Exaone4ForCausalLM, "exaone4-global": transformers.Exaone4ForCausalLM,
           "glm4": transformers.Glm4ForCausalLM, "lfm2": transformers.Lfm2ForCausalLM,
           "lfm2moe": transformers.Lfm2MoeForCausalLM, "ernie4_5": transformers.Ernie4_5ForCausalLM,
           **dict.fromkeys(("granite4", "granite4-nope", "granite4-moe"), transformers.GraniteMoeHybridForCausalLM),
           "cohere": transformers.CohereForCausalLM, "cohere2": transformers.Cohere2ForCausalLM,
           "hunyuan": transformers.HunYuanDenseV1ForCausalLM}[arch]
    config = hf_config(arch, tie, vocab_size, window)
    if head_dim is not None:
        config.head_dim = head_dim
    model = cls(config).eval()
    with torch.no_grad():  # random norms too, so a swapped norm would show
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1 + 0.1 * torch.randn_like(p))
            elif name.endswith("sinks"):  # gpt-oss's, near the scores' size so that they show
                p.copy_(torch.randn_like(p))
            elif name.endswith("bias"):  # gpt-oss's router and experts' biases (initialized to 0)
                p.copy_(0.1 * torch.randn_like(p))
        for name, b in model.named_buffers():
            if name.endswith("expert_bias"):  # LFM2-MoE's selection bias (0 at init), near the scores' spread
                b.copy_(0.2 * torch.randn_like(b))
    return model


def llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """HF rotate_half row order -> llama.cpp's interleaved order (its converter's formula)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


_GGUF_NAMES = {
    "input_layernorm.weight": "attn_norm.weight", "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight", "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.q_proj.bias": "attn_q.bias", "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.bias": "attn_v.bias", "self_attn.o_proj.weight": "attn_output.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight", "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.down_proj.weight": "ffn_down.weight", "mlp.up_proj.weight": "ffn_up.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight", "self_attn.k_norm.weight": "attn_k_norm.weight",
    "self_attn.qkv_proj.weight": "attn_qkv.weight", "mlp.gate_up_proj.weight": "ffn_up.weight",  # Phi-3's fused
    "post_self_attn_layernorm.weight": "post_attention_norm.weight",  # GLM 4's
    "post_mlp_layernorm.weight": "post_ffw_norm.weight",
    "self_attn.query_layernorm.weight": "attn_q_norm.weight",  # Hunyuan's
    "self_attn.key_layernorm.weight": "attn_k_norm.weight",
    # LFM2's (and LFM2-MoE's router and selection bias)
    "feed_forward.gate.weight": "ffn_gate_inp.weight", "feed_forward.expert_bias": "exp_probs_b.bias",
    "feed_forward.experts.down_proj": "ffn_down_exps.weight",
    "operator_norm.weight": "attn_norm.weight", "self_attn.q_layernorm.weight": "attn_q_norm.weight",
    "self_attn.k_layernorm.weight": "attn_k_norm.weight", "self_attn.out_proj.weight": "attn_output.weight",
    "conv.in_proj.weight": "shortconv.in_proj.weight", "conv.conv.weight": "shortconv.conv.weight",
    "conv.out_proj.weight": "shortconv.out_proj.weight", "feed_forward.w1.weight": "ffn_gate.weight",
    "ffn_norm.weight": "ffn_norm.weight",
    "feed_forward.w2.weight": "ffn_down.weight", "feed_forward.w3.weight": "ffn_up.weight",
    "mlp.gate.weight": "ffn_gate_inp.weight", "mlp.experts.down_proj": "ffn_down_exps.weight",  # MoE
    "block_sparse_moe.router.weight": "ffn_gate_inp.weight",
    "block_sparse_moe.experts.down_proj": "ffn_down_exps.weight",
    "shared_mlp.output_linear.weight": "ffn_down_shexp.weight",
    "mlp.shared_expert.gate_proj.weight": "ffn_gate_shexp.weight", "mlp.shared_expert.up_proj.weight": "ffn_up_shexp.weight",
    "mlp.shared_expert.down_proj.weight": "ffn_down_shexp.weight",
}
# llama.cpp's names for Gemma 3's four norms (its post_attention_layernorm is the sandwich norm).
_GEMMA3_GGUF_NAMES = {
    **_GGUF_NAMES, "post_attention_layernorm.weight": "post_attention_norm.weight",
    "pre_feedforward_layernorm.weight": "ffn_norm.weight", "post_feedforward_layernorm.weight": "post_ffw_norm.weight",
}


# gpt-oss's tensors as llama.cpp's converter writes them (_gpt_oss_tensor splits the experts').
_GPT_OSS_GGUF = {
    "post_attention_layernorm.weight": "post_attention_norm.weight", "self_attn.o_proj.bias": "attn_output.bias",
    "self_attn.sinks": "attn_sinks.weight", "mlp.router.weight": "ffn_gate_inp.weight",
    "mlp.router.bias": "ffn_gate_inp.bias", "mlp.experts.gate_up_proj": None, "mlp.experts.gate_up_proj_bias": None,
    "mlp.experts.down_proj": "ffn_down_exps.weight", "mlp.experts.down_proj_bias": "ffn_down_exps.bias",
}


def _gpt_oss_tensor(prefix: str, rest: str, a: np.ndarray) -> dict[str, np.ndarray]:
    """gpt-oss's experts are x @ w ([experts, in, out]), gate and up in alternate columns; GGUF's
    are [experts, out, in] and apart."""
    if rest == "mlp.experts.down_proj":
        a = a.swapaxes(1, 2)
    elif rest.startswith("mlp.experts.gate_up_proj"):
        if a.ndim == 3:
            a = a.swapaxes(1, 2)
        suffix = "weight" if a.ndim == 3 else "bias"
        return {f"{prefix}ffn_gate_exps.{suffix}": np.ascontiguousarray(a[:, 0::2]),
                f"{prefix}ffn_up_exps.{suffix}": np.ascontiguousarray(a[:, 1::2])}
    return {prefix + _GPT_OSS_GGUF[rest]: np.ascontiguousarray(a)}


def gguf_tensors(model, arch: str = "llama") -> dict[str, np.ndarray]:
    """The HF model's weights under GGUF names, Q/K permuted for llama; for the gemmas,
    norm weights + 1 as llama.cpp's converter stores Gemma's (1 + w) norms."""
    cfg = model.config
    # OLMo 2/3 and EXAONE 4 name their post-norms so
    names = _GEMMA3_GGUF_NAMES if arch in ("gemma2", "gemma3", "olmo2", "exaone4") else _GGUF_NAMES
    out = {}
    for name, t in model.state_dict().items():
        a = t.float().numpy().copy()
        if arch in ("gemma", "gemma2", "gemma3") and name.endswith("norm.weight"):
            a = a + 1
        if name == "model.embed_tokens.weight":
            out["token_embd.weight"] = a
        elif name == "model.norm.weight":
            out["output_norm.weight"] = a
        elif name == "model.embedding_norm.weight":  # LFM2's final norm, under llama.cpp's name for it
            out["token_embd_norm.weight"] = a
        elif name == "lm_head.weight":
            if not cfg.tie_word_embeddings:
                out["output.weight"] = a
        else:
            _, _, i, rest = name.split(".", 3)
            permuted = arch in ("llama", "mixtral") or arch.startswith("granitemoe")
            if permuted and rest.startswith("self_attn.q_proj"):
                a = llama_cpp_permute(a, cfg.num_attention_heads)
            elif permuted and rest.startswith("self_attn.k_proj"):
                a = llama_cpp_permute(a, cfg.num_key_value_heads)
            if arch == "gptoss" and rest in _GPT_OSS_GGUF:
                out.update(_gpt_oss_tensor(f"blk.{i}.", rest, a))
            elif rest.endswith("experts.gate_up_proj"):  # transformers' [experts, gate rows then up rows, dim]
                gate, up = np.split(a, 2, axis=1)
                out[f"blk.{i}.ffn_gate_exps.weight"] = np.ascontiguousarray(gate)
                out[f"blk.{i}.ffn_up_exps.weight"] = np.ascontiguousarray(up)
            elif rest == "shared_mlp.input_linear.weight":  # Granite's shared expert: gate rows, then up rows
                out[f"blk.{i}.ffn_gate_shexp.weight"], out[f"blk.{i}.ffn_up_shexp.weight"] = np.split(a, 2)
            elif rest == "mlp.shared_expert_gate.weight":  # a vector in GGUF
                out[f"blk.{i}.ffn_gate_inp_shexp.weight"] = a[0]
            else:
                out[f"blk.{i}.{names[rest]}"] = a.squeeze(1) if rest == "conv.conv.weight" else a
    return out


def write_gguf(path: Path, tensors: dict[str, np.ndarray], *, arch: str = "llama", n_layers: int = 2,
               quant: Optional[dict[str, "gguf.GGMLQuantizationType"]] = None, tokens: Optional[list[str]] = None,
               add_bos: Optional[bool] = False, tokenizer_model: str = "gpt2",
               merges: Optional[list[tuple[str, str]]] = None, extra: Optional[dict] = None,
               head_dim: int = 16, dim: int = 64, hidden_dim: int = 96, n_heads: int = 4,
               n_kv_heads: Union[int, list[int]] = 2, control: tuple[str, ...] = tuple(SPECIALS),
               template: str = CHAT_TEMPLATE, context: int = 128, rope_theta: float = 10000.0) -> Path:
    """Write a tiny GGUF: llama-style metadata, a byte-level tokenizer and `tensors`.

    `tokens` and `merges` replace the byte-level vocabulary and its merges (MERGES);
    `control` are the tokens typed as control (special) tokens.

    `quant` maps tensor names to a type to store them in (quantized with gguf.quants; a
    uint8 array is taken as that type's blocks already, [rows, bytes per row]).
    """
    from gguf import GGMLQuantizationType as T
    from gguf import quants

    w = gguf.GGUFWriter(str(path), arch)
    w.add_uint32(f"{arch}.block_count", n_layers)
    w.add_uint32(f"{arch}.context_length", context)
    w.add_uint32(f"{arch}.embedding_length", dim)
    w.add_uint32(f"{arch}.feed_forward_length", hidden_dim)
    w.add_uint32(f"{arch}.attention.head_count", n_heads)
    if isinstance(n_kv_heads, list):  # per layer (LFM2's: 0 on a convolution layer)
        w.add_array(f"{arch}.attention.head_count_kv", n_kv_heads)
    else:
        w.add_uint32(f"{arch}.attention.head_count_kv", n_kv_heads)
    w.add_float32(f"{arch}.rope.freq_base", rope_theta)
    w.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", 1e-5)
    w.add_uint32(f"{arch}.rope.dimension_count", head_dim)
    if head_dim != 16:
        w.add_uint32(f"{arch}.attention.key_length", head_dim)
    tokens = byte_level_tokens() if tokens is None else tokens
    w.add_uint32(f"{arch}.vocab_size", len(tokens))
    w.add_tokenizer_model(tokenizer_model)
    w.add_token_list(tokens)
    w.add_token_types([3 if t in control else 1 for t in tokens])
    if tokenizer_model == "gpt2":
        w.add_token_merges([f"{a} {b}" for a, b in (MERGES if merges is None else merges)])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_pad_token_id(2)
    if add_bos is not None:
        w.add_add_bos_token(add_bos)
    w.add_chat_template(template)
    for key, value in (extra or {}).items():
        if isinstance(value, bool):
            w.add_bool(key, value)
        elif isinstance(value, str):
            w.add_string(key, value)
        elif isinstance(value, float):
            w.add_float32(key, value)
        elif isinstance(value, (list, tuple)):
            w.add_array(key, list(value))
        else:
            w.add_uint32(key, value)
    for name, a in tensors.items():
        qtype = (quant or {}).get(name, T.F32)
        if qtype == T.F32:
            w.add_tensor(name, a.astype(np.float32))
        elif qtype == T.F16:
            w.add_tensor(name, a.astype(np.float16))
        elif a.dtype == np.uint8:
            w.add_tensor(name, a, raw_dtype=qtype)
        else:
            w.add_tensor(name, quants.quantize(a.astype(np.float32), qtype), raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def write_hf_dir(directory: Path, model, *, tokenizer_config: Optional[dict] = None,
                 max_shard_size: Optional[str] = None, template: Optional[str] = None) -> Path:
    """save_pretrained plus a byte-level BPE tokenizer.json built with `tokenizers`.

    `template` is a TemplateProcessing `single` spec (e.g. "<|im_start|> $A") for
    the tokenizer's post-processor; None leaves it without one.
    """
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

    kwargs = {"max_shard_size": max_shard_size} if max_shard_size else {}
    model.save_pretrained(directory, **kwargs)
    tokens = byte_level_tokens()
    tok = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=MERGES))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIALS])
    if template is not None:
        tok.post_processor = processors.TemplateProcessing(
            single=template, special_tokens=[(t, i) for i, t in enumerate(SPECIALS) if t in template])
    tok.save(str(directory / "tokenizer.json"))
    config = {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>", "chat_template": CHAT_TEMPLATE,
              **(tokenizer_config or {})}
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    return directory


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    """Import into a test module: each test gets its own conversion cache, never the user's.

    (Not in a conftest.py: a second `conftest` module would shadow tests/conftest.py
    for the modules that import helpers from it.)
    """
    monkeypatch.setenv("FASTDECODE_CACHE", str(tmp_path / "fd-cache"))
