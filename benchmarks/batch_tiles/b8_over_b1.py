"""B streams against one, alternating in one process, so that the host's drift (this VM's
speed moves by a quarter between seconds) falls on both sides of each ratio.

    python benchmarks/batch_tiles/b8_over_b1.py MODEL [B [ROUNDS]]

Each round: one stream's 64 greedy tokens, then B streams' 64 each, then one stream again; the
round's ratio is B's aggregate tokens/s over the mean of the two single-stream figures.
Prints every round and the median ratio.
"""

import statistics
import sys
import time

import fastdecode

model = sys.argv[1]
batch = int(sys.argv[2]) if len(sys.argv) > 2 else 8
rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 7
llm = fastdecode.load(model, max_batch_size=batch)
ids = llm.tokenizer.encode("The history of the city begins", add_special_tokens=False)
prompts = [ids + [100 + i] for i in range(batch)]
llm.generate(prompts, max_new_tokens=4, temperature=0)


def rate(ps: list) -> float:
    t = time.perf_counter()
    out = llm.generate(ps, max_new_tokens=64, temperature=0, ignore_eos=True)
    return sum(len(c.token_ids) for c in out) / (time.perf_counter() - t)


ratios = []
for r in range(rounds):
    one_a = rate(prompts[:1])
    many = rate(prompts)
    one_b = rate(prompts[:1])
    ratios.append(many / ((one_a + one_b) / 2))
    print(f"round {r + 1}: B=1 {one_a:.1f}, {one_b:.1f}  B={batch} {many:.1f} tok/s  ratio {ratios[-1]:.2f}", flush=True)
print(f"median B={batch} / B=1: {statistics.median(ratios):.2f} ({rounds} rounds)")
