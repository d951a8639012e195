"""Hugging Face directories: Llama, Mistral, Qwen2, Qwen3, Gemma 1, 2 and 3, SmolLM3, Granite, OLMo 2 and Phi-3, single and sharded,
against transformers."""

import json
import math

import pytest
import torch

from fastdecode.checkpoints import load_checkpoint
from fastdecode.errors import FastDecodeError
from tiny_checkpoints import private_cache  # noqa: F401  (autouse fixture)
from tiny_checkpoints import VOCAB, hf_config, hf_model, write_hf_dir

transformers = pytest.importorskip("transformers")

TOKENS = torch.tensor([[1, 200, 17, 5, 261, 99, 42, 3]])


def build_ours(ckpt):
    from fastdecode.quant import build_model  # what load() builds the model with

    return build_model(ckpt.args, ckpt.state_dict, torch.float32)[0].eval()


@pytest.mark.parametrize("arch,tie", [("llama", True), ("llama", False), ("mistral", False), ("qwen2", True),
                                       ("qwen3", True), ("qwen3", False), ("gemma3", True), ("ministral3", False),
                                       ("smollm3", True), ("granite", True), ("granite", False),
                                       ("olmo2", False), ("olmo3", False), ("gemma", True), ("gemma2", True),
                                       ("phi3", False),
                                       ("phi3", True), ("exaone4", True), ("exaone4", False), ("exaone4-global", False),
                                       ("glm4", False), ("glm4", True), ("ernie4_5", True), ("ernie4_5", False),
                                       ("cohere", True), ("cohere2", True), ("cohere2", False), ("hunyuan", False)])
def test_logits_match_transformers(tmp_path, arch, tie):
    model = hf_model(arch, tie=tie, seed=1)
    write_hf_dir(tmp_path, model)
    ckpt = load_checkpoint(tmp_path, dtype=torch.float32, device="cpu")
    assert ckpt.format == "hf" and ckpt.args.tie_embeddings is tie
    assert ckpt.args.qkv_bias is (arch in ("qwen2", "glm4"))
    assert ckpt.args.qk_norm is (arch in ("qwen3", "gemma3", "olmo2", "olmo3", "exaone4", "exaone4-global", "hunyuan"))
    if arch == "exaone4":  # three sliding layers, then a global one without RoPE
        a = ckpt.args
        assert (a.layer_types, a.nope_layers, a.pre_norms, a.qk_norm_full) == (("sliding",) * 3 + ("global",), (3,),
                                                                                False, False)
    assert ("output.weight" in ckpt.state_dict) is (not tie)
    with torch.no_grad():
        diff = (build_ours(ckpt)(TOKENS, None) - model(TOKENS).logits).abs().max().item()
    assert diff <= 1e-4


