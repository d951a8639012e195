"""A step's large blocks keep their pages from one step to the next (engine/malloc.py)."""

import ctypes
import resource

import pytest
import torch

import fastdecode

glibc = pytest.mark.skipif(not hasattr(ctypes.CDLL(None), "gnu_get_libc_version"), reason="glibc's mallopt only")


def faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


@glibc
def test_an_engine_keeps_a_freed_chunk_of_logits_for_the_next_step():
    fastdecode.load("tiny", max_batch_size=2)  # a CPU engine sets the thresholds
    n = 40 << 20  # above glibc's own 32 MiB ceiling: without the setting, every one is mmapped afresh
    torch.empty(n // 4).fill_(1.0)
    before = faults()
    for _ in range(3):
        torch.empty(n // 4).fill_(1.0)
    pages = 3 * n // 4096
    assert faults() - before < pages // 10, f"{faults() - before} page faults for {pages} pages"
