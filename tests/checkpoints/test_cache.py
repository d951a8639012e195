"""The converted-GGUF cache: hit, miss, corruption, atomic writes, clearing."""

import json
import logging
import os
import sys

import pytest
import torch

from fastdecode.checkpoints import cache, clear_cache, load_checkpoint
from tiny_checkpoints import private_cache  # noqa: F401  (autouse fixture)
from tiny_checkpoints import (BOUNDARY_MERGES, MERGES, boundary_tokens, byte_level_tokens, gguf_tensors, hf_model,
                              write_gguf)


@pytest.fixture
def tiny_gguf(tmp_path):
    return write_gguf(tmp_path / "tiny.gguf", gguf_tensors(hf_model()))


def load(path, dtype=torch.float32):
    return load_checkpoint(path, dtype=dtype, device="cpu")


def entries():
    root = cache.cache_root() / "converted"
    return sorted(p.name for p in root.iterdir()) if root.exists() else []


def test_second_load_comes_from_the_cache(tiny_gguf):
    first = load(tiny_gguf)
    assert not first.from_cache and first.cache_path is not None and first.cache_path.is_dir()
    assert str(first.cache_path).startswith(os.environ["FASTDECODE_CACHE"])
    second = load(tiny_gguf)
    assert second.from_cache and second.cache_path == first.cache_path
    assert second.args == first.args
    assert second.state_dict.keys() == first.state_dict.keys()
    for k, v in first.state_dict.items():
        assert torch.equal(second.state_dict[k], v), k
    t1, t2 = first.tokenizer, second.tokenizer
    text = "<|im_start|>user\nhello wörld 🤖<|im_end|>"
    assert t2.encode(text) == t1.encode(text)
    assert (t2.bos_id, t2.eos_ids, t2.pad_id, t2.add_bos, t2.chat_template) == (
        t1.bos_id, t1.eos_ids, t1.pad_id, t1.add_bos, t1.chat_template)


def test_a_tokenizer_built_by_an_older_rule_is_rebuilt_and_the_weights_kept(tmp_path, monkeypatch):
    """An entry from before TOKENIZER_VERSION (here one that split a StarCoder-style vocabulary
    as GPT-2, so its digit merges joined numbers) gets the file's tokenizer, and keeps it."""
    tokens = boundary_tokens()
    path = write_gguf(tmp_path / "sc.gguf", gguf_tensors(hf_model(vocab_size=len(tokens))), tokens=tokens,
                      merges=BOUNDARY_MERGES, extra={"tokenizer.ggml.pre": "refact"}, control=("<|endoftext|>",))
    first = load(path)
    entry = first.cache_path
    assert first.tokenizer.encode("123", add_special_tokens=False) == [tokens.index(c) for c in "123"]
    # What an older fastdecode wrote: the GPT-2 split, no tokenizer_version in meta.json.
    old = json.loads((entry / "tokenizer_state.json").read_text())
    backend = json.loads(old["backend"])
    assert backend["pre_tokenizer"]["type"] == "Sequence"
    backend["pre_tokenizer"] = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                                "use_regex": True}
    old["backend"] = json.dumps(backend)
    (entry / "tokenizer_state.json").write_text(json.dumps(old))
    meta = json.loads((entry / "meta.json").read_text())
    meta["sizes"]["tokenizer_state.json"] = (entry / "tokenizer_state.json").stat().st_size
    del meta["tokenizer_version"]
    (entry / "meta.json").write_text(json.dumps(meta))
    weights = {p.name: p.stat().st_mtime_ns for p in weight_files(entry)}
    stale = cache.read_entry(entry, path)
    assert stale.tokenizer_version == 1 and stale.tokenizer.encode("123", add_special_tokens=False) == [
        tokens.index("123")]

    second = load(path)
    assert second.from_cache and second.cache_path == entry
    assert second.tokenizer.encode("123", add_special_tokens=False) == [tokens.index(c) for c in "123"]
    assert {p.name: p.stat().st_mtime_ns for p in weight_files(entry)} == weights  # not converted again
    assert json.loads((entry / "meta.json").read_text())["tokenizer_version"] == cache.TOKENIZER_VERSION
    assert cache.read_entry(entry, path).tokenizer.encode("123", add_special_tokens=False) == [
        tokens.index(c) for c in "123"]


