"""Decode tokens/s of the default model with float32 vs float16 (and q8_0) KV caches,
in one process, interleaved A/B rounds (the machine may be shared): batch 1, batch 8
and a ~1500-token context. Eager steps (compiled=None), greedy, 64 new tokens.

    PYTHONPATH=src python benchmarks/kv_dtype_bench.py [rounds] [kv dtypes...]
"""

import os
import statistics
import sys
from pathlib import Path

import fastdecode

rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
kinds = sys.argv[2:] or ["float32", "float16"]
text = (Path(fastdecode.__file__).parent / "data" / "perplexity.txt").read_text(encoding="utf-8")
llms = {kv: fastdecode.load(kv_dtype=kv, compiled=None) for kv in kinds}
tok = next(iter(llms.values())).tokenizer
long_ids = tok.encode(text)[:1500]
cases = {
    "batch 1": [tok.encode("The history of the printing press")],
    "batch 8": [tok.encode(f"Story number {i}: once upon a time") for i in range(8)],
    "ctx 1500": [long_ids],
}
res = {(c, kv): [] for c in cases for kv in kinds}
for llm in llms.values():  # warm-up
    llm.generate(cases["batch 1"], max_new_tokens=8, temperature=0)
for r in range(rounds):
    for case, prompts in cases.items():
        for kv in (kinds if r % 2 == 0 else kinds[::-1]):
            cs = llms[kv].generate(prompts, max_new_tokens=64, temperature=0, ignore_eos=True)
            res[case, kv].append(cs[0].decode_tokens_per_s * len(cs))
print("load average:", os.getloadavg())
for case in cases:
    line = [f"{case:9s}"]
    for kv in kinds:
        v = res[case, kv]
        line.append(f"{kv} {statistics.median(v):7.1f} tok/s ({' '.join(f'{x:.1f}' for x in v)})")
    print("  ".join(line))
