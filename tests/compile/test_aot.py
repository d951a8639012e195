"""Exported packages (`fastdecode export`, `load(..., compiled=PATH)`) against eager.

The session exports one package of the tiny model through the CLI (conftest's
`tiny_package`, an AOTInductor compile: seconds), and the module checks
everything else against it.
"""

import fcntl
import json
import os
import random
import tempfile
import zipfile
from pathlib import Path

import time

import pytest
import torch
from torch._dynamo.utils import counters

import fastdecode
from fastdecode.compile import aot
from fastdecode.cli import main as cli
from fastdecode.compile.aot import check_compatible, read_metadata
from fastdecode.errors import FastDecodeError
from fastdecode.api import build as build_module
from fastdecode.config import LoadOptions
from fastdecode.paths import BusyFlag, open_busy_lock
from conftest import make_model

SAMPLED = dict(temperature=0.9, top_k=40, top_p=0.9, min_p=0.02, repetition_penalty=1.2,
               frequency_penalty=0.3, presence_penalty=0.2, seed=11)


@pytest.fixture(scope="module")
def package(tiny_package):
    return tiny_package


@pytest.fixture(scope="module")
def exported(package):
    return fastdecode.load("tiny", compiled=package, max_batch_size=4)


def ids(completions):
    return [c.token_ids for c in completions]


def test_package_equals_eager_and_never_compiles(tiny_llm, exported):
    graphs = counters["stats"]["unique_graphs"]
    rng = random.Random(1)
    for i in range(10):
        B = 1 + i % 4
        lengths = (250, 300) if i % 5 == 4 else (1, 40)  # two cache buckets
        prompts = [[rng.randrange(3, 256) for _ in range(rng.randint(*lengths))] for _ in range(B)]
        opts = dict(temperature=0) if i % 2 else dict(SAMPLED)
        opts["max_new_tokens"] = rng.choice([1, 3, 9, 19])
        assert ids(exported.generate(prompts, **opts)) == ids(tiny_llm.generate(prompts, **opts)), i

    # Rows that finish early on an EOS, and min_new_tokens holding EOS back.
    prompts = [[5, 6, 7], [40, 41, 42, 43, 44, 45], [9] * 20]
    eos = tiny_llm.generate(prompts, max_new_tokens=20, temperature=0, ignore_eos=True)[0].token_ids[5]
    for opts in (dict(temperature=0), dict(SAMPLED), dict(temperature=0, min_new_tokens=12)):
        a = tiny_llm.generate(prompts, max_new_tokens=20, eos_token_ids=[eos], **opts)
        b = exported.generate(prompts, max_new_tokens=20, eos_token_ids=[eos], **opts)
        assert ids(a) == ids(b)
        assert [c.finish_reason for c in a] == [c.finish_reason for c in b]
    assert "stop" in [c.finish_reason for c in a[:1]] or len(a[0].token_ids) >= 12
    assert counters["stats"]["unique_graphs"] == graphs  # no Dynamo tracing at all


def test_steps_take_the_caches_set_up_after_them(package):
    """The steps keep the caches' tensors between steps; caches set up again (new tensors) must
    be the ones the next step reads and writes, as eager's are."""
    llm = fastdecode.load("tiny", compiled=package, max_batch_size=2)
    model, steps = llm.engine.model, llm.steps
    assert steps.compiled == package
    tokens, pos = torch.tensor([[5, 6, 7, 8]]), torch.arange(4)[None]
    rows, at = torch.tensor([1]), torch.tensor([[3]])
    first = steps.step(tokens, pos, rows, at)
    old = model.layers[0].attention.kv_cache.k_cache
    model.setup_caches(2, 64, dtype=model.kv_dtype)
    new = model.layers[0].attention.kv_cache.k_cache
    assert new.data_ptr() != old.data_ptr()
    written = old[1, :4].clone()
    again = steps.step(tokens, pos, rows, at)
    assert torch.equal(again, first)
    assert torch.equal(new[1, :4], written)  # written into the new caches


def test_metadata_records_what_the_package_was_built_for(package):
    _, meta = read_metadata(package)
    assert json.loads(meta["model_args"])["n_layers"] == 2
    assert meta["dtype"] == "float32" and meta["device"] == "cpu"
    assert meta["torch_version"] == torch.__version__


@pytest.mark.parametrize("change, message", [
    (dict(n_layers=3), r"exported for a different model: n_layers=2 \(this model: 3\)"),
    (dict(max_seq_len=256), r"max_seq_len=512 \(this model: 256\)"),
])
def test_a_different_architecture_is_rejected(package, change, message):
    _, meta = read_metadata(package)
    with pytest.raises(FastDecodeError, match=message):
        check_compatible(meta, make_model(**change), package)


