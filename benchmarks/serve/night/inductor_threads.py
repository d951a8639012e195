"""Batch-1 decode, 16-row decode and prefill of the default model from one package, to compare
packages exported with different Inductor settings. Run it with its own FASTDECODE_CACHE and
TORCHINDUCTOR_CACHE_DIR per setting (the package key does not include Inductor's settings), e.g.
TORCHINDUCTOR_CPP_MIN_CHUNK_SIZE=1000000 (every fused elementwise loop serial) against the default:

    FASTDECODE_CACHE=/tmp/c1 TORCHINDUCTOR_CACHE_DIR=/tmp/i1 TORCHINDUCTOR_CPP_MIN_CHUNK_SIZE=1000000 \\
      python benchmarks/serve/night/inductor_threads.py serial

The first run exports the package in the background and waits for it. Prints the best of three:
ms a token at batch 1 (64 tokens), ms a 16-row step (64 steps, prompts cached), and the prefill
rate of 48 prompts of 40-200 words, 16 a call.
"""

import sys, time, random, subprocess
import fastdecode
llm = fastdecode.load("smollm2-135m-instruct", max_batch_size=16)
rng = random.Random(0)
words = "river city market history light stone water forest winter garden music table".split()
ids = llm.tokenizer.encode("The history of the city begins", add_special_tokens=False)
llm.generate([ids], max_new_tokens=4, temperature=0)
while subprocess.run(["pgrep", "-f", "export_job"], capture_output=True).returncode == 0: time.sleep(3)
llm = fastdecode.load("smollm2-135m-instruct", max_batch_size=16)
llm.generate([ids], max_new_tokens=4, temperature=0)
def t(f, n=3):
    best = 1e9
    for _ in range(n):
        s = time.perf_counter(); f(); best = min(best, time.perf_counter() - s)
    return best
b1 = t(lambda: llm.generate([ids + [5]], max_new_tokens=64, temperature=0))
prompts = [llm.tokenizer.encode(" ".join(rng.choice(words) for _ in range(120)), add_special_tokens=False) for _ in range(16)]
llm.generate(prompts, max_new_tokens=2, temperature=0)
b16 = t(lambda: llm.generate(prompts, max_new_tokens=64, temperature=0))
pre = [llm.tokenizer.encode(" ".join(rng.choice(words) for _ in range(rng.randint(40, 200))), add_special_tokens=False) for _ in range(48)]
s = time.perf_counter()
for i in range(0, 48, 16): llm.generate(pre[i:i+16], max_new_tokens=1, temperature=0)
pf = sum(map(len, pre)) / (time.perf_counter() - s)
print(sys.argv[1], f"B=1 {b1/64*1e3:.2f} ms/token | 16 rows {b16/64*1e3:.2f} ms/step | prefill {pf:.0f} tok/s")
