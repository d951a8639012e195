"""Where fastdecode keeps what it builds and converts: one cache root for the kernels,
converted checkpoints, packages and per-machine choices; and the busy flag there that
background exports yield to."""

from __future__ import annotations

import fcntl
import os
import shutil
import time
from pathlib import Path

BUSY_LOCK = "busy.lock"
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


class BusyFlag:
    """A shared lock on `<cache>/busy.lock`, held while this process generates.

    A background export (background_export.py) is paused whenever any process holds it:
    on 2 cores a compile beside generation stalls its OpenMP regions, nice or not. The
    kernel drops the lock with the process, so a killed generator never blocks an export.
    """

    def __init__(self) -> None:
        self._fd: int | None = None
        self._held = False
        self._broken = False  # an unwritable cache: no export can run there either

    def set(self, busy: bool) -> None:
        if busy == self._held or self._broken:
            return
        try:
            if self._fd is None:
                root = cache_root()
                root.mkdir(parents=True, exist_ok=True)
                self._fd = os.open(root / BUSY_LOCK, os.O_CREAT | os.O_RDWR, 0o644)
            fcntl.flock(self._fd, fcntl.LOCK_SH if busy else fcntl.LOCK_UN)
            self._held = busy
        except OSError:
            self._broken = True
