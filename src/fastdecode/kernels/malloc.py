"""Keeping a step's large freed blocks in the process (glibc only).

glibc hands a freed block back to the OS if it was mmapped (sizes above its mmap
threshold, which adapts upwards only as far as 32 MiB) or if it leaves more than the
trim threshold free at the heap's top. A tensor of the same size every step is then
page-faulted in afresh every step, on every thread that touches it. The largest is a
prefill chunk's logits at every position, for prompt logprobs: [200, 49152] float32 is
39 MiB on the default model, and its faults cost a third of the head matmul's 70 ms on
two cores (benchmarks/lm_eval/README.md). Raising both thresholds lets steps reuse the
pages: the process keeps up to twice the largest step block free instead.

A thread other than the main one gets an arena of its own, whose heaps (64 MiB at most)
are unmapped as soon as they empty, whatever the thresholds; the server's engine thread
therefore shares the main arena (`share_main_arena`, before that thread starts).

The opposite holds during and after a one-off burst, such as converting a checkpoint on
its first load: each layer's blocks, freed once the layer is written, only partly fit the
next layer's (1B Q4_K_M: ~25 MB a layer stayed resident, ~680 MB by the end), and would
stay so for the whole run next to the memory-mapped copy that replaced them
(`trim_heap` after each layer, `release_free_memory` after the load).

Used by the engine (steps) and by checkpoints/ (conversions), hence kept down here.
"""

from __future__ import annotations

import ctypes
import gc
import logging
from typing import Callable, Optional

log = logging.getLogger("fastdecode")

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD, _M_ARENA_MAX = -1, -3, -8
_FLOOR = 64 << 20  # above glibc's own adaptive ceiling (32 MiB), so smaller blocks gain too
_CEILING = 1 << 30
_applied = 0  # the largest block size set so far: only ever raised


def _mallopt() -> Optional[Callable[[int, int], int]]:
    try:
        f = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # not glibc
        return None
    f.argtypes, f.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return f


def share_main_arena() -> bool:
    """Threads that start after this allocate from the main thread's arena."""
    f = _mallopt()
    return bool(f and f(_M_ARENA_MAX, 1))


def keep_freed_blocks(largest: int) -> bool:
    """Serve blocks up to `largest` bytes (at least 64 MiB, at most 1 GiB) from the heap and
    keep twice that free at its top. Process-wide; it only ever raises the thresholds.
    Returns whether glibc took the values (False elsewhere: nothing changes)."""
    global _applied
    size = min(max(int(largest), _FLOOR), _CEILING)
    if size <= _applied:
        return True
    f = _mallopt()
    if f is None or not (f(_M_MMAP_THRESHOLD, size) and f(_M_TRIM_THRESHOLD, 2 * size)):
        log.debug("malloc kept its thresholds (refused %d bytes)", size)
        return False
    _applied = size
    return True


def trim_heap() -> bool:
    """Hand the free pages of every arena back to the OS (glibc's malloc_trim: 4-16 ms on a
    1B conversion's heap). False elsewhere, or when nothing was returned."""
    try:
        f = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return False
    f.argtypes, f.restype = [ctypes.c_size_t], ctypes.c_int
    return bool(f(0))


def release_free_memory() -> bool:
    """`trim_heap`, after collecting reference cycles that may still hold large tensors."""
    gc.collect()
    return trim_heap()
