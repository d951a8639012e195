"""weights= at load: packed GGUF types, quantizing float checkpoints, kernel fallbacks and bad input."""

import json
import logging
import sys
from pathlib import Path

import pytest
import torch
from gguf import GGMLQuantizationType as T

sys.path.insert(0, str(Path(__file__).parents[1] / "checkpoints"))
import fastdecode  # noqa: E402
from fastdecode import kernels  # noqa: E402
from fastdecode.checkpoints import cache  # noqa: E402
from fastdecode.cli.main import main  # noqa: E402
from fastdecode.quant.formats import dequantize  # noqa: E402
from fastdecode.quant.linear import QuantEmbedding, QuantLinear  # noqa: E402
from fastdecode.quant.transform import set_native  # noqa: E402
from tiny_checkpoints import gguf_tensors, hf_model, private_cache, write_gguf, write_hf_dir  # noqa: E402,F401

# Each matrix in a different packed type; the Q/K rows also go through llama.cpp's permutation.
QUANT = {"token_embd.weight": T.Q8_0}
for i in range(2):
    QUANT.update({f"blk.{i}.attn_q.weight": T.Q4_1, f"blk.{i}.attn_k.weight": T.Q4_1,
                  f"blk.{i}.attn_v.weight": T.Q4_1, f"blk.{i}.attn_output.weight": T.Q4_0,
                  f"blk.{i}.ffn_gate.weight": T.Q5_0, f"blk.{i}.ffn_up.weight": T.Q5_0,
                  f"blk.{i}.ffn_down.weight": T.Q8_0})


@pytest.fixture
def quant_gguf(tmp_path):
    return write_gguf(tmp_path / "q.gguf", gguf_tensors(hf_model()), quant=QUANT)


def logits(llm, ids=(1, 5, 9, 40, 7, 3)):
    with torch.inference_mode():
        return llm.model(torch.tensor([list(ids)]), None)[0]


def test_gguf_types_stay_packed_and_dequantize_to_the_float_path(quant_gguf):
    q = fastdecode.load(str(quant_gguf), weights="auto")
    f = fastdecode.load(str(quant_gguf), weights="float")
    assert isinstance(q.model.tok_embeddings, QuantEmbedding)
    layer, ref = q.model.layers[0], f.model.layers[0]
    assert isinstance(layer.attention.wqkv, QuantLinear) and layer.attention.wqkv.layout == "q4"
    assert layer.feed_forward.w13.layout == "q5s" and layer.feed_forward.w2.layout == "q8"
    # Repacked, unpermuted and fused rows dequantize to exactly what the float path loaded.
    for mod, fmod in ((layer.attention.wqkv, ref.attention.wqkv), (layer.attention.wo, ref.attention.wo),
                      (layer.feed_forward.w13, ref.feed_forward.w13), (layer.feed_forward.w2, ref.feed_forward.w2)):
        assert torch.equal(dequantize(mod.packed()), fmod.weight)
    assert torch.equal(dequantize(q.model.tok_embeddings.packed()), f.model.tok_embeddings.weight)
    ids = torch.tensor([[3, 17, 200]])
    assert torch.equal(q.model.tok_embeddings(ids), f.model.tok_embeddings(ids))
    a, b = logits(q), logits(f)
    assert (a - b).abs().max() < 0.05 * b.abs().max()
    assert "Q4_1->q4 x6" in q.weights_summary and "Q5_0->q5s x4" in q.weights_summary


def test_q4_parts_of_part_panels_run_as_split_matmuls(tmp_path):
    """q4 keeps rows in panels of 16: a fused part of 24 rows (k, with head_dim 12) cannot be
    followed in one matrix, so q + k and v run split, and still give the float path's results."""
    q4 = {f"blk.{i}.attn_{p}.weight": T.Q4_1 for i in range(2) for p in ("q", "k", "v")}
    path = write_gguf(tmp_path / "h12.gguf", gguf_tensors(hf_model(head_dim=12)), quant=q4, head_dim=12)
    q = fastdecode.load(str(path), weights="auto")
    f = fastdecode.load(str(path), weights="float")
    wqkv = q.model.layers[0].attention.wqkv
    assert [p.out_features for p in wqkv.parts] == [72, 24]
    fused = torch.cat([dequantize(p.packed()) for p in wqkv.parts])
    assert torch.equal(fused, f.model.layers[0].attention.wqkv.weight)
    a, b = logits(q), logits(f)
    assert (a - b).abs().max() < 0.05 * b.abs().max()


@pytest.mark.parametrize("weights", ["int8", "int4"])
def test_float_checkpoint_quantized_at_load(tmp_path, weights):
    d = write_hf_dir(tmp_path / "hf", hf_model(tie=False))
    q = fastdecode.load(str(d), weights=weights)
    f = fastdecode.load(str(d), weights="float")
    assert isinstance(q.model.output, QuantLinear) and q.model.output.layout == "q8"
    assert q.model.layers[0].feed_forward.w2.layout == ("q8" if weights == "int8" else "q4")
    a, b = logits(q), logits(f)
    assert (a - b).abs().max() < 0.1 * b.abs().max()
    assert f"quantized to {weights}" in q.weights_summary
    out = q.generate([1, 2, 3], max_new_tokens=4, temperature=0, ignore_eos=True)[0]
    assert len(out.token_ids) == 4


