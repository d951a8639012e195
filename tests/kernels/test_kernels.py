"""kernels/__init__.py: building and registering the native ops, saying once why they are
unavailable, and the quantized kernels' instruction-set switch.

What each kernel computes is tested against its PyTorch twin where the twin lives
(tests/quant/ for the quantized matmuls).
"""

import logging
import os
import re

import pytest
import torch

from fastdecode import kernels
from fastdecode.quant import formats

NATIVE = kernels.load_kernels()
native_only = pytest.mark.skipif(not NATIVE, reason=f"native kernels unavailable: {kernels.unavailable_reason}")


@pytest.fixture
def unloaded(monkeypatch):
    """Forget for one test whether the kernels loaded (the ops stay registered); restored after."""
    monkeypatch.setattr(kernels, "_loaded", None)
    monkeypatch.setattr(kernels, "unavailable_reason", None)


def kernel_warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "fastdecode.kernels"]


@pytest.mark.parametrize("cause, words", [
    (lambda mp: mp.setenv("FASTDECODE_NO_KERNELS", "1"), "FASTDECODE_NO_KERNELS is set"),
    (lambda mp: mp.setattr("torch.backends.cpu.get_cpu_capability", lambda: "DEFAULT"), "this CPU lacks AVX2/FMA"),
    (lambda mp: mp.setattr("shutil.which", lambda name: None), "no C++ compiler found"),
], ids=["env", "no-avx2", "no-compiler"])
def test_unavailable_says_why_once(unloaded, monkeypatch, caplog, cause, words):
    cause(monkeypatch)
    with caplog.at_level(logging.WARNING, logger="fastdecode.kernels"):
        assert kernels.load_kernels() is False
        assert kernels.load_kernels() is False  # decided once per process
    assert words in kernels.unavailable_reason
    assert kernel_warnings(caplog) == [
        f"native kernels unavailable, using the PyTorch reference path: {kernels.unavailable_reason}"]
    assert kernels.active_isa() == "reference" and kernels.available_isas() == []
    with pytest.raises(RuntimeError, match=re.escape(words)):
        kernels.set_isa("avx2")


def test_failed_build_is_one_line(unloaded, monkeypatch, caplog, tmp_path):
    """The reason is the compiler's first error line (a stand-in compiler that fails at once)."""
    cxx = tmp_path / "c++"
    cxx.write_text("#!/bin/sh\necho 'In file included from x.h:1:'\necho 'x.cpp:1:1: error: boom' >&2\n"
                   "echo 'x.cpp:2:1: error: more' >&2\nexit 1\n")
    cxx.chmod(0o755)
    monkeypatch.setattr(kernels, "_lib", None)  # as if nothing were built in this process
    monkeypatch.setenv("FASTDECODE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("CXX", str(cxx))
    monkeypatch.setattr("torch.backends.cpu.get_cpu_capability", lambda: "AVX2")
    with caplog.at_level(logging.WARNING, logger="fastdecode.kernels"):
        assert kernels.load_kernels() is False
    assert kernels.unavailable_reason == "build failed: x.cpp:1:1: error: boom"
    assert len(kernel_warnings(caplog)) == 1
    assert [p.name for p in (tmp_path / "cache" / "kernels").iterdir()] == []  # no temporary directory left


@native_only
def test_loaded_again_without_rebuilding(unloaded, monkeypatch):
    def fail(*args, **kwargs):
        raise AssertionError("rebuilt although this process has the library")

    monkeypatch.setattr(kernels, "_build", fail)
    assert kernels.load_kernels() is True and kernels.unavailable_reason is None


def test_build_dir_is_per_torch_version_under_the_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("FASTDECODE_CACHE", str(tmp_path))
    d = kernels.build_dir()
    assert d.parent == tmp_path / "kernels"
    assert d.name.startswith(f"torch-{torch.__version__.replace('+', '_')}-")
    assert d == kernels.build_dir()  # the source hash is stable


@native_only
def test_isa_switch():
    isas = kernels.available_isas()
    assert isas[0] == "avx2"  # the kernels load only on CPUs with AVX2
    detected = kernels.active_isa()
    assert detected == (os.environ.get("FASTDECODE_ISA") or isas[-1])  # detection picks the best one here
    for name in isas:
        assert kernels.set_isa(name) == name == kernels.active_isa()
        assert kernels.available_isas() == isas and kernels.active_isa() == name  # listing changes nothing
    assert kernels.set_isa(None) == detected
    missing = [n for n in kernels.ISAS if n not in isas]
    if missing:
        with pytest.raises(ValueError, match=f"does not support {missing[0]}"):
            kernels.set_isa(missing[0])
        assert kernels.active_isa() == detected


@native_only
def test_opcheck():
    """The fake (shape-only) registrations agree with the kernels, for torch.compile and torch.export."""
    x = torch.randn(3, 64)
    p4, p8 = formats.quantize(torch.randn(8, 64), "q4"), formats.quantize(torch.randn(8, 64), "q8")
    torch.library.opcheck(torch.ops.fastdecode.q4_linear, (x, p4["qweight"], p4["scales"], p4["mins"]))
    torch.library.opcheck(torch.ops.fastdecode.q8_linear, (x, p8["qweight"], p8["scales"]))
    torch.library.opcheck(torch.ops.fastdecode.gemv, (x, torch.randn(8, 64)))
    torch.library.opcheck(torch.ops.fastdecode.rms_norm, (torch.randn(2, 3, 64), torch.randn(64), 1e-5))
    torch.library.opcheck(torch.ops.fastdecode.first_max, (torch.randn(3, 100),))
    torch.library.opcheck(torch.ops.fastdecode.rope, (torch.arange(10).view(2, 5), torch.rand(16)))
    torch.library.opcheck(torch.ops.fastdecode.silu_mul, (torch.randn(2, 3, 64),))
    torch.library.opcheck(torch.ops.fastdecode.gelu_tanh_mul, (torch.randn(2, 3, 64),))