def mapped_ranges(path):
    """The address ranges at which this process maps `path` (/proc/self/maps)."""
    real, out = os.path.realpath(path), []
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split(maxsplit=5)
            if len(parts) == 6 and parts[5].strip() == real:
                lo, hi = (int(x, 16) for x in parts[0].split("-"))
                out.append((lo, hi))
    return out


def weight_files(entry):
    return sorted(entry.glob("model-*.safetensors"))


def test_first_load_runs_from_the_memory_mapped_entry(tiny_gguf):
    """A conversion's own tensors are dropped for the entry it wrote, so that a first run
    does not hold the weights twice (the converted copy and the file's pages)."""
    first = load(tiny_gguf)
    ranges = [r for path in weight_files(first.cache_path) for r in mapped_ranges(path)]
    assert ranges
    for k, v in first.state_dict.items():
        assert any(lo <= v.data_ptr() < hi for lo, hi in ranges), k


def test_key_covers_dtype_and_file_changes(tiny_gguf):
    load(tiny_gguf)
    load(tiny_gguf, dtype=torch.bfloat16)
    assert len(entries()) == 2
    os.utime(tiny_gguf, ns=(1, 1))  # a new mtime is a new file as far as the cache knows
    assert not load(tiny_gguf).from_cache
    assert len(entries()) == 3


@pytest.mark.parametrize("damage", ["truncate_weights", "garbage_meta", "delete_meta", "bad_tokenizer",
                                    "bad_backend"])
