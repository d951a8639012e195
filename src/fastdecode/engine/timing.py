"""Timing and memory figures reported with every generation."""

from __future__ import annotations

import resource
import sys
import time

import torch


def synchronize(device: torch.device) -> None:
    """Wait for queued device work so wall-clock timings are honest."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def now(device: torch.device) -> float:
    synchronize(device)
    return time.perf_counter()


def peak_memory_bytes(device: torch.device) -> int:
    """Peak allocated memory on CUDA; on MPS, which keeps no peak, what the Metal driver holds
    (freed blocks stay cached until `reset_peak_memory`, so it bounds the peak from above);
    peak resident set size of the process on CPU."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    if device.type == "mps":
        return int(torch.mps.driver_allocated_memory())
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(rss if sys.platform == "darwin" else rss * 1024)  # Linux reports KiB


def reset_peak_memory(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    elif device.type == "mps":
        torch.mps.empty_cache()  # drop cached blocks so the driver's figure is this run's


def memory_source(device: torch.device) -> str:
    """What `peak_memory_bytes` measures on `device`, for reports."""
    return {"cuda": "torch.cuda.max_memory_allocated",
            "mps": "torch.mps.driver_allocated_memory"}.get(device.type, "process RSS")
