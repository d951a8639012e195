"""Mixture-of-experts checkpoints: Mixtral, Qwen 2 MoE (with its gated shared expert), Qwen 3 MoE, OLMoE and
Granite MoE (with its multipliers, and a shared expert in Granite MoE Shared), as
Hugging Face directories and as GGUF files written by the tests from random transformers models,
against those models and llama.cpp (where installed); the engine on them; their bad input."""

import json
import logging

import pytest
import torch
from gguf import GGMLQuantizationType as T
from safetensors.torch import save_file

import fastdecode
from fastdecode import kernels
from fastdecode.checkpoints import load_checkpoint
from fastdecode.errors import FastDecodeError
from test_gguf_families import logits_diff, one_line_error, ours_and_llama_cpps_logits
from tiny_checkpoints import private_cache  # noqa: F401  (autouse fixture)
from tiny_checkpoints import VOCAB, gguf_tensors, hf_model, write_gguf, write_hf_dir
from conftest import need_llama_cpp
from fastdecode.evaluation.perplexity import llama_cpp_available

transformers = pytest.importorskip("transformers")

GRANITE_MOE_META = {"granitemoe.expert_count": 4, "granitemoe.expert_used_count": 2, "granitemoe.embedding_scale": 3.0,
                    "granitemoe.residual_scale": 0.5, "granitemoe.attention.scale": 0.3, "granitemoe.logit_scale": 4.0}
FAMILIES = ("mixtral", "qwen2moe", "qwen3moe", "olmoe", "granitemoe", "granitemoeshared", "gptoss")
# What llama.cpp's converter writes for tiny_checkpoints' models: (architecture, keys, the MLP's
# size). Mixtral is a "llama" file whose MLP size is the experts'.
GGUF = {
    "mixtral": ("llama", {"llama.expert_count": 4, "llama.expert_used_count": 2}, 32),
    "qwen2moe": ("qwen2moe", {"qwen2moe.expert_count": 4, "qwen2moe.expert_used_count": 2,
                              "qwen2moe.expert_feed_forward_length": 32,
                              "qwen2moe.expert_shared_feed_forward_length": 48}, 96),
    "qwen3moe": ("qwen3moe", {"qwen3moe.expert_count": 4, "qwen3moe.expert_used_count": 2,
                              "qwen3moe.expert_feed_forward_length": 32, "qwen3moe.attention.value_length": 24}, 96),
    "olmoe": ("olmoe", {"olmoe.expert_count": 4, "olmoe.expert_used_count": 2}, 32),
    "granitemoe": ("granitemoe", GRANITE_MOE_META, 32),
    "granitemoeshared": ("granitemoe", {**GRANITE_MOE_META, "granitemoe.expert_shared_feed_forward_length": 48}, 32),
    "gptoss": ("gpt-oss", {"gpt-oss.expert_count": 4, "gpt-oss.expert_used_count": 2,
                           "gpt-oss.expert_feed_forward_length": 32, "gpt-oss.attention.sliding_window": 8,
                           "gpt-oss.rope.scaling.type": "yarn", "gpt-oss.rope.scaling.factor": 8.0,
                           "gpt-oss.rope.scaling.original_context_length": 16}, 32),
}
TOKENS = torch.randint(3, VOCAB, (1, 40), generator=torch.Generator().manual_seed(0))


def write_moe(path, family, quant=None, extra=None):
    """The family's tiny model as a GGUF file (the experts' tensors in `quant`, if given), and the model."""
    model = hf_model(family, tie=False, seed=3)
    arch, meta, hidden = GGUF[family]
    tensors = gguf_tensors(model, family)
    types = None if quant is None else {k: quant for k in tensors if k.endswith("_exps.weight")}
    return write_gguf(path, tensors, arch=arch, extra={**meta, **(extra or {})}, hidden_dim=hidden, quant=types,
                      head_dim=24 if family == "qwen3moe" else 16, n_kv_heads=model.config.num_key_value_heads), model


