"""One quantized matmul of one source tree, called for SECONDS, and its median time and weight
bytes read per second.

    python benchmarks/batch_tiles/linear_rate.py SRC TYPE MxNxK COPIES SECONDS

TYPE: a GGUF type with a native layout (Q4_K, Q6_K, Q4_1, Q4_0, Q8_0, ...). The weights are
`linear_ab.random_packs`' (packed by SRC's `formats.pack_gguf`), rotated over COPIES copies: 1
keeps them in cache ("hot"), 8 or more of a 1B shape stream them from DRAM. THREADS
(default 1) sets torch's threads; ISA=avx2 (with ATEN_CPU_CAPABILITY=avx2) runs the AVX2 kernels.
"""

import os
import sys
import time

import numpy as np
import torch

sys.path.insert(0, sys.argv[1])
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fastdecode import kernels  # noqa: E402
from fastdecode.quant import formats  # noqa: E402
from fastdecode.quant.linear import packed_linear  # noqa: E402
from linear_ab import random_packs  # noqa: E402

kernels.load_kernels()
if os.environ.get("ISA"):
    kernels.set_isa(os.environ["ISA"])
torch.set_num_threads(int(os.environ.get("THREADS", "1")))
name, shape, copies, seconds = sys.argv[2], sys.argv[3], int(sys.argv[4]), float(sys.argv[5])
m, n, k = map(int, shape.split("x"))
packs = random_packs(name, n, k, copies, np.random.default_rng(0))
layout = formats.layout_of(packs[0])
x = torch.randn(m, k)
times, start, i = [], time.time(), 0
while time.time() - start < seconds:
    t0 = time.perf_counter()
    packed_linear(x, layout, packs[i % copies], native=True)
    times.append(time.perf_counter() - t0)
    i += 1
median = sorted(times)[len(times) // 2]
nbytes = sum(t.numel() * t.element_size() for t in packs[0].values())
print(f"{name} {shape} copies {copies}: {median * 1e6:.1f} us, {nbytes / median / 1e9:.1f} GB/s")
