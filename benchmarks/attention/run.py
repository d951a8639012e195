"""The attention kernel before and after its tiled rewrite, in one process per shape.

    python benchmarks/attention/run.py [--baseline REV] [--rounds 40] [--threads 1,2] [--check]
        [--only 0,3] [--out benchmarks/attention/results.jsonl]

NEW_FLAGS (environment, space-separated) adds compiler flags to the working tree's build
only, e.g. NEW_FLAGS="-mavx512f -mavx512vl" to try it built for AVX-512.

Builds harness.cpp against the baseline's kernel (math.cpp's row-per-task one, or the tiled
attention.cpp of a later REV, with kernels.h at REV, from git, under the namespace `base`) and
the working tree's attention.cpp, with
the kernels' own compiler flags; --check first compares the two bit for bit over a
grid of shapes, formats, windows and thread counts. Each bench line times both in
alternation (see harness.cpp) and appends one JSON object to --out.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
KERNELS = ROOT / "src" / "fastdecode" / "kernels"
BASELINE = "989ba30"  # main before the tiled kernel: one task per query row
FLAGS = ["-std=c++20", "-O3", "-mavx2", "-mfma", "-mf16c", "-fopenmp", "-ffp-contract=off"]  # as kernels/__init__.py
KV = {"f32": 0, "f16": 1, "bf16": 2, "q8_0": 3}
# (kv, T, L, B, H, Hkv, D, window): SmolLM2-135M (9/3 heads) prefill chunks over a long
# cache (turn 2 of benchmarks/prefix_cache.py: 18 new tokens over 1,551), cold chunks,
# decode batches; Llama 3.2 1B (32/8); Gemma 3's sliding window (head_dim 256, 512 keys).
SHAPES = [
    ("f16", 18, 1569, 1, 9, 3, 64, 0),
    ("f16", 8, 1024, 1, 9, 3, 64, 0),
    ("f16", 64, 2048, 1, 9, 3, 64, 0),
    ("f16", 256, 256, 1, 9, 3, 64, 0),
    ("f16", 256, 8192, 1, 9, 3, 64, 0),
    ("f32", 18, 1569, 1, 9, 3, 64, 0),
    ("bf16", 18, 1569, 1, 9, 3, 64, 0),
    ("q8_0", 18, 1569, 1, 9, 3, 64, 0),
    ("f16", 64, 2048, 1, 32, 8, 64, 0),
    ("f16", 64, 2048, 1, 8, 4, 256, 512),
    ("f16", 1, 1569, 1, 9, 3, 64, 0),
    ("f16", 1, 1569, 4, 9, 3, 64, 0),
    ("f16", 1, 512, 16, 9, 3, 64, 0),
    ("f16", 1, 4096, 1, 32, 8, 64, 0),
]


NEW_FLAGS = os.environ.get("NEW_FLAGS", "").split()


def git_show(rev: str, path: str) -> str:
    return subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:{path}"], check=True, capture_output=True,
                          text=True).stdout


def build(rev: str, out: Path) -> Path:
    (out / "base_kernels.h").write_text(git_show(rev, "src/fastdecode/kernels/kernels.h"))
    (out / "simd.h").write_text(git_show(rev, "src/fastdecode/kernels/simd.h"))
    # Before the tiled kernel, attention lived in math.cpp with a row-range interface; from
    # then on in attention.cpp, with the working tree's interface (BASE_TILED in harness.cpp).
    tiled = subprocess.run(["git", "-C", str(ROOT), "cat-file", "-e", f"{rev}:src/fastdecode/kernels/attention.cpp"],
                           capture_output=True).returncode == 0
    source = "attention.cpp" if tiled else "math.cpp"
    (out / "base.cpp").write_text(
        git_show(rev, f"src/fastdecode/kernels/{source}").replace('#include "kernels.h"', '#include "base_kernels.h"'))
    cxx = ["c++", *FLAGS]
    subprocess.run([*cxx, "-Dfd=base", "-c", str(out / "base.cpp"), "-o", str(out / "base.o")], check=True)
    subprocess.run([*cxx, *NEW_FLAGS, "-c", str(KERNELS / "attention.cpp"), "-o", str(out / "new.o")], check=True)
    exe = out / "harness"
    subprocess.run([*cxx, *(["-DBASE_TILED"] if tiled else []), f"-I{KERNELS}", f"-I{out}",
                    str(Path(__file__).parent / "harness.cpp"),
                    str(out / "base.o"), str(out / "new.o"), "-o", str(exe)], check=True)
    return exe


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--baseline", default=BASELINE)
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--layers", type=int, default=30, help="separate caches used in turn (a model's layers)")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--only", default="", help="comma-separated indices into SHAPES (default: all)")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results.jsonl"))
    a = ap.parse_args()
    shapes = [SHAPES[int(i)] for i in a.only.split(",")] if a.only else SHAPES
    with tempfile.TemporaryDirectory() as tmp:
        exe = build(a.baseline, Path(tmp))
        if a.check:
            r = subprocess.run([str(exe), "check"], capture_output=True, text=True)
            print(r.stdout.strip())
            if r.returncode != 0:
                sys.exit("the kernels differ")
        print(f"{'kv':5} {'T':>4} {'L':>5} {'B':>3} {'H':>6} {'D':>4} {'win':>4} {'thr':>3} "
              f"{'base ms':>9} {'new ms':>9} {'x':>5}   (minimum: base, new, x)")
        with open(a.out, "a", encoding="utf-8") as f:
            for threads in [int(t) for t in a.threads.split(",")]:
                for kv, T, L, B, H, Hkv, D, w in shapes:
                    cmd = [str(exe), "bench", *map(str, (KV[kv], T, L, B, H, Hkv, D, w, threads, a.rounds, a.layers))]
                    row = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)
                    f.write(json.dumps({"baseline": a.baseline, **row}) + "\n")
                    print(f"{kv:5} {T:4} {L:5} {B:3} {f'{H}/{Hkv}':>6} {D:4} {w:4} {threads:3} "
                          f"{row['base_ms']:9.3f} {row['new_ms']:9.3f} {row['speedup']:5.2f}   "
                          f"{row['base_min_ms']:.3f} {row['new_min_ms']:.3f} {row['speedup_min']:.2f}"
                          + ("" if row["same"] else "  DIFFERENT"))


if __name__ == "__main__":
    main()
