"""kernels/__init__.py's build: built once, then loaded whatever PATH holds; never half-built; one line saying
why when it fails.

One real cold build per session (the module's `built` fixture, ~10-40 s: the session's own when it began with
no kernels, see conftest.py); the other tests that need a library in a fresh cache copy that one in place of
compiling (`fake_compile`). A library is loaded in a subprocess
whenever it is not this process's own: a second copy of the ops would be registered twice.
"""

import json
import logging
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import fastdecode
from fastdecode import kernels
from fastdecode.errors import FastDecodeError
from conftest import KERNEL_LOAD as LOAD, VENV_BIN, cold_kernel_build, run_python

pytestmark = pytest.mark.skipif(not kernels.load_kernels(),
                                reason=f"native kernels unavailable: {kernels.unavailable_reason}")

def python(code: str, cache: Path, path: str) -> subprocess.CompletedProcess:
    p = run_python(code, cache, path)
    assert p.returncode == 0, p.stderr
    return p


def building_lines(stderr: str) -> list[str]:
    return [ln for ln in stderr.splitlines() if "native kernels" in ln]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """A cache with the kernels built cold by a process whose PATH starts with the venv's bin (its ninja)."""
    cold = cold_kernel_build()
    if cold is not None:
        return cold
    cache = tmp_path_factory.mktemp("kernel-cache")
    p = python(LOAD, cache, f"{VENV_BIN}:{os.environ['PATH']}")
    [so] = (cache / "kernels").glob("torch-*/fastdecode_kernels.so")
    return cache, so, p.stderr


def test_built_once_then_loaded_without_any_build_tool(built, tmp_path):
    cache, so, stderr = built
    lines = building_lines(stderr)
    assert len(lines) == 2 and "building native kernels for this CPU" in lines[0], stderr
    assert str(so.parent) in lines[0] and lines[1].startswith("fastdecode: native kernels built in ")
    assert sorted(p.name for p in so.parent.iterdir()) == ["build.json", "fastdecode_kernels.so"]
    assert [p.name for p in so.parent.parent.iterdir()] == [so.parent.name]  # no temporary directory left
    before = so.stat()
    # Another PATH (no venv bin) whose first ninja and c++ would fail loudly: neither runs, nothing is printed.
    fake = tmp_path / "bin"
    fake.mkdir()
    for tool in ("ninja", "c++"):
        (fake / tool).write_text(f"#!/bin/sh\ntouch {tmp_path}/{tool}-ran\nexit 1\n")
        (fake / tool).chmod(0o755)
    p = python(LOAD, cache, f"{fake}:/usr/bin:/bin")
    assert building_lines(p.stderr) == [] and not list(tmp_path.glob("*-ran")), p.stderr
    after = so.stat()
    assert (after.st_ino, after.st_mtime_ns, after.st_size) == (before.st_ino, before.st_mtime_ns, before.st_size)


