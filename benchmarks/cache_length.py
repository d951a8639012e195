"""Batch-1 decode speed against the model's context length (max_seq_len).

Usage: python benchmarks/cache_length.py [--model random-smollm2-135m] [--steps 64] [--repeats 3]

Compares, in one run:
  sized-512   load(max_seq_len=512):  the cache is sized to the request
  sized-8192  load(max_seq_len=8192): the same, the context limit does not matter
  full-8192   a cache preallocated at 8192 slots, attended in full every step
              (what a cache sized to the context length would cost)
"""

import argparse
import statistics
import time

import torch

import fastdecode
from fastdecode.generate import decode_one_token


def per_step_ms(llm, steps):
    """Median ms per decode step of a greedy batch-1 generation."""
    run = llm.start("The meaning of life is", fastdecode.SamplingParams(temperature=0),
                    fastdecode.GenerationConfig(max_new_tokens=steps, ignore_eos=True))
    times, last = [], None
    for _ in run:
        now = time.perf_counter()
        if last is not None:
            times.append((now - last) * 1e3)
        last = now
    return statistics.median(times)


def full_cache_ms(llm, steps):
    model = llm.model
    model.setup_caches(1, llm.args.max_seq_len)
    token = torch.tensor([1])
    pick = lambda logits: logits.argmax(-1)  # noqa: E731
    times = []
    with torch.inference_mode():
        for pos in range(steps):
            t0 = time.perf_counter()
            token = decode_one_token(llm.steps.decode, token, torch.tensor([pos]), None, pick)
            times.append((time.perf_counter() - t0) * 1e3)
    model.free_caches()
    return statistics.median(times[1:])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="random-smollm2-135m")
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    short = fastdecode.load(a.model, max_seq_len=512)
    long = fastdecode.load(a.model, max_seq_len=8192)
    rows = {"sized-512": [], "sized-8192": [], "full-8192": []}
    for _ in range(a.repeats):  # interleaved, so drift on a shared machine hits all rows alike
        rows["sized-512"].append(per_step_ms(short, a.steps))
        rows["sized-8192"].append(per_step_ms(long, a.steps))
        rows["full-8192"].append(full_cache_ms(long, a.steps))
    base = statistics.median(rows["sized-512"])
    print(f"model={a.model} dtype={long.dtype} threads={torch.get_num_threads()} steps={a.steps}")
    print(f"{'cache':<12}{'ms/step':>10}{'tokens/s':>10}{'vs sized-512':>14}")
    for name, values in rows.items():
        ms = statistics.median(values)
        print(f"{name:<12}{ms:>10.2f}{1e3 / ms:>10.1f}{base / ms:>13.2f}x")


if __name__ == "__main__":
    main()
