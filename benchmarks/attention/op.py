"""torch.ops.fastdecode.attention as the model calls it, timed in CPU time on one thread.

    PYTHONPATH=src python benchmarks/attention/op.py [--rounds 20] [--wide]

The shapes of the default model (SmolLM2-135M: 9 query heads, 3 KV heads, head_dim 64,
float16 KV): turn 2 of the multi-turn chat (18 new tokens over 1,551 cached ones, q the
strided view of the fused qkv output), and decode at 1,569. 30 caches are used in turn,
as the 30 layers are, so K/V come from L3 or memory. Run it with each tree's src on
PYTHONPATH, alternately, to compare kernels (run.py compares them in one process).
--wide times the 8-lane and the AVX-512 path in alternation instead (`kernels.set_wide`).
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
    ap.add_argument("--wide", action="store_true", help="time the 8-lane and the AVX-512 path, alternately")
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
        paths = {"narrow": False, "wide": True} if a.wide else {"default": None}
        ts = {p: [] for p in paths}
        for _ in range(a.rounds):
            for path, wide in paths.items():
                if not kernels.set_wide(wide) and wide:
                    raise SystemExit("the AVX-512 path needs the avx512-vnni instruction set")
                for layer in range(LAYERS):
                    t0 = time.thread_time()
                    torch.ops.fastdecode.attention(q, k[layer], v[layer], pos, rows, 0, 0.125)
                    ts[path].append(time.thread_time() - t0)
        kernels.set_wide(None)
        for path, t in ts.items():
            t.sort()
            key = name if path == "default" else f"{name}_{path}"
            out[key] = {"lower_quartile_ms": 1e3 * t[len(t) // 4], "median_ms": 1e3 * t[len(t) // 2]}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
