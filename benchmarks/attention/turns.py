"""Multi-turn chat with prefix caching (benchmarks/prefix_cache.py part 1) timed in CPU
time, on one thread: the figure the attention kernel moves, robust to the other
processes on shared cores (wall time on a loaded 2-core machine is mostly waiting).

    PYTHONPATH=src python benchmarks/attention/turns.py [--threads 1] [--repeats 3]

For turns 2-6: the CPU time to the first token of the turn on a prefix-cache hit, and
of a prompt of only its new tokens on an engine without the cache (the target: the
hit at most 1.5x the cold prompt). Each turn's times are the minimum over --repeats
runs of the whole chat (a fresh engine each), so a turn always hits the same prefix.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("FASTDECODE_NO_PACKAGE", "1")  # eager steps; no background export competing for the cores

import torch  # noqa: E402

import fastdecode  # noqa: E402
from fastdecode.api.llm import split_options  # noqa: E402
from fastdecode.checkpoints import resolve_checkpoint_name  # noqa: E402

DOC = (Path(fastdecode.__file__).parent / "data" / "perplexity.txt").read_text(encoding="utf-8")
QUESTIONS = ["Who is the story about?", "What did she see first?", "Where did the rabbit go?",
             "What was written on the jar?", "How did she feel while falling?", "Summarize it in one line."]


def first_token(llm, prompt: list[int], n: int) -> tuple[float, float, list[int], int]:
    """(CPU s, wall s) to the first token, the tokens, and the cached prompt tokens."""
    c0, w0 = time.process_time(), time.perf_counter()
    run = llm.start([prompt], *split_options(dict(max_new_tokens=n, temperature=0)))
    it = iter(run)
    next(it)
    cpu, wall = time.process_time() - c0, time.perf_counter() - w0
    for _ in it:
        pass
    c = run.completions[0]
    return cpu, wall, c.token_ids, c.cached_tokens


def chat(model: str) -> list[dict]:
    on = fastdecode.load(model, max_batch_size=4, max_seq_len=4096)
    off = fastdecode.load(model, max_batch_size=4, max_seq_len=4096, prefix_cache=False)
    ids = on.tokenizer.encode(DOC, add_special_tokens=False)[:1500]
    hist = [{"role": "system", "content": on.tokenizer.decode(ids)}]
    rows = []
    for turn, q in enumerate(QUESTIONS, 1):
        hist.append({"role": "user", "content": q})
        prompt = on.chat_prompt(hist)
        cpu, wall, out, cached = first_token(on, prompt, 32)
        row = {"turn": turn, "prompt_tokens": len(prompt), "cached_tokens": cached, "hit_cpu_s": cpu, "hit_wall_s": wall}
        if turn > 1:
            cold_cpu, cold_wall, _, _ = first_token(off, prompt[cached:], 1)
            row.update(cold_cpu_s=cold_cpu, cold_wall_s=cold_wall)
        rows.append(row)
        hist.append({"role": "assistant", "content": on.tokenizer.decode(out)})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=str(resolve_checkpoint_name("smollm2-135m-instruct")))
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    runs = [chat(a.model) for _ in range(a.repeats)]
    best = []
    for turn in zip(*runs):
        row = dict(turn[0])
        for k in row:
            if k.endswith("_s"):
                row[k] = min(r[k] for r in turn)
        if "cold_cpu_s" in row:
            row["hit_over_cold_cpu"] = row["hit_cpu_s"] / row["cold_cpu_s"]
        best.append(row)
        print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()}), file=sys.stderr)
    print(json.dumps({"threads": a.threads, "repeats": a.repeats, "load": os.getloadavg(), "turns": best}))


if __name__ == "__main__":
    main()
