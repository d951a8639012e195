"""GGUF files of the Gemma 1, 2 and 3, Qwen 3, Ministral 3, SmolLM3, Granite, OLMo 2, EXAONE 4, GLM 4,
Phi-3 and Qwen-VL architectures, written by the tests from random transformers models, against those
models (and llama.cpp, where installed); ERNIE 4.5 and Cohere's too; and their bad input."""

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as T

import fastdecode
from fastdecode.checkpoints import load_checkpoint
from fastdecode.errors import FastDecodeError
from tiny_checkpoints import private_cache  # noqa: F401  (autouse fixture)
from tiny_checkpoints import VOCAB, gguf_tensors, hf_config, hf_model, write_gguf
from conftest import need_llama_cpp
from fastdecode.evaluation.perplexity import llama_cpp_available

transformers = pytest.importorskip("transformers")

# What llama.cpp's converter writes for the tiny Gemma 3 of tiny_checkpoints (window 8):
# layer 1 global, the others sliding; RoPE base 100 on the sliding layers; the softmax
# scale from query_pre_attn_scalar = 24.
GEMMA3_META = {
    "gemma3.attention.sliding_window": 8,
    "gemma3.attention.sliding_window_pattern": [True, False, True],
    "gemma3.rope.freq_base_swa": 100.0,
    "gemma3.attention.scale": 24 ** -0.5,
}


def write_gemma3(path, model, meta=GEMMA3_META, **kwargs):
    return write_gguf(path, gguf_tensors(model, arch="gemma3"), arch="gemma3", n_layers=3, extra=meta, **kwargs)


def logits_diff(ckpt, model, tokens, context=None):
    """Our model's logits against transformers'; context: through caches of that many positions
    (LongRoPE takes its long factors past the original context, as transformers does for `tokens`)."""
    from fastdecode.quant import build_model

    ours = build_model(ckpt.args, ckpt.state_dict, torch.float32)[0].eval()
    with torch.no_grad():
        if context is None:
            got = ours(tokens, None)
        else:
            ours.setup_caches(1, context)
            got = ours(tokens, torch.arange(tokens.shape[1])[None])
        return (got - model(tokens).logits).abs().max().item()


TOKENS = torch.randint(3, VOCAB, (1, 30), generator=torch.Generator().manual_seed(0))  # past the window of 8


def test_gemma3_gguf_matches_the_transformers_model(tmp_path):
    model = hf_model("gemma3", seed=4, window=8)
    ckpt = load_checkpoint(write_gemma3(tmp_path / "g.gguf", model), dtype=torch.float32, use_cache=False)
    a = ckpt.args
    assert (a.sliding_window, a.layer_types, a.rope_local_theta) == (8, ("sliding", "global", "sliding"), 100.0)
    assert (a.qk_norm, a.post_norms, a.activation, a.embed_scale) == (True, True, "gelu_tanh", 8.0)
    assert abs(a.attn_scale - 24 ** -0.5) < 1e-7 and a.tie_embeddings
    assert logits_diff(ckpt, model, TOKENS) <= 1e-4


def test_gemma3_defaults_when_the_file_omits_them(tmp_path):
    """llama.cpp's files carry the window only: every sixth layer global, local base
    10000, scale 1/sqrt(head_dim), as transformers assumes for them."""
    model = hf_model("gemma3", seed=4, window=8)
    path = write_gemma3(tmp_path / "g.gguf", model, meta={"gemma3.attention.sliding_window": 8})
    a = load_checkpoint(path, dtype=torch.float32, use_cache=False).args
    assert a.layer_types == ("sliding",) * 3 and a.rope_local_theta == 10000.0 and a.attn_scale == 16 ** -0.5


