"""gpt-oss as OpenAI publishes it: a Hugging Face directory whose experts are MXFP4 blocks and scales
(`quant_method: mxfp4`), against transformers loading the same directory (which dequantizes them on
a CPU); packed as q4mx, exactly the file's numbers; its bad input."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from fastdecode.checkpoints import load_checkpoint
from fastdecode.errors import FastDecodeError
from fastdecode.quant import build_model
from test_gguf_families import logits_diff
from tiny_checkpoints import private_cache  # noqa: F401  (autouse fixture)
from tiny_checkpoints import VOCAB, hf_model, write_hf_dir

transformers = pytest.importorskip("transformers")

TOKENS = torch.randint(3, VOCAB, (1, 40), generator=torch.Generator().manual_seed(0))
QUANT = {"quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                                             "model.embed_tokens", "lm_head"]}


def write_mxfp4_dir(directory):
    """The tiny gpt-oss with each layer's experts as random MXFP4 codes and scales 2^-9..2^-5 (the
    weights' size in gpt-oss-20b), in OpenAI's tensor names and shapes."""
    d = write_hf_dir(directory, hf_model("gptoss", tie=False, seed=3))
    sd = load_file(str(d / "model.safetensors"))
    g = torch.Generator().manual_seed(1)
    for i in range(2):
        for proj, rows, k in (("gate_up_proj", 64, 64), ("down_proj", 64, 32)):
            name = f"model.layers.{i}.mlp.experts.{proj}"
            del sd[name]
            sd[f"{name}_blocks"] = torch.randint(0, 256, (4, rows, k // 32, 16), dtype=torch.uint8, generator=g)
            sd[f"{name}_scales"] = torch.randint(118, 123, (4, rows, k // 32), dtype=torch.uint8, generator=g)
    save_file(sd, str(d / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**config, "quantization_config": QUANT}))
    return d, sd


def test_mxfp4_experts_match_transformers_and_stay_packed(tmp_path):
    d, _ = write_mxfp4_dir(tmp_path / "m")
    reference = transformers.AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
    reference.config._attn_implementation = "eager"
    floats = load_checkpoint(d, dtype=torch.float32, weights="float")
    assert floats.weights_summary == "MXFP4->float x24, float"  # 2 layers x 4 experts x gate, up, down
    assert logits_diff(floats, reference, TOKENS) <= 1e-4  # measured 1.8e-7: the same numbers
    packed = load_checkpoint(d, dtype=torch.float32, weights="auto")
    assert packed.weights_summary == "MXFP4->q4mx x24, float"
    model, _ = build_model(packed.args, packed.state_dict, torch.float32)
    assert {e.w13.layout for layer in model.layers for e in layer.feed_forward.experts} == {"q4mx"}
    assert logits_diff(packed, reference, TOKENS) <= 1e-2  # measured 3.7e-3: the int8 activations
    int8 = load_checkpoint(d, dtype=torch.float32, weights="int8")
    assert int8.weights_summary == "MXFP4->q4mx x24, quantized to int8 at load"


def test_bad_mxfp4_input_is_named(tmp_path):
    d, sd = write_mxfp4_dir(tmp_path / "m")
    config = json.loads((d / "config.json").read_text())

    def refused(match):
        with pytest.raises(FastDecodeError, match=match) as e:
            load_checkpoint(d, dtype=torch.float32)
        assert "\n" not in str(e.value)

    blocks = "model.layers.1.mlp.experts.down_proj_blocks"
    save_file({k: v for k, v in sd.items() if k != blocks}, str(d / "model.safetensors"))
    refused(r"layers.1.feed_forward.experts.down_proj's MXFP4 scales have no blocks")
    save_file({**sd, blocks: sd[blocks][:, :32].contiguous()}, str(d / "model.safetensors"))
    refused(r"down_proj's MXFP4 blocks \[4, 32, 1, 16\] and scales \[4, 64, 1\] do not fit the config, "
            r"which makes them \[4, 64, 1, 16\] and \[4, 64, 1\]")
    save_file({**sd, blocks: sd[blocks].to(torch.int16)}, str(d / "model.safetensors"))
    refused("MXFP4 blocks and scales must be uint8, got torch.int16")
    (d / "config.json").write_text(json.dumps({**config, "quantization_config": {"quant_method": "gptq"}}))
    refused(r"weights quantized for transformers \('gptq'\) are not supported \(only gpt-oss's own mxfp4\)")
    llama = write_hf_dir(tmp_path / "llama", hf_model("llama"))
    config = json.loads((llama / "config.json").read_text())
    (llama / "config.json").write_text(json.dumps({**config, "quantization_config": QUANT}))
    with pytest.raises(FastDecodeError, match=r"\('mxfp4'\) are not supported \(only gpt-oss's own mxfp4\)"):
        load_checkpoint(llama, dtype=torch.float32)