@pytest.mark.parametrize("family", [*FAMILIES, "qwen2moe-dense"])
def test_hf_checkpoint_matches_the_transformers_model(tmp_path, family):
    model = hf_model(family, tie=False, seed=3)
    ckpt = load_checkpoint(write_hf_dir(tmp_path / "m", model), dtype=torch.float32, use_cache=False)
    a = ckpt.args
    assert (a.n_experts, a.n_experts_used, a.expert_hidden_dim) == (4, 2, 32)
    assert a.norm_expert_weights is (family in ("mixtral", "qwen3moe", "granitemoe", "granitemoeshared", "gptoss"))
    oss = family == "gptoss"
    assert (a.attn_sinks, a.attn_out_bias, a.expert_bias, a.qkv_bias) == (oss, oss, oss, oss or family.startswith("qwen2moe"))
    assert (a.activation, a.layer_types) == (("swiglu_oai", ("sliding", "global")) if oss else ("silu", None))
    assert (a.qk_norm, a.qk_norm_full) == (family in ("qwen3moe", "olmoe"), family == "olmoe")
    assert a.shared_expert_dim == (48 if family.startswith("qwen2") or family == "granitemoeshared" else 0)
    assert a.shared_expert_gate is family.startswith("qwen2")
    granite = (3.0, 0.5, 4.0) if "granite" in family else (1, 1, 1)
    assert (a.embed_scale, a.residual_scale, a.logits_scaling) == granite
    assert a.dense_layers == ((1,) if family == "qwen2moe-dense" else ())
    assert logits_diff(ckpt, model, TOKENS) <= 1e-4


def test_experts_saved_as_transformers_5_holds_them(tmp_path):
    """A checkpoint of the in-memory form: each layer's experts in two [experts, rows, cols] tensors."""
    model = hf_model("qwen3moe", tie=False, seed=3)
    d = write_hf_dir(tmp_path / "m", model)
    assert "model.layers.0.mlp.experts.gate_up_proj" in model.state_dict()
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(d / "model.safetensors"))
    ckpt = load_checkpoint(d, dtype=torch.float32, use_cache=False)
    assert logits_diff(ckpt, model, TOKENS) <= 1e-4


@pytest.mark.parametrize("family", FAMILIES)
def test_gguf_matches_the_transformers_model_and_stays_packed(tmp_path, family):
    path, model = write_moe(tmp_path / "f.gguf", family)
    assert logits_diff(load_checkpoint(path, dtype=torch.float32, use_cache=False), model, TOKENS) <= 1e-4
    path, model = write_moe(tmp_path / "q.gguf", family, T.Q8_0)
    ckpt = load_checkpoint(path, dtype=torch.float32, weights="auto")
    assert "Q8_0->q8 x24" in ckpt.weights_summary  # 2 layers x 4 experts x 3 matrices, each packed
    assert logits_diff(ckpt, model, TOKENS) <= 2e-3  # measured 3.0e-5 to 7.4e-4: the quantization


@pytest.mark.parametrize("family", FAMILIES)
def test_gguf_matches_llama_cpp(tmp_path, family):
    """Measured apart at most (llama.cpp keeps K and V in float16): 7.3e-6 (Granite) to 2.2e-4 in float32,
    3.1e-5 to 6.6e-4 with Q8_0 experts, 2.7e-5 to 7.0e-4 with MXFP4 experts (q4mx); the same argmax at
    all 100 positions, for each family."""
    need_llama_cpp()
    for quant in (None, T.Q8_0, T.MXFP4):
        path, _ = write_moe(tmp_path / f"{quant}.gguf", family, quant)
        ours, theirs = ours_and_llama_cpps_logits(path)
        assert (ours - theirs).abs().max().item() <= 2e-3


def test_qwen3_vl_moe_gguf_runs_its_text_model(tmp_path):
    """Qwen3-VL-30B-A3B's GGUF (arch qwen3vlmoe) as Qwen 3 MoE: on text its M-RoPE is RoPE. Against
    transformers, and llama.cpp where installed (measured 2.2e-4 apart)."""
    model = hf_model("qwen3moe", tie=False, seed=3)
    _, meta, hidden = GGUF["qwen3moe"]
    meta = {k.replace("qwen3moe.", "qwen3vlmoe."): v for k, v in meta.items()}
    path = write_gguf(tmp_path / "vl.gguf", gguf_tensors(model, "qwen3moe"), arch="qwen3vlmoe", hidden_dim=hidden,
                      extra={**meta, "qwen3vlmoe.rope.dimension_sections": [4, 4, 4, 0]}, head_dim=24,
                      n_kv_heads=model.config.num_key_value_heads)
    ckpt = load_checkpoint(path, dtype=torch.float32, use_cache=False)
    assert (ckpt.args.n_experts, ckpt.args.qk_norm, ckpt.args.norm_expert_weights) == (4, True, True)
    assert logits_diff(ckpt, model, TOKENS) <= 1e-4
    if llama_cpp_available():
        ours, theirs = ours_and_llama_cpps_logits(path)
        assert (ours - theirs).abs().max().item() <= 2e-3