def test_gemma3_gguf_quantized_runs_the_engine_past_the_window(tmp_path):
    """Q8_0/Q4_0 matrices (packed for the kernels) through the engine's cache equal the
    cache-free forward of the same model: prompt longer than the window, decoded past it."""
    model = hf_model("gemma3", seed=5, window=8)
    tensors = gguf_tensors(model, arch="gemma3")
    quant = {n: (T.Q8_0 if "attn" in n else T.Q4_0) for n, a in tensors.items() if a.ndim == 2}
    path = write_gguf(tmp_path / "q.gguf", tensors, arch="gemma3", n_layers=3, extra=GEMMA3_META, quant=quant)
    # float32 KV, as the cache-free forward keeps k/v
    llm = fastdecode.load(str(path), max_seq_len=128, max_batch_size=2, kv_dtype="float32")
    assert "Q8_0->q8" in llm.weights_summary and "Q4_0->q4s" in llm.weights_summary
    prompt = TOKENS[0].tolist()
    got = llm.generate([prompt], max_new_tokens=16, min_new_tokens=16, temperature=0)[0].token_ids
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(16):
            ids.append(int(llm.model(torch.tensor([ids]), None)[0, -1].argmax()))
    assert got == ids[len(prompt):]


def test_qwen3_gguf_has_qk_norm(tmp_path):
    model = hf_model("qwen3", seed=6)
    tensors = gguf_tensors(model, arch="qwen3")
    assert "blk.0.attn_q_norm.weight" in tensors
    path = write_gguf(tmp_path / "q3.gguf", tensors, arch="qwen3", head_dim=24)
    ckpt = load_checkpoint(path, dtype=torch.float32, use_cache=False)
    assert ckpt.args.qk_norm and not ckpt.args.qkv_bias and ckpt.args.head_dim == 24
    assert logits_diff(ckpt, model, TOKENS) <= 1e-4


def write_vl_text(path, kind, seed=6):
    """tiny_checkpoints' Qwen 2 or Qwen 3 as the text model of a Qwen2-VL or Qwen3-VL GGUF (arch qwen2vl
    or qwen3vl, M-RoPE sections over the rotary pairs, Qwen3-VL's deepstack count), and the model."""
    text = {"qwen2vl": "qwen2", "qwen3vl": "qwen3"}[kind]
    model = hf_model(text, seed=seed)
    head_dim = 24 if text == "qwen3" else 16
    sections = [4, 4, 4, 0] if text == "qwen3" else [2, 3, 3, 0]
    extra = {f"{kind}.rope.dimension_sections": sections, f"{kind}.n_deepstack_layers": 3,
             f"{kind}.attention.value_length": head_dim}
    return write_gguf(path, gguf_tensors(model, arch=text), arch=kind, head_dim=head_dim, extra=extra), model


@pytest.mark.parametrize("kind", ["qwen2vl", "qwen3vl"])
def test_vision_language_ggufs_run_their_text_model(tmp_path, kind):
    """Qwen2-VL's and Qwen3-VL's GGUFs (the image encoder is another file) run as Qwen 2 and Qwen 3: on
    text, M-RoPE's three position streams are one, so it is RoPE; against transformers, and Qwen3-VL's
    against llama.cpp where installed (measured 2.5e-4 apart). (llama.cpp's qwen2vl reads no RMSNorm
    epsilon, so it runs this file with none: 5.0e-3 from its own qwen2 on the same weights, and from ours.)"""
    path, model = write_vl_text(tmp_path / "vl.gguf", kind)
    ckpt = load_checkpoint(path, dtype=torch.float32, use_cache=False)
    assert (ckpt.args.qk_norm, ckpt.args.qkv_bias) == ((True, False) if kind == "qwen3vl" else (False, True))
    assert logits_diff(ckpt, model, TOKENS) <= 1e-4
    if kind == "qwen3vl" and llama_cpp_available():
        ours, theirs = ours_and_llama_cpps_logits(path)
        assert (ours - theirs).abs().max().item() <= 1e-3


def test_m_rope_that_is_not_rope_on_text_is_named(tmp_path):
    model = hf_model("qwen3", seed=6)
    for sections in ([4, 4, 3, 0], [4, 4, 2, 2]):
        path = write_gguf(tmp_path / "vl.gguf", gguf_tensors(model, arch="qwen3"), arch="qwen3vl", head_dim=24,
                          extra={"qwen3vl.rope.dimension_sections": sections})
        one_line_error(path, r"qwen3vl.rope.dimension_sections \[4, 4, \d, \d\] is not three sections covering "
                             r"the 12 rotary pairs")


