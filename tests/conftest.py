import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

# load() exports a package per model in the background (compiled="auto"); tests that
# are not about that run without one instead of paying a minute per model and cache folder.
os.environ.setdefault("FASTDECODE_NO_PACKAGE", "1")
# The tests' kernels, converted checkpoints and packages live in an ignored folder of
# the checkout (kept between runs), never in the user's ~/.cache/fastdecode.
os.environ.setdefault("FASTDECODE_CACHE", str(Path(__file__).resolve().parents[1] / ".pytest_cache" / "fastdecode"))
# Inductor's caches do not key on ATEN_CPU_CAPABILITY: on an AVX-512 machine, code cached
# by a default run and reused by an `ATEN_CPU_CAPABILITY=avx2` run indexed out of bounds.
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(
    Path(__file__).resolve().parents[1] / ".pytest_cache" / f"inductor-{os.environ.get('ATEN_CPU_CAPABILITY', 'default')}"))

# The first vectorized transcendental (exp, tanh, erf, sin) torch runs in a process, split over two
# threads, came out with relative errors up to ~1.5e-4 on the second thread's half in about 1
# process in 17 on an Intel Xeon VM (torch 2.13; later calls exact to an ulp; never after any such
# op ran first). A twin computed so missed the attention kernel's softcap test by 6e-5. This takes
# that first call.
torch.exp(torch.zeros(1 << 16))

import fastdecode
from fastdecode.model.args import get_preset
from fastdecode.model.transformer import Transformer, init_random_weights


@pytest.fixture(scope="session")
def tiny_llm():
    return fastdecode.load("tiny")


@pytest.fixture(scope="session")
def tiny_package(tmp_path_factory):
    """The tiny model exported once through `fastdecode export` (an AOTInductor compile: ~15 s)."""
    from fastdecode.cli import main as cli

    folder = tmp_path_factory.mktemp("aot")
    path = folder / "tiny.pt2"
    assert cli.main(["export", "model=tiny", f"out={path}"]) == 0
    assert sorted(p.name for p in folder.iterdir()) == ["tiny.pt2"]  # no temporary file left
    return str(path)


def need_llama_cpp():
    """llama_cpp, or a skip saying why it cannot run here: `pytest.importorskip` misses an install
    without its library, whose import raises FileNotFoundError rather than ImportError."""
    from fastdecode.evaluation.perplexity import llama_cpp_problem

    problem = llama_cpp_problem()
    if problem:
        pytest.skip(problem, allow_module_level=True)
    import llama_cpp

    return llama_cpp


def make_model(**changes) -> Transformer:
    """Tiny random model, optionally with changed ModelArgs fields."""
    args = get_preset("tiny").replace(**changes)
    return init_random_weights(Transformer(args), seed=0).eval()


@pytest.fixture(autouse=True)
def _no_grad():
    with torch.no_grad():
        yield


KERNEL_LOAD = "from fastdecode import kernels; assert kernels.load_kernels(), kernels.unavailable_reason; print('ok')"
VENV_BIN = str(Path(sys.executable).parent)
_cold_kernel_build = None


def run_python(code: str, cache: Path, path: str) -> subprocess.CompletedProcess:
    """code in a new interpreter with this kernel cache and PATH, and the CPU's own ISA (no FASTDECODE_ISA)."""
    env = {**os.environ, "FASTDECODE_CACHE": str(cache), "PATH": path}
    env.pop("FASTDECODE_ISA", None)
    # A cold build takes ~15-40 s on 2 cores; the bound is for a machine busy with other jobs.
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True,
                          timeout=900)


def pytest_configure(config):
    """A run that starts with no kernels in the tests' cache (CI's clean clone) builds them here,
    in a child process whose PATH starts with the venv's bin (its ninja), before any test module
    loads them: tests/kernels/test_build.py checks this cold build instead of compiling a second
    time (~35 s on two cores)."""
    global _cold_kernel_build
    root = Path(os.environ["FASTDECODE_CACHE"]) / "kernels"
    if root.exists():
        return
    p = run_python(KERNEL_LOAD, root.parent, f"{VENV_BIN}:{os.environ['PATH']}")
    built = list(root.glob("torch-*/fastdecode_kernels.so"))
    if p.returncode == 0 and len(built) == 1:  # else the tests report why the kernels are unavailable
        _cold_kernel_build = (root.parent, built[0], p.stderr)


def cold_kernel_build():
    """(cache, library, the build's stderr) when this session built the kernels cold, else None."""
    return _cold_kernel_build
