"""Decode time per step of B greedy streams, the prefill left out (benchmarks/real_sizes_zen3.md).

    python benchmarks/batch_tiles/decode_step_ms.py MODEL B CALLS

Each call generates 65 tokens per stream; the clock starts at the first token, so the figure is
64 decode steps of B rows. Prints the median over CALLS calls, after one untimed call. Two code
versions compare by running this in alternation, each from its own tree and cache.
"""

import statistics
import sys
import time

import fastdecode
from fastdecode.api.llm import split_options

model, batch, calls = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
llm = fastdecode.load(model, max_batch_size=batch)
ids = llm.tokenizer.encode("The history of the city begins", add_special_tokens=False)
prompts = [ids + [100 + i] for i in range(batch)]


def step_ms() -> float:
    run = llm.start(prompts, *split_options(dict(max_new_tokens=65, temperature=0, ignore_eos=True)))
    it = iter(run)
    next(it)
    t = time.perf_counter()
    for _ in it:
        pass
    return (time.perf_counter() - t) / 64 * 1000


step_ms()
ms = [step_ms() for _ in range(calls)]
print(f"B={batch} ms/step median {statistics.median(ms):.1f} ({' '.join(f'{m:.1f}' for m in ms)})")
