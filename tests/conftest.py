import os

import pytest
import torch

# load() exports a package per model on first use (compiled="auto"); tests that are
# not about that run without one instead of paying a minute per model and cache folder.
os.environ.setdefault("FASTDECODE_NO_PACKAGE", "1")

import fastdecode
from fastdecode.config import get_preset
from fastdecode.model import Transformer, init_random_weights


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
