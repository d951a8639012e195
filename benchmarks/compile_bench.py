"""Measure one compile configuration in a fresh process; prints one JSON line.

    .venv/bin/python benchmarks/compile_bench.py --model random-smollm2-135m --strategy decode \
        --options '{"freezing": true}' --gemv 1 --batch 1 4 --new 48
    .venv/bin/python benchmarks/compile_bench.py --model smollm2-135m-instruct --compiled model.pt2

first_call_s is load + warm-up (every graph compiled) + the first generation;
point TORCHINDUCTOR_CACHE_DIR at an empty folder for a cold number and run
again for the warm-cache number.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

import fastdecode
from fastdecode.compile.compiled import CompiledSteps
from fastdecode.compile.steps import Steps
from fastdecode.compile.strategies import make_steps
from fastdecode.quant.transform import set_gemv


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="random-smollm2-135m")
    p.add_argument("--strategy", default="decode", choices=["none", "decode", "generate"])
    p.add_argument("--options", default=None, help="Inductor options as JSON (decode strategy)")
    p.add_argument("--gemv", type=int, default=1)
    p.add_argument("--batch", type=int, nargs="+", default=[1, 4])
    p.add_argument("--new", type=int, default=48)
    p.add_argument("--prompt", type=int, default=16)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--compiled", default=None, help="run this `fastdecode export` package instead of a strategy")
    p.add_argument("--profile", default=None, help="write Dynamo/Inductor compile times to this file")
    a = p.parse_args()

    t0 = time.perf_counter()
    llm = fastdecode.load(a.model, max_batch_size=max(a.batch), compiled=a.compiled)
    if a.compiled:
        a.strategy = "package"
    else:
        set_gemv(llm.model, bool(a.gemv))
        if a.strategy == "decode" and a.options is not None:
            c = CompiledSteps(llm.model, options=json.loads(a.options))
            llm.engine.runner.steps = Steps(step=c.step, warmup=c.warmup)
        else:
            llm.engine.runner.steps = make_steps(llm.model, a.strategy)
    llm.compile = a.strategy
    llm.steps.warmup()
    prompt = [[7 + (i % 50) for i in range(a.prompt)]]
    llm.generate(prompt, max_new_tokens=4, temperature=0, ignore_eos=True)
    first_call = time.perf_counter() - t0

    rates = {}
    for B in a.batch:
        runs = [llm.generate(prompt * B, max_new_tokens=a.new, temperature=0, ignore_eos=True)[0].decode_tokens_per_s
                for _ in range(a.repeats)]
        rates[f"b{B}_tok_s"] = round(statistics.median(runs), 2)
    if a.profile:
        with open(a.profile, "w") as f:
            f.write(torch._dynamo.utils.compile_times(repr="str") + "\n")
    print(json.dumps({"model": a.model, "strategy": a.strategy, "options": a.options, "gemv": a.gemv,
                      "first_call_s": round(first_call, 1), **rates, "threads": torch.get_num_threads()}))


if __name__ == "__main__":
    main()
