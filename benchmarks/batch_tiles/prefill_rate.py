"""Prefill rate of one model: ROWS prompts of N random token ids, each call `generate` with one new
token, CALLS calls after an untimed one (benchmarks/batch_tiles/unpacked.md).

    python benchmarks/batch_tiles/prefill_rate.py MODEL N CALLS [ROWS]

MODEL: a checkpoint name or a .gguf path. Prints the median prompt tokens/s and every call's. Two
source trees compare by running this in alternation with PYTHONPATH=<tree>/src.
"""

import random
import statistics
import sys
import time

import fastdecode

model, n, calls = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rows = int(sys.argv[4]) if len(sys.argv) > 4 else 1
llm = fastdecode.load(model, max_batch_size=rows, max_seq_len=max(1024, n + 8))
rng = random.Random(0)


def once() -> float:
    prompts = [[rng.randrange(100, 40000) for _ in range(n)] for _ in range(rows)]
    t = time.perf_counter()
    llm.generate(prompts, max_new_tokens=1, temperature=0)
    return rows * n / (time.perf_counter() - t)


once()
rates = [once() for _ in range(calls)]
print(f"prefill {rows}x{n}: {statistics.median(rates):.0f} tok/s ({' '.join(f'{r:.0f}' for r in rates)})")