# What llama.cpp's converter writes for tiny_checkpoints' Ministral 3 (YaRN over 16 positions, the
# queries' scale by position).
MINISTRAL3_META = {"mistral3.rope.scaling.type": "yarn", "mistral3.rope.scaling.factor": 4.0,
                   "mistral3.rope.scaling.original_context_length": 16,
                   "mistral3.rope.scaling.yarn_log_multiplier": 1.0, "mistral3.attention.temperature_scale": 0.5}


def qwen3_with_yarn(seed=6):
    """A tiny Qwen 3 with YaRN (factor 4 over an original context of 16), as a transformers
    model and as the GGUF llama.cpp's converter writes of it."""
    model = hf_model("qwen3", seed=seed)
    model.config.rope_parameters = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                                    "original_max_position_embeddings": 16}
    model.model.rotary_emb = type(model.model.rotary_emb)(config=model.config)
    meta = {"qwen3.rope.scaling.type": "yarn", "qwen3.rope.scaling.factor": 4.0,
            "qwen3.rope.scaling.original_context_length": 16}
    return model, meta


def test_qwen3_gguf_with_yarn_matches_the_transformers_model(tmp_path):
    model, meta = qwen3_with_yarn()
    assert model.model.rotary_emb.attention_scaling != 1.0
    path = write_gguf(tmp_path / "q3.gguf", gguf_tensors(model, arch="qwen3"), arch="qwen3", head_dim=24, extra=meta)
    ckpt = load_checkpoint(path, dtype=torch.float32, use_cache=False)
    s = ckpt.args.rope_scaling
    assert (s.kind, s.factor, s.original_max_position_embeddings, s.beta_fast, s.beta_slow) == ("yarn", 4, 16, 32, 1)
    tokens = torch.randint(3, VOCAB, (1, 100), generator=torch.Generator().manual_seed(0))  # past 16 and 64
    assert logits_diff(ckpt, model, tokens) <= 1e-4


# What llama.cpp's converter writes for tiny_checkpoints' Granite (its multipliers).
GRANITE_META = {"granite.embedding_scale": 3.0, "granite.residual_scale": 0.5, "granite.attention.scale": 0.3,
                "granite.logit_scale": 4.0}


# OLMo 3 as llama.cpp's converter writes it: an olmo2 file with a window (the tiny model's 8, its
# layers 0-2 sliding). Real OLMo 3 files give both kinds of layer one RoPE base, as here: llama.cpp's
# graph uses the global base on sliding layers too, whatever rope.freq_base_swa says.
OLMO3_META = {"olmo2.attention.sliding_window": 8, "olmo2.rope.freq_base_swa": 10000.0}
# Gemma 2 as llama.cpp's converter writes it (tiny_checkpoints' caps, a window of 8; no layer
# pattern or scale: llama.cpp assumes every other layer sliding and 1/sqrt(head_dim)).
GEMMA2_META = {"gemma2.attention.sliding_window": 8, "gemma2.attn_logit_softcapping": 0.05,
               "gemma2.final_logit_softcapping": 1.0}
# Phi-3 as llama.cpp's converter writes it: 12 of 16 dims rotated, LongRoPE's factors as tensors,
# its attention factor sqrt(1 + ln(128 / 16) / ln(16)).
PHI3_META = {"phi3.rope.dimension_count": 12, "phi3.rope.scaling.original_context_length": 16,
             "phi3.rope.scaling.attn_factor": (1 + np.log(8) / np.log(16)) ** 0.5, "phi3.attention.sliding_window": 0}
OLMO3_YARN = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 16}
OLMO3_YARN_META = {**OLMO3_META, "olmo2.rope.scaling.type": "yarn", "olmo2.rope.scaling.factor": 4.0,
                   "olmo2.rope.scaling.original_context_length": 16}


