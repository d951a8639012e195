"""LFM2: most layers' attention is a gated short convolution whose state (the last inputs of each
cache slot) carries across a request's chunks. Its Hugging Face directory and GGUF file against
transformers and llama.cpp (and LFM2-MoE's, with experts chosen by sigmoid scores and a selection
bias); the engine, several requests in fewer slots with chunked prefill, against the cache-free
forward; what it refuses."""

import json

import pytest
import torch
from gguf import GGMLQuantizationType as T

import fastdecode
from fastdecode.checkpoints import load_checkpoint
from fastdecode.errors import FastDecodeError
from fastdecode.quant import build_model
from test_gguf_families import logits_diff, one_line_error, ours_and_llama_cpps_logits
from tiny_checkpoints import private_cache  # noqa: F401  (autouse fixture)
from tiny_checkpoints import VOCAB, gguf_tensors, hf_model, write_gguf, write_hf_dir
from fastdecode.evaluation.perplexity import llama_cpp_available

transformers = pytest.importorskip("transformers")

TOKENS = torch.randint(3, VOCAB, (2, 30), generator=torch.Generator().manual_seed(0))


def write_lfm2_gguf(path, model, quant=None):
    """The model as llama.cpp's converter writes it: head_count_kv 0 on the convolution layers."""
    tensors = gguf_tensors(model, "lfm2")
    matrices = [k for k, a in tensors.items() if a.ndim == 2 and not k.endswith(("norm.weight", "conv.weight"))]
    types = None if quant is None else {k: quant for k in matrices}
    return write_gguf(path, tensors, arch="lfm2", n_layers=4, hidden_dim=64, n_kv_heads=[0, 0, 2, 0], quant=types,
                      extra={"lfm2.shortconv.l_cache": 3})


def test_hf_directory_matches_transformers_cached_and_chunked(tmp_path):
    model = hf_model("lfm2", seed=1)
    ckpt = load_checkpoint(write_hf_dir(tmp_path / "m", model), dtype=torch.float32)
    a = ckpt.args
    assert (a.conv_layers, a.conv_kernel, a.hidden_dim, a.qk_norm, a.attention_layers) == ((0, 1, 3), 3, 64, True, 1)
    ours = build_model(a, ckpt.state_dict, torch.float32)[0].eval()
    with torch.no_grad():
        ref = model(TOKENS).logits
        assert (ours(TOKENS, None) - ref).abs().max().item() <= 1e-4  # measured 2.4e-7
        ours.setup_caches(2, 64)
        pos = torch.arange(30)[None].expand(2, 30)
        chunks = torch.cat([ours(TOKENS[:, :13], pos[:, :13]), ours(TOKENS[:, 13:], pos[:, 13:])], dim=1)
        assert (chunks - ref).abs().max().item() <= 1e-4
        # Slot 1 again from position 0, a token at a time: its earlier state is not read.
        steps = [ours(TOKENS[1:, t:t + 1], torch.tensor([[t]]), rows=torch.tensor([1])) for t in range(30)]
        assert (torch.cat(steps, dim=1) - ref[1:]).abs().max().item() <= 1e-4


def test_gguf_matches_transformers_and_llama_cpp(tmp_path):
    """Measured: 2.4e-7 from transformers; 1.1e-4 from llama.cpp (its float16 K and V)."""
    model = hf_model("lfm2", seed=1)
    path = write_lfm2_gguf(tmp_path / "f.gguf", model)
    ckpt = load_checkpoint(path, dtype=torch.float32, use_cache=False)
    assert (ckpt.args.conv_layers, ckpt.args.n_kv_heads) == ((0, 1, 3), 2)
    assert logits_diff(ckpt, model, TOKENS[:1]) <= 1e-4
    if llama_cpp_available():
        ours, theirs = ours_and_llama_cpps_logits(path)
        assert (ours - theirs).abs().max().item() <= 1e-3
    packed = load_checkpoint(write_lfm2_gguf(tmp_path / "q.gguf", model, T.Q8_0), dtype=torch.float32, weights="auto")
    # 3 x (in_proj, out_proj), q, k, v, o, 4 x (gate, up, down), the embedding; the filters stay F32
    assert "Q8_0->q8 x23" in packed.weights_summary
    assert logits_diff(packed, model, TOKENS[:1]) <= 2e-2


LFM2_MOE_META = {"lfm2moe.shortconv.l_cache": 3, "lfm2moe.expert_count": 4, "lfm2moe.expert_used_count": 2,
                 "lfm2moe.expert_feed_forward_length": 32, "lfm2moe.leading_dense_block_count": 1,
                 "lfm2moe.expert_gating_func": 2}