def test_mxfp4_experts_stay_packed_on_the_grouped_kernel(tmp_path):
    """gpt-oss' expert type: each expert's matrices q4mx (the file's bytes). The logits are those of
    the same file dequantized to float but for the int8 activations, and the native kernels' (every
    layer's chosen experts in one grouped_linear call per projection) are the PyTorch twin's bits."""
    from fastdecode.quant import build_model
    from fastdecode.quant.transform import set_native

    path, _ = write_moe(tmp_path / "mx.gguf", "qwen3moe", T.MXFP4)
    packed = load_checkpoint(path, dtype=torch.float32, weights="auto")
    assert "MXFP4->q4mx x24" in packed.weights_summary
    floats = load_checkpoint(path, dtype=torch.float32, weights="float")
    model, ref_model = (build_model(c.args, c.state_dict, torch.float32)[0].eval() for c in (packed, floats))
    assert {e.w13.layout for layer in model.layers for e in layer.feed_forward.experts} == {"q4mx"}
    with torch.no_grad():
        twin, ref = model(TOKENS, None), ref_model(TOKENS, None)
        assert (twin - ref).abs().max().item() <= 2e-3  # measured 4.9e-4
        if kernels.available_isas():
            set_native(model, True)
            assert torch.equal(model(TOKENS, None), twin)


def test_engine_batches_a_shared_expert_model_as_the_cache_free_forward(tmp_path, caplog):
    """Three prompts of different lengths at once, chunked prefill, packed experts: greedy tokens equal
    the cache-free forward's. The model runs eagerly and nothing is exported for it."""
    path, _ = write_moe(tmp_path / "m.gguf", "qwen2moe", T.Q8_0)
    with caplog.at_level(logging.WARNING, logger="fastdecode"):
        llm = fastdecode.load(str(path), max_seq_len=128, max_batch_size=3, prefill_chunk=16, compile="decode",
                              kv_dtype="float32")
    assert llm.report.compile == "none" and "runs eagerly" in caplog.text
    prompts = [TOKENS[0, :n].tolist() for n in (40, 7, 19)]
    outs = llm.generate(prompts, max_new_tokens=16, min_new_tokens=16, temperature=0)
    stops = list(llm.tokenizer.eos_ids)
    for prompt, out in zip(prompts, outs):
        seq = list(prompt)
        with torch.no_grad():
            for _ in range(16):
                logits = llm.model(torch.tensor([seq]), None)[0, -1]
                logits[stops] = -float("inf")  # as min_new_tokens keeps them out
                seq.append(int(logits.argmax()))
        assert out.token_ids == seq[len(prompt):]


@pytest.mark.parametrize("extra, match", [
    ({"qwen3moe.expert_used_count": 0}, "n_experts_used must be from 1 to n_experts"),
    ({"qwen3moe.expert_used_count": 5}, "n_experts_used must be from 1 to n_experts"),
    ({"qwen3moe.expert_count": 3}, r"ffn_gate_exps.weight' has shape \[4, 32, 64\], but the file's metadata makes it "
                                   r"\[3, 32, 64\]"),
])
def test_bad_expert_metadata_is_named(tmp_path, extra, match):
    path, _ = write_moe(tmp_path / "m.gguf", "qwen3moe", extra=extra)
    one_line_error(path, match)


