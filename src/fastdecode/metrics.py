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


def now(device: torch.device) -> float:
    synchronize(device)
    return time.perf_counter()


def peak_memory_bytes(device: torch.device) -> int:
    """Peak allocated memory on CUDA, peak resident set size of the process on CPU."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(rss if sys.platform == "darwin" else rss * 1024)  # Linux reports KiB


def reset_peak_memory(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