def test_corrupt_entry_is_detected_and_rebuilt(tiny_gguf, damage, caplog):
    entry = load(tiny_gguf).cache_path
    if damage == "truncate_weights":
        path = weight_files(entry)[1]
        data = path.read_bytes()
        path.write_bytes(data[: len(data) // 3])
    elif damage == "garbage_meta":
        (entry / "meta.json").write_text("{not json")
    elif damage == "delete_meta":
        (entry / "meta.json").unlink()
    elif damage == "bad_backend":
        path = entry / "tokenizer_state.json"
        state = json.loads(path.read_text())
        text = json.dumps({**state, "backend": "{}"})
        path.write_text(text + " " * (path.stat().st_size - len(text)))  # keep the recorded size
    else:
        size = (entry / "tokenizer_state.json").stat().st_size
        (entry / "tokenizer_state.json").write_text("x" * size)  # same size, unreadable
    with caplog.at_level(logging.WARNING, logger="fastdecode.checkpoints"):
        again = load(tiny_gguf)
    assert not again.from_cache
    assert "corrupt" in caplog.text
    assert load(tiny_gguf).from_cache  # rebuilt and good again


def test_same_size_weights_with_wrong_shapes_are_caught(tiny_gguf):
    entry = load(tiny_gguf).cache_path
    meta = json.loads((entry / "meta.json").read_text())
    meta["args"]["hidden_dim"] = 32
    (entry / "meta.json").write_text(json.dumps(meta))
    assert not load(tiny_gguf).from_cache


def test_failed_write_leaves_nothing_behind(tiny_gguf, monkeypatch, caplog):
    def boom(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(cache, "save_file", boom)
    with caplog.at_level(logging.WARNING, logger="fastdecode.checkpoints"):
        ckpt = load(tiny_gguf)
    assert ckpt.cache_path is None and ckpt.state_dict  # the load itself still works
    assert "not caching" in caplog.text
    assert entries() == []  # no entry and no temporary directory


def test_interrupted_write_leaves_no_temporary_directory(tiny_gguf, monkeypatch):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(cache, "save_file", interrupted)
    with pytest.raises(KeyboardInterrupt):
        load(tiny_gguf)
    assert entries() == []


def test_unwritable_cache_still_loads(tiny_gguf, tmp_path, monkeypatch):
    blocker = tmp_path / "file-not-dir"
    blocker.write_text("")
    monkeypatch.setenv("FASTDECODE_CACHE", str(blocker))
    assert load(tiny_gguf).cache_path is None


def test_clear_cache(tiny_gguf):
    load(tiny_gguf)
    assert entries()
    cleared = clear_cache()
    assert not cleared.exists() and entries() == []


def test_use_cache_false_writes_nothing(tiny_gguf):
    load_checkpoint(tiny_gguf, dtype=torch.float32, device="cpu", use_cache=False)
    assert entries() == []


def test_a_rejected_file_is_not_cached(tmp_path):
    from tiny_checkpoints import byte_level_tokens

    from fastdecode.errors import FastDecodeError

    path = write_gguf(tmp_path / "v.gguf", gguf_tensors(hf_model()), tokens=byte_level_tokens() + ["extra"])
    with pytest.raises(FastDecodeError, match="tokenizer has"):
        load(path)
    assert entries() == []


def test_dtype_must_be_a_torch_float_dtype(tiny_gguf):
    from fastdecode.errors import FastDecodeError

    with pytest.raises(FastDecodeError, match="dtype must be"):
        load_checkpoint(tiny_gguf, dtype="float32", device="cpu")


def test_a_conversion_writes_each_layer_before_converting_the_next(tiny_gguf, monkeypatch):
    """The entry is written a part at a time (each layer, then the rest), so that a first
    load holds one layer's converted tensors, not the model's."""
    from fastdecode.checkpoints import loader

    real = loader.gguf_shards
    seen = []

    def watched(*args, **kwargs):
        for part in real(*args, **kwargs):
            tmp = [p for p in (cache.cache_root() / "converted").iterdir() if p.name.startswith(".tmp-")]
            assert len(tmp) == 1 and len(weight_files(tmp[0])) == len(seen)  # the parts before are on disk
            seen.append(sorted(part))
            yield part

    monkeypatch.setattr(loader, "gguf_shards", watched)
    ckpt = load(tiny_gguf)
    assert len(seen) == ckpt.args.n_layers + 1 == len(weight_files(ckpt.cache_path))
    assert all(all(k.startswith(f"layers.{i}.") for k in keys) for i, keys in enumerate(seen[:-1]))
    assert not any(k.startswith("layers.") for k in seen[-1])


def test_a_bad_file_leaves_no_entry(tmp_path):
    """Names and shapes are checked before an entry is named: a file missing a tensor is
    refused with the usual one-line error, and nothing is left in the cache."""
    tensors = gguf_tensors(hf_model())
    del tensors["blk.1.ffn_up.weight"]
    path = write_gguf(tmp_path / "missing.gguf", tensors)
    with pytest.raises(ValueError, match="missing tensor for layers.1.feed_forward.w3"):
        load(path)
    assert entries() == []


# VmHWM, not getrusage's ru_maxrss: a child's ru_maxrss starts at its parent's peak before exec.
_PEAK_SCRIPT = """
import json, sys, torch
from fastdecode.checkpoints import load_checkpoint

def status(key):
    return int(next(l for l in open("/proc/self/status") if l.startswith(key)).split()[1]) * 1024

base = status("VmRSS")
ckpt = load_checkpoint(sys.argv[1], dtype=torch.float32, weights="auto")
assert not ckpt.from_cache
print(json.dumps({"base": base, "peak": status("VmHWM"), "after": status("VmRSS")}))
"""


def test_a_first_load_of_a_large_file_peaks_near_the_file(tmp_path):
    """A 124 MiB Q8_0 file of 8 layers: converting it holds about a layer at a time, and the
    file's pages that it has read are let go after each layer. Measured over the process
    before the load: a peak of 0.53-0.58x the file (66-72 MiB: a layer, its fused copies,
    the reader's header and the modules the load imports), and 18-21 MiB still resident
    after it. Without the heap trimmed after each layer, the blocks freed by earlier layers
    stayed: 0.70x at the peak and 81 MiB after. Holding the converted model and its
    serialized copy, as conversions did until the entry was written a layer at a time,
    peaked at 2.4x."""
    import subprocess
    import sys

    import numpy as np
    from gguf import GGMLQuantizationType as T

    dim, hidden, heads, kv_heads, layers = 1024, 4096, 16, 4, 8
    rng = np.random.default_rng(0)

    def q8_0(rows, cols):  # random blocks of 32: a float16 scale of 0.01, then 32 int8 values
        blocks = rng.integers(0, 256, size=(rows, cols // 32, 34), dtype=np.uint8)
        blocks[..., :2] = np.frombuffer(np.float16(0.01).tobytes(), np.uint8)
        return blocks.reshape(rows, -1)

    kv = dim // heads * kv_heads
    tensors = {"token_embd.weight": rng.standard_normal((266, dim), dtype=np.float32),
               "output_norm.weight": np.ones(dim, np.float32)}
    quant = {}
    for i in range(layers):
        shapes = {"attn_q": (dim, dim), "attn_k": (kv, dim), "attn_v": (kv, dim), "attn_output": (dim, dim),
                  "ffn_gate": (hidden, dim), "ffn_up": (hidden, dim), "ffn_down": (dim, hidden)}
        for name, (rows, cols) in shapes.items():
            tensors[f"blk.{i}.{name}.weight"] = q8_0(rows, cols)
            quant[f"blk.{i}.{name}.weight"] = T.Q8_0
        tensors[f"blk.{i}.attn_norm.weight"] = np.ones(dim, np.float32)
        tensors[f"blk.{i}.ffn_norm.weight"] = np.ones(dim, np.float32)
    path = write_gguf(tmp_path / "large.gguf", tensors, quant=quant, n_layers=layers, head_dim=dim // heads,
                      dim=dim, hidden_dim=hidden, n_heads=heads, n_kv_heads=kv_heads)
    size = path.stat().st_size
    assert size > 100 * 2**20
    out = subprocess.run([sys.executable, "-c", _PEAK_SCRIPT, str(path)], capture_output=True, text=True,
                         env={**os.environ}, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    m = json.loads(out.stdout.strip().splitlines()[-1])
    assert m["peak"] - m["base"] < size, {k: v / 2**20 for k, v in m.items()}
    assert m["after"] - m["base"] < size / 3, {k: v / 2**20 for k, v in m.items()}


_WARM_SCRIPT = """
import ctypes, json, sys
import fastdecode

def anon():
    return int(next(l for l in open("/proc/self/status") if l.startswith("RssAnon")).split()[1]) * 1024

llm = fastdecode.load(sys.argv[1], compiled=None)
before = anon()
ctypes.CDLL(None).malloc_trim(0)
print(json.dumps({"cached": llm.from_cache, "trimmed": before - anon()}))
"""


def big_vocabulary(n_merges: int) -> tuple[list[str], list[tuple[str, str]]]:
    """The byte-level tokens plus random merges of letters into words of up to 8 characters."""
    import random

    tokens, merges = byte_level_tokens(), list(MERGES)
    have, rng = set(tokens), random.Random(0)
    letters = [t for t in tokens if len(t) == 1 and t.isalpha()]
    words = list(letters)
    while len(merges) < n_merges:
        a, b = rng.choice(words), rng.choice(letters if rng.random() < 0.5 else words)
        if len(a) + len(b) <= 8 and a + b not in have:
            have.add(a + b)
            tokens.append(a + b)
            merges.append((a, b))
            words.append(a + b)
    return tokens, merges


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim and /proc")
def test_a_warm_load_hands_back_what_building_the_tokenizer_freed(tmp_path):
    """Building a tokenizer from the cache's JSON frees most of what it allocates; glibc keeps
    those pages unless trimmed. 100,000 merges: 52 MB stayed resident after a warm load, and
    Gemma 3's 262,144 tokens left 280 MB (2.5x its 253 MB file). What a trim of the loaded
    process still finds is what the load left behind."""
    import subprocess

    tokens, merges = big_vocabulary(100_000)
    path = write_gguf(tmp_path / "vocab.gguf", gguf_tensors(hf_model(vocab_size=len(tokens))), tokens=tokens,
                      merges=merges)
    env = {**os.environ, "FASTDECODE_NO_KERNELS": "1"}  # the tokenizer is the point, not a kernel build
    runs = [subprocess.run([sys.executable, "-c", _WARM_SCRIPT, str(path)], capture_output=True, text=True,
                           env=env, timeout=300) for _ in range(2)]
    assert all(r.returncode == 0 for r in runs), runs[-1].stderr[-2000:]
    first, warm = (json.loads(r.stdout.strip().splitlines()[-1]) for r in runs)
    assert not first["cached"] and warm["cached"]
    assert warm["trimmed"] < 16 * 2**20, warm["trimmed"] / 2**20
