"""Compile time of the model step with transformer blocks as nested compile
regions (the default) or inlined; one fresh process per variant, each on an
empty Inductor cache. Prints one JSON line per variant.

    .venv/bin/python benchmarks/nested_regions.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time

import torch


def measure(nested: bool) -> dict:
    import fastdecode
    from fastdecode.compile.compiled import CompiledSteps
    from fastdecode.model.transformer import TransformerBlock

    if not nested:  # the undecorated function: Dynamo inlines all 30 blocks
        TransformerBlock.forward = TransformerBlock.forward.__marked_compile_region_fn__
    # The engine's cache; compiled=none: no package export runs beside the timing.
    llm = fastdecode.load("random-smollm2-135m", max_batch_size=1, max_seq_len=256, compiled="none")
    steps = CompiledSteps(llm.model)
    steps.warmed_up = True  # compile on the first call below, timed
    # one token at position 3 of slot 0, its logits (flat token index 0)
    args = torch.zeros(1, 1, dtype=torch.long), torch.tensor([[3]]), torch.tensor([0]), torch.tensor([[0]])
    t0 = time.perf_counter()
    steps.step(*args)
    compile_s = time.perf_counter() - t0
    for _ in range(3):
        steps.step(*args)
    t0 = time.perf_counter()
    for _ in range(20):
        steps.step(*args)
    step_ms = (time.perf_counter() - t0) / 20 * 1000
    return {"nested": nested, "compile_s": round(compile_s, 1), "step_ms": round(step_ms, 2)}


if __name__ == "__main__":
    if len(sys.argv) > 1:
        print(json.dumps(measure(sys.argv[1] == "1")))
    else:
        for flag in ("1", "0"):
            with tempfile.TemporaryDirectory() as cache:
                env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache)
                out = subprocess.run([sys.executable, __file__, flag], env=env, capture_output=True, text=True)
                print(out.stdout.strip().splitlines()[-1] if out.stdout.strip() else out.stderr[-2000:])