@pytest.mark.parametrize("key, value, message", [
    ("torch_version", "2.0.0", "exported with torch 2.0.0"),
    ("fastdecode_format", "0", "package format 0"),
    ("cpu_capability", "AVX512", "compiled for AVX512 CPUs"),
    ("rope", "0" * 16, "exported for other RoPE frequencies"),
])
def test_a_different_environment_is_rejected(package, key, value, message, monkeypatch):
    _, meta = read_metadata(package)
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX2")  # a CPU without AVX-512
    model = make_model()
    model.kv_dtype = torch.float16  # as load() resolves kv_dtype=auto on CPU, which the package was exported with
    with pytest.raises(FastDecodeError, match=message):
        check_compatible({**meta, key: value}, model, package)


def test_longrope_contexts_get_packages_of_their_own():
    """The package's code holds RoPE's frequencies as constants, and LongRoPE's follow the context
    (its long factors past the original one): each choice has its own key."""
    scaling = dict(kind="longrope", factor=8.0, original_max_position_embeddings=64, short_factor=(1.0,) * 8,
                   long_factor=(4.0,) * 8)
    model = make_model(rope_scaling=scaling)
    keys = []
    for context in (64, 65, 32):
        model.init_rope(context=context)
        keys.append(aot.package_path(model))
    assert keys[0] != keys[1] and keys[0] == keys[2]


def test_load_rejects_a_package_for_another_dtype(package):
    with pytest.raises(FastDecodeError, match="exported for dtype=float32, this model has dtype=bfloat16"):
        fastdecode.load("tiny", compiled=package, dtype="bfloat16")


def test_load_rejects_a_package_for_another_kv_dtype(package):
    """The package takes the caches as inputs: one exported for float16 caches (the CPU
    default) is refused, in one message, for float32 or bfloat16 caches, never run on them."""
    _, meta = read_metadata(package)
    assert meta["kv_dtype"] == "float16"
    for kv in ("float32", "bfloat16"):
        with pytest.raises(FastDecodeError, match=f"exported for kv_dtype=float16, this model has kv_dtype={kv}"):
            fastdecode.load("tiny", compiled=package, kv_dtype=kv)


def test_load_rejects_missing_foreign_and_corrupt_files(package, tmp_path):
    with pytest.raises(FastDecodeError, match="does not exist; create one with `fastdecode export`"):
        fastdecode.load("tiny", compiled=str(tmp_path / "none.pt2"))
    text = tmp_path / "notes.pt2"
    text.write_text("not a package")
    with pytest.raises(FastDecodeError, match="not a compiled package"):
        fastdecode.load("tiny", compiled=str(text))
    other = tmp_path / "other.pt2"
    with zipfile.ZipFile(other, "w") as z:
        z.writestr("other/data.txt", "hello")
    with pytest.raises(FastDecodeError, match="cannot load the compiled package|not made by `fastdecode export`"):
        fastdecode.load("tiny", compiled=str(other))
    data = bytearray(open(package, "rb").read())
    with zipfile.ZipFile(package) as z:
        so = next(i for i in z.infolist() if i.filename.endswith(".so"))
    start = so.header_offset + 30 + len(so.filename.encode()) + len(so.extra)
    for i in range(start + 100, start + 200):
        data[i] ^= 0xFF
    corrupt = tmp_path / "corrupt.pt2"
    corrupt.write_bytes(bytes(data))
    with pytest.raises(FastDecodeError, match="corrupt compiled package"):
        fastdecode.load("tiny", compiled=str(corrupt))


def test_packages_only_combine_with_the_step_strategies(package):
    with pytest.raises(FastDecodeError, match="cannot be combined with compile='generate'"):
        fastdecode.load("tiny", compiled=package, compile="generate")
    with pytest.raises(FastDecodeError, match="needs cache='static'"):
        fastdecode.load("tiny", compiled=package, cache="dynamic")


