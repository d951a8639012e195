"""Where fastdecode keeps what it builds and converts: one cache root for the kernels,
converted checkpoints, packages and per-machine choices."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

STALE_TMP_SECONDS = 3600  # a writer's temporary folder older than this was left by a killed process


def cache_root() -> Path:
    """`$FASTDECODE_CACHE`, else `~/.cache/fastdecode`."""
    env = os.environ.get("FASTDECODE_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "fastdecode"


def remove_stale_tmp(root: Path) -> None:
    """Clear the `.tmp-*` folders that writers killed mid-write left under `root`."""
    now = time.time()
    for p in root.glob(".tmp-*"):
        try:
            if now - p.stat().st_mtime > STALE_TMP_SECONDS:
                shutil.rmtree(p, ignore_errors=True)
        except OSError:
            pass
