"""The process group a tensor-parallel model runs in, and its collectives.

`all_reduce` and `all_gather` are functional collectives, as in gpt-fast's
tp.py: Dynamo traces each as an op with an output, so a compiled step keeps
them inside its graph with no graph break, and the quantized custom ops
around them need nothing from the DTensor machinery.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch import Tensor

from ..errors import FastDecodeError

# Backends that can reduce tensors on each device type.
_BACKENDS = {"cpu": ("gloo", "mpi", "ucc"), "cuda": ("nccl", "ucc", "mpi")}


def all_reduce(x: Tensor, group: dist.ProcessGroup) -> Tensor:
    """The sum of `x` over the ranks of `group` (every rank gets the same bits)."""
    return funcol.all_reduce(x, "sum", group)


def all_gather(x: Tensor, group: dist.ProcessGroup) -> Tensor:
    """The ranks' `x` [M, ...] stacked along dim 0: [size * M, ...], rank 0's first."""
    return funcol.all_gather_single(x, 0, group)


def check_tp(tp: object) -> int:
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
        raise FastDecodeError(f"tp={tp!r} is out of range; accepted: an integer >= 1 (1: no tensor parallelism)")
    return tp


def tp_group(tp: object, device: torch.device) -> Optional[dist.ProcessGroup]:
    """The process group for `load(..., tp=tp)`: None for tp=1, else the
    initialized default group, checked against tp and the device."""
    if check_tp(tp) == 1:
        return None
    if not dist.is_available() or not dist.is_initialized():
        raise FastDecodeError(
            f"tp={tp} needs an initialized torch.distributed process group of {tp} processes; launch with "
            f"`torchrun --nproc-per-node {tp} ...` and call torch.distributed.init_process_group() before load()")
    world = dist.get_world_size()
    if world != tp:
        raise FastDecodeError(f"tp={tp} but the process group has {world} processes; tp must equal the world size")
    backend = str(dist.get_backend())
    # "gloo", "nccl", or per device: "cpu:gloo,cuda:nccl".
    per_device = dict(p.split(":", 1) for p in backend.split(",")) if ":" in backend else None
    name = per_device.get(device.type, "") if per_device else backend
    accepted = _BACKENDS.get(device.type, ())
    if name not in accepted:
        raise FastDecodeError(f"tp={tp} on {device.type} needs a {' or '.join(accepted) or 'cpu or cuda'} process "
                              f"group; this one is {backend!r}")
    return dist.group.WORLD
