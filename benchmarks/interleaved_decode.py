"""Batch-1 decode, fastdecode against llama.cpp on one GGUF, in alternating rounds in one process.

    python benchmarks/interleaved_decode.py MODEL.gguf [--rounds 12] [--new 64] [--threads 2]

`fastdecode bench` runs one contender's runs, then the next's. On these shared VMs the
bandwidth moves by 1.5x within minutes (benchmarks/real_sizes.md), so a ratio from two windows
a minute apart can say 0.9x or 1.2x for the same code. Here each round decodes NEW greedy tokens
with fastdecode, then with llama-cpp-python, from the same prompt, and the ratio is taken per
round; the median of those is the figure. Only the decode is timed: from the first generated
token to the last, after the prompt (8 tokens) is prefilled.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import fastdecode
from fastdecode.api.llm import split_options


def ours(llm, prompt: list[int], new: int) -> float:
    run = llm.start([prompt], *split_options(dict(max_new_tokens=new, temperature=0, ignore_eos=True)))
    it = iter(run)
    next(it)
    t0 = time.perf_counter()
    for _ in it:
        pass
    n = len(run.completions[0].token_ids)
    return (n - 1) / (time.perf_counter() - t0)


def theirs(llama, prompt: list[int], new: int) -> float:
    llama.reset()
    llama.eval(prompt)
    tok = llama.sample(temp=0)
    t0 = time.perf_counter()
    for _ in range(new - 1):
        llama.eval([tok])
        tok = llama.sample(temp=0)
    return (new - 1) / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    from llama_cpp import Llama

    llm = fastdecode.load(a.model, max_batch_size=1)
    llama = Llama(a.model, n_threads=a.threads, n_threads_batch=a.threads, n_ctx=a.new + 64, verbose=False)
    prompt = llm.tokenizer.encode("The history of the city begins", add_special_tokens=False)[:8]
    ours(llm, prompt, 8), theirs(llama, prompt, 8)  # warm-up
    rows = []
    for r in range(a.rounds):
        f, l = ours(llm, prompt, a.new), theirs(llama, prompt, a.new)
        rows.append({"round": r, "fastdecode_tok_s": f, "llama_cpp_tok_s": l, "ratio": f / l})
        print(f"round {r:2d}: fastdecode {f:6.1f}  llama.cpp {l:6.1f}  ratio {f / l:.2f}", file=sys.stderr)
    ratios = [x["ratio"] for x in rows]
    summary = {"model": a.model, "new_tokens": a.new, "threads": a.threads, "rounds": rows,
               "median_ratio": statistics.median(ratios), "min_ratio": min(ratios), "max_ratio": max(ratios),
               "median_fastdecode": statistics.median(x["fastdecode_tok_s"] for x in rows),
               "median_llama_cpp": statistics.median(x["llama_cpp_tok_s"] for x in rows)}
    print(f"median ratio {summary['median_ratio']:.2f} (range {summary['min_ratio']:.2f}-{summary['max_ratio']:.2f});"
          f" median tok/s fastdecode {summary['median_fastdecode']:.1f}, llama.cpp {summary['median_llama_cpp']:.1f}")
    if a.out:
        with open(a.out, "w", encoding="utf-8") as fh:
            json.dump(summary, fh, indent=1)


if __name__ == "__main__":
    main()