def test_ministral3_past_its_original_context(tmp_path):
    """Ministral 3: YaRN and the queries' scale by position (1 + 0.5 ln(1 + floor(p / 16)) here),
    against transformers over 100 positions."""
    model = hf_model("ministral3", seed=2)
    write_hf_dir(tmp_path, model)
    ckpt = load_checkpoint(tmp_path, dtype=torch.float32, device="cpu")
    a = ckpt.args
    assert (a.query_scale_beta, a.query_scale_period, a.rope_scaling.kind) == (0.5, 16, "yarn")
    tokens = torch.randint(0, VOCAB, (1, 100), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = model(tokens).logits
        diff = (build_ours(ckpt)(tokens, None) - ref).abs().max().item()
    assert diff <= 1e-4 * ref.abs().max().item()


@pytest.mark.parametrize("no_rope_layers", [None, [0, 1, 1, 0]])
def test_smollm3_layers_without_rope(tmp_path, no_rope_layers):
    """SmolLM3: no RoPE on every fourth layer by default, or where `no_rope_layers` holds 0;
    against transformers past 100 positions (the NoPE layers see no position but the mask)."""
    model = hf_model("smollm3", seed=3)
    if no_rope_layers is not None:
        model.config.no_rope_layers = no_rope_layers
        model = type(model)(model.config).eval()
    write_hf_dir(tmp_path, model)
    a = load_checkpoint(tmp_path, dtype=torch.float32, device="cpu").args
    assert a.nope_layers == ((3,) if no_rope_layers is None else (0, 3))
    ckpt = load_checkpoint(tmp_path, dtype=torch.float32, device="cpu")
    tokens = torch.randint(0, VOCAB, (1, 100), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert (build_ours(ckpt)(tokens, None) - model(tokens).logits).abs().max().item() <= 1e-4


@pytest.mark.parametrize("global_rope", [{"rope_type": "default", "rope_theta": 1e4},
                                         {"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0,
                                          "original_max_position_embeddings": 16}], ids=["plain", "yarn"])
def test_olmo3_rope_per_layer_type(tmp_path, global_rope):
    """OLMo 3: three sliding layers in four with their own RoPE base, scaling (YaRN) on the global
    layers only; against transformers past the window of 8 and the original context of 16."""
    model = hf_model("olmo3", seed=4, tie=False, window=8)
    model.config.rope_parameters = {"full_attention": dict(global_rope),
                                    "sliding_attention": {"rope_type": "default", "rope_theta": 500000.0}}
    model.model.rotary_emb = type(model.model.rotary_emb)(config=model.config)
    write_hf_dir(tmp_path, model)
    ckpt = load_checkpoint(tmp_path, dtype=torch.float32, device="cpu")
    a = ckpt.args
    assert (a.rope_theta, a.rope_local_theta, a.layer_types) == (1e4, 500000.0, ("sliding",) * 3 + ("global",))
    tokens = torch.randint(0, VOCAB, (1, 100), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert (build_ours(ckpt)(tokens, None) - model(tokens).logits).abs().max().item() <= 1e-4


@pytest.mark.parametrize("arch", ["smollm3", "olmo3", "olmo2", "gemma3"])
def test_a_config_without_rope_theta_takes_its_familys_default(tmp_path, arch):
    """A config.json that names no RoPE base gets the one its transformers config class defaults
    to (SmolLM3 2,000,000, OLMo 3 500,000, Gemma 3 1,000,000, OLMo 2 Llama's 10,000), as
    transformers loading the same directory does."""
    write_hf_dir(tmp_path, hf_model(arch, seed=9, tie=arch != "olmo2", window=8))
    config = json.loads((tmp_path / "config.json").read_text())
    for key in ("rope_theta", "rope_parameters", "rope_scaling", "rope_local_base_freq"):
        config.pop(key, None)
    (tmp_path / "config.json").write_text(json.dumps(config))
    reference = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    ckpt = load_checkpoint(tmp_path, dtype=torch.float32, device="cpu")
    assert ckpt.args.rope_theta == {"smollm3": 2e6, "olmo3": 5e5, "olmo2": 1e4, "gemma3": 1e6}[arch]
    tokens = torch.randint(3, VOCAB, (1, 40), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert (build_ours(ckpt)(tokens, None) - reference(tokens).logits).abs().max().item() <= 1e-4


@pytest.mark.parametrize("arch, key", [("phi3", "rms_norm_eps"), ("phi3", "original_max_position_embeddings"),
                                       ("olmo2", "rms_norm_eps"), ("exaone4", "rms_norm_eps"),
                                       ("gemma2", "hidden_activation"), ("gemma3", "hidden_activation"),
                                       ("gemma3", "query_pre_attn_scalar"), ("mixtral", "rope_parameters")])
def test_a_config_without_a_key_takes_its_config_classs_default(tmp_path, arch, key):
    """A key left out of config.json means its transformers config class's default (Phi-3's eps 1e-5 and
    original context 4,096, Gemma 3's GELU and query scalar 256, Mixtral's RoPE base 1,000,000), not
    Llama's: the logits of transformers loading the same directory."""
    write_hf_dir(tmp_path, hf_model(arch, seed=9))
    config = json.loads((tmp_path / "config.json").read_text())
    config.pop(key)
    (tmp_path / "config.json").write_text(json.dumps(config))
    reference = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    ours = build_ours(load_checkpoint(tmp_path, dtype=torch.float32, device="cpu"))
    ours.setup_caches(1, 100)  # caches past Phi-3's original context: its long factors, as transformers' on 100 tokens
    tokens = torch.randint(3, VOCAB, (1, 100), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert (ours(tokens, torch.arange(100)[None]) - reference(tokens).logits).abs().max().item() <= 1e-4


@pytest.mark.parametrize("arch", ["gemma3", "exaone4", "cohere2"])
@pytest.mark.parametrize("context", [8192, 64])
def test_a_config_without_sliding_window_takes_its_config_classs_window(tmp_path, arch, context):
    """Their config classes' window of 4,096 where config.json names none: the sliding layers stay sliding
    (Gemma 3's with their own RoPE base, EXAONE 4's and Command R7B's global ones without RoPE); they ran
    as global layers. Over a shorter context the window is the context (it was refused as too large)."""
    write_hf_dir(tmp_path, hf_model(arch, seed=9))
    config = json.loads((tmp_path / "config.json").read_text())
    del config["sliding_window"]
    config["max_position_embeddings"] = context
    (tmp_path / "config.json").write_text(json.dumps(config))
    reference = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    ckpt = load_checkpoint(tmp_path, dtype=torch.float32, device="cpu")
    assert ckpt.args.sliding_window == min(4096, context)
    tokens = torch.randint(3, VOCAB, (1, 40), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert (build_ours(ckpt)(tokens, None) - reference(tokens).logits).abs().max().item() <= 1e-4


def test_granite_multipliers_come_from_the_config(tmp_path):
    write_hf_dir(tmp_path, hf_model("granite"))
    a = load_checkpoint(tmp_path, dtype=torch.float32, device="cpu").args
    assert (a.embed_scale, a.residual_scale, a.attn_scale, a.logits_scaling) == (3.0, 0.5, 0.3, 4.0)


@pytest.mark.parametrize("names", ["files", "modules"])
def test_gemma3_vision_language_directory_runs_its_text_model(tmp_path, names):
    """Gemma 3 4B-27B ship as Gemma3ForConditionalGeneration: the text model runs, the image encoder
    is left out. Its text_config names a few keys and leaves the rest to Gemma3TextConfig's defaults
    (those keys are taken out of config.json here, and the values match the defaults); the tensors
    are named as the checkpoints' files name them, or as transformers 5's modules do."""
    from safetensors.torch import load_file, save_file

    torch.manual_seed(5)
    text = transformers.Gemma3TextConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=8,
        num_key_value_heads=4, head_dim=256, pad_token_id=0, bos_token_id=1, eos_token_id=2,
        rope_parameters={"full_attention": {"rope_type": "linear", "rope_theta": 1_000_000.0, "factor": 8.0},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}})
    vision = transformers.SiglipVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                             num_attention_heads=2, image_size=28, patch_size=14)
    model = transformers.Gemma3ForConditionalGeneration(
        transformers.Gemma3Config(text_config=text, vision_config=vision, mm_tokens_per_image=4)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(0.1 * torch.randn_like(p))
    write_hf_dir(tmp_path, model)
    config = json.loads((tmp_path / "config.json").read_text())
    for key in ("num_attention_heads", "num_key_value_heads", "head_dim", "rms_norm_eps", "query_pre_attn_scalar",
                "max_position_embeddings", "sliding_window", "hidden_activation", "layer_types"):
        config["text_config"].pop(key, None)
    (tmp_path / "config.json").write_text(json.dumps(config))
    weights = load_file(str(tmp_path / "model.safetensors"))
    assert any(k.startswith("vision_tower.") for k in weights)
    if names == "modules":
        weights = {k.replace("language_model.model.", "model.language_model.", 1): v for k, v in weights.items()}
        save_file(weights, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    ckpt = load_checkpoint(tmp_path, dtype=torch.float32, device="cpu")
    a = ckpt.args
    assert (a.n_heads, a.n_kv_heads, a.head_dim, a.sliding_window, a.max_seq_len) == (8, 4, 256, 4096, 131072)
    assert a.layer_types == ("sliding", "sliding", "sliding") and a.rope_scaling.factor == 8.0
    assert not any("vision" in k or "projector" in k for k in ckpt.state_dict)
    reference = transformers.Gemma3ForConditionalGeneration.from_pretrained(tmp_path).eval()
    tokens = torch.randint(3, VOCAB, (1, 40), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert (build_ours(ckpt)(tokens, None) - reference(input_ids=tokens).logits).abs().max().item() <= 1e-4


@pytest.mark.parametrize("text", ["mistral", "ministral3"])
def test_mistral3_vision_language_directory_runs_its_text_model(tmp_path, text):
    """Mistral Small 3.1 / 3.2 and Ministral 3 ship as Mistral3ForConditionalGeneration, with a
    Mistral or a Ministral 3 text model: it runs, the image encoder is left out."""
    torch.manual_seed(6)
    text_config = hf_config(text, tie=False)
    vision = transformers.PixtralVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                              num_attention_heads=2, image_size=28, patch_size=14, head_dim=16)
    model = transformers.Mistral3ForConditionalGeneration(
        transformers.Mistral3Config(text_config=text_config, vision_config=vision)).eval()
    write_hf_dir(tmp_path, model)
    ckpt = load_checkpoint(tmp_path, dtype=torch.float32, device="cpu")
    assert (ckpt.args.query_scale_beta > 0) is (text == "ministral3")
    reference = transformers.Mistral3ForConditionalGeneration.from_pretrained(tmp_path).eval()
    tokens = torch.randint(3, VOCAB, (1, 100), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = reference(input_ids=tokens).logits
        assert (build_ours(ckpt)(tokens, None) - ref).abs().max().item() <= 1e-4 * max(1.0, ref.abs().max().item())


def qwen_vl(kind, tmp_path):
    """A tiny Qwen 2.5-VL or Qwen3-VL, saved; Qwen 2.5-VL's config.json as its own repositories
    write it (the text model's keys at the top level, RoPE as type mrope)."""
    text = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=128, rope_theta=10000.0, tie_word_embeddings=False,
                rms_norm_eps=1e-6, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    if kind == "qwen3vl":
        config = transformers.Qwen3VLConfig(
            text_config={**text, "head_dim": 16, "rope_scaling": {"rope_type": "default", "mrope_section": [4, 2, 2],
                                                                  "mrope_interleaved": True}},
            vision_config=dict(hidden_size=32, intermediate_size=64, depth=1, num_heads=2, out_hidden_size=64,
                               deepstack_visual_indexes=[0]), tie_word_embeddings=False, bos_token_id=1,
            eos_token_id=2, pad_token_id=0)
        model = transformers.Qwen3VLForConditionalGeneration(config)
    else:
        config = transformers.Qwen2_5_VLConfig(
            text_config={**text, "rope_scaling": {"type": "mrope", "mrope_section": [2, 3, 3]}},
            vision_config=dict(hidden_size=32, intermediate_size=64, depth=1, num_heads=2, out_hidden_size=64,
                               fullatt_block_indexes=[0]), tie_word_embeddings=False, bos_token_id=1, eos_token_id=2,
            pad_token_id=0)
        model = transformers.Qwen2_5_VLForConditionalGeneration(config)
    with torch.no_grad():  # random norms, so that a swapped one would show
        for name, p in model.named_parameters():
            if "norm" in name and "visual" not in name:
                p.copy_(1 + 0.1 * torch.randn_like(p))
    write_hf_dir(tmp_path, model.eval())
    if kind == "qwen2.5vl":
        config = json.loads((tmp_path / "config.json").read_text())
        flat = {**config, **config.pop("text_config"), "model_type": "qwen2_5_vl"}
        flat["rope_scaling"] = {"type": "mrope", "mrope_section": [2, 3, 3]}
        flat.pop("rope_parameters", None)
        (tmp_path / "config.json").write_text(json.dumps(flat))
    return model


@pytest.mark.parametrize("kind", ["qwen2.5vl", "qwen3vl"])
def test_qwen_vision_language_directory_runs_its_text_model(tmp_path, kind):
    """Qwen 2.5-VL and Qwen3-VL directories run Qwen 2's and Qwen 3's text model: on text alone the
    three M-RoPE position streams are one, so RoPE gives the same logits as transformers' M-RoPE."""
    torch.manual_seed(8)
    model = qwen_vl(kind, tmp_path)
    ckpt = load_checkpoint(tmp_path, dtype=torch.float32, device="cpu")
    assert (ckpt.args.qkv_bias, ckpt.args.qk_norm) == ((True, False) if kind == "qwen2.5vl" else (False, True))
    assert not any("visual" in k for k in ckpt.state_dict)
    reference = type(model).from_pretrained(tmp_path).eval()
    tokens = torch.randint(3, VOCAB, (1, 100), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert (build_ours(ckpt)(tokens, None) - reference(input_ids=tokens).logits).abs().max().item() <= 1e-4


def test_weights_quantized_for_transformers_are_refused_in_one_line(tmp_path):
    write_hf_dir(tmp_path, hf_model())
    config = json.loads((tmp_path / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "fp8", "weight_block_size": [128, 128]}
    (tmp_path / "config.json").write_text(json.dumps(config))
    message = error_of(tmp_path)
    assert "weights quantized for transformers ('fp8') are not supported" in message and "\n" not in message


def test_exaone4_layer_pattern_without_layer_types(tmp_path):
    """A config without layer_types: sliding_window_pattern, as a period or as a string of L and G
    (llama.cpp's converter reads both); anything else is one line."""
    write_hf_dir(tmp_path, hf_model("exaone4"))
    config = json.loads((tmp_path / "config.json").read_text())
    del config["layer_types"]
    for pattern, types in ((2, ("sliding", "global") * 2), ("LLGL", ("sliding", "sliding", "global", "sliding"))):
        (tmp_path / "config.json").write_text(json.dumps({**config, "sliding_window_pattern": pattern}))
        a = load_checkpoint(tmp_path, dtype=torch.float32, device="cpu").args
        assert a.layer_types == types and a.nope_layers == tuple(i for i, t in enumerate(types) if t == "global")
    for bad in (0, "LXG", True):
        (tmp_path / "config.json").write_text(json.dumps({**config, "sliding_window_pattern": bad}))
        message = error_of(tmp_path)
        assert "sliding_window_pattern must be an integer >= 1 or a string of L and G" in message, message
        assert "\n" not in message


@pytest.mark.parametrize("arch", ["granite4", "granite4-nope", "granite4-moe"])
def test_granite_4_attention_only_models_match_transformers(tmp_path, arch):
    """GraniteMoeHybridForCausalLM without Mamba layers (granite-4.0-micro, -1b, -350m): Granite's
    multipliers and its shared MLP as the dense one, RoPE or none as position_embedding_type says; with
    experts, GraniteMoeShared's layout. Its Mamba layers are one line."""
    model = hf_model(arch, tie=False, seed=2)
    write_hf_dir(tmp_path, model)
    ckpt = load_checkpoint(tmp_path, dtype=torch.float32, device="cpu")
    a = ckpt.args
    assert (a.embed_scale, a.residual_scale, a.logits_scaling) == (3.0, 0.5, 4.0)
    assert a.nope_layers == ((0, 1) if arch == "granite4-nope" else ())
    assert (a.n_experts, a.shared_expert_dim, a.hidden_dim) == ((4, 48, 32) if arch == "granite4-moe" else (0, 0, 48))
    with torch.no_grad():
        assert (build_ours(ckpt)(TOKENS, None) - model(TOKENS).logits).abs().max().item() <= 1e-4  # measured 3.0e-8
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "layer_types": ["mamba", "attention"]}))
    assert "Granite 4's Mamba layers are not supported" in error_of(tmp_path)


def test_biases_a_family_does_not_have_are_refused(tmp_path):
    for arch, key in (("llama", "attention_bias"), ("llama", "mlp_bias"), ("ernie4_5", "use_bias")):
        write_hf_dir(tmp_path, hf_model(arch))
        config = json.loads((tmp_path / "config.json").read_text())
        (tmp_path / "config.json").write_text(json.dumps({**config, key: True}))
        assert "attention_bias/mlp_bias/use_bias are not supported" in error_of(tmp_path)


def test_mistral_sliding_window_is_read_not_capped(tmp_path):
    write_hf_dir(tmp_path, hf_model("mistral"))
    args = load_checkpoint(tmp_path, dtype=torch.float32, device="cpu").args
    assert (args.max_seq_len, args.sliding_window, args.layer_types) == (128, 64, None)
    assert [args.window(i) for i in range(args.n_layers)] == [64, 64]


def test_gemma3_fields_come_from_the_config(tmp_path):
    write_hf_dir(tmp_path, hf_model("gemma3"))
    a = load_checkpoint(tmp_path, dtype=torch.float32, device="cpu").args
    assert a.layer_types == ("sliding", "global", "sliding") and a.sliding_window == 64
    assert (a.rope_theta, a.rope_local_theta, a.attn_scale) == (10000.0, 100.0, 24 ** -0.5)
    assert (a.activation, a.embed_scale, a.post_norms, a.qk_norm) == ("gelu_tanh", 8.0, True, True)


def test_gemma1_reads_hidden_act_as_transformers_does(tmp_path):
    """Gemma 1's configs name "hidden_act": "gelu" (exact GELU in transformers 5, which reads that key
    alone) beside "hidden_activation": "gelu_pytorch_tanh"."""
    config = hf_config("gemma")
    config.hidden_act = "gelu"
    torch.manual_seed(7)
    model = transformers.GemmaForCausalLM(config).eval()
    write_hf_dir(tmp_path, model)
    saved = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**saved, "hidden_activation": "gelu_pytorch_tanh"}))
    ckpt = load_checkpoint(tmp_path, dtype=torch.float32, device="cpu")
    assert (ckpt.args.activation, ckpt.args.embed_scale, ckpt.args.tie_embeddings) == ("gelu", 8.0, True)
    tokens = torch.randint(3, VOCAB, (1, 40), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert (build_ours(ckpt)(tokens, None) - model(tokens).logits).abs().max().item() <= 1e-4


def test_gemma2_fields_come_from_the_config(tmp_path):
    """Gemma 2's soft-caps and softmax scale from its config (query_pre_attn_scalar 24, not
    head_dim's 16), logits against transformers; a null cap is none, a missing one Gemma2Config's."""
    config = hf_config("gemma2", window=8)
    config.query_pre_attn_scalar = 24
    torch.manual_seed(5)
    model = transformers.Gemma2ForCausalLM(config).eval()
    write_hf_dir(tmp_path, model)
    ckpt = load_checkpoint(tmp_path, dtype=torch.float32, device="cpu")
    a = ckpt.args
    assert a.layer_types == ("sliding", "global") * 2 and a.sliding_window == 8 and a.rope_local_theta is None
    assert (a.attn_scale, a.attn_softcap, a.logit_softcap) == (24 ** -0.5, 0.05, 1.0)
    assert (a.activation, a.embed_scale, a.post_norms, a.qk_norm, a.tie_embeddings) == (
        "gelu_tanh", 8.0, True, False, True)
    tokens = torch.randint(3, VOCAB, (1, 40), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert (build_ours(ckpt)(tokens, None) - model(tokens).logits).abs().max().item() <= 1e-4
    saved = json.loads((tmp_path / "config.json").read_text())
    for changes, caps in (({"final_logit_softcapping": None}, (0.05, 0.0)),
                          ({"attn_logit_softcapping": None, "final_logit_softcapping": None}, (0.0, 0.0))):
        (tmp_path / "config.json").write_text(json.dumps({**saved, **changes}))
        a = load_checkpoint(tmp_path, dtype=torch.float32, device="cpu", use_cache=False).args
        assert (a.attn_softcap, a.logit_softcap) == caps
    (tmp_path / "config.json").write_text(json.dumps({k: v for k, v in saved.items() if "softcapping" not in k}))
    a = load_checkpoint(tmp_path, dtype=torch.float32, device="cpu", use_cache=False).args
    assert (a.attn_softcap, a.logit_softcap) == (50.0, 30.0)


@pytest.mark.parametrize("context", [16, 128])
def test_phi3_longrope_follows_the_context_the_caches_hold(tmp_path, context):
    """Phi-3.5 / Phi-4-mini's LongRoPE: caches no longer than the original context (16) take the
    short factors, longer ones the long factors, as llama.cpp chooses; each against transformers
    on as many tokens (which picks by the sequence's length). 12 of 16 dims rotated."""
    model = hf_model("phi3", tie=False, seed=3)
    write_hf_dir(tmp_path, model)
    ckpt = load_checkpoint(tmp_path, dtype=torch.float32, device="cpu")
    s = ckpt.args.rope_scaling
    assert (ckpt.args.rope_dim, s.kind, s.factor, s.original_max_position_embeddings) == (12, "longrope", 8.0, 16)
    assert abs(s.cos_sin_scale - (1 + math.log(8) / math.log(16)) ** 0.5) < 1e-12
    ours = build_ours(ckpt)
    ours.setup_caches(1, context)
    tokens = torch.randint(3, VOCAB, (1, context), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        got = ours(tokens, torch.arange(context)[None])
        assert (got - model(tokens).logits).abs().max().item() <= 1e-4


def test_phi3_fused_tensor_of_the_wrong_size_is_named(tmp_path):
    write_hf_dir(tmp_path, hf_model("phi3"))
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "intermediate_size": 80}))
    message = error_of(tmp_path)
    assert "model.safetensors: tensor layers.0.feed_forward.w13.weight has 192 rows, but the config makes it 160" \
        in message and "\n" not in message


def test_phi3_window_longer_than_the_context_is_none(tmp_path):
    """Phi-3.5-mini's config names a window of 262,144 over a context of 131,072: no window at all."""
    config = hf_config("phi3")
    config.sliding_window = 256
    write_hf_dir(tmp_path, transformers.Phi3ForCausalLM(config))
    assert load_checkpoint(tmp_path, dtype=torch.float32, device="cpu").args.sliding_window is None


# Sequences longer than the window (8), decoded past it: the engine's cached path
# with its attention kernel against transformers' own generation.
@pytest.mark.parametrize("arch", ["mistral", "gemma3", "qwen3", "qwen2", "smollm3", "granite", "olmo2", "olmo3",
                                  "gemma2", "phi3"])
def test_greedy_tokens_match_transformers_past_the_window(tmp_path, arch):
    import fastdecode

    model = hf_model(arch, tie=arch != "mistral", seed=2, window=8)
    write_hf_dir(tmp_path, model)
    llm = fastdecode.load(str(tmp_path), max_seq_len=128, max_batch_size=3)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, VOCAB, (n,), generator=g).tolist() for n in (5, 13, 30)]
    got = [c.token_ids for c in llm.generate(prompts, max_new_tokens=24, min_new_tokens=24, temperature=0)]
    for prompt, ours in zip(prompts, got):
        with torch.no_grad():
            out = model.generate(torch.tensor([prompt]), max_new_tokens=24, min_new_tokens=24, do_sample=False,
                                 pad_token_id=0)
        assert ours == out[0, len(prompt):].tolist()
    with torch.no_grad():  # and the prefill logits of the longest prompt
        t = torch.tensor([prompts[-1]])
        assert (llm.model(t, None) - model(t).logits).abs().max().item() <= 1e-4


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_a_tying_config_beside_a_head_of_its_own_runs_that_head(tmp_path, arch):
    """tie_word_embeddings true (Gemma's default when left out) with an lm_head.weight in the files that is
    not the embedding, as some fine-tunes save: transformers takes the config to be wrong and runs that head,
    so we do (the head was dropped for the embedding's). A head that is the embedding's copy stays tied."""
    model = hf_model(arch, tie=False, seed=4)
    write_hf_dir(tmp_path, model)
    config = json.loads((tmp_path / "config.json").read_text())
    config["tie_word_embeddings"] = True
    (tmp_path / "config.json").write_text(json.dumps(config))
    reference = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    ckpt = load_checkpoint(tmp_path, dtype=torch.float32, device="cpu")
    assert not ckpt.args.tie_embeddings
    with torch.no_grad():
        assert (build_ours(ckpt)(TOKENS, None) - reference(TOKENS).logits).abs().max().item() <= 1e-4
    assert not load_checkpoint(tmp_path, dtype=torch.float32, device="cpu", weights="int8").args.tie_embeddings
    from safetensors.torch import load_file, save_file

    weights = load_file(tmp_path / "model.safetensors")
    weights["lm_head.weight"] = weights["model.embed_tokens.weight"].clone()  # the embedding twice
    save_file(weights, tmp_path / "model.safetensors", metadata={"format": "pt"})
    ckpt = load_checkpoint(tmp_path, dtype=torch.float32, device="cpu")
    assert ckpt.args.tie_embeddings and "output.weight" not in ckpt.state_dict


