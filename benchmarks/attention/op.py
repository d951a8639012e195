"""torch.ops.fastdecode.attention as the model calls it, timed in CPU time on one thread.

    PYTHONPATH=src python benchmarks/attention/op.py [--rounds 20]

The shapes of the default model (SmolLM2-135M: 9 query heads, 3 KV heads, head_dim 64,
float16 KV): turn 2 of the multi-turn chat (18 new tokens over 1,551 cached ones, q the
strided view of the fused qkv output), and decode at 1,569. 30 caches are used in turn,
as the 30 layers are, so K/V come from L3 or memory. Run it with each tree's src on
PYTHONPATH, alternately, to compare kernels (run.py compares them in one process).
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch

from fastdecode import kernels

LAYERS = 30
SHAPES = {"turn2_prefill": (18, 1551), "decode": (1, 1568)}  # (new tokens, first position)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=20)
    a = ap.parse_args()
    if not kernels.load_kernels():
        raise SystemExit(f"native kernels unavailable: {kernels.unavailable_reason}")
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    k = [torch.randn(4, 3, 4096, 64, generator=g).half() for _ in range(LAYERS)]
    v = [torch.randn(4, 3, 4096, 64, generator=g).half() for _ in range(LAYERS)]
    out = {"build": str(kernels.build_dir()), "load": os.getloadavg()}
    for name, (T, start) in SHAPES.items():
        q = torch.randn(1, T, 15, 64, generator=g)[:, :, :9]  # q, k, v share the qkv matmul's output
        pos, rows = torch.arange(start, start + T)[None], torch.tensor([1])
        ts = []
        for _ in range(a.rounds):
            for layer in range(LAYERS):
                t0 = time.thread_time()
                torch.ops.fastdecode.attention(q, k[layer], v[layer], pos, rows, 0, 0.125)
                ts.append(time.thread_time() - t0)
        ts.sort()
        out[name] = {"lower_quartile_ms": 1e3 * ts[len(ts) // 4], "median_ms": 1e3 * ts[len(ts) // 2]}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
