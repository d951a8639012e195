"""Where fastdecode keeps what it builds and converts: one cache root for the kernels,
converted checkpoints, packages and per-machine choices; and the machine's busy flag,
which background exports yield to."""

from __future__ import annotations

import fcntl
import os
import shutil
import tempfile
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


def busy_lock() -> Path:
    """The busy flag's file: one per machine (not per cache root), as the cores are."""
    return Path(tempfile.gettempdir()) / "fastdecode-busy.lock"


def open_busy_lock() -> int:
    # Read-only is enough for flock, so another user's file works too; no symlinks in /tmp.
    return os.open(busy_lock(), os.O_RDONLY | os.O_CREAT | os.O_NOFOLLOW, 0o644)


class BusyFlag:
    """A shared lock on `busy_lock()`, held while this process loads a model (as a context
    manager, api/build.py) or generates (the engine, with `set`).

    A background export (compile/background.py) is paused whenever any process holds it:
    on 2 cores a compile beside generation stalls its OpenMP regions, nice or not, and
    beside a cold 1B load it made the load ~8x slower (benchmarks/load_time.md). The kernel
    drops the lock with the process, so a killed generator never blocks an export.
    """

    def __init__(self) -> None:
        self._fd: int | None = None
        self._held = False
        self._broken = False  # no temp folder to lock in: nothing to signal

    def set(self, busy: bool) -> None:
        if busy == self._held or self._broken:
            return
        try:
            if self._fd is None:
                self._fd = open_busy_lock()
            fcntl.flock(self._fd, fcntl.LOCK_SH if busy else fcntl.LOCK_UN)
            self._held = busy
        except OSError:
            self._broken = True

    def close(self) -> None:
        """Drop the flag and its file (closing it releases the lock)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd, self._held = None, False

    def __enter__(self) -> "BusyFlag":
        self.set(True)
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