def test_sharded_checkpoint(tmp_path):
    model = hf_model("llama", tie=False)
    write_hf_dir(tmp_path, model, max_shard_size="40KB")
    assert (tmp_path / "model.safetensors.index.json").exists()
    assert not (tmp_path / "model.safetensors").exists()
    ckpt = load_checkpoint(tmp_path, dtype=torch.bfloat16, device="cpu")
    assert ckpt.state_dict["layers.1.feed_forward.w2.weight"].dtype == torch.bfloat16
    assert torch.equal(ckpt.state_dict["output.weight"], model.lm_head.weight.detach().to(torch.bfloat16))


def test_tokenizer_settings_come_from_the_directory(tmp_path):
    write_hf_dir(tmp_path, hf_model(), template="<|im_start|> $A")
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 0]}))
    tok = load_checkpoint(tmp_path, dtype=torch.float32, device="cpu").tokenizer
    assert tok.bos_id == 1 and tok.add_bos
    assert tok.eos_ids == frozenset({0, 2})
    assert tok.chat_template is not None and "<|im_start|>" in tok.chat_template
    assert tok.encode("hello")[0] == 1
    assert tok.encode("hello", add_special_tokens=False)[0] != 1


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_num_hidden_layers_past_the_layer_bound(tmp_path, arch):
    """Gemma 3's per-layer list was built from num_hidden_layers before ModelArgs bounded it: 2**40 layers
    ended in a MemoryError after half a minute."""
    write_hf_dir(tmp_path, hf_model(arch))
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 2**40}))
    with pytest.raises(FastDecodeError, match="num_hidden_layers must be 1..4,096, got 1,099,511,627,776"):
        load_checkpoint(tmp_path, dtype=torch.float32, device="cpu")


