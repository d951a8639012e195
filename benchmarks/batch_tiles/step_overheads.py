"""Two per-step costs outside the matmuls, each against what it replaced, in one process.

    python benchmarks/batch_tiles/step_overheads.py

- the greedy pick: `sampling.first_max` (the kernels' op once they are loaded) against torch.max's
  reduction, on [B, 49152] float32 logits for B = 1 and 16;
- the exported step's inputs: the caches' tensors as the step keeps them against walking the
  layers' modules for them each step (the default model's 30 layers).

Prints microseconds a call, the median of 5 rounds of 2,000 calls, both sides alternating.
"""

import statistics
import time

import torch

import fastdecode
from fastdecode.sampling import first_max


def per_call_us(f, n: int = 2000) -> float:
    for _ in range(50):
        f()
    t = time.perf_counter()
    for _ in range(n):
        f()
    return (time.perf_counter() - t) / n * 1e6


def compare(name: str, new, old) -> None:
    rounds = [(per_call_us(new), per_call_us(old)) for _ in range(5)]
    a, b = statistics.median(r[0] for r in rounds), statistics.median(r[1] for r in rounds)
    print(f"{name}: {a:.1f} us against {b:.1f} us")


llm = fastdecode.load("smollm2-135m-instruct", max_batch_size=1)  # loads the kernels too
for B in (1, 16):
    x = torch.randn(B, 49152)
    assert torch.equal(first_max(x), x.max(dim=-1).indices)
    compare(f"first_max [{B}, 49152] (torch.max)", lambda: first_max(x), lambda: x.max(dim=-1).indices)

steps = llm.steps
if steps.compiled is None:
    raise SystemExit("no exported package yet (it exports in the background): run this again later")
exported = steps.step.__self__
model = llm.engine.model


def walk():
    caches = [layer.attention.kv_cache for layer in model.layers]
    return [c.k_cache for c in caches] + [c.v_cache for c in caches]


assert all(a is b for a, b in zip(exported._cache_tensors(), walk(), strict=True))
compare(f"caches' tensors, {len(model.layers)} layers (walking the modules)", exported._cache_tensors, walk)
