"""Joining the process group that torchrun describes, for the command line.

`torchrun --nproc-per-node N -m fastdecode generate tp=N ...` starts N
copies of the command; each joins the group here, loads its shard, and runs
the same requests in lockstep. Only rank 0 prints: the others keep their
one-line errors (prefixed with their rank) and drop everything else.
"""

from __future__ import annotations

import atexit
import io
import logging
import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist

from ..errors import FastDecodeError
from .comm import check_tp

# How long a collective waits for a peer before failing (a dead peer's closed
# connection usually fails it at once; this bounds the other cases).
DEFAULT_TIMEOUT_S = 300.0

_joined = False  # this process joined a group in join_torchrun


def join_torchrun(tp: int, device: str, command: str = "generate") -> int:
    """Initialize the default process group from torchrun's environment
    (gloo on CPU, NCCL on CUDA); returns this process's rank."""
    if check_tp(tp) == 1 or (dist.is_available() and dist.is_initialized()):
        return dist.get_rank() if tp > 1 else 0
    if "WORLD_SIZE" not in os.environ or "MASTER_ADDR" not in os.environ:
        raise FastDecodeError(f"tp={tp} runs one process per rank; launch it with torchrun: "
                              f"torchrun --nproc-per-node {tp} -m fastdecode {command} tp={tp} ...")
    world = int(os.environ["WORLD_SIZE"])
    if world != tp:
        raise FastDecodeError(f"tp={tp} but torchrun started {world} processes; use --nproc-per-node {tp} "
                              "(times the number of nodes)")
    cuda = device.startswith("cuda")
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))  # one GPU per rank on a node
    dist.init_process_group("nccl" if cuda else "gloo", timeout=timedelta(seconds=_timeout_s()))
    global _joined
    _joined = True
    atexit.register(_leave)  # for a command that does not end through end_process
    rank = dist.get_rank()
    if rank != 0:
        quiet(rank)
    return rank


def _timeout_s() -> float:
    text = os.environ.get("FASTDECODE_TP_TIMEOUT_S", "")
    try:
        value = float(text) if text else DEFAULT_TIMEOUT_S
    except ValueError:
        value = -1.0
    if not value > 0:
        raise FastDecodeError(f"FASTDECODE_TP_TIMEOUT_S={text!r} is not valid; accepted: seconds > 0")
    return value


def _leave() -> None:
    if dist.is_initialized():
        # Leave together: a rank that tears its connections down while a peer is still
        # in its last collective makes the peer abort.
        try:
            dist.barrier()
        except RuntimeError:  # a peer is gone already (it failed): nothing to wait for
            pass
        dist.destroy_process_group()


def end_process(code: int) -> int:
    """`code`, for a process that never joined a group; otherwise leave the group
    with the other ranks and end the process here with `code`.

    Skipping the interpreter's shutdown is the point: gloo's worker threads can
    still be dropping the tensors of the last collective, which takes the GIL,
    and a thread that waits for the GIL while the interpreter finalizes aborts
    the whole process (SIGABRT, "terminate called without an active exception"),
    even after destroy_process_group (pytorch/pytorch#190489)."""
    if not _joined:
        return code
    _leave()
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        try:
            stream.flush()
        except (OSError, ValueError):  # closed, or a reader that went away
            pass
    os._exit(code)


def quiet(rank: int) -> None:
    """Drop this rank's output but its error lines (FASTDECODE_DEBUG=1 keeps all of stderr)."""
    sys.stdout = open(os.devnull, "w", encoding="utf-8")  # noqa: SIM115 - lives as long as the process
    if os.environ.get("FASTDECODE_DEBUG") != "1":
        sys.stderr = _ErrorsOnly(sys.stderr, f"[rank {rank}] ")


class _ErrorsOnly(io.TextIOBase):
    """A stderr that passes on only the CLI's `fastdecode: error:` lines."""

    def __init__(self, inner, prefix: str):
        self.inner, self.prefix, self._line = inner, prefix, ""

    def writable(self) -> bool:
        return True

    def isatty(self) -> bool:
        return False  # no progress spinners

    def write(self, text: str) -> int:
        self._line += text
        *lines, self._line = self._line.split("\n")
        for line in lines:
            if line.startswith("fastdecode: error:"):
                self.inner.write(self.prefix + line + "\n")
                self.inner.flush()
        return len(text)
