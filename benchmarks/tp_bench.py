"""Tensor parallelism on this machine: decode step time at TP=1 and TP=2, the
time in all-reduces, and the replicated vs vocabulary-parallel output head.

    .venv/bin/python benchmarks/tp_bench.py            # runs every case, one JSON line each
    torchrun --standalone --nproc-per-node 2 benchmarks/tp_bench.py --case ...   # one case (internal)

TP=1 runs in one process with all cores' threads; TP=2 in two processes under
torchrun (gloo, CPU), with the cores split between them. The models are
random-weight presets: `tiny`, and SmolLM2-135M's matrix shapes with 12 heads
of 48 and 4 kv heads (the checkpoint's 9 and 3 do not split 2 ways; every
matrix has the same shape). Eager steps, float32; medians of repeated steps.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import torch

MODELS = {"tiny": {}, "smollm2-135m-shaped": {"n_heads": 12, "n_kv_heads": 4, "head_dim": 48}}


def build(name: str):
    from fastdecode.model.args import get_preset
    from fastdecode.model.transformer import Transformer, init_random_weights

    args = get_preset("tiny" if name == "tiny" else "random-smollm2-135m").replace(**MODELS[name])
    return init_random_weights(Transformer(args), seed=0).eval().requires_grad_(False)


def done(t):
    """Wait for a functional collective's result (an AsyncCollectiveTensor, or already a Tensor)."""
    return t.wait() if hasattr(t, "wait") else t


def median_ms(fn, n: int) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3


def decode_case(name: str, batch: int, steps: int, head: str = "auto") -> dict:
    import torch.distributed as dist

    from fastdecode.compile.strategies import eager_steps
    from fastdecode.parallel import same_kernels, shard_model
    from fastdecode.quant import apply_kernels

    model = build(name)
    group = dist.group.WORLD if dist.is_initialized() else None
    if group is not None:
        shard_model(model, group, head=head)
    kernels = apply_kernels(model)
    if group is not None:
        same_kernels(model, kernels, group)
    model.setup_caches(batch, 512)
    step = eager_steps(model).step
    tokens, rows = torch.zeros(batch, 1, dtype=torch.long), torch.arange(batch)
    pos, at = torch.full((batch, 1), 100), torch.arange(batch)[:, None]  # each row's token (flat indices)
    with torch.inference_mode():
        ms = median_ms(lambda: step(tokens, pos, rows, at), steps)
        out = {"model": name, "batch": batch, "tp": 1 if group is None else dist.get_world_size(),
               "threads": torch.get_num_threads(), "step_ms": round(ms, 3),
               "head": model.tp.head if group is not None else "whole"}
        if group is not None:  # the same all-reduces alone: 2 per layer of [batch, dim]
            from fastdecode.parallel import all_reduce

            x = torch.randn(batch, model.args.dim)
            n = 2 * model.args.n_layers
            out["all_reduce_ms_per_step"] = round(median_ms(lambda: [done(all_reduce(x, group)) for _ in range(n)],
                                                            steps), 3)
    return out


def head_case(batch: int, steps: int) -> dict:
    """SmolLM2's tied head (49152 x 576): whole on every rank vs this rank's rows of the
    vocabulary with the all-gather of the logits (parallel.VocabParallelHead)."""
    import torch.distributed as dist

    from fastdecode.parallel import VocabParallelHead

    V, D = 49152, 576
    tp, rank = dist.get_world_size(), dist.get_rank()
    w = torch.randn(V, D)
    rows = torch.nn.Linear(D, V // tp, bias=False)
    rows.weight.data = w[rank * V // tp:(rank + 1) * V // tp].clone()
    head = VocabParallelHead(rows, dist.group.WORLD, tp)
    x = torch.randn(batch, 1, D)
    with torch.inference_mode():
        full_ms = median_ms(lambda: torch.nn.functional.linear(x, w), steps)
        parallel_ms = median_ms(lambda: done(head(x)), steps)
    return {"case": "head", "batch": batch, "tp": tp, "replicated_ms": round(full_ms, 3),
            "vocab_parallel_ms": round(parallel_ms, 3)}


def run_case(case: str) -> None:
    import torch.distributed as dist

    if "WORLD_SIZE" in os.environ:
        dist.init_process_group("gloo")
    kind, *rest = case.split(":")
    out = head_case(int(rest[0]), 50) if kind == "head" else decode_case(kind, int(rest[0]), int(rest[1]), *rest[2:])
    if not dist.is_initialized() or dist.get_rank() == 0:
        print(json.dumps(out), flush=True)
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def main() -> None:
    cores = os.cpu_count() or 1
    env = dict(os.environ, FASTDECODE_NO_PACKAGE="1")
    print(json.dumps({"cores": cores, "load_average": os.getloadavg()}), flush=True)
    # (case, [(tp, threads per rank)]): TP=1 on one core and on all, TP=2 with the cores split.
    runs = [(1, 1), (1, cores), (2, max(1, cores // 2))]
    cases = [(f"{m}:{b}:{s}", runs) for m, s in (("tiny", 200), ("smollm2-135m-shaped", 20)) for b in (1, 8)]
    cases += [(f"smollm2-135m-shaped:{b}:20:replicated", runs[2:]) for b in (1, 8)]
    cases += [(f"head:{b}", runs[2:]) for b in (1, 8)]
    for case, plan in cases:
        for tp, threads in plan:
            cmd = [sys.executable, __file__, "--case", case]
            if tp > 1:
                cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(tp),
                       *cmd[1:]]
            out = subprocess.run(cmd, env=dict(env, OMP_NUM_THREADS=str(threads)), capture_output=True, text=True)
            lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
            print(lines[-1] if lines else out.stderr[-2000:], flush=True)
    print(json.dumps({"load_average": os.getloadavg()}), flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--case")
    a = parser.parse_args()
    run_case(a.case) if a.case else main()