def exaone4_64(seed=3):
    """EXAONE 4 with 64 layers, which llama.cpp runs sliding (a window of 8), every fourth layer global."""
    import transformers

    config = hf_config("exaone4", tie=False, window=8)
    config.num_hidden_layers, config.layer_types = 64, None
    config.__post_init__()  # the default layer types for 64 layers
    torch.manual_seed(seed)
    return transformers.Exaone4ForCausalLM(config).eval()


def write_family(path, family, seed=3):
    """tiny_checkpoints' model of `family` as llama.cpp's converter writes it, and the model
    (family "olmo3-yarn": OLMo 3 with YaRN on its global layer; "exaone4-64": exaone4_64())."""
    olmo = family.startswith("olmo")
    if family == "exaone4-64":
        model = exaone4_64(seed)
    else:  # llama.cpp's OLMo reads an untied head
        model = hf_model(family.removesuffix("-yarn"), seed=seed, tie=not olmo, window=8)
    if family == "olmo3-yarn":
        model.config.rope_parameters["full_attention"] = dict(OLMO3_YARN)
        model.model.rotary_emb = type(model.model.rotary_emb)(config=model.config)
    arch, extra = {"ministral3": ("mistral3", MINISTRAL3_META), "smollm3": ("smollm3", {}),
                   "gemma": ("gemma", {}), "gemma2": ("gemma2", GEMMA2_META), "phi3": ("phi3", PHI3_META),
                   "granite": ("granite", GRANITE_META), "olmo2": ("olmo2", {}), "olmo3": ("olmo2", OLMO3_META),
                   "olmo3-yarn": ("olmo2", OLMO3_YARN_META), "exaone4-global": ("exaone4", {}),
                   "exaone4-64": ("exaone4", {"exaone4.attention.sliding_window": 8}),
                   "glm4": ("glm4", {"glm4.rope.dimension_count": 8}), "ernie4_5": ("ernie4_5", {}),
                   "cohere": ("command-r", {"command-r.logit_scale": 0.5,
                                            "command-r.attention.layer_norm_epsilon": 1e-5}),
                   "cohere2": ("cohere2", {"cohere2.logit_scale": 0.5, "cohere2.attention.layer_norm_epsilon": 1e-5,
                                           "cohere2.attention.sliding_window": 8})}[family]
    names = ("olmo2" if olmo else "exaone4" if family.startswith("exaone4")
             else family if family in ("gemma", "gemma2", "phi3", "glm4", "ernie4_5", "cohere", "cohere2") else "llama")
    tensors = gguf_tensors(model, names)
    if family == "phi3":
        rope = model.config.rope_parameters
        tensors["rope_factors_short.weight"] = np.array(rope["short_factor"], dtype=np.float32)
        tensors["rope_factors_long.weight"] = np.array(rope["long_factor"], dtype=np.float32)
    return write_gguf(path, tensors, arch=arch,
                      n_layers=model.config.num_hidden_layers, extra=extra), model


@pytest.mark.parametrize("family", ["smollm3", "granite", "olmo2", "olmo3", "olmo3-yarn", "gemma", "gemma2", "phi3",
                                    "exaone4-global", "exaone4-64", "glm4", "ernie4_5", "cohere", "cohere2"])
