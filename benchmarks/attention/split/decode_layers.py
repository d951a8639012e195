"""The attention op alone at batch 1, over every layer's own float16 cache (so the reads come
from memory, as in a decode step), on 1 and 2 threads (benchmarks/attention/split.md).

    PYTHONPATH=src python benchmarks/attention/split/decode_layers.py H HKV D LAYERS [CONTEXT ...]

e.g. `4 1 256 18` (Gemma 3 270M's heads, every layer read to the end), `9 3 64 30` (SmolLM2-135M).
Prints the best of 7 timings of 5 steps per context, in ms a step, and K + V GB/s.
"""

import sys
import time

import torch

from fastdecode import kernels

kernels.load_kernels()
H, Hkv, D, layers = (int(x) for x in sys.argv[1:5])
contexts = [int(c) for c in sys.argv[5:]] or [512, 2048, 8000]
S = max(contexts)
ks = [torch.randn(1, Hkv, S, D).half() for _ in range(layers)]
vs = [torch.randn(1, Hkv, S, D).half() for _ in range(layers)]
for threads in (1, 2):
    torch.set_num_threads(threads)
    cells = []
    for ctx in contexts:
        q = torch.randn(1, 1, H, D)
        pos, rows = torch.full((1, 1), ctx - 1), torch.arange(1)

        def step():
            for k, v in zip(ks, vs):
                torch.ops.fastdecode.attention(q, k, v, pos, rows, 0, D ** -0.5)

        for _ in range(3):
            step()
        times = []
        for _ in range(7):
            t = time.perf_counter()
            for _ in range(5):
                step()
            times.append((time.perf_counter() - t) / 5)
        best = min(times)
        cells.append(f"{ctx}: {best * 1e3:.2f} ms ({layers * Hkv * ctx * D * 4 / best / 1e9:.1f} GB/s)")
    print(f"threads {threads}:", " | ".join(cells), flush=True)
