"""Decode and prefill rates of one model through LLM.generate, each case's best of 3 calls after a
warm-up call (benchmarks/serial_loops.md).

    python benchmarks/serial_loops/steps.py [MODEL]

Prints one line: B<n> aggregate greedy decode tokens/s of n streams (48 new tokens each),
P<n> prompt tokens/s of one random prompt of n tokens (one new token).
"""

import sys
import time

import torch

import fastdecode

llm = fastdecode.load(sys.argv[1] if len(sys.argv) > 1 else "smollm2-135m-instruct")
ids = llm.tokenizer.encode("The history of the city begins", add_special_tokens=False)
gen = torch.Generator().manual_seed(0)
high = min(llm.tokenizer.vocab_size, 32000)


def decode(b: int) -> float:
    prompts = [ids + [100 + i] for i in range(b)]
    t = time.perf_counter()
    out = llm.generate(prompts, max_new_tokens=48, temperature=0)
    return sum(len(c.token_ids) for c in out) / (time.perf_counter() - t)


def prefill(n: int) -> float:
    prompt = torch.randint(100, high, (n,), generator=gen).tolist()
    t = time.perf_counter()
    llm.generate([prompt], max_new_tokens=1, temperature=0)
    return n / (time.perf_counter() - t)


cases = [("B1", lambda: decode(1)), ("B4", lambda: decode(4)), ("B8", lambda: decode(8)),
         ("P32", lambda: prefill(32)), ("P128", lambda: prefill(128)), ("P512", lambda: prefill(512))]
for _, f in cases:
    f()
print(" ".join(f"{name} {max(f() for _ in range(3)):.1f}" for name, f in cases))