def test_smollm3_granite_olmo_gemma_and_phi3_ggufs_match_the_transformers_model(tmp_path, family):
    path, model = write_family(tmp_path / "m.gguf", family)
    a = load_checkpoint(path, dtype=torch.float32, use_cache=False).args
    if family == "smollm3":
        assert a.nope_layers == (3,)
    elif family.startswith("olmo"):
        assert a.qk_norm_full and not a.pre_norms and a.post_norms
        if family != "olmo2":
            assert a.layer_types == ("sliding",) * 3 + ("global",) and a.sliding_window == 8
            assert (a.rope_theta, a.rope_local_theta) == (10000.0, 10000.0)
            assert (a.rope_scaling is not None) is (family == "olmo3-yarn")
    elif family.startswith("cohere"):  # LayerNorm, the parallel block, logits times 0.5
        assert (a.norm, a.parallel_block, a.logits_scaling) == ("layer", True, 2.0)
        assert (a.layer_types, a.nope_layers) == ((("sliding",) * 3 + ("global",), (3,)) if family == "cohere2"
                                                  else (None, ()))
    elif family == "ernie4_5":  # Llama's fields; its rows in pairs, reordered at load
        assert (a.qkv_bias, a.qk_norm, a.rope_dim, a.post_norms) == (False, False, None, False)
    elif family == "glm4":
        assert a.rope_dim == 8 and a.qkv_bias and a.post_norms and a.pre_norms and not a.qk_norm
    elif family.startswith("exaone4"):
        assert a.qk_norm and not a.qk_norm_full and not a.pre_norms and a.post_norms
        globals_ = tuple(range(3, 64, 4)) if family == "exaone4-64" else ()
        assert a.nope_layers == globals_ and (a.sliding_window == 8) is (family == "exaone4-64")
    elif family == "phi3":
        assert a.rope_dim == 12 and a.rope_scaling.kind == "longrope" and a.sliding_window is None
        assert a.rope_scaling.original_max_position_embeddings == 16
    elif family == "gemma":
        assert (a.activation, a.embed_scale, a.post_norms, a.tie_embeddings) == ("gelu_tanh", 8.0, False, True)
    elif family == "gemma2":
        assert a.layer_types == ("sliding", "global") * 2 and a.sliding_window == 8 and a.rope_local_theta is None
        assert (a.attn_softcap, a.logit_softcap, a.attn_scale, a.embed_scale) == pytest.approx((0.05, 1.0, 0.25, 8.0))
        assert a.post_norms and not a.qk_norm and a.tie_embeddings
    else:
        assert (a.embed_scale, a.residual_scale, a.logits_scaling) == (3.0, 0.5, 4.0)
        assert abs(a.attn_scale - 0.3) < 1e-7 and a.nope_layers == ()
    tokens = torch.randint(3, VOCAB, (1, 100), generator=torch.Generator().manual_seed(0))
    ckpt = load_checkpoint(path, dtype=torch.float32, use_cache=False)
    assert logits_diff(ckpt, model, tokens, context=128 if family == "phi3" else None) <= 1e-4
    if family == "phi3":  # within the original context: the short factors
        assert logits_diff(ckpt, model, tokens[:, :16]) <= 1e-4


def test_hunyuan_dense_gguf_matches_transformers_and_llama_cpp(tmp_path):
    """Hunyuan's QK-norm after RoPE, and its NTK-alpha base as llama.cpp's converter writes it (the scaled
    freq_base). Measured 2.4e-7 from transformers (QK-norm before RoPE: 2.0e-2), 1.7e-4 from llama.cpp."""
    model = hf_model("hunyuan", seed=3)
    theta = 10000.0 * 1000.0 ** (16 / 14)
    path = write_gguf(tmp_path / "h.gguf", gguf_tensors(model, "hunyuan"), arch="hunyuan-dense", rope_theta=theta)
    ckpt = load_checkpoint(path, dtype=torch.float32, use_cache=False)
    assert ckpt.args.qk_norm_after_rope and ckpt.args.rope_theta == pytest.approx(theta, rel=1e-6)
    assert logits_diff(ckpt, model, TOKENS) <= 1e-4
    if llama_cpp_available():
        ours, theirs = ours_and_llama_cpps_logits(path)
        assert (ours - theirs).abs().max().item() <= 1e-3


def test_granite_4_files_list_their_kv_heads_per_layer(tmp_path):
    """llama.cpp's converter writes Granite 4's attention-only models (granite-4.0-micro, -1b, -350m) as
    granite files whose head_count_kv is a list, one equal count per layer."""
    model = hf_model("granite")
    path = write_gguf(tmp_path / "g.gguf", gguf_tensors(model), arch="granite", extra=GRANITE_META, n_kv_heads=[2, 2])
    ckpt = load_checkpoint(path, dtype=torch.float32, use_cache=False)
    assert ckpt.args.n_kv_heads == 2 and logits_diff(ckpt, model, TOKENS) <= 1e-4
    bad = write_gguf(tmp_path / "b.gguf", gguf_tensors(model), arch="granite", extra=GRANITE_META, n_kv_heads=[2, 1])
    one_line_error(bad, r"granite.attention.head_count_kv must give one head count; got \[2, 1\]")


