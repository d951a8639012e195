"""Best-of-400 single calls at M=1 (weights from DRAM): on shared cores the minimum is the
closest to the uncontended speed. Usage: PYTHONPATH=src python benchmarks/kernel_micro_min.py [isa|-]"""
import os, sys, time, statistics, torch
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kernel_micro as km
from fastdecode.kernels import load_kernels, active_isa, set_isa
from fastdecode.quant.linear import packed_linear
load_kernels(); set_isa(sys.argv[1] if len(sys.argv) > 1 and sys.argv[1] != "-" else None)
gen = torch.Generator().manual_seed(0)
for layout in ("q4k", "q6k", "q4"):
    for n, k in ((8192, 2048), (2048, 8192), (2048, 2048)):
        one = km.random_group(layout, n, k, gen); size = km.nbytes(one)
        groups = [one] + [km.random_group(layout, n, k, gen) for _ in range(max(2, -(-2 * km._L3_BYTES // size)) - 1)]
        x = torch.randn(1, k, generator=gen)
        ts = []
        for i in range(400):
            g = groups[i % len(groups)]; t0 = time.perf_counter(); packed_linear(x, layout, g, True); ts.append(time.perf_counter() - t0)
        ts.sort(); b = ts[0]; p10 = ts[len(ts) // 10]
        print(f"{active_isa()} {layout:4} {n}x{k} min {b*1e6:7.1f} us {size/b/1e9:6.2f} GB/s  p10 {size/p10/1e9:6.2f} GB/s", flush=True)
