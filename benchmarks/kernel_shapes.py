"""Packed matmuls on random groups at one M (default 200), for shapes with and without a
partial last group. Usage: PYTHONPATH=src python benchmarks/kernel_shapes.py [M]"""
import os, sys, time, torch
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kernel_micro as km
from fastdecode.kernels import load_kernels
from fastdecode.quant.linear import packed_linear
load_kernels()
gen = torch.Generator().manual_seed(0)
M = int(sys.argv[1]) if len(sys.argv) > 1 else 200
for layout in ("q4", "q8"):
    for n, k in ((3072, 512), (3072, 576), (3072, 768), (3072, 1024), (3072, 1536), (576, 1536), (49152, 576), (8192,2048)):
        g = km.random_group(layout, n, k, gen)
        x = torch.randn(M, k, generator=gen)
        packed_linear(x, layout, g, True)
        ts = []
        for i in range(7):
            t0 = time.perf_counter(); packed_linear(x, layout, g, True); ts.append(time.perf_counter() - t0)
        b = sorted(ts)[1]
        print(f"{layout} M={M} {n}x{k} {b*1e3:7.2f} ms {M*n*k/b/1e9:6.1f} GMAC/s", flush=True)
