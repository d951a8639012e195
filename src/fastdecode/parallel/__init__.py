"""Tensor parallelism: a transform of a built model (`shard_model`), applied by
`load(..., tp=N)` inside an initialized torch.distributed process group."""

from .agree import SharedSeeds, rank0_value, same_kernels
from .comm import all_gather, all_reduce, tp_group
from .head import VocabParallelHead, choose_head
from .shard import RowParallel, ShardInfo, check_divisible, shard_model, valid_tp

__all__ = ["shard_model", "ShardInfo", "RowParallel", "VocabParallelHead", "check_divisible", "valid_tp",
           "choose_head", "all_reduce", "all_gather", "tp_group", "SharedSeeds", "rank0_value", "same_kernels"]