def test_lfm2_moe_matches_transformers_and_llama_cpp(tmp_path):
    """LFM2-MoE: its first MLP dense, then experts chosen by sigmoid score plus a learned selection bias,
    weighted by their scores renormalized. Measured 2.4e-7 from transformers (6.4e-2 without the
    selection bias), 2.1e-4 from llama.cpp on the GGUF."""
    model = hf_model("lfm2moe", seed=1)
    ckpt = load_checkpoint(write_hf_dir(tmp_path / "m", model), dtype=torch.float32)
    a = ckpt.args
    assert (a.router, a.expert_selection_bias, a.dense_layers, a.n_experts, a.conv_layers) == (
        "sigmoid", True, (0,), 4, (0, 1, 3))
    assert logits_diff(ckpt, model, TOKENS[:1]) <= 1e-4
    path = write_gguf(tmp_path / "m.gguf", gguf_tensors(model, "lfm2moe"), arch="lfm2moe", n_layers=4, hidden_dim=96,
                      n_kv_heads=[0, 0, 2, 0], extra=LFM2_MOE_META)
    gguf = load_checkpoint(path, dtype=torch.float32, use_cache=False)
    assert gguf.args == a.replace(max_seq_len=gguf.args.max_seq_len, norm_eps=gguf.args.norm_eps)
    assert logits_diff(gguf, model, TOKENS[:1]) <= 1e-4
    if llama_cpp_available():
        ours, theirs = ours_and_llama_cpps_logits(path)
        assert (ours - theirs).abs().max().item() <= 1e-3
    bad = write_gguf(tmp_path / "bad.gguf", gguf_tensors(model, "lfm2moe"), arch="lfm2moe", n_layers=4,
                     hidden_dim=96, n_kv_heads=[0, 0, 2, 0], extra={**LFM2_MOE_META, "lfm2moe.expert_gating_func": 4})
    one_line_error(bad, "expert_gating_func 4 is not one we run; accepted: 1 \\(softmax\\), 2 \\(sigmoid\\)")


def test_engine_runs_more_requests_than_slots_in_chunks(tmp_path):
    """Three prompts in two slots, prefilled 8 tokens a chunk: every prompt token's log-probability
    (computed chunk by chunk, the convolutions' state carried between chunks and reset for a slot's
    next request) and the greedy tokens after it are those of the cache-free forward."""
    d = write_hf_dir(tmp_path / "m", hf_model("lfm2", seed=1))
    llm = fastdecode.load(str(d), max_batch_size=2, max_seq_len=128, prefill_chunk=8)
    try:
        assert llm.engine.prefix is None  # no prefix reuse: the state holds no positions
        g = torch.Generator().manual_seed(1)
        prompts = [torch.randint(3, VOCAB, (n,), generator=g).tolist() for n in (5, 19, 11)]
        outs = llm.generate(prompts, max_new_tokens=8, min_new_tokens=8, temperature=0, prompt_logprobs=0)
        stops = list(llm.tokenizer.eos_ids)
        for prompt, out in zip(prompts, outs):
            ids = list(prompt)
            with torch.no_grad():
                ref = torch.log_softmax(llm.model(torch.tensor([ids]), None)[0].float(), dim=-1)
                want = [ref[i - 1, t].item() for i, t in enumerate(ids) if i]
                got = [lp.logprob for lp in out.prompt_logprobs[1:]]
                assert max(abs(a - b) for a, b in zip(got, want)) <= 1e-4
                for _ in range(8):
                    logits = llm.model(torch.tensor([ids]), None)[0, -1]
                    logits[stops] = -float("inf")
                    ids.append(int(logits.argmax()))
            assert out.token_ids == ids[len(prompt):]
        with pytest.raises(FastDecodeError, match="LFM2's convolution layers cannot take back rejected drafts"):
            llm.generate([prompts[0]], max_new_tokens=4, speculative="prompt-lookup")
    finally:
        llm.engine.close()


def test_bad_lfm2_input_is_named(tmp_path):
    model = hf_model("lfm2", seed=1)
    d = write_hf_dir(tmp_path / "m", model)
    config = json.loads((d / "config.json").read_text())
    for change, match in (({"conv_bias": True}, "conv_bias is not supported"),
                          ({"layer_types": ["conv", "mamba", "full_attention", "conv"]},
                           "layer_types must name each of the 4 layers conv or full_attention"),
                          ({"layer_types": ["conv"] * 4}, "no attention layer")):
        (d / "config.json").write_text(json.dumps({**config, **change}))
        with pytest.raises(FastDecodeError, match=match) as e:
            load_checkpoint(d, dtype=torch.float32)
        assert "\n" not in str(e.value)
    (d / "config.json").write_text(json.dumps(config))
    (tmp_path / "x.pt2").write_bytes(b"")
    with pytest.raises(FastDecodeError, match="LFM2's convolution layers are not exported"):
        fastdecode.load(str(d), compiled=str(tmp_path / "x.pt2"))
    path = write_gguf(tmp_path / "bad.gguf", gguf_tensors(model, "lfm2"), arch="lfm2", n_layers=4, hidden_dim=64,
                      n_kv_heads=[0, 1, 2, 0], extra={"lfm2.shortconv.l_cache": 3})
    one_line_error(path, "head_count_kv must give one head count, or 0 on a convolution layer")
