"""`fastdecode.evaluation.perplexity` and `fastdecode perplexity`: the method checked against a
direct computation from the definition, the window bookkeeping, the command, and
the default model (against llama.cpp when it is installed)."""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import fastdecode
from fastdecode.cli import main as cli
from fastdecode.errors import FastDecodeError
from fastdecode.evaluation.perplexity import (encode_text, llama_cpp_available, llama_cpp_perplexity,
                                              perplexity, plan_windows)
from fastdecode.cli.perplexity import read_text
from conftest import need_llama_cpp

ROOT = Path(__file__).resolve().parents[2]
TEXT = read_text(None)  # the built-in text


@pytest.fixture(autouse=True)
def _one_thread():
    """The tiny model's matmuls are too small to share: a second thread only adds
    synchronization, which costs 100x on a busy 2-core machine. (The module-scoped
    default-model run below is set up before this and keeps every thread.)"""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def direct_ppl(llm, text, ctx, stride):
    """Perplexity from the definition, written out without the module's helpers."""
    tok = llm.tokenizer
    ids = [tok.bos_id] + list(text.encode("utf-8"))  # the tiny model's byte tokenizer, BOS first
    half = ctx // 2
    total, count, start, last_scored = 0.0, 0, 0, -1
    while start + ctx <= len(ids):
        x = torch.tensor([[tok.bos_id] + ids[start + 1:start + ctx]])
        logits = llm.model(x, None)[0].double()
        # window positions j > ctx // 2 that no earlier window scored; logits[j - 1] predicts x[j]
        js = [j for j in range(half + 1, ctx) if start + j > last_scored]
        total += F.cross_entropy(logits[[j - 1 for j in js]], x[0, js], reduction="sum").item()
        count += len(js)
        last_scored = start + ctx - 1
        start += stride
    return math.exp(total / count), count


# -- (a) the method against the definition ------------------------------------------------

@pytest.mark.parametrize("ctx, stride", [(64, None), (64, 16), (65, 40)])
def test_matches_a_direct_computation(tiny_llm, ctx, stride):
    text = TEXT[:1000]
    got = perplexity(tiny_llm, text, ctx=ctx, stride=stride)
    want, count = direct_ppl(tiny_llm, text, ctx, stride or ctx)
    assert got.tokens == count
    assert got.ppl == pytest.approx(want, rel=1e-6)
    assert got.nll == pytest.approx(math.log(want), rel=1e-6)
    assert len(got.window_nlls) == got.windows


def test_text_and_its_ids_give_the_same_result(tiny_llm):
    a = perplexity(tiny_llm, TEXT[:600], ctx=64)
    b = perplexity(tiny_llm, encode_text(tiny_llm.tokenizer, TEXT[:600]), ctx=64)
    assert (a.ppl, a.tokens, a.window_nlls) == (b.ppl, b.tokens, b.window_nlls)


# -- (b) windows and strides ---------------------------------------------------------------

@pytest.mark.parametrize("n, ctx, stride", [(5576, 512, 512), (1000, 64, 64), (1000, 64, 16), (1000, 64, 31),
                                            (1000, 64, 40), (999, 65, 20), (64, 64, 64), (300, 4, 1), (50, 3, 1)])