def test_named_chat_templates_with_odd_entries_are_skipped(tmp_path):
    """Entries of a named-template list whose name is not a string (a list, an object) failed the load with a
    bare 'unhashable type'; like entries that are not objects, they are skipped."""
    entries = [{"name": ["a"], "template": "x"}, {"name": {"b": 1}, "template": "y"}, 5,
               {"name": "default", "template": "{{ messages[0]['content'] }}"}]
    write_hf_dir(tmp_path, hf_model(), tokenizer_config={"chat_template": entries})
    tok = load_checkpoint(tmp_path, dtype=torch.float32, device="cpu").tokenizer
    assert tok.chat_template == "{{ messages[0]['content'] }}"


@pytest.mark.parametrize("name", ["chat_template.jinja", "additional_chat_templates/tool_use.jinja"])
def test_chat_template_file_that_is_not_utf8_is_named(tmp_path, name):
    """A template file with bytes that are not UTF-8 failed with a bare UnicodeDecodeError."""
    write_hf_dir(tmp_path, hf_model())
    (tmp_path / name).parent.mkdir(exist_ok=True)
    (tmp_path / name).write_bytes(b"{{ messages }}\xff")
    with pytest.raises(FastDecodeError, match=f"{name}: not UTF-8 text \\(byte 0xff at offset 14\\)"):
        load_checkpoint(tmp_path, dtype=torch.float32, device="cpu")


