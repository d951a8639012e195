"""Batch-1 greedy decode of the default model after a prompt of N random tokens
(benchmarks/step_overhead.md).

    python benchmarks/step_overhead/long_context.py N [REPEATS]

Each repeat times a 64-token generation and, right after, a 1-token one of the same prompt (its
prefix cached by then, as in the 64-token call), and takes the difference as 63 decode steps.
Prints N and the best of REPEATS (3) in tokens/s.
"""

import sys
import time

import torch

import fastdecode

llm = fastdecode.load("smollm2-135m-instruct")
n = int(sys.argv[1])
prompt = torch.randint(100, 30000, (n,), generator=torch.Generator().manual_seed(0)).tolist()
llm.generate([prompt], max_new_tokens=4, temperature=0)


def timed(new: int) -> float:
    t = time.perf_counter()
    llm.generate([prompt], max_new_tokens=new, temperature=0, ignore_eos=True)
    return time.perf_counter() - t


best = max(63 / (timed(64) - timed(1)) for _ in range(int(sys.argv[2]) if len(sys.argv) > 2 else 3))
print(n, "decode tok/s", round(best, 1))
