"""`fastdecode perplexity kv_dtype=...`: the key reaches load(), a bad value is one line
naming the accepted ones, and scoring through the KV cache matches the cache-free
forward for a float32 cache (and stays close for q8_0)."""

import json

import pytest
import torch

from fastdecode.cli import main as cli
from fastdecode.cli.perplexity import read_text
from fastdecode.config import KV_DTYPE_CHOICES
from fastdecode.errors import FastDecodeError
from fastdecode.evaluation.perplexity import GGML_KV_TYPES, llama_cpp_perplexity, perplexity
from fastdecode.model.kv_cache import KV_DTYPES
from conftest import need_llama_cpp

TEXT = read_text(None)[:1000]


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def run_cli(capsys, *args):
    rc = cli.main(["perplexity", *args])
    out, err = capsys.readouterr()
    return rc, out, err


def test_a_bad_kv_dtype_is_one_line_naming_the_accepted_values(capsys):
    rc, out, err = run_cli(capsys, "model=tiny", "kv_dtype=q4")
    assert rc == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("fastdecode: error: ")
    assert f"unknown kv_dtype 'q4'; accepted: {', '.join(KV_DTYPE_CHOICES)}" in err


def test_q8_0_on_a_model_whose_head_dim_does_not_fit_is_one_line(capsys):
    rc, out, err = run_cli(capsys, "model=tiny", "kv_dtype=q8_0", "ctx=64")
    assert rc == 2 and out == "" and err.count("\n") == 1
    assert "kv_dtype=q8_0 needs head_dim a multiple of 32" in err


class _Reached(Exception):
    pass


@pytest.mark.parametrize("args, want", [((), {}), (("kv_dtype=q8_0",), {"kv_dtype": "q8_0"}),
                                        (("kv_dtype=auto",), {"kv_dtype": "auto"})])
def test_the_value_reaches_load(monkeypatch, args, want):
    seen = {}

    def fake_load(model, **kwargs):
        seen.update(kwargs)
        raise _Reached

    monkeypatch.setattr("fastdecode.api.build.load", fake_load)
    assert cli.main(["perplexity", "model=tiny", *args]) != 0  # the command reports what load() raised
    assert "weights" in seen  # load() was called
    assert {k: v for k, v in seen.items() if k == "kv_dtype"} == want  # none: load()'s default, not passed


def test_the_json_report_names_the_cache(capsys, tmp_path):
    path = tmp_path / "text.txt"
    path.write_text(TEXT, encoding="utf-8")
    reports = {}
    for kv in (None, "float32", "float16"):
        rc, out, err = run_cli(capsys, "model=tiny", f"text={path}", "ctx=64", "max_windows=3", "--json",
                               *(() if kv is None else (f"kv_dtype={kv}",)))
        assert rc == 0, err
        reports[kv] = json.loads(out)
    assert [reports[kv]["kv_dtype"] for kv in reports] == [None, "float32", "float16"]
    ppl = {kv: r["results"][0]["ppl"] for kv, r in reports.items()}
    assert ppl["float32"] == pytest.approx(ppl[None], rel=1e-5)  # the same arithmetic, through the cache
    assert ppl["float16"] == pytest.approx(ppl[None], rel=1e-3)


def test_scoring_through_the_engine_matches_the_cache_free_forward(tiny_llm):
    """kv_cache=True sends each window to the engine (prompt logprobs, chunked prefill, the
    engine's own float16 cache here); its caches stay the ones it built."""
    model = tiny_llm.model
    before = [layer.attention.kv_cache for layer in model.layers]
    free = perplexity(tiny_llm, TEXT, ctx=64, max_windows=3)
    cached = perplexity(tiny_llm, TEXT, ctx=64, max_windows=3, kv_cache=True)
    assert [layer.attention.kv_cache for layer in model.layers] == before
    assert (cached.tokens, cached.windows) == (free.tokens, free.windows)
    assert cached.ppl == pytest.approx(free.ppl, rel=1e-3)


def test_a_q8_0_cache_is_close_to_float():
    """The default model (head_dim 64) scored through float32 and q8_0 caches."""
    import fastdecode

    results = {}
    for kv in ("float32", "q8_0"):
        llm = fastdecode.load(kv_dtype=kv, compiled=None)
        results[kv] = perplexity(llm, TEXT, ctx=128, max_windows=2, kv_cache=True)
    free = perplexity(llm, TEXT, ctx=128, max_windows=2)
    assert results["float32"].ppl == pytest.approx(free.ppl, rel=1e-4)
    assert results["q8_0"].ppl != results["float32"].ppl  # the cache is really quantized
    assert results["q8_0"].ppl == pytest.approx(results["float32"].ppl, rel=0.02)


def test_llama_cpp_takes_the_same_names():
    assert set(GGML_KV_TYPES) == set(KV_DTYPES)
    with pytest.raises(FastDecodeError, match="unknown kv_dtype 'auto' for llama.cpp"):
        llama_cpp_perplexity("x.gguf", None, [1, 2, 3], ctx=3, kv_dtype="auto")


def test_default_model_with_a_q8_0_cache_agrees_with_llama_cpp():
    """One window of the default model, both engines with q8_0 K/V caches."""
    need_llama_cpp()
    import fastdecode
    from fastdecode.evaluation.perplexity import encode_text

    llm = fastdecode.load(kv_dtype="q8_0")
    ids = encode_text(llm.tokenizer, read_text(None))
    ours = perplexity(llm, ids, ctx=512, max_windows=1, kv_cache=True)
    theirs = llama_cpp_perplexity(llm.source, llm.tokenizer, ids, ctx=512, max_windows=1, n_threads=1,
                                  kv_dtype=llm.model.kv_dtype_name)
    assert llm.model.kv_dtype_name == "q8_0" and (theirs.tokens, theirs.windows) == (ours.tokens, 1)
    assert abs(theirs.ppl / ours.ppl - 1) < 0.02


def test_a_window_of_the_whole_context_goes_through_the_engine(capsys):
    """kv_dtype sends windows to the engine, which generates one token after each: that token is
    never fed back, so a window may fill the model's context (512 for tiny), as without kv_dtype;
    one more is refused in one line before anything is scored."""
    ppl = {}
    for kv in (None, "float32"):
        rc, out, err = run_cli(capsys, "model=tiny", "ctx=512", "max_windows=1", "--json",
                               *(() if kv is None else (f"kv_dtype={kv}",)))
        assert rc == 0, err
        ppl[kv] = json.loads(out)["results"][0]["ppl"]
    assert ppl["float32"] == pytest.approx(ppl[None], rel=1e-5)
    rc, out, err = run_cli(capsys, "model=tiny", "kv_dtype=float32", "ctx=513", "max_windows=1")
    assert rc == 2 and out == "" and err.count("\n") == 1
    assert "ctx=513 is out of range; accepted: 3..512 for this model" in err