@pytest.mark.parametrize("preset", ["tiny", "tiny-gemma3"])
@pytest.mark.parametrize("weights", ["int8", "int4"])
def test_a_preset_quantized_at_load_has_no_float_matrix(preset, weights):
    """A preset's random weights come from the built model, whose q/k/v and gate/up are fused:
    they are quantized as well (they stayed float32 matmuls, which round by the rows beside them)."""
    llm = fastdecode.load(preset, weights=weights, compiled="none")
    assert not [n for n, m in llm.model.named_modules() if isinstance(m, torch.nn.Linear)]
    layer = llm.model.layers[0]
    assert layer.attention.wqkv.layout == layer.feed_forward.w13.layout == ("q8" if weights == "int8" else "q4")
    out = llm.generate([1, 2, 3], max_new_tokens=4, temperature=0, ignore_eos=True)[0]
    assert len(out.token_ids) == 4


@pytest.mark.parametrize("weights", ["int8", "int4"])
def test_a_float_gguf_is_quantized_a_layer_at_a_time(tmp_path, weights):
    """Each converted part (a layer, then the embedding and head) leaves quantized, so the float model
    is never held whole; its matrices are quantize() of the float path's, bit for bit."""
    from collections import Counter

    from fastdecode.checkpoints.gguf_file import GGUFFile
    from fastdecode.checkpoints.gguf_config import gguf_model_args
    from fastdecode.checkpoints.gguf_loader import gguf_shards
    from fastdecode.quant.formats import quantize

    f = GGUFFile(write_gguf(tmp_path / "f.gguf", gguf_tensors(hf_model(tie=False))))
    args = gguf_model_args(f)
    floats = {k: v for part in gguf_shards(f, args, torch.float32, "float", Counter()) for k, v in part.items()}
    parts = list(gguf_shards(f, args, torch.float32, weights, Counter()))
    assert len(parts) == 3
    for part in parts:
        assert not [k for k, t in part.items() if k.endswith(".weight") and t.dim() == 2]
    packed = {k: v for part in parts for k, v in part.items()}
    for key in ("layers.1.feed_forward.w2", "output", "tok_embeddings"):
        want = quantize(floats[f"{key}.weight"], "q4" if weights == "int4" and "layers" in key else "q8")
        assert all(torch.equal(packed[f"{key}.{name}"], t) for name, t in want.items()), key


def test_int4_on_a_quantized_file_is_refused(quant_gguf):
    with pytest.raises(fastdecode.FastDecodeError, match="quantizes float checkpoints"):
        fastdecode.load(str(quant_gguf), weights="int4")


