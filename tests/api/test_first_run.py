"""What a first run does where the machine cannot do what was asked: it generates, and says what ran instead.

These run in subprocesses without FASTDECODE_NO_PACKAGE (which tests/conftest.py sets
for the other tests), so load()'s own choice of steps is what runs.
"""

import os
import subprocess
import sys

SCRIPT = """
import sys, fastdecode
kwargs = eval(sys.argv[1])
llm = fastdecode.load("tiny", **kwargs)
out = llm.generate([[1, 2, 3]], max_new_tokens=4, temperature=0)[0].token_ids
print("TOKENS", out, "COMPILED", llm.compiled, "COMPILE", llm.compile, "EXPORTING", llm.exporting_package)
"""


def run(tmp_path, kwargs: str, **env: str) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if k != "FASTDECODE_NO_PACKAGE"}
    environ.update(FASTDECODE_CACHE=str(tmp_path / "cache"), **env)
    return subprocess.run([sys.executable, "-c", SCRIPT, kwargs], env=environ, capture_output=True, text=True,
                          timeout=300)


def warnings(p: subprocess.CompletedProcess) -> list[str]:
    return [line for line in p.stderr.splitlines() if line.strip()]


def test_no_kernels_default_load_generates_without_a_package(tmp_path):
    p = run(tmp_path, "{}", FASTDECODE_NO_KERNELS="1")
    assert p.returncode == 0, p.stderr
    assert "TOKENS [" in p.stdout and "COMPILED None" in p.stdout and "EXPORTING None" in p.stdout
    assert not (tmp_path / "cache" / "packages").exists()  # no export started without the kernels


def test_a_package_without_kernels_runs_the_strategy_and_says_so(tmp_path):
    package = tmp_path / "step.pt2"
    package.write_bytes(b"")
    p = run(tmp_path, f"dict(compiled={str(package)!r})", FASTDECODE_NO_KERNELS="1")
    assert p.returncode == 0, p.stderr
    assert "COMPILED None" in p.stdout and "COMPILE none" in p.stdout
    said = [line for line in warnings(p) if "compiled=" in line]
    assert len(said) == 1 and "unavailable" in said[0] and "FASTDECODE_NO_KERNELS" in said[0], p.stderr


def test_compile_without_a_compiler_runs_eager_and_says_so(tmp_path):
    p = run(tmp_path, "dict(compile='decode', compiled=None)", CXX=str(tmp_path / "no-such-compiler"))
    assert p.returncode == 0, p.stderr
    assert "COMPILE none" in p.stdout
    said = [line for line in warnings(p) if "compile=decode" in line]
    assert len(said) == 1 and "C++ compiler" in said[0] and "eager" in said[0], p.stderr
