"""This machine's compiled package, exported in a child process while the caller generates.

Exporting a model's step (torch.export + AOTInductor, `aot.export_package`)
takes a minute or more on a small CPU. `load(compiled="auto")` uses the
machine's package when it exists; when it does not, generation starts at once
on the `compile` strategy's steps, and a child process at the lowest CPU
priority waits until the caller's process is idle (a compile beside
generation stalls it, nice or not), then loads the same model and exports
the package, pausing while any process on the machine loads a model or has
work in its engine (the busy flag in `paths.py`). The next load uses it, and a running
engine switches to it between requests (`PackageWhenReady.refresh`), never
inside one.

Files beside the package, `<cache>/packages/step-<key>.*`:
    .lock    the exporting child's pid, while it runs (a dead pid's lock is stale)
    .log     the child's output
    .failed  the reason the last export failed; no new export starts for a day
             (`fastdecode export` with no `out` retries in the foreground)
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Optional

import torch

from ..paths import busy_lock
from .steps import Steps

log = logging.getLogger("fastdecode")
RETRY_FAILED_AFTER_S = 24 * 3600


@dataclass(frozen=True)
class ExportJob:
    """What the child loads (as `load()` was given it) and where it writes the package."""

    model: str
    dtype: str
    weights: str
    path: str
    gemv: bool  # the parent's float-kernel choice, which the package's key includes
    kv_dtype: str = "auto"  # the parent's resolved KV dtype, which the package's key includes
    threads: int = 1  # the parent's torch threads, which the package's loops are planned for
    context: int = 0  # the parent's max_seq_len, whose RoPE frequencies (LongRoPE's factors) the package holds


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def running_export(path: Path) -> Optional[int]:
    """The pid exporting `path` now, or None (a stale lock is removed)."""
    lock = path.with_suffix(".lock")
    try:
        pid = int(lock.read_text(encoding="ascii").strip() or 0)
    except (OSError, ValueError):
        return None
    if pid and _pid_alive(pid):
        return pid
    lock.unlink(missing_ok=True)
    return None


def recent_failure(path: Path) -> Optional[str]:
    marker = path.with_suffix(".failed")
    try:
        if time.time() - marker.stat().st_mtime < RETRY_FAILED_AFTER_S:
            return marker.read_text(encoding="utf-8").strip() or "unknown error"
    except OSError:
        pass
    return None


def start(job: ExportJob) -> Optional[int]:
    """Start the child that exports `job.path`, unless one runs already; its pid, or None
    (an export failed recently, or the package folder is not writable)."""
    path = Path(job.path)
    pid = running_export(path)
    if pid is not None:
        return pid
    failed = recent_failure(path)
    if failed is not None:
        log.warning("not exporting this machine's package in the background: the last try failed (%s; see %s); "
                    "`fastdecode export` retries it", failed, path.with_suffix(".log"))
        return None
    lock = path.with_suffix(".lock")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:  # another process started one just now
        return running_export(path)
    except OSError as e:
        log.warning("not exporting this machine's package: cannot write %s (%s); set FASTDECODE_CACHE to a "
                    "writable folder", path.parent, e.strerror or e)
        return None
    try:
        # At the lowest priority from its first instruction (torch's import included).
        nice = shutil.which("nice")
        cmd = [sys.executable, "-c", _WAIT_THEN_EXPORT, str(os.getpid()), str(busy_lock()),
               json.dumps(asdict(job))]
        with open(path.with_suffix(".log"), "w", encoding="utf-8") as out:
            child = subprocess.Popen(
                [nice, "-n", "19", *cmd] if nice else cmd,
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        os.write(fd, str(child.pid).encode("ascii"))
    except OSError as e:
        lock.unlink(missing_ok=True)
        log.warning("not exporting this machine's package: cannot start the exporter (%s)", e.strerror or e)
        return None
    finally:
        os.close(fd)
    return child.pid


# The child's entry, a supervisor that never imports torch. It waits until the parent is idle
# (under 10% of a core for two seconds) or gone, then runs the export in a process group of
# its own, which it stops (SIGSTOP) whenever any process on the machine holds the busy flag
# (paths.BusyFlag: a model loading, or an engine with work) and continues when none does. Even at the lowest
# priority, a compile beside generation stalls its OpenMP regions on 2 cores (decode fell to
# ~1 token/s), whether the generator is the parent or a later process. The export dies with
# the supervisor (PR_SET_PDEATHSIG), so killing the pid in the lock stops it all.
_WAIT_THEN_EXPORT = """
import ctypes, fcntl, os, signal, subprocess, sys, time
def cpu(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None
def busy(fd):
    if fd is None:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    fcntl.flock(fd, fcntl.LOCK_UN)
    return False
def die_with_supervisor():
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
parent, busy_path, job = int(sys.argv[1]), sys.argv[2], sys.argv[3]
while True:
    before = cpu(parent)
    time.sleep(2)
    after = cpu(parent)
    if before is None or after is None or after - before < 0.2:
        break
try:
    fd = os.open(busy_path, os.O_RDONLY | os.O_CREAT | os.O_NOFOLLOW, 0o644)
except OSError:
    fd = None
code = "import sys; from fastdecode.cli.export import export_job; sys.exit(export_job(sys.argv[1:]))"
worker = subprocess.Popen([sys.executable, "-c", code, job], start_new_session=True,
                          preexec_fn=die_with_supervisor)
paused = False
while worker.poll() is None:
    now = busy(fd)
    if now != paused:
        try:
            os.killpg(worker.pid, signal.SIGSTOP if now else signal.SIGCONT)
        except ProcessLookupError:
            break
        paused = now
    time.sleep(0.2)
sys.exit(worker.wait())
"""


class PackageWhenReady:
    """Steps that run `fallback` until the package at `path` exists, then the package's.

    The engine calls `refresh()` only when no request is in flight, so a request
    runs on one kind of step from its first token to its last.
    """

    def __init__(self, fallback: Steps, path: Path, load_package: Callable[[str], Steps],
                 pid: Optional[int], check_every_s: float = 1.0):
        self.current, self.path, self.pid = fallback, path, pid
        self._load_package, self._every, self._checked = load_package, check_every_s, 0.0

    @property
    def compiled(self) -> Optional[str]:
        """The package path, once switched to it."""
        return self.current.compiled

    @property
    def step(self):
        return self.current.step

    @property
    def warmup(self):
        return self.current.warmup

    @property
    def chunk(self):
        return self.current.chunk

    @property
    def exporting(self) -> bool:
        return self.compiled is None and self.pid is not None and running_export(self.path) is not None

    def refresh(self) -> None:
        if self.compiled is not None or time.monotonic() - self._checked < self._every:
            return
        self._checked = time.monotonic()
        if self.path.is_file() and running_export(self.path) is None:
            try:
                self.current = self._load_package(str(self.path))
            except Exception as e:  # noqa: BLE001 - keep generating on the steps we have
                log.warning("not switching to this machine's package %s: %s", self.path, e)
                self.pid = None
                self._checked = float("inf")
                return
            log.info("switched to this machine's compiled package %s", self.path)


def run_child(argv: list[str], export: Callable[[ExportJob], None]) -> int:
    """The child's side: at the lowest priority, on one thread, run `export(job)` (load the
    model as the parent did and export its package, for the parent's thread count); record a
    failure, remove the lock.

    cli/export.py's `export_job` passes `export` in: it loads the model through the
    API, which imports this module.
    """
    job = ExportJob(**json.loads(argv[0]))
    path = Path(job.path)
    try:
        os.nice(19)
    except OSError:
        pass
    torch.set_num_threads(1)
    try:
        export(job)
        path.with_suffix(".failed").unlink(missing_ok=True)
        return 0
    except BaseException as e:  # noqa: BLE001 - record why, for the parent's next load
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        try:
            path.with_suffix(".failed").write_text(f"{type(e).__name__}: {first}\n", encoding="utf-8")
        except OSError:
            pass
        raise
    finally:
        path.with_suffix(".lock").unlink(missing_ok=True)