@pytest.mark.parametrize("name", ["config.json", "tokenizer_config.json", "generation_config.json"])
def test_json_nested_too_deep_is_a_one_line_error(tmp_path, name):
    """Nesting past Python's recursion limit escaped the JSON readers as a RecursionError."""
    write_hf_dir(tmp_path, hf_model())
    (tmp_path / name).write_text('{"a": ' + "[" * 100_000 + "]" * 100_000 + "}")
    with pytest.raises(FastDecodeError, match=f"{name}: cannot read JSON"):
        load_checkpoint(tmp_path, dtype=torch.float32, device="cpu")


@pytest.mark.parametrize("name, eos", [("generation_config.json", [2, "x"]), ("generation_config.json", [None]),
                                       ("config.json", ["<eos>"]), ("config.json", [2, 1.5])])
def test_eos_token_id_list_with_other_items_is_named(tmp_path, name, eos):
    """A listed end-of-sequence id that is not an integer failed with a bare ValueError or TypeError."""
    write_hf_dir(tmp_path, hf_model())
    config = json.loads((tmp_path / name).read_text()) if (tmp_path / name).is_file() else {}
    (tmp_path / name).write_text(json.dumps({**config, "eos_token_id": eos}))
    with pytest.raises(FastDecodeError, match=f"{name}: eos_token_id must be an integer or a list of integers"):
        load_checkpoint(tmp_path, dtype=torch.float32, device="cpu")