def test_int4_needs_block_multiples(tmp_path):
    import transformers

    cfg = transformers.LlamaConfig(vocab_size=266, hidden_size=64, intermediate_size=80, num_hidden_layers=1,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    d = write_hf_dir(tmp_path / "odd", transformers.LlamaForCausalLM(cfg).eval())
    with pytest.raises(fastdecode.FastDecodeError, match="multiples of 32") as e:
        fastdecode.load(str(d), weights="int4")
    assert "\n" not in str(e.value)


def test_unknown_weights_value(capsys):
    with pytest.raises(fastdecode.FastDecodeError, match="accepted: auto, float, int8, int4"):
        fastdecode.load("tiny", weights="int3")
    assert main(["generate", "model=tiny", "weights=int3", "hi"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "accepted: auto, float, int8, int4" in err[0]


def test_cache_entry_of_another_layout_version_is_rebuilt(quant_gguf, caplog):
    fastdecode.load(str(quant_gguf))
    (entry,) = (cache.cache_root() / "converted").iterdir()
    meta = json.loads((entry / "meta.json").read_text())
    meta["layout_version"] = 0
    (entry / "meta.json").write_text(json.dumps(meta))
    with caplog.at_level(logging.WARNING, logger="fastdecode.checkpoints"):
        llm = fastdecode.load(str(quant_gguf))
    assert not llm.from_cache
    assert any("layout version 0" in r.getMessage() for r in caplog.records)
    assert json.loads((entry / "meta.json").read_text())["layout_version"] != 0
    assert fastdecode.load(str(quant_gguf)).from_cache


@pytest.fixture
def kernels_unloaded(monkeypatch):
    """Forget the loaded kernels for one test (the ops stay registered)."""
    monkeypatch.setattr(kernels, "_loaded", None)
    monkeypatch.setattr(kernels, "unavailable_reason", None)
    yield
    kernels._loaded = None


@pytest.mark.parametrize("cause, patch, words", [
    ("no AVX2", ("torch.backends.cpu.get_cpu_capability", lambda: "DEFAULT"), "lacks AVX2"),
    ("no compiler", ("shutil.which", lambda name: None), "install one"),
])
def test_reference_path_when_kernels_unavailable(quant_gguf, kernels_unloaded, monkeypatch, caplog,
                                                 cause, patch, words):
    monkeypatch.setattr(*patch)
    with caplog.at_level(logging.WARNING):
        llm = fastdecode.load(str(quant_gguf))
    assert llm.kernels.quant == "reference" and llm.kernels.ops == []
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len([w for w in warnings if words in w]) == 1, warnings
    assert len(llm.generate([1, 2, 3], max_new_tokens=4, temperature=0, ignore_eos=True)[0].token_ids) == 4
    monkeypatch.undo()
    kernels._loaded = None
    native = fastdecode.load(str(quant_gguf))
    if native.kernels.quant == "reference":
        pytest.skip("native kernels unavailable here")
    # The quantized matmuls' reference path is the kernels' bit-exact twin.
    expected = logits(native)
    set_native(native.model, False)
    assert torch.equal(logits(native), expected)


def test_mixed_layout_group_runs_each_part_on_its_kernel(tmp_path):
    """A fused group whose parts have different layouts (Q4_1 q/k, Q8_0 v, as Q4_K_M
    mixes Q4_K and Q6_K) is a SplitLinear, not dequantized: its output is the parts'
    outputs concatenated, and it equals the float path's to the quantization error."""
    from fastdecode.quant.linear import SplitLinear, packed_linear

    quant = {**QUANT, "blk.0.attn_v.weight": T.Q8_0}
    path = write_gguf(tmp_path / "mixed.gguf", gguf_tensors(hf_model()), quant=quant)
    q = fastdecode.load(str(path), weights="auto")
    assert "dequantized" not in q.weights_summary
    wqkv = q.model.layers[0].attention.wqkv
    assert isinstance(wqkv, SplitLinear) and [p.layout for p in wqkv.parts] == ["q4", "q8"]
    assert [p.out_features for p in wqkv.parts] == [64 + 32, 32]
    x = torch.randn(3, 64)
    with torch.inference_mode():
        sep = torch.cat([packed_linear(x, p.layout, p.packed(), p.native) for p in wqkv.parts], dim=-1)
        assert torch.equal(wqkv(x), sep)
    f = fastdecode.load(str(path), weights="float")
    a, b = logits(q), logits(f)
    assert (a - b).abs().max() < 0.05 * b.abs().max()
    again = fastdecode.load(str(path), weights="auto")  # from the cache: the same
    assert again.from_cache and torch.equal(logits(again), a)
    if q.kernels.quant != "reference":
        set_native(q.model, False)
        assert torch.equal(logits(q), a)


def test_mixed_layout_parts_loaded_from_the_cache_share_no_storage(tmp_path):
    """Q4_1 q/k and Q5_1 v store qweight and scales with one dtype and row width, so the cache
    entry keeps each fused across q, k and v. The SplitLinear's parts built from its row views
    must not share a storage: an exported layer's inputs may not alias (torch.export's nested
    regions refuse them, which left Q4_K_M files, Q4_K q/k with Q6_K v, without a package)."""
    from fastdecode.quant.linear import SplitLinear

    quant = {**QUANT, "blk.0.attn_v.weight": T.Q5_1}
    path = write_gguf(tmp_path / "mixed5.gguf", gguf_tensors(hf_model()), quant=quant)
    first = fastdecode.load(str(path), weights="auto")
    again = fastdecode.load(str(path), weights="auto")
    assert again.from_cache
    wqkv = again.model.layers[0].attention.wqkv
    assert isinstance(wqkv, SplitLinear) and [p.layout for p in wqkv.parts] == ["q4", "q5"]
    storages = [{t.untyped_storage().data_ptr() for t in p.packed().values()} for p in wqkv.parts]
    assert not storages[0] & storages[1]
    assert torch.equal(logits(again), logits(first))


def test_exported_package_with_quantized_weights(quant_gguf, tmp_path):
    """A package exported from packed weights runs them, greedy tokens equal to the eager
    steps', and refuses a model whose layouts differ. On the tiny model of five packed types:
    the default model's 30 layers took 122 s to export for the same check."""
    from fastdecode.compile.aot import export_package

    quant = fastdecode.load(str(quant_gguf), weights="auto", compiled=None, max_seq_len=64, max_batch_size=2)
    path = tmp_path / "q.pt2"
    meta = export_package(quant.model, path)
    assert set(meta["layouts"].split(",")) >= {"q4", "q8"}
    llm = fastdecode.load(str(quant_gguf), weights="auto", compiled=str(path), max_seq_len=64, max_batch_size=2)
    def greedy(m, prompt):
        return m.generate([prompt], max_new_tokens=8, temperature=0, ignore_eos=True)[0].token_ids

    for prompt in ([1, 5, 9, 40], [7, 3, 11]):
        assert greedy(llm, prompt) == greedy(quant, prompt)
    with pytest.raises(fastdecode.FastDecodeError, match="layouts"):
        fastdecode.load(str(quant_gguf), weights="float", compiled=str(path), max_seq_len=64)
