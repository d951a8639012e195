"""Time one quantized matmul (of a Q4_1, Q8_0, Q4_0, Q4_K, Q5_K or Q6_K weight: layouts q4, q8, q4s, q4k, q5k,
q6k) of two source trees, through torch, in alternating rounds, and print each shape's median time per tree and
their ratio.

    python benchmarks/batch_tiles/linear_ab.py BASE_SRC NEW_SRC [--type Q4_1|Q8_0|Q4_0|Q4_K|Q6_K] [--rounds 3] MxNxK ...

BASE_SRC and NEW_SRC are `src` folders (e.g. of a `git archive` copy); each round runs each tree in
a fresh process. The weights are random GGUF blocks (any bytes are valid ones; the float16 scales
set to small values) packed by that tree's `formats.pack_gguf`, rotated over COPIES copies
(default 8) so that they stream from memory as a model's do; the time of a shape is the first
quartile of ROUNDS_PER_RUN calls (default 60). THREADS (default 2) sets torch's threads; ISA=avx2
(with ATEN_CPU_CAPABILITY=avx2) runs the AVX2 kernels.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time


def random_packs(qtype_name: str, n: int, k: int, copies: int, rng) -> list:
    """`copies` random GGUF tensors [n, k] of a type (any bytes are valid blocks; their float16
    fields set to 0.01), each packed by the `fastdecode` on sys.path."""
    import numpy as np
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    from fastdecode.quant import formats

    qtype = GGMLQuantizationType[qtype_name]
    block_size, block_bytes = GGML_QUANT_SIZES[qtype]
    # where each block's float16 fields are (d, and Q4_1's, Q5_1's m, Q4_K's, Q5_K's dmin)
    halves = {"Q4_1": (0, 2), "Q5_1": (0, 2), "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,)}.get(qtype_name, (0,))
    out = []
    for _ in range(copies):
        raw = rng.integers(0, 256, size=(n * k // block_size, block_bytes), dtype=np.uint8)
        for at in halves:
            raw[:, at:at + 2] = np.full((raw.shape[0], 1), 0.01, np.float16).view(np.uint8)
        out.append(formats.pack_gguf(raw, qtype, n, k))
    return out


def worker(src: str, qtype_name: str, shapes: list[str]) -> None:
    sys.path.insert(0, src)
    import numpy as np
    import torch

    from fastdecode import kernels
    from fastdecode.quant import formats
    from fastdecode.quant.linear import packed_linear

    kernels.load_kernels()
    if os.environ.get("ISA"):
        kernels.set_isa(os.environ["ISA"])
    torch.set_num_threads(int(os.environ.get("THREADS", "2")))
    copies, calls = int(os.environ.get("COPIES", "8")), int(os.environ.get("ROUNDS_PER_RUN", "60"))
    rng = np.random.default_rng(0)
    out = {}
    for spec in shapes:
        m, n, k = map(int, spec.split("x"))
        ps = random_packs(qtype_name, n, k, copies, rng)
        layout = formats.layout_of(ps[0])
        x = torch.randn(m, k, generator=torch.Generator().manual_seed(0))
        ts = []
        for r in range(calls):
            p = ps[r % copies]
            t0 = time.perf_counter()
            packed_linear(x, layout, p, native=True)
            ts.append(time.perf_counter() - t0)
        out[spec] = sorted(ts)[calls // 4]
    print(json.dumps(out))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("base")
    ap.add_argument("new")
    ap.add_argument("shapes", nargs="+", help="MxNxK")
    ap.add_argument("--type", choices=("Q4_1", "Q8_0", "Q4_0", "Q4_K", "Q5_K", "Q6_K"), default="Q4_1")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        return worker(a.base, a.type, a.shapes)
    times: dict[str, dict[str, list[float]]] = {s: {"base": [], "new": []} for s in a.shapes}
    for _ in range(a.rounds):
        for side, src in (("base", a.base), ("new", a.new)):
            cmd = [sys.executable, __file__, src, src, *a.shapes, "--type", a.type, "--worker"]
            res = subprocess.run(cmd, capture_output=True, text=True, check=True)
            for spec, t in json.loads(res.stdout.strip().splitlines()[-1]).items():
                times[spec][side].append(t)
    print(f"{'M x N x K':>14} {'base us':>9} {'new us':>9} {'new GMAC/s':>10} {'speed':>6}")
    for spec, t in times.items():
        m, n, k = map(int, spec.split("x"))
        b, w = statistics.median(t["base"]), statistics.median(t["new"])
        print(f"{spec:>14} {b * 1e6:9.1f} {w * 1e6:9.1f} {m * n * k / w / 1e9:10.1f} {b / w:6.2f}")


if __name__ == "__main__":
    main()
