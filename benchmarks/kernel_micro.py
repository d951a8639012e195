#!/usr/bin/env python3
"""Single calls of the packed matmul kernels at real model shapes, in GB/s of weight bytes.

    PYTHONPATH=src python benchmarks/kernel_micro.py [--isa avx2|avx512-vnni] [--layouts q4k,q6k]
        [--shapes 2048x2048,8192x2048] [--m 1,16] [--hot]

Each (layout, shape) gets random packed weights of that layout (any bytes are a valid
block; scales are small fp16 values). Unless --hot, the call rotates through enough
copies that they exceed the L3 cache, so every call streams its weights from DRAM as
decode does. Prints, per row, the median microseconds per call and the weight bytes
read per second (M=1: the bandwidth; compare with `fastdecode bench`'s probe) and, for
M > 1, the multiply-accumulates per second. `--json PATH` writes the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch

from fastdecode.kernels import active_isa, load_kernels, set_isa
from fastdecode.quant.formats import LAYOUT_TENSORS, packed_shapes, tensor_dtypes
from fastdecode.quant.linear import packed_linear


def _l3_bytes() -> int:
    """This CPU's L3 as the OS reports it (a VM may report the host's whole L3), at least 32 MiB."""
    try:
        return max(32 << 20, os.sysconf("SC_LEVEL3_CACHE_SIZE"))
    except (ValueError, OSError):
        return 32 << 20


_L3_BYTES = _l3_bytes()
_DEFAULT_SHAPES = "2048x2048,512x2048,3072x2048,8192x2048,16384x2048,2048x8192,49152x2048"


def random_group(layout: str, n: int, k: int, gen: torch.Generator) -> dict[str, torch.Tensor]:
    dtypes = tensor_dtypes(layout)
    out = {}
    for name, shape in packed_shapes(layout, n, k).items():
        dt = dtypes[name]
        if dt == torch.float16:
            t = (torch.rand(shape, generator=gen) * 0.01 + 0.001).half()
            out[name] = -t if name == "mins" else t
        elif name == "e":  # q4mx: real weights' exponents (random bytes make subnormal and infinite scales)
            out[name] = torch.randint(112, 123, shape, generator=gen, dtype=torch.uint8)
        elif name in ("sc", "mn") and layout in ("q4k", "q5k"):
            out[name] = torch.randint(0, 64, shape, generator=gen, dtype=torch.uint8)
        elif dt == torch.int8:
            lo = -32 if name == "sc" else -127
            out[name] = torch.randint(lo, -lo + 1, shape, generator=gen, dtype=torch.int8)
        else:
            out[name] = torch.randint(0, 256, shape, generator=gen, dtype=torch.uint8)
    return out


def nbytes(t: dict[str, torch.Tensor]) -> int:
    return sum(v.numel() * v.element_size() for v in t.values())


def time_calls(layout: str, groups: list[dict[str, torch.Tensor]], x: torch.Tensor, seconds: float) -> float:
    """Median seconds per call, rotating through `groups`."""
    for g in groups[:3]:
        packed_linear(x, layout, g, True)
    times = []
    t_end = time.perf_counter() + seconds
    i = 0
    while time.perf_counter() < t_end or len(times) < 10:
        g = groups[i % len(groups)]
        i += 1
        t0 = time.perf_counter()
        packed_linear(x, layout, g, True)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--isa", choices=["avx2", "avx512-vnni"], default=None)
    p.add_argument("--layouts", default="q4,q8,q4k,q5k,q6k")
    p.add_argument("--shapes", default=_DEFAULT_SHAPES)
    p.add_argument("--m", default="1")
    p.add_argument("--hot", action="store_true", help="one weight copy (cache-resident when it fits)")
    p.add_argument("--seconds", type=float, default=1.0, help="per row")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    if not load_kernels():
        raise SystemExit("native kernels unavailable")
    set_isa(args.isa)
    gen = torch.Generator().manual_seed(0)
    rows = []
    print(f"isa={active_isa()} threads={torch.get_num_threads()} hot={args.hot} load={os.getloadavg()[0]:.2f}")
    for layout in args.layouts.split(","):
        for shape in args.shapes.split(","):
            n, k = (int(v) for v in shape.split("x"))
            one = random_group(layout, n, k, gen)
            size = nbytes(one)
            copies = 1 if args.hot else max(2, -(-2 * _L3_BYTES // size))
            groups = [one] + [{name: t.clone() for name, t in one.items()} for _ in range(copies - 1)]
            for m in (int(v) for v in args.m.split(",")):
                x = torch.randn(m, k, generator=gen)
                s = time_calls(layout, groups, x, args.seconds)
                row = {"layout": layout, "n": n, "k": k, "m": m, "us": s * 1e6, "weight_bytes": size,
                       "gb_s": size / s / 1e9, "gmac_s": m * n * k / s / 1e9}
                rows.append(row)
                print(f"{layout:4} {n:6}x{k:<5} M={m:<4} {s * 1e6:9.1f} us  {row['gb_s']:6.2f} GB/s  "
                      f"{row['gmac_s']:7.1f} GMAC/s", flush=True)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"isa": active_isa(), "hot": args.hot, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
