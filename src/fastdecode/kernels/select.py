"""What this machine is, for cache keys: the CPU model, and choices measured once per machine."""

from __future__ import annotations

import json
import logging
import os
import tempfile
from typing import Callable

import torch

log = logging.getLogger("fastdecode")


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
    except OSError:
        return ""


def measured_once(name: str, measure: Callable[[], bool]) -> bool:
    """A yes/no choice measured once per machine and torch version, then read back.

    Stored in `<cache>/machine.json`, so a noisy timing cannot flip it between
    processes (it is part of exported packages' keys). Without a writable cache
    it is measured in each process.
    """
    from ..paths import cache_root

    path = cache_root() / "machine.json"
    key = f"{name}|{cpu_model()}|{torch.backends.cpu.get_cpu_capability()}|torch {torch.__version__}"
    try:
        stored = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(stored, dict):
            stored = {}
    except (OSError, ValueError):
        stored = {}
    if isinstance(stored.get(key), bool):
        return stored[key]
    value = bool(measure())
    stored[key] = value
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".machine-", dir=path.parent)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(stored, f, indent=1, sort_keys=True)
        os.replace(tmp, path)
    except OSError as e:
        log.debug("not storing %s in %s: %s", name, path, e)
    return value
