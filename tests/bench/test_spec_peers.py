"""bench-spec's peers: the `peers` setting, skipped peers, and small smoke runs."""

import importlib.util

import pytest

from fastdecode.bench.speculative import SpecBenchSettings, main
from fastdecode.bench.spec_peers import PeerOptions, run_spec_peers, summary_lines
from fastdecode.errors import FastDecodeError
from fastdecode.cli.keys import load_settings
from fastdecode.evaluation.perplexity import llama_cpp_problem
from conftest import need_llama_cpp


def _options(model, **changes):
    o = dict(model=model, device="cpu", dtype=None, max_new_tokens=8, num_draft_tokens=3, ngram_size=2, threads=1)
    return PeerOptions(**{**o, **changes})


@pytest.mark.parametrize("overrides, match", [
    (["peers=vllm"], "unknown peer 'vllm'; accepted: transformers, llama.cpp"),
    (["peers=llama.cpp", "peers=llama.cpp"], "repeated"),
])
def test_bad_peers_are_one_line_errors(overrides, match):
    with pytest.raises(FastDecodeError, match=match) as e:
        load_settings(SpecBenchSettings, overrides)
    assert "\n" not in str(e.value)


def test_bad_peers_exit_2_before_loading(capsys):
    assert main(["peers=hf", "model=tiny"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("fastdecode: error: unknown peer 'hf'") and "\n" not in err


def test_peers_default_to_both_and_empty_means_none():
    assert load_settings(SpecBenchSettings, []).peers == ["transformers", "llama.cpp"]
    assert load_settings(SpecBenchSettings, ["peers="]).peers == []


def test_a_preset_model_skips_every_peer():
    report = run_spec_peers(["transformers", "llama.cpp"], _options("tiny"), {"grounded": [[1, 2, 3]]})
    assert set(report) == {"transformers", "llama.cpp"}
    for name, rep in report.items():
        assert rep == {"skipped": "model 'tiny' is a random-weight preset; peers need a checkpoint file"}
    assert summary_lines(report) == [f"peer {n}: skipped: {report[n]['skipped']}" for n in report]


def test_a_missing_package_skips_its_peer(monkeypatch, tmp_path):
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llama_cpp"
                        else find_spec(name, *a))
    report = run_spec_peers(["llama.cpp"], _options(str(tmp_path)), {"grounded": [[1, 2, 3]]})
    assert report["llama.cpp"]["skipped"].startswith("llama-cpp-python is not installed; install with: pip")


@pytest.mark.skipif(importlib.util.find_spec("transformers") is None, reason="transformers not installed")
def test_a_model_that_does_not_load_is_skipped_with_a_note(tmp_path):
    # an empty directory: no config.json for transformers, no GGUF file for llama.cpp
    report = run_spec_peers(["transformers", "llama.cpp"], _options(str(tmp_path)), {"grounded": [[1, 2, 3]]})
    assert report["transformers"]["skipped"].startswith("its model did not load: ")
    assert "\n" not in report["transformers"]["skipped"]
    if importlib.util.find_spec("llama_cpp") is None:  # CI does not build llama-cpp-python
        assert report["llama.cpp"]["skipped"].startswith("llama-cpp-python is not installed")
    elif llama_cpp_problem():  # installed without a library it can load
        assert report["llama.cpp"] == {"skipped": llama_cpp_problem()}
    else:
        assert report["llama.cpp"] == {"skipped": "llama.cpp needs a GGUF file; the model is a Hugging Face directory"}


@pytest.fixture(scope="module")
def tiny_hf_dir(tmp_path_factory):
    transformers = pytest.importorskip("transformers")
    import torch

    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                                      bos_token_id=1, eos_token_id=2)
    path = tmp_path_factory.mktemp("tiny-llama")
    transformers.LlamaForCausalLM(config).save_pretrained(path)
    return path


def test_transformers_smoke_on_a_tiny_model(tiny_hf_dir):
    prompt = [5, 6, 7, 8, 9, 10, 11, 12] * 3
    report = run_spec_peers(["transformers"], _options(str(tiny_hf_dir)), {"grounded": [prompt], "open-ended": [[5]]})
    rep = report["transformers"]
    assert rep["engine"] == "transformers" and rep["dtype"] == "float32"
    for kind in ("grounded", "open-ended"):
        rows = rep["tasks"][kind]["per_prompt"]
        assert set(rows) == {"plain", "prompt-lookup"}
        plain, lookup = rows["plain"][0], rows["prompt-lookup"][0]
        assert 1 <= plain["tokens"] <= 8 and plain["tokens_per_forward"] <= 1.0
        assert lookup["same_tokens_as_plain"] is True  # greedy, float32: prompt lookup changes no token
        summary = rep["tasks"][kind]["summary"]
        assert summary["plain"]["vs_plain"] in (1.0, None)
    assert any(line.startswith("grounded    transformers prompt-lookup") for line in summary_lines(report))


def test_llamacpp_smoke_on_the_default_gguf():
    need_llama_cpp()
    from fastdecode.bench.peers import PeerSkipped, peer_checkpoint

    try:
        peer_checkpoint(None)
    except PeerSkipped as e:
        pytest.skip(str(e))
    prompt = [504, 2365, 6354, 16438, 27003, 690, 260, 23790, 2767, 30] * 2
    report = run_spec_peers(["llama.cpp"], _options(None), {"grounded": [prompt]})
    rep = report["llama.cpp"]
    assert rep["engine"] == "llama.cpp", rep
    rows = rep["tasks"]["grounded"]["per_prompt"]
    assert rows["plain"][0]["tokens_per_forward"] <= 1.0 and rows["prompt-lookup"][0]["tokens"] >= 1
    assert isinstance(rows["prompt-lookup"][0]["same_tokens_as_plain"], bool)