def test_granite_without_rope_when_the_file_says_so(tmp_path):
    """llama.cpp reads `rope.scaling.finetuned` false on a Granite file as no RoPE on any layer."""
    path = write_gguf(tmp_path / "g.gguf", gguf_tensors(hf_model("granite")), arch="granite",
                      extra={**GRANITE_META, "granite.rope.scaling.finetuned": False})
    assert load_checkpoint(path, dtype=torch.float32, use_cache=False).args.nope_layers == (0, 1)


@pytest.mark.parametrize("family", ["ministral3", "smollm3", "granite", "olmo2", "olmo3", "olmo3-yarn", "gemma",
                                    "gemma2", "phi3", "exaone4-global", "exaone4-64", "glm4", "ernie4_5", "cohere",
                                    "cohere2"])
def test_families_match_llama_cpp(tmp_path, family):
    """The same file through llama.cpp, where installed. Measured apart at most (llama.cpp keeps K and V
    in float16): Ministral 3 1.3e-4 (4.7e-3 with the queries' scale left out), SmolLM3 1.7e-4 (1.8e-3
    with RoPE on every layer), Granite 6.5e-6 (3.3e-2 without the residual multiplier), OLMo 2 1.8e-4,
    OLMo 3 4.7e-4 and with YaRN 5.4e-4 (transformers is as far from llama.cpp; a window of 7 or 9: 0.4), Gemma 2
    8.2e-4 (transformers is as far: ours is 5e-7 from it; 0.20 without the score cap, 0.50 without the logits'),
    EXAONE 4 2.1e-4, and with 64 layers, which slide, 1.5e-3 (transformers is as far: ours is 1.5e-6 from it;
    0.59 with RoPE on its global layers), GLM 4 2.2e-4 (5.1e-3 with its Q/K rows left in pairs), ERNIE 4.5
    1.3e-4 (7.1e-3 so), Cohere 7.0e-5 (2.6e-3 so) and Command R7B's 8.3e-5 (3.8e-3 so)."""
    need_llama_cpp()
    path, _ = write_family(tmp_path / "m.gguf", family)
    ours, theirs = ours_and_llama_cpps_logits(path)
    assert (ours - theirs).abs().max().item() <= (3e-3 if family == "exaone4-64" else 1e-3)