def test_window_bookkeeping(n, ctx, stride):
    windows = plan_windows(n, ctx, stride)
    per_window = ctx - ctx // 2 - 1  # llama-perplexity's count: 255 at ctx=512
    assert len(windows) == (n - ctx) // stride + 1
    assert windows[-1].start + ctx <= n < windows[-1].start + ctx + stride
    expected = per_window + (len(windows) - 1) * min(per_window, stride)
    scored = [w.start + j for w in windows for j in range(w.score_from, ctx)]
    assert len(scored) == expected == len(set(scored))  # no token is scored twice
    for w in windows:
        assert w.score_from > ctx // 2  # every scored token has over half a window of context
    if stride <= per_window:  # windows overlap enough: every token from the first scored one on is scored
        assert scored == list(range(ctx // 2 + 1, windows[-1].start + ctx))


def test_llama_cpp_window_count():
    assert sum(512 - w.score_from for w in plan_windows(5576, 512, 512)) == 10 * 255
    assert len(plan_windows(5576, 512, 512, max_windows=2)) == 2


def test_bos_replaces_the_first_token_of_every_window(tiny_llm):
    firsts = []
    hook = tiny_llm.model.register_forward_pre_hook(lambda module, args: firsts.append(args[0][0, 0].item()))
    try:
        r = perplexity(tiny_llm, TEXT[:400], ctx=64)
    finally:
        hook.remove()
    assert firsts == [tiny_llm.tokenizer.bos_id] * r.windows


@pytest.mark.parametrize("kwargs, message", [
    ({"ctx": 2}, "ctx=2 is out of range"),
    ({"ctx": 10_000}, "ctx=10000 is out of range; accepted: 3..512"),
    ({"ctx": 64, "stride": 65}, "stride=65 is out of range"),
    ({"ctx": 64, "max_windows": 0}, "max_windows=0 is out of range"),
])
def test_bad_arguments(tiny_llm, kwargs, message):
    with pytest.raises(FastDecodeError, match=message):
        perplexity(tiny_llm, TEXT[:400], **kwargs)


def test_ids_outside_the_vocabulary(tiny_llm):
    with pytest.raises(FastDecodeError, match=r"token id 999 is outside the vocabulary \[0, 260\)"):
        perplexity(tiny_llm, [1] * 10 + [999], ctx=4)


def test_text_shorter_than_a_window(tiny_llm):
    with pytest.raises(FastDecodeError, match="the text has 11 tokens, fewer than one window of ctx=64"):
        perplexity(tiny_llm, "ten bytes!", ctx=64)


# -- (c) the command ------------------------------------------------------------------------

def test_command_prints_a_perplexity(tmp_path):
    path = tmp_path / "text.txt"
    path.write_text(TEXT[:1000], encoding="utf-8")
    p = subprocess.run([sys.executable, "-m", "fastdecode", "perplexity", "model=tiny", f"text={path}", "ctx=64"],
                       capture_output=True, timeout=120, cwd=ROOT)
    out, err = p.stdout.decode(), p.stderr.decode()
    assert p.returncode == 0, err
    lines = out.splitlines()
    assert len(lines) == 1 and lines[0].startswith("fastdecode  ppl ")
    assert "tokens scored 465 in 15 windows" in lines[0]  # 1001 ids: 15 windows of 64, 31 scored in each
    assert sorted(p.name for p in tmp_path.iterdir()) == ["text.txt"]  # nothing written


def run_cli(capsys, *args):
    rc = cli.main(["perplexity", *args])
    out, err = capsys.readouterr()
    return rc, out, err


def test_command_json(capsys, tmp_path, tiny_llm):
    path = tmp_path / "text.txt"
    path.write_text(TEXT[:1000], encoding="utf-8")
    rc, out, err = run_cli(capsys, "model=tiny", f"text={path}", "ctx=64", "max_windows=3", "--json")
    assert rc == 0, err
    report = json.loads(out)
    assert report["text"] == str(path) and report["text_tokens"] == 1001
    [r] = report["results"]  # llama.cpp runs on .gguf files only
    want = perplexity(tiny_llm, TEXT[:1000], ctx=64, max_windows=3)
    assert (r["engine"], r["windows"], r["tokens"]) == ("fastdecode", 3, 93)
    assert r["ppl"] == want.ppl


@pytest.mark.parametrize("content, args, message", [
    (None, [], "text '{path}' not found"),
    (b"ok\n\xff\xfe", [], "text '{path}' is not valid UTF-8: byte 0xff on line 2"),
    (b" \n", [], "text '{path}' is empty"),
    (b"short text", ["ctx=64"], "the text has 11 tokens, fewer than one window of ctx=64"),
    (b"x" * 200, ["ctx=5000"], "ctx=5000 is out of range; accepted: 3..512 for this model"),
    (b"x" * 200, ["ctx=2"], "ctx=2 is out of range"),
    (b"x" * 200, ["ctx=abc"], "ctx='abc' is not valid"),
    (b"x" * 200, ["max_windows=0"], "max_windows=0 is out of range"),
    (b"x" * 200, ["llama_cpp=true"], "llama_cpp=true needs a .gguf model"),
    (b"x" * 200, ["weights=int3"], "weights"),
    (b"x" * 200, ["cxt=64"], "unknown key 'cxt'"),
])
def test_command_bad_input(capsys, tmp_path, content, args, message):
    path = tmp_path / "text.txt"
    if content is not None:
        path.write_bytes(content)
    rc, out, err = run_cli(capsys, "model=tiny", f"text={path}", *args)
    assert rc == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("fastdecode: error: ")
    assert message.format(path=path) in err


# -- (d) the default model --------------------------------------------------------------------

@pytest.fixture(scope="module")
def default_run():
    """Our perplexity on the default model and text, first two windows of 512 (one
    thread: on a busy 2-core machine a second one costs more than it brings)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        llm = fastdecode.load()
        ids = encode_text(llm.tokenizer, TEXT)
        return llm, ids, perplexity(llm, ids, ctx=512, max_windows=2)
    finally:
        torch.set_num_threads(threads)


def test_default_model_perplexity_is_plausible(default_run):
    _, _, ours = default_run
    assert (ours.windows, ours.tokens) == (2, 2 * 255)
    assert math.isfinite(ours.ppl) and 1 < ours.ppl < 100  # English prose, a 135M instruct model


def test_default_model_agrees_with_llama_cpp(default_run):
    need_llama_cpp()
    llm, ids, ours = default_run
    theirs = llama_cpp_perplexity(llm.source, llm.tokenizer, ids, ctx=512, max_windows=2, n_threads=1)
    assert (theirs.engine, theirs.windows, theirs.tokens) == ("llama.cpp", ours.windows, ours.tokens)
    assert abs(theirs.ppl / ours.ppl - 1) < 0.02


def test_command_on_the_default_model(capsys):
    """Both engines through the command (llama.cpp when installed), on one short window."""
    rc, out, err = run_cli(capsys, "ctx=64", "max_windows=1")
    assert rc == 0, err
    lines = out.splitlines()
    assert lines[0].startswith("fastdecode  ppl ") and "tokens scored 31 in 1 windows" in lines[0]
    if llama_cpp_available():
        assert len(lines) == 2 and lines[1].startswith("llama.cpp   ppl ") and "% vs fastdecode)" in lines[1]
    else:
        assert len(lines) == 1
