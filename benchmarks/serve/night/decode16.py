"""16 streams' decode steps, as the server's: one engine with max_batch_size=16 (LLM's default is 8,
so `batch_tiles/decode_batch.py MODEL 16 ...` runs two steps of 8), 16 prompts of L words,
64 new tokens each. The prompts are prefilled by a first call, so the timed calls find them
in the prefix cache and time the decode steps (at positions L..L+64 tokens).

    python benchmarks/serve/night/decode16.py L REPEATS

Prints the milliseconds a 16-row step.
"""
import sys, time, random
import fastdecode
llm = fastdecode.load("smollm2-135m-instruct", max_batch_size=16)
rng = random.Random(0)
words = "river city market history light stone water forest winter garden music table".split()
B = 16; L = int(sys.argv[1]); R = int(sys.argv[2])
prompts = [llm.tokenizer.encode(" ".join(rng.choice(words) for _ in range(L)), add_special_tokens=False) for _ in range(B)]
llm.generate(prompts, max_new_tokens=2, temperature=0)
t = time.perf_counter()
for _ in range(R):
    llm.generate(prompts, max_new_tokens=64, temperature=0)
dt = time.perf_counter() - t
print(B, L, "decode 16x64 x", R, round(dt / R / 64 * 1e3, 2), "ms/step (prefill cached)")