def ours_and_llama_cpps_logits(path):
    """The logits of 100 random tokens from the file through our float model, its caches as long as
    llama.cpp's context (128: LongRoPE's factors follow it in both), and through llama.cpp."""
    import llama_cpp

    from fastdecode.quant import build_model

    ckpt = load_checkpoint(path, dtype=torch.float32, use_cache=False)
    tokens = torch.randint(3, VOCAB, (100,), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        model = build_model(ckpt.args, ckpt.state_dict, torch.float32)[0].eval()
        model.setup_caches(1, 128)
        ours = model(tokens[None], torch.arange(len(tokens))[None])[0]
    ref = llama_cpp.Llama(model_path=str(path), n_ctx=128, n_batch=128, logits_all=True, n_threads=2, verbose=False)
    try:
        ref.eval(tokens.tolist())
        return ours, torch.from_numpy(ref.scores[:len(tokens)].copy()).float()
    finally:
        ref.close()


@pytest.mark.parametrize("family", ["qwen3-yarn", "ministral3", "smollm3", "granite", "olmo2", "olmo3-yarn",
                                    "gemma2", "phi3"])
def test_scaled_rope_and_queries_through_the_engine(tmp_path, family):
    """The engine's cached, chunked steps scale cos and sin (YaRN) and the queries (Ministral 3),
    skip RoPE on SmolLM3's NoPE layers, apply Granite's multipliers, OLMo 2's norms and Gemma 2's
    caps at each row's positions as the cache-free forward does."""
    if family != "qwen3-yarn":
        path, _ = write_family(tmp_path / "m.gguf", family)
    else:
        model, meta = qwen3_with_yarn()
        path = write_gguf(tmp_path / "q3.gguf", gguf_tensors(model, arch="qwen3"), arch="qwen3", head_dim=24,
                          extra=meta)
    llm = fastdecode.load(str(path), max_seq_len=128, max_batch_size=2, kv_dtype="float32", prefill_chunk=16)
    prompt = TOKENS[0].tolist()
    got = llm.generate([prompt], max_new_tokens=24, min_new_tokens=24, temperature=0)[0].token_ids
    ids, stops = list(prompt), list(llm.tokenizer.eos_ids)
    with torch.no_grad():
        for _ in range(24):
            logits = llm.model(torch.tensor([ids]), None)[0, -1]
            logits[stops] = -float("inf")  # as min_new_tokens keeps them out
            ids.append(int(logits.argmax()))
    assert got == ids[len(prompt):]


def test_qwen3_gguf_with_yarn_matches_llama_cpp(tmp_path):
    """The same file through llama.cpp (where llama-cpp-python is installed): measured 2.3e-4
    apart at most (llama.cpp keeps K and V in float16), and 0.34 from the file without YaRN."""
    need_llama_cpp()
    model, meta = qwen3_with_yarn()
    path = write_gguf(tmp_path / "q3.gguf", gguf_tensors(model, arch="qwen3"), arch="qwen3", head_dim=24,
                      extra={**meta, "qwen3.attention.value_length": 24})
    ours, theirs = ours_and_llama_cpps_logits(path)
    assert (ours - theirs).abs().max().item() <= 2e-3


def test_ministral3_gguf_matches_the_transformers_model(tmp_path):
    path, model = write_family(tmp_path / "m3.gguf", "ministral3")
    ckpt = load_checkpoint(path, dtype=torch.float32, use_cache=False)
    a = ckpt.args
    assert (a.query_scale_beta, a.query_scale_period, a.rope_scaling.cos_sin_scale) == (0.5, 16, 1.0)
    tokens = torch.randint(3, VOCAB, (1, 100), generator=torch.Generator().manual_seed(0))
    assert logits_diff(ckpt, model, tokens) <= 1e-4


# --- bad input: one line each ------------------------------------------------------------------

def one_line_error(path, match):
    with pytest.raises(FastDecodeError, match=match) as info:
        load_checkpoint(path, dtype=torch.float32, device="cpu", use_cache=False)
    message = str(info.value)
    assert "\n" not in message and str(path) in message
    return message


def test_unsupported_architecture_lists_the_supported_ones(tmp_path):
    path = write_gguf(tmp_path / "phi.gguf", gguf_tensors(hf_model()), arch="phi2")
    message = one_line_error(path, "unsupported architecture 'phi2'")
    assert message.endswith("supported: llama, mistral3, qwen2, qwen3, gemma, gemma2, gemma3, smollm3, granite, olmo2, "
                            "exaone4, glm4, lfm2, lfm2moe, ernie4_5, command-r, cohere2, hunyuan-dense, phi3, qwen2moe, "
                            "qwen3moe, olmoe, granitemoe, gpt-oss, qwen2vl, qwen3vl, qwen3vlmoe")


def test_phi3_rope_factors_missing_or_of_the_wrong_length_are_named(tmp_path):
    model = hf_model("phi3", tie=False, seed=3)
    tensors = gguf_tensors(model, "phi3")
    tensors["rope_factors_short.weight"] = np.ones(6, dtype=np.float32)
    path = write_gguf(tmp_path / "one.gguf", tensors, arch="phi3", extra=PHI3_META)
    one_line_error(path, "rope_factors_long.weight is missing beside rope_factors_short.weight")
    tensors["rope_factors_long.weight"] = np.ones(5, dtype=np.float32)
    path = write_gguf(tmp_path / "short.gguf", tensors, arch="phi3", extra=PHI3_META)
    one_line_error(path, "short_factor and long_factor must be as long as each other, got 6 and 5")


def test_phi3_fused_tensor_of_the_wrong_size_is_named(tmp_path):
    """A phi3 file whose fused gate/up tensor is one matrix, not two, fails in one line naming it."""
    path = write_gguf(tmp_path / "p.gguf", gguf_tensors(hf_model()), arch="phi3")
    one_line_error(path, r"tensor 'blk.0.ffn_up.weight' has shape \[96, 64\], but the file's metadata makes it "
                         r"\[192, 64\]")


def test_missing_required_metadata_key_is_named(tmp_path):
    path = write_gemma3(tmp_path / "g.gguf", hf_model("gemma3", window=8), meta={})
    one_line_error(path, "missing metadata key gemma3.attention.sliding_window$")


def test_sliding_window_larger_than_the_context(tmp_path):
    path = write_gemma3(tmp_path / "g.gguf", hf_model("gemma3", window=8),
                        meta={**GEMMA3_META, "gemma3.attention.sliding_window": 4096})
    one_line_error(path, "sliding window of 4096 positions is larger than the context of 128")


def test_pattern_of_the_wrong_length(tmp_path):
    path = write_gemma3(tmp_path / "g.gguf", hf_model("gemma3", window=8),
                        meta={**GEMMA3_META, "gemma3.attention.sliding_window_pattern": [True, False]})
    one_line_error(path, "sliding_window_pattern has 2 entries for 3 layers")


@pytest.mark.parametrize("key, value, match", [
    ("rope.scaling.yarn_ext_factor", 0.5, "qwen3.rope.scaling.yarn_ext_factor = 0.5 is not supported"),
    ("rope.scaling.type", "longrope", "RoPE scaling 'longrope' is not supported; supported: linear, llama3, yarn"),
    ("rope.scaling.yarn_beta_slow", 64.0, "needs 0 < beta_slow <= beta_fast"),
    ("rope.scaling.factor", "four", "qwen3.rope.scaling.factor must be a number, got 'four'"),
    ("rope.scaling.original_context_length", "x", "original_context_length must be an integer, got 'x'"),
])
def test_rope_scaling_we_do_not_run_is_named(tmp_path, key, value, match):
    model, meta = qwen3_with_yarn()
    path = write_gguf(tmp_path / "q3.gguf", gguf_tensors(model, arch="qwen3"), arch="qwen3", head_dim=24,
                      extra={**meta, f"qwen3.{key}": value})
    one_line_error(path, match)


def test_norm_tensors_of_another_family_are_refused(tmp_path):
    tensors = gguf_tensors(hf_model())  # llama
    tensors["blk.0.attn_q_norm.weight"] = np.ones(16, dtype=np.float32)
    one_line_error(write_gguf(tmp_path / "x.gguf", tensors), "unexpected tensor layers.0.attention.q_norm.weight")


def test_end_of_turn_token_of_the_template_stops_generation(tmp_path):
    """An instruction-tuned Gemma file names no EOT id; its template ends turns with
    <end_of_turn>, which then ends generation as well as <eos>."""
    import gguf

    from fastdecode.checkpoints.gguf_file import GGUFFile
    from fastdecode.checkpoints.gguf_tokenizer import tokenizer_from_gguf

    template = ("{% for m in messages %}<start_of_turn>{{ m['role'] }}\n{{ m['content'] }}<end_of_turn>\n"
                "{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}")
    tokens = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>",
              *(f"<0x{b:02X}>" for b in range(256)), "▁", "a", "b"]
    path = tmp_path / "it.gguf"
    w = gguf.GGUFWriter(str(path), "gemma3")
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_types([3] * 6 + [6] * 256 + [1] * 3)
    w.add_token_scores([0.0] * len(tokens))
    w.add_bos_token_id(2)
    w.add_eos_token_id(1)
    w.add_chat_template(template)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    tok = tokenizer_from_gguf(GGUFFile(path))
    assert tok.eos_ids == frozenset({1, 5})
    text = tok.apply_chat_template([{"role": "user", "content": "ab"}])
    assert text == "<start_of_turn>user\nab<end_of_turn>\n<start_of_turn>model\n"
    assert tok.encode(text, add_special_tokens=False)[:2] == [4, tokens.index("<0x75>")]  # "u" by byte fallback