@pytest.mark.parametrize("template,config", [
    (None, {}),
    (None, {"add_bos_token": True}),  # ignored by transformers 5 when tokenizer.json exists
    ("<|im_start|> $A", {}),
    ("<|im_start|> $A <|im_end|>", {"add_bos_token": False}),
])
def test_token_ids_match_transformers(tmp_path, template, config):
    write_hf_dir(tmp_path, hf_model(), tokenizer_config=config, template=template)
    ref = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    tok = load_checkpoint(tmp_path, dtype=torch.float32, device="cpu").tokenizer
    for text in ["hello world", " the  thorn\n\n", "<|im_start|>user\nhé 🤖<|im_end|>", ""]:
        assert tok.encode(text) == ref(text)["input_ids"], text
        assert tok.encode(text, add_special_tokens=False) == ref(text, add_special_tokens=False)["input_ids"]
        ids = tok.encode(text)
        assert tok.decode(ids) == ref.decode(ids, skip_special_tokens=True)
        assert tok.decode(ids, skip_special_tokens=False) == ref.decode(ids, skip_special_tokens=False)


def test_chat_template_file_takes_precedence(tmp_path):
    write_hf_dir(tmp_path, hf_model())
    (tmp_path / "chat_template.jinja").write_text("{{ messages[0]['content'] }}")
    tok = load_checkpoint(tmp_path, dtype=torch.float32, device="cpu").tokenizer
    assert tok.apply_chat_template([{"role": "user", "content": "x"}]) == "x"


TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}]


@pytest.mark.parametrize("where", ["config list", "additional file"])
def test_tool_use_template_for_chats_with_tools(tmp_path, where):
    """A checkpoint with a "tool_use" template (Hermes 2 Pro and 3 have one) renders chats that
    offer tools with it and others with the default, as transformers chooses."""
    default, tool_use = "plain:{{ messages[0]['content'] }}", "tools:{{ tools | length }}:{{ messages[0]['content'] }}"
    if where == "config list":
        write_hf_dir(tmp_path, hf_model(), tokenizer_config={"chat_template": [
            {"name": "default", "template": default}, {"name": "tool_use", "template": tool_use}]})
    else:  # as transformers 5 saves them
        write_hf_dir(tmp_path, hf_model())
        (tmp_path / "chat_template.jinja").write_text(default)
        (tmp_path / "additional_chat_templates").mkdir()
        (tmp_path / "additional_chat_templates" / "tool_use.jinja").write_text(tool_use)
    tok = load_checkpoint(tmp_path, dtype=torch.float32, device="cpu").tokenizer
    ref = transformers.AutoTokenizer.from_pretrained(tmp_path)
    chat = [{"role": "user", "content": "x"}]
    for tools in (None, TOOLS):
        ours = tok.apply_chat_template(chat, tools=tools)
        assert ours == ref.apply_chat_template(chat, tools=tools, tokenize=False)
        assert ours == ("plain:x" if tools is None else "tools:1:x")


# --- bad input ----------------------------------------------------------------------------------

def error_of(path):
    with pytest.raises(FastDecodeError) as info:
        load_checkpoint(path, dtype=torch.float32, device="cpu")
    assert "\n" not in str(info.value)
    return str(info.value)


def test_missing_config(tmp_path):
    assert "no config.json" in error_of(tmp_path)