@pytest.fixture
def fake_compile(built, monkeypatch):
    """kernels._compile copying the built library (optionally cut short) instead of compiling; for this process."""
    _, so, _ = built

    def compile_(out: Path, truncate: bool = False, then=None):
        data = so.read_bytes()
        (out / "fastdecode_kernels.so").write_bytes(data[:len(data) // 3] if truncate else data)
        if then:
            then()

    monkeypatch.setattr(kernels, "_compile", compile_)
    return compile_


def copying_loader(so: Path, delay: float = 0.0) -> str:
    """Subprocess code: load the kernels with _compile copying `so` (after `delay` s) in place of compiling."""
    return f"""
        import shutil, time
        from fastdecode import kernels
        def compile_(out):
            time.sleep({delay})
            shutil.copy({str(so)!r}, out / "fastdecode_kernels.so")
        kernels._compile = compile_
        assert kernels.load_kernels(), kernels.unavailable_reason
        import torch
        x = torch.randn(2, 64)
        assert torch.allclose(torch.ops.fastdecode.gemv(x, torch.eye(64)), x)
        print("ok")
    """


def test_interrupted_build_leaves_nothing_under_the_real_name(fake_compile, monkeypatch, tmp_path):
    monkeypatch.setenv("FASTDECODE_CACHE", str(tmp_path))
    d = kernels.build_dir()

    def interrupt():
        raise KeyboardInterrupt

    monkeypatch.setattr(kernels, "_compile", lambda out: fake_compile(out, truncate=True, then=interrupt))
    with pytest.raises(KeyboardInterrupt):
        kernels._build(d)
    assert not d.exists() and list(d.parent.iterdir()) == []  # Ctrl-C: the temporary directory is removed too


def test_killed_build_is_never_used(built, tmp_path):
    """A build killed halfway leaves a temporary directory with a truncated library, which no one loads."""
    _, so, _ = built
    killed = """
        import os, signal
        from fastdecode import kernels
        def compile_(out):
            data = open({so!r}, "rb").read()
            (out / "fastdecode_kernels.so").write_bytes(data[:len(data) // 3])
            os.kill(os.getpid(), signal.SIGKILL)
        kernels._compile = compile_
        kernels.load_kernels()
    """.format(so=str(so))
    e = {**os.environ, "FASTDECODE_CACHE": str(tmp_path)}
    assert subprocess.run([sys.executable, "-c", textwrap.dedent(killed)], env=e, timeout=900).returncode == -9
    [tmp] = (tmp_path / "kernels").iterdir()
    assert tmp.name.startswith(".tmp-torch-") and (tmp / "fastdecode_kernels.so").stat().st_size < so.stat().st_size
    old = time.time() - 2 * 3600
    os.utime(tmp, (old, old))  # an hour old: cleared by the next build
    python(copying_loader(so), tmp_path, os.environ["PATH"])
    [final] = (tmp_path / "kernels").iterdir()
    assert final.name.startswith("torch-") and final.name in tmp.name
    assert (final / "fastdecode_kernels.so").read_bytes() == so.read_bytes()
    assert json.loads((final / "build.json").read_text())["size"] == so.stat().st_size


def test_truncated_library_under_the_real_name_is_rebuilt(fake_compile, monkeypatch, tmp_path):
    monkeypatch.setenv("FASTDECODE_CACHE", str(tmp_path))
    d = kernels.build_dir()
    d.mkdir(parents=True)
    (d / "fastdecode_kernels.so").write_bytes(b"\x7fELF truncated")
    assert not kernels._complete(d)
    kernels._build(d)
    assert kernels._complete(d) and (d / "fastdecode_kernels.so").stat().st_size > 1000
    assert [p.name for p in d.parent.iterdir()] == [d.name]


def test_two_processes_building_at_once_both_work(built, tmp_path):
    _, so, _ = built
    code = copying_loader(so, delay=1.0)  # both are still "compiling" when the first renames its build into place
    e = {**os.environ, "FASTDECODE_CACHE": str(tmp_path)}
    e.pop("FASTDECODE_ISA", None)
    procs = [subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], env=e, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=900) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    assert [len(building_lines(err)) for _, err in outs] == [2, 2]  # both built; one rename won
    [final] = (tmp_path / "kernels").iterdir()
    assert kernels._complete(final) and sorted(p.name for p in final.iterdir()) == ["build.json",
                                                                                      "fastdecode_kernels.so"]


@pytest.fixture
def fresh(monkeypatch):
    """Forget this process's kernels for one test (the ops stay registered); restored after."""
    isa, default, lib = kernels.active_isa(), kernels._default_isa, kernels._lib
    monkeypatch.setattr(kernels, "_loaded", None)
    monkeypatch.setattr(kernels, "unavailable_reason", None)
    yield
    kernels._default_isa = default
    lib.fastdecode_set_isa(kernels.ISAS[isa])


def test_unwritable_cache_is_one_line_and_the_reference_path_works(fresh, monkeypatch, tmp_path, caplog):
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("FASTDECODE_CACHE", str(tmp_path / "file" / "cache"))  # fails even as root
    monkeypatch.setattr(kernels, "_lib", None)
    with caplog.at_level(logging.WARNING):
        llm = fastdecode.load("tiny")
    reason = kernels.unavailable_reason
    assert reason.startswith(f"cannot write the kernel cache {tmp_path / 'file' / 'cache' / 'kernels'} (")
    assert "FASTDECODE_CACHE" in reason and "\n" not in reason
    assert [r.getMessage() for r in caplog.records if r.name == "fastdecode.kernels"] == [
        f"native kernels unavailable, using the PyTorch reference path: {reason}"]
    assert llm.kernels.ops == []
    assert len(llm.generate([1, 2, 3], max_new_tokens=4, temperature=0, ignore_eos=True)[0].token_ids) == 4


def test_compile_error_gives_the_compilers_first_error_line(fresh, monkeypatch, tmp_path):
    src = tmp_path / "src"
    shutil.copytree(kernels._HERE, src, ignore=shutil.ignore_patterns("*.py", "__pycache__"))
    first = kernels._SOURCES[0]  # started first, and fails at once
    (src / first).write_text("int f() { return undeclared_name; }\n")
    monkeypatch.setattr(kernels, "_HERE", src)
    monkeypatch.setattr(kernels, "_lib", None)
    monkeypatch.setenv("FASTDECODE_CACHE", str(tmp_path / "cache"))
    t0 = time.monotonic()
    assert kernels.load_kernels() is False
    assert kernels.unavailable_reason == (f"build failed: {src / first}:1:18: error: "
                                          "'undeclared_name' was not declared in this scope")
    assert time.monotonic() - t0 < 5  # the other compilers are stopped, not waited for
    assert list((tmp_path / "cache" / "kernels").iterdir()) == []


@pytest.mark.parametrize("value, disabled", [("1", True), ("true", True), ("YES", True), ("0", False),
                                             ("false", False), ("", False)])
def test_no_kernels_switch(fresh, monkeypatch, value, disabled):
    monkeypatch.setenv("FASTDECODE_NO_KERNELS", value)
    assert kernels.load_kernels() is not disabled


def test_isa_from_the_environment(fresh, monkeypatch, caplog):
    monkeypatch.setenv("FASTDECODE_ISA", "avx2")
    assert kernels.load_kernels() and kernels.active_isa() == "avx2"
    best = kernels.available_isas()[-1]
    assert kernels.set_isa(best) == best and kernels.set_isa(None) == "avx2"  # None: the environment's choice
    monkeypatch.setattr(kernels, "_loaded", None)
    monkeypatch.setenv("FASTDECODE_ISA", "sse9")
    with caplog.at_level(logging.WARNING, logger="fastdecode.kernels"):
        assert kernels.load_kernels()
    assert [r.getMessage() for r in caplog.records if r.name == "fastdecode.kernels"] == [
        "FASTDECODE_ISA='sse9' is not one of avx2, avx512-vnni; detecting the instruction set instead"]
    assert kernels.active_isa() == best and kernels.set_isa(None) == best
    with pytest.raises(FastDecodeError, match="unknown instruction set 'sse9'; accepted: avx2, avx512-vnni"):
        kernels.set_isa("sse9")


def test_load_builds_on_a_thread_while_it_reads_the_checkpoint(built, tmp_path):
    """A cold load() starts the kernel build on a thread first (it overlaps the checkpoint's
    reading and conversion), builds once, and then uses the kernels."""
    _, so, _ = built
    code = f"""
        import shutil, threading
        import fastdecode
        from fastdecode import kernels
        seen = []
        def compile_(out):
            seen.append(threading.current_thread().name)
            shutil.copy({str(so)!r}, out / "fastdecode_kernels.so")
        kernels._compile = compile_
        llm = fastdecode.load("tiny", compiled=None)
        assert seen == ["fastdecode-kernel-build"], seen
        assert kernels.load_kernels(), kernels.unavailable_reason
        print(llm.generate([[1, 2, 3]], max_new_tokens=4, temperature=0)[0].token_ids)
    """
    p = python(code, tmp_path / "cache", os.environ["PATH"])
    assert len(building_lines(p.stderr)) == 2, p.stderr
