"""Greedy decode of B streams through LLM.generate, 64 new tokens each (benchmarks/batch_tiles.md).

    python benchmarks/batch_tiles/decode_batch.py MODEL B REPEATS

Prints B and the aggregate tokens/s over REPEATS calls, after one short warm-up call.
"""

import sys
import time

import fastdecode

model, batch, repeats = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
llm = fastdecode.load(model)
ids = llm.tokenizer.encode("The history of the city begins", add_special_tokens=False)
prompts = [ids + [100 + i] for i in range(batch)]
llm.generate(prompts, max_new_tokens=4, temperature=0)
t = time.perf_counter()
for _ in range(repeats):
    out = llm.generate(prompts, max_new_tokens=64, temperature=0)
print(batch, sum(len(c.token_ids) for c in out) * repeats / (time.perf_counter() - t), "tok/s")
