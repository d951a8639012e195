"""Load time of the default model: GGUF first load, cached load, and transformers on the same file.

Usage: python benchmarks/load_time.py [--repeats 3]

Each figure is the median over repeats in one process,
after one untimed import warm-up, so imports are not counted for either side.
"""

import argparse
import os
import statistics
import tempfile
import time

import torch

import fastdecode
from fastdecode.checkpoints import default_model_path, load_checkpoint


def timed(fn):
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    path = default_model_path()
    rows = {"fastdecode: GGUF, first load (convert + write cache)": [],
            "fastdecode: GGUF, cached load": [],
            "fastdecode: load() end to end, cached": [],
            "transformers: from_pretrained(gguf_file=...)": []}
    from transformers import AutoModelForCausalLM

    for _ in range(a.repeats):
        with tempfile.TemporaryDirectory() as cache_dir:
            os.environ["FASTDECODE_CACHE"] = cache_dir
            rows["fastdecode: GGUF, first load (convert + write cache)"].append(
                timed(lambda: load_checkpoint(path, dtype=torch.float32)))
            rows["fastdecode: GGUF, cached load"].append(timed(lambda: load_checkpoint(path, dtype=torch.float32)))
        rows["transformers: from_pretrained(gguf_file=...)"].append(timed(
            lambda: AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                         dtype=torch.float32)))
    os.environ.pop("FASTDECODE_CACHE")
    fastdecode.load()  # fills the user cache (converted copy, native kernel) if empty
    for _ in range(a.repeats):
        rows["fastdecode: load() end to end, cached"].append(timed(lambda: fastdecode.load()))
    print(f"model file: {path.name}  threads={torch.get_num_threads()}  repeats={a.repeats}")
    print(f"{'what':<56}{'median s':>10}")
    for name, values in rows.items():
        print(f"{name:<56}{statistics.median(values):>10.2f}")


if __name__ == "__main__":
    main()
