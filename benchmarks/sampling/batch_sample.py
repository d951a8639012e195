"""Aggregate decode tokens/s of B requests generated together, greedy and sampled.

    PYTHONPATH=src .venv/bin/python benchmarks/sampling/batch_sample.py default|MODEL.gguf B

B prompts, 128 new tokens each (EOS ignored), seed 5, after a short warm-up:
greedy, temperature 1.0 (the OpenAI API's default), and temperature 0.8 with top_p 0.95.
"""

import sys
import time

import fastdecode


def main() -> None:
    model, B = sys.argv[1], int(sys.argv[2])
    llm = fastdecode.load(None if model == "default" else model, max_batch_size=B)
    prompts = [f"Story number {i}: once upon a time" for i in range(B)]
    llm.generate(prompts, max_new_tokens=8, temperature=0)
    for kw in ({"temperature": 0}, {"temperature": 1.0}, {"temperature": 0.8, "top_p": 0.95}):
        t = time.perf_counter()
        llm.generate(prompts, max_new_tokens=128, ignore_eos=True, seed=5, **kw)
        print(f"B={B} {kw}: {B * 128 / (time.perf_counter() - t):.1f} tokens/s aggregate")


if __name__ == "__main__":
    main()