def test_unsupported_architecture(tmp_path):
    write_hf_dir(tmp_path, hf_model())
    config = json.loads((tmp_path / "config.json").read_text())
    config["architectures"] = ["GPT2LMHeadModel"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    message = error_of(tmp_path)
    assert "unsupported architecture 'GPT2LMHeadModel'" in message and "Qwen2ForCausalLM" in message


@pytest.mark.parametrize("shard", ["../model.safetensors", "/etc/hostname", "sub/model.safetensors",
                                   "model-00001-of-00001.bin"])
def test_index_shards_are_files_beside_it(tmp_path, shard):
    """An index naming a shard in another folder read that file (any file on the machine), and a .bin
    shard of a safetensors index unpickled it."""
    write_hf_dir(tmp_path / "m", hf_model())
    (tmp_path / "model.safetensors").write_bytes((tmp_path / "m" / "model.safetensors").read_bytes())
    (tmp_path / "m" / "sub").mkdir()
    (tmp_path / "m" / "sub" / "model.safetensors").write_bytes((tmp_path / "model.safetensors").read_bytes())
    (tmp_path / "m" / "model-00001-of-00001.bin").write_bytes(b"")
    (tmp_path / "m" / "model.safetensors").unlink()
    index = {"weight_map": {"model.embed_tokens.weight": shard}}
    (tmp_path / "m" / "model.safetensors.index.json").write_text(json.dumps(index))
    assert f"shard {shard!r} is not a .safetensors file name beside the index" in error_of(tmp_path / "m")


def test_integer_weights_are_refused(tmp_path):
    """An int32 tensor (a quantizer's packed words without its config, say) was cast to float: garbage
    weights that loaded and generated."""
    from safetensors.torch import load_file, save_file

    write_hf_dir(tmp_path, hf_model())
    state = load_file(tmp_path / "model.safetensors")
    name = "model.layers.0.self_attn.q_proj.weight"
    state[name] = state[name].view(torch.int32)
    save_file(state, tmp_path / "model.safetensors")
    assert f"tensor '{name}' is int32; expected floating-point weights" in error_of(tmp_path)


def test_missing_weights(tmp_path):
    write_hf_dir(tmp_path, hf_model())
    (tmp_path / "model.safetensors").unlink()
    assert "no model.safetensors" in error_of(tmp_path)


def test_pytorch_bin_weights_load_as_safetensors_do(tmp_path):
    """Older repositories hold pytorch_model.bin alone (or sharded with its index): read with
    weights_only (no code runs); a file that is not tensors, or truncated, is one line."""
    model = hf_model(tie=False)
    write_hf_dir(tmp_path, model)
    (tmp_path / "model.safetensors").unlink()
    state = {k: v.clone() for k, v in model.state_dict().items()}
    torch.save(state, tmp_path / "pytorch_model.bin")
    ckpt = load_checkpoint(tmp_path, dtype=torch.float32, device="cpu")
    with torch.no_grad():
        assert (build_ours(ckpt)(TOKENS, None) - model(TOKENS).logits).abs().max().item() <= 1e-4
    # torch.save's format before PyTorch 1.6, which older repositories' files are in (failed: not mmap-able)
    torch.save(state, tmp_path / "pytorch_model.bin", _use_new_zipfile_serialization=False)
    with torch.no_grad():
        assert (build_ours(load_checkpoint(tmp_path, dtype=torch.float32))(TOKENS, None)
                - model(TOKENS).logits).abs().max().item() <= 1e-4
    (tmp_path / "pytorch_model.bin").unlink()  # two shards and their index
    names = sorted(state)
    halves = {"pytorch_model-00001-of-00002.bin": names[::2], "pytorch_model-00002-of-00002.bin": names[1::2]}
    for file, keys in halves.items():
        torch.save({k: state[k] for k in keys}, tmp_path / file)
    index = {"weight_map": {k: file for file, keys in halves.items() for k in keys}}
    (tmp_path / "pytorch_model.bin.index.json").write_text(json.dumps(index))
    assert (build_ours(load_checkpoint(tmp_path, dtype=torch.float32))(TOKENS, None)
            - model(TOKENS).logits).abs().max().item() <= 1e-4
    torch.save({"not": "tensors"}, tmp_path / "pytorch_model-00002-of-00002.bin")
    assert "not a state dict of named tensors" in error_of(tmp_path)
    data = (tmp_path / "pytorch_model-00001-of-00002.bin").read_bytes()
    (tmp_path / "pytorch_model-00001-of-00002.bin").write_bytes(data[: len(data) // 2])
    assert "cannot read a PyTorch weights file" in error_of(tmp_path)
    (tmp_path / "pytorch_model-00001-of-00002.bin").write_bytes(b"not a checkpoint" * 64)
    message = error_of(tmp_path)  # torch's own first line advised weights_only=False
    assert "cannot read a PyTorch weights file (weights_only unpickling refused it: Unsupported operand" in message
    assert "weights_only` set to `False`" not in message


def test_truncated_safetensors(tmp_path):
    write_hf_dir(tmp_path, hf_model())
    data = (tmp_path / "model.safetensors").read_bytes()
    (tmp_path / "model.safetensors").write_bytes(data[: len(data) // 2])
    assert "cannot read safetensors" in error_of(tmp_path)


def test_missing_tokenizer(tmp_path):
    write_hf_dir(tmp_path, hf_model())
    (tmp_path / "tokenizer.json").unlink()
    assert "no tokenizer.json" in error_of(tmp_path)


def test_tokenizer_vocabulary_larger_than_model(tmp_path):
    write_hf_dir(tmp_path, hf_model(vocab_size=VOCAB - 10))
    assert f"tokenizer has {VOCAB} tokens but the model's vocabulary is {VOCAB - 10}" in error_of(tmp_path)


def test_llama3_rope_scaling_matches_transformers(tmp_path):
    import transformers as tf

    torch.manual_seed(0)
    config = tf.LlamaConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=True,
        rope_scaling={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 32})
    model = tf.LlamaForCausalLM(config).eval()
    write_hf_dir(tmp_path, model)
    ckpt = load_checkpoint(tmp_path, dtype=torch.float32, device="cpu")
    s = ckpt.args.rope_scaling
    assert (s.factor, s.low_freq_factor, s.high_freq_factor, s.original_max_position_embeddings) == (8, 1, 4, 32)
    assert ckpt.args.rope_theta == 500000.0
    tokens = torch.randint(0, VOCAB, (1, 40), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        diff = (build_ours(ckpt)(tokens, None) - model(tokens).logits).abs().max().item()
    assert diff <= 1e-4


def test_rope_scaling_beside_rope_parameters_wins_as_in_transformers(tmp_path):
    """A config saved by transformers 5 (rope_parameters, default RoPE) with a rope_scaling
    added by hand: transformers applies the added scaling, and so do we."""
    import transformers as tf

    write_hf_dir(tmp_path, hf_model())
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["rope_parameters"]["rope_type"] == "default"
    config["rope_scaling"] = {"rope_type": "linear", "factor": 4.0}
    (tmp_path / "config.json").write_text(json.dumps(config))
    theirs = tf.AutoConfig.from_pretrained(tmp_path).rope_parameters
    ckpt = load_checkpoint(tmp_path, dtype=torch.float32, device="cpu")
    s = ckpt.args.rope_scaling
    assert (theirs["rope_type"], theirs["factor"]) == ("linear", 4.0)
    assert (s.kind, s.factor, ckpt.args.rope_theta) == ("linear", 4.0, theirs["rope_theta"])


def test_sliding_window_larger_than_the_context_is_the_context(tmp_path):
    """transformers attends to every position then, as a window of the context does."""
    write_hf_dir(tmp_path, hf_model("mistral"))
    config = json.loads((tmp_path / "config.json").read_text())
    config["sliding_window"] = 4096
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert load_checkpoint(tmp_path, dtype=torch.float32, device="cpu").args.sliding_window == 128


def test_qwen_window_applies_only_when_enabled(tmp_path):
    write_hf_dir(tmp_path, hf_model("qwen2"))
    config = json.loads((tmp_path / "config.json").read_text())
    config.update(sliding_window=32, use_sliding_window=False, max_window_layers=1)
    config.pop("layer_types", None)
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert load_checkpoint(tmp_path, dtype=torch.float32, device="cpu").args.sliding_window is None
    config["use_sliding_window"] = True  # layers from max_window_layers on slide, as in transformers
    (tmp_path / "config.json").write_text(json.dumps(config))
    args = load_checkpoint(tmp_path, dtype=torch.float32, device="cpu").args
    assert (args.sliding_window, args.layer_types) == (32, ("global", "sliding"))


def test_unsupported_rope_scaling(tmp_path):
    write_hf_dir(tmp_path, hf_model())
    config = json.loads((tmp_path / "config.json").read_text())
    config.pop("rope_parameters", None)
    config["rope_scaling"] = {"rope_type": "dynamic", "factor": 4.0}
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert "RoPE scaling 'dynamic' is not supported; supported: default, llama3, linear, yarn, longrope" in error_of(tmp_path)


@pytest.mark.parametrize("arch, scaling", [
    # What Qwen's model cards tell users to add to config.json for long prompts.
    ("qwen3", {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16}),
    ("qwen2", {"type": "yarn", "factor": 2.0, "original_max_position_embeddings": 24, "beta_fast": 8}),
    # DeepSeek-style mscales, and no original context (the config's is used).
    ("llama", {"rope_type": "yarn", "factor": 8.0, "mscale": 0.8, "mscale_all_dim": 0.5}),
])
def test_yarn_rope_scaling_matches_transformers(tmp_path, arch, scaling):
    """Logits past the original context against transformers on the same directory."""
    write_hf_dir(tmp_path, hf_model(arch))
    config = json.loads((tmp_path / "config.json").read_text())
    config["rope_scaling"] = scaling
    (tmp_path / "config.json").write_text(json.dumps(config))
    theirs = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    assert theirs.model.rotary_emb.attention_scaling != 1.0
    ckpt = load_checkpoint(tmp_path, dtype=torch.float32, device="cpu")
    assert ckpt.args.rope_scaling.kind == "yarn"
    tokens = torch.randint(0, VOCAB, (1, 100), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = theirs(tokens).logits
        diff = (build_ours(ckpt)(tokens, None) - ref).abs().max().item()
    assert diff <= 1e-4 * ref.abs().max().item()


def test_yarn_stretches_the_declared_context(tmp_path):
    """Qwen 3's config keeps max_position_embeddings 40,960 beside YaRN's factor 4 over 32,768:
    the model runs 131,072 positions."""
    write_hf_dir(tmp_path, hf_model("qwen3"))
    config = json.loads((tmp_path / "config.json").read_text())
    config["max_position_embeddings"] = 40960
    config["rope_scaling"] = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert load_checkpoint(tmp_path, dtype=torch.float32, device="cpu").args.max_seq_len == 131072
    config["rope_scaling"] = {"rope_type": "yarn", "factor": 1.0, "original_max_position_embeddings": 32768}
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert load_checkpoint(tmp_path, dtype=torch.float32, device="cpu").args.max_seq_len == 40960


@pytest.mark.parametrize("change, expected", [
    ({"num_attention_heads": float("inf")}, "num_attention_heads must be an integer, got inf"),
    ({"hidden_size": 64.5}, "hidden_size must be an integer, got 64.5"),
    ({"max_position_embeddings": True}, "max_position_embeddings must be an integer, got True"),
    ({"max_position_embeddings": 10**9}, "max_seq_len must be at most 16,777,216"),
    ({"num_hidden_layers": 10**9}, "num_hidden_layers must be 1..4,096, got 1,000,000,000"),
    ({"rms_norm_eps": "x"}, "rms_norm_eps must be a finite number, got 'x'"),
    ({"rope_parameters": 7}, "rope_parameters must be an object, got 7"),
    ({"hidden_act": ["silu"]}, "hidden activation ['silu'] is not supported"),
    ({"tie_word_embeddings": "yes"}, "tie_word_embeddings must be true or false, got 'yes'"),
    ({"architectures": ["GraniteForCausalLM"], "logits_scaling": 0}, "logits_scaling must be > 0, got 0.0"),
    ({"architectures": ["GraniteForCausalLM"], "residual_multiplier": "half"},
     "residual_multiplier must be a finite number, got 'half'"),
    ({"architectures": ["SmolLM3ForCausalLM"], "no_rope_layers": [1, 2]},
     "no_rope_layers must list 0 or 1 for each of the 2 layers, got [1, 2]"),
    ({"architectures": ["SmolLM3ForCausalLM"], "no_rope_layer_interval": 0}, "no_rope_layer_interval must be >= 1"),
    ({"architectures": ["Gemma3ForConditionalGeneration"], "text_config": [1]}, "text_config must be an object"),
    ({"architectures": ["Gemma3ForConditionalGeneration"]}, "a Gemma3ForConditionalGeneration config needs text_config"),
    ({"architectures": ["Mistral3ForConditionalGeneration"], "text_config": {"model_type": "llama"}},
     "a Mistral3ForConditionalGeneration with a 'llama' text model is not supported; supported: mistral, ministral3"),
    ({"rope_scaling": {"rope_type": "longrope", "short_factor": [1.0] * 8, "long_factor": [2.0] * 7,
                       "original_max_position_embeddings": 16}},
     "short_factor and long_factor must be as long as each other, got 8 and 7"),
    ({"rope_scaling": {"rope_type": "longrope", "short_factor": [1.0] * 6, "long_factor": [2.0] * 6,
                       "original_max_position_embeddings": 16}}, "factors must be one per frequency (8), got 6"),
    ({"rope_scaling": {"rope_type": "longrope", "short_factor": "1", "long_factor": [2.0] * 8,
                       "original_max_position_embeddings": 16}}, "rope short_factor must be a list of numbers"),
    ({"rope_scaling": {"rope_type": "longrope", "short_factor": [0.0] * 8, "long_factor": [2.0] * 8,
                       "original_max_position_embeddings": 16}}, "short_factor must be a list of numbers > 0"),
    ({"rope_scaling": {"rope_type": "longrope", "short_factor": [1.0] * 8, "long_factor": [2.0] * 8}},
     "rope scaling is missing 'original_max_position_embeddings'"),
    ({"partial_rotary_factor": 1.5}, "partial_rotary_factor must be in (0, 1], got 1.5"),
    ({"partial_rotary_factor": 0.01}, "rope_dim must be an even integer from 2 to head_dim (16), got 0"),
], ids=["inf heads", "float dim", "bool positions", "1e9 positions", "1e9 layers", "str eps", "int rope",
        "list act", "str tie", "zero logits scaling", "str residual", "bad nope flags", "zero nope interval",
        "list text config", "no text config", "other text model", "longrope lengths", "longrope per frequency",
        "longrope str factors", "longrope zero factor", "longrope no original", "partial rotary 1.5",
        "partial rotary tiny"])
def test_config_values_of_the_wrong_type_or_size(tmp_path, change, expected):
    """Each gets the one-line error naming the key (they raised OverflowError, AttributeError,
    TypeError, or went on to allocate a billion layers or RoPE positions)."""
    write_hf_dir(tmp_path, hf_model())
    config = json.loads((tmp_path / "config.json").read_text())
    config.update(change)
    (tmp_path / "config.json").write_text(json.dumps(config))
    message = error_of(tmp_path)
    assert expected in message and "\n" not in message