def test_export_cli_rejects_bad_output_paths(tmp_path, capsys):
    assert cli.main(["export", "model=tiny", "out="]) == 2
    assert "out must be a package path" in capsys.readouterr().err
    assert cli.main(["export", "model=tiny", f"out={tmp_path / 'x.bin'}"]) == 2
    assert "must end in .pt2" in capsys.readouterr().err
    assert cli.main(["export", "model=tiny", f"out={tmp_path / 'missing' / 'x.pt2'}"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "does not exist" in err
    assert list(tmp_path.iterdir()) == []


def test_generate_cli_runs_a_package(tiny_llm, package, capsys):
    assert cli.main(["generate", "model=tiny", f"compiled={package}", "temperature=0", "chat=false",
                     "max_new_tokens=8", "hello"]) == 0
    want = tiny_llm.generate(["hello"], temperature=0, max_new_tokens=8)[0].text
    assert capsys.readouterr().out == want + "\n"


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def test_default_load_generates_at_once_and_exports_the_package_in_the_background(tiny_llm, tmp_path,
                                                                                    monkeypatch):
    """compiled="auto" (the default) with no package yet: the load does not wait for an export;
    it generates eager tokens at once while a child process exports the package; the running
    engine switches to the package between requests, later loads open it, and every run
    generates what eager does."""
    monkeypatch.delenv("FASTDECODE_NO_PACKAGE", raising=False)
    # A busy flag of this test's own: the machine-wide one pauses the export while any other
    # process on the machine generates (a busy machine would stall this test).
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    (tmp_path / "kernels").symlink_to(Path(os.environ["FASTDECODE_CACHE"]) / "kernels")  # no second build
    monkeypatch.setenv("FASTDECODE_CACHE", str(tmp_path))
    first = fastdecode.load("tiny", max_batch_size=4)
    if first.kernels.ops == []:
        pytest.skip("native kernels unavailable here: no package is made without them")
    prompts = [[1, 2, 3], [4, 5]]
    want = ids(tiny_llm.generate(prompts, max_new_tokens=8, temperature=0))
    assert first.compiled is None and first.exporting_package is not None
    assert ids(first.generate(prompts, max_new_tokens=8, temperature=0)) == want  # before the export is done
    path = aot.package_path(first.model)
    # While any process holds the busy flag (an engine with work), the export is stopped.
    flag = BusyFlag()
    flag.set(True)
    supervisor = first.exporting_package
    deadline = time.monotonic() + 30
    while not (workers := _children(supervisor)) and time.monotonic() < deadline:
        time.sleep(0.2)  # the supervisor waits for this process to be idle, then starts the export
    assert len(workers) == 1
    time.sleep(0.6)
    assert _state(workers[0]) == "T" and not path.is_file()
    flag.set(False)
    time.sleep(0.6)
    assert _state(workers[0]) != "T"
    deadline = time.monotonic() + 600
    while first.exporting_package is not None and time.monotonic() < deadline:
        time.sleep(1)
    assert path.is_file(), (path.with_suffix(".log").read_text() if path.with_suffix(".log").exists() else "")
    time.sleep(1.1)  # past the steps' once-a-second check
    assert ids(first.generate(prompts, max_new_tokens=8, temperature=0)) == want
    assert first.compiled == str(path)  # switched between requests
    again = fastdecode.load("tiny", max_batch_size=4)
    assert again.compiled == str(path) and again.exporting_package is None
    assert ids(again.generate(prompts, max_new_tokens=8, temperature=0)) == want
    assert sorted(p.name for p in (tmp_path / "packages").iterdir()) == sorted([path.name, path.with_suffix(".log").name])
    # Where a package does not apply, "auto" means none.
    assert fastdecode.load("tiny", compile="generate").compiled is None
    assert fastdecode.load("tiny", cache="dynamic").compiled is None


def test_the_background_export_plans_its_loops_for_the_parents_threads(tmp_path, monkeypatch):
    """Inductor plans its loops by torch's thread count when it compiles (which ones it fuses; the
    package's loops all run serial): the export child runs on one thread, so it must export with
    the thread count the parent runs the package on, as the parent's own export would."""
    from fastdecode.cli import export as export_cli

    monkeypatch.delenv("FASTDECODE_NO_PACKAGE", raising=False)
    (tmp_path / "kernels").symlink_to(Path(os.environ["FASTDECODE_CACHE"]) / "kernels")
    monkeypatch.setenv("FASTDECODE_CACHE", str(tmp_path))
    jobs = []
    monkeypatch.setattr(build_module.background_export, "start", lambda job: jobs.append(job))
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(3)
        llm = fastdecode.load("tiny", max_batch_size=2)
        if llm.kernels.ops == []:
            pytest.skip("native kernels unavailable here: no package is made without them")
        assert [job.threads for job in jobs] == [3]
        planned = []
        monkeypatch.setattr(aot, "export_package", lambda model, path: planned.append(torch.get_num_threads()))
        torch.set_num_threads(1)  # as the child runs
        export_cli._export_as_the_parent_loaded(jobs[0])
        assert planned == [3]
    finally:
        torch.set_num_threads(threads)


def _flag_held() -> bool:
    """Whether some open file holds the busy flag (this process's included: flock locks
    belong to open files)."""
    fd = open_busy_lock()
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def test_a_load_holds_the_busy_flag_and_the_exports_own_load_does_not(tmp_path, monkeypatch):
    """Background exports pause while any process loads a model (a cold 1B load beside one ran
    ~8x slower); the export's own load must not hold the flag, or its supervisor would stop it."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # a flag of this test's own
    seen = []
    real = build_module._load_weights

    def spy(*args, **kwargs):
        seen.append(_flag_held())
        return real(*args, **kwargs)

    monkeypatch.setattr(build_module, "_load_weights", spy)
    fastdecode.load("tiny", max_batch_size=1, compiled=None)
    assert not _flag_held()  # released once loaded (an idle engine holds nothing)
    build_module.build(LoadOptions.from_keywords("tiny", {"max_batch_size": 1, "compiled": None}), busy=False)
    assert seen == [True, False]
