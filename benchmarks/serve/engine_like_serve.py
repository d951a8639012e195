"""The server load of `serve_load.py` (prompts of 40-200 random words, 64 greedy tokens, EOS
ignored) through `LLM.generate` instead of HTTP, with the engine's decode and prefill calls
timed: 6 requests one at a time (N = 1), then 32 at once with 16 slots (N = 16).

    python benchmarks/serve/engine_like_serve.py

Prints tokens/s for both and where the engine's time went (benchmarks/serve/README.md).
"""
import random
import time

import fastdecode

WORDS = ("the quick brown fox jumps over a lazy dog while seven wizards quietly judge boxing matches "
         "near an old river bank full of bright stones and tall green reeds").split()
rng = random.Random(0)
prompts = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(40, 200))) for _ in range(32)]
llm = fastdecode.load(max_batch_size=16)
r = llm.engine.runner
# Timing wrappers around the runner's two calls, for this measurement only.
acc = {"decode": 0.0, "prefill": 0.0, "nd": 0, "np": 0, "rows": 0, "ptok": 0}
od, op = r.decode, r.prefill
def dec(reqs, drafts):
    t = time.perf_counter(); out = od(reqs, drafts); acc["decode"] += time.perf_counter() - t; acc["nd"] += 1; acc["rows"] += len(reqs); return out
def pre(reqs, n):
    t = time.perf_counter(); out = op(reqs, n); acc["prefill"] += time.perf_counter() - t; acc["np"] += 1; acc["ptok"] += n * len(reqs); return out
r.decode, r.prefill = dec, pre
llm.generate(prompts[:2], max_new_tokens=8, temperature=0, ignore_eos=True)
for k in acc: acc[k] = 0
t = time.perf_counter()
n1 = 0
for p in prompts[:6]:
    n1 += len(llm.generate([p], max_new_tokens=64, temperature=0, ignore_eos=True)[0].token_ids)
w1 = time.perf_counter() - t
a1 = dict(acc)
for k in acc: acc[k] = 0
t = time.perf_counter()
out = llm.generate(prompts, max_new_tokens=64, temperature=0, ignore_eos=True)
w16 = time.perf_counter() - t
n16 = sum(len(c.token_ids) for c in out)
print(f"N=1: {n1/w1:.1f} tok/s wall {w1:.2f}s {a1}")
print(f"N=16: {n16/w16:.1f} tok/s wall {w16:.2f}s {acc}  ratio {n16/w16/(n1/w1):.2f}")