def test_bad_expert_config_is_named(tmp_path):
    model = hf_model("qwen2moe", tie=False, seed=3)
    d = write_hf_dir(tmp_path / "m", model)
    config = json.loads((d / "config.json").read_text())
    for change, match in (({"num_experts_per_tok": 9}, "n_experts_used must be from 1 to n_experts"),
                          ({"decoder_sparse_step": 0}, "decoder_sparse_step must be >= 1"),
                          ({"mlp_only_layers": "1"}, "mlp_only_layers must be a list"),
                          ({"moe_intermediate_size": 16}, "has shape")):
        (d / "config.json").write_text(json.dumps({**config, **change}))
        with pytest.raises(FastDecodeError, match=match) as e:
            load_checkpoint(d, dtype=torch.float32, use_cache=False)
        assert "\n" not in str(e.value)


def test_packages_and_tensor_parallelism_are_refused_in_one_line(tmp_path):
    path, _ = write_moe(tmp_path / "m.gguf", "mixtral")
    (tmp_path / "x.pt2").write_bytes(b"")
    with pytest.raises(FastDecodeError, match="mixture-of-experts models are not exported"):
        fastdecode.load(str(path), max_seq_len=64, compiled=str(tmp_path / "x.pt2"))
    from fastdecode.compile.aot import export_package
    from fastdecode.parallel.shard import check_divisible, valid_tp

    llm = fastdecode.load(str(path), max_seq_len=64, max_batch_size=1)
    # The stats' bandwidth counts the experts a token chooses, 2 of each layer's 4, in float32 here
    experts = 2 * 4 * 3 * 64 * 32 * 4
    assert llm.weight_bytes_per_token == sum(t.nbytes for t in llm.model.state_dict().values()) - 64 * VOCAB * 4 - (
        experts // 2)
    with pytest.raises(FastDecodeError, match="cannot be exported"):
        export_package(llm.model, tmp_path / "y.pt2")
    with pytest.raises(FastDecodeError, match="does not split mixture-of-experts models"):
        check_divisible(llm.model, 2)
    assert valid_tp(llm.model) == [1]


def test_bench_skips_the_compiled_modes_of_an_moe_model(tmp_path):
    """`fastdecode bench`'s compile rows would run the eager steps under their names, and no package can be
    exported: skipped rows, saying so."""
    from fastdecode.bench.cli import main

    path, _ = write_moe(tmp_path / "m.gguf", "qwen3moe", T.Q8_0)
    out = tmp_path / "bench"
    main([f"model={path}", "modes=static", "modes=static+compile", "modes=package", "peers=", "batch_sizes=1",
          "new_tokens=4", "prompt_lengths=5", "runs=1", "warmup=0", "probe_mib=4", f"out={out}"])
    rows = {r["name"]: r for r in json.loads((out / "results.json").read_text())["rows"]}
    assert rows["static"]["status"] == "ok"
    assert rows["static+compile"]["status"] == "skipped" and "ran the eager steps" in rows["static+compile"]["error"]
    assert rows["package"]["status"] == "skipped" and "cannot be exported" in rows["package"]["error"]


def test_bad_gpt_oss_input_is_named(tmp_path):
    """gpt-oss's own fields: an experts' bias of the wrong size in a GGUF, and its config's numbers."""
    model = hf_model("gptoss", tie=False, seed=3)
    arch, meta, hidden = GGUF["gptoss"]
    tensors = gguf_tensors(model, "gptoss")
    tensors["blk.1.ffn_up_exps.bias"] = tensors["blk.1.ffn_up_exps.bias"][:, :16]
    path = write_gguf(tmp_path / "m.gguf", tensors, arch=arch, extra=meta, hidden_dim=hidden,
                      n_kv_heads=model.config.num_key_value_heads)
    one_line_error(path, r"'blk.1.ffn_up_exps.bias' has shape \[4, 16\], but the file's metadata makes it \[4, 32\]")
    d = write_hf_dir(tmp_path / "hf", model)
    config = json.loads((d / "config.json").read_text())
    for change, match in (({"swiglu_limit": "high"}, "swiglu_limit"), ({"attention_bias": "yes"}, "attention_bias"),
                          ({"swiglu_alpha": -1.0}, "glu_alpha and glu_limit must be > 0")):
        (d / "config.json").write_text(json.dumps({**config, **change}))
        with pytest.raises(FastDecodeError, match=match) as e:
            load_checkpoint(d, dtype=torch.float32, use_cache=False)
        assert "\n" not in str(e.value)
