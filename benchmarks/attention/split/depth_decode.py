"""Batch-1 greedy decode after prompts of several lengths, through load()'s defaults (the
machine's package), as tokens/s of the 32 tokens after the first (benchmarks/attention/split.md).

    PYTHONPATH=src python benchmarks/attention/split/depth_decode.py MODEL [DEPTH ...]

Two prompts of random token ids per depth (different seeds); the model's context must hold
the longest depth plus 33.
"""

import random
import sys

import fastdecode

model = sys.argv[1]
depths = [int(d) for d in sys.argv[2:]] or [0, 256, 2048, 8192]
llm = fastdecode.load(model, max_seq_len=max(depths) + 64)
for depth in depths:
    rates = []
    for seed in range(2):
        rnd = random.Random(depth * 10 + seed)
        ids = [rnd.randrange(1000, min(llm.tokenizer.vocab_size, 40000)) for _ in range(max(depth, 1))]
        out = llm.generate([ids], max_new_tokens=33, temperature=0, ignore_eos=True)
        rates.append(out[0].decode_tokens_per_s)
    print(f"depth {depth}: decode tok/s " + " ".join(f"{r:.1f}" for r in rates), flush=True)
