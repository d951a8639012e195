"""Progress display for slow one-off work (model load, compilation).

Drawn on stderr, and only when stderr is a terminal, so piped output and logs
stay clean. Usage:

    with progress("loading model", total=n_tensors) as bar:
        for t in tensors:
            ...
            bar.update()

Without `total` it is a spinner with the elapsed time. A background thread
redraws a few times a second, so a spinner keeps moving while the caller is
blocked in one long call (such as the first compiled step).
"""

from __future__ import annotations

import sys
import threading
import time
from typing import IO, Optional

_FRAMES = "|/-\\"
_WIDTH = 24


class Progress:
    """One progress line; `update(n)` records n more units of `total` done."""

    def __init__(self, desc: str, total: Optional[int], stream: IO[str], enabled: bool):
        self.desc, self.total, self.stream, self.enabled = desc, total, stream, enabled
        self.done = 0
        self.start = time.perf_counter()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: Optional[threading.Thread] = None
        self._frame = 0

    def update(self, n: int = 1) -> None:
        with self._lock:
            self.done += n

    def line(self) -> str:
        elapsed = time.perf_counter() - self.start
        if self.total:
            frac = min(self.done / self.total, 1.0)
            filled = int(frac * _WIDTH)
            bar = "#" * filled + "." * (_WIDTH - filled)
            return f"{self.desc} [{bar}] {self.done}/{self.total} {elapsed:.1f}s"
        self._frame += 1
        return f"{self.desc} {_FRAMES[self._frame % len(_FRAMES)]} {elapsed:.1f}s"

    def _draw(self, text: str, end: str = "") -> None:
        try:
            self.stream.write("\r\033[K" + text + end)  # \033[K clears the rest of the line
            self.stream.flush()
        except (OSError, ValueError):  # stderr closed: drawing is best-effort
            self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            with self._lock:
                self._draw(self.line())

    def __enter__(self) -> "Progress":
        if self.enabled:
            self._thread = threading.Thread(target=self._run, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if not self.enabled:
            return
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        elapsed = time.perf_counter() - self.start
        status = "done" if exc_type is None else "failed"
        self._draw(f"{self.desc}: {status} in {elapsed:.1f}s", end="\n")


def progress(desc: str, total: Optional[int] = None, *, stream: Optional[IO[str]] = None,
             enabled: Optional[bool] = None) -> Progress:
    """A context manager showing `desc` with a bar (given `total`) or a spinner.

    `enabled=None` shows it only when `stream` (default stderr) is a terminal.
    """
    stream = sys.stderr if stream is None else stream
    if enabled is None:
        enabled = _is_tty(stream)
    return Progress(desc, total, stream, enabled)


def _is_tty(stream: IO[str]) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False

