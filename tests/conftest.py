import os
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

import fastdecode
from fastdecode.model.args import get_preset
from fastdecode.model.transformer import Transformer, init_random_weights


@pytest.fixture(scope="session")
def tiny_llm():
    return fastdecode.load("tiny")


def make_model(**changes) -> Transformer:
    """Tiny random model, optionally with changed ModelArgs fields."""
    args = get_preset("tiny").replace(**changes)
    return init_random_weights(Transformer(args), seed=0).eval()


@pytest.fixture(autouse=True)
def _no_grad():
    with torch.no_grad():
        yield
