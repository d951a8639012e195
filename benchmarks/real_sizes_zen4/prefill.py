"""Prefill rate of one prompt through LLM.generate: PROMPT random token ids, one new token.

    python benchmarks/real_sizes_zen4/prefill.py MODEL [PROMPT [REPEATS]]

Prints the median prompt tokens/s over REPEATS calls after one warm-up call (comparable with
llama-bench's pp<PROMPT>, which also times one prompt of that many tokens).
"""

import statistics
import sys
import time

import torch

import fastdecode

model = sys.argv[1]
n = int(sys.argv[2]) if len(sys.argv) > 2 else 512
repeats = int(sys.argv[3]) if len(sys.argv) > 3 else 3
llm = fastdecode.load(model, max_seq_len=n + 16)
gen = torch.Generator().manual_seed(0)
high = min(llm.tokenizer.vocab_size, 32000)  # the ids of the recorded runs; their values do not change the time
times = []
for r in range(repeats + 1):
    ids = torch.randint(100, high, (n,), generator=gen).tolist()
    t = time.perf_counter()
    llm.generate([ids], max_new_tokens=1, temperature=0)
    if r:
        times.append(time.perf_counter() - t)
print(n, n / statistics.median(times), "prompt tok/s")
