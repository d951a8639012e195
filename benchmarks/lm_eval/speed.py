"""Loglikelihood speed alone (no lm-eval run): batches of 8 prompts x 100 token ids, as
lm-eval's local-completions sends them (echo, logprobs=1, max_tokens=1, temperature 0),
against the prefill rate of the same prompts through the Python API, and against
`fastdecode bench`'s prefill figure (one 512-token prompt at batch 1: 512 / TTFT).

    python benchmarks/lm_eval/speed.py [--model NAME] [--rounds 3] [--batches 3] [--profile api|torch]

Rounds alternate the three measurements (API plain prefill, API prompt_logprobs=1, server
echo) so that load from other jobs falls on all of them alike; each figure is the median
of its rounds, by wall time and by CPU time (user + system of the process doing the work:
this one for the API, the server's for the server). --profile api|torch prints cProfile's or
torch.profiler's top functions of the API prompt_logprobs calls.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from run import free_port, start_server  # noqa: E402


def batches(V: int, n: int = 3) -> list:
    rng = random.Random(0)
    return [[[rng.randrange(100, V) for _ in range(100)] for _ in range(8)] for _ in range(n)]


def body(b):
    return {"model": "m", "prompt": b, "echo": True, "logprobs": 1, "max_tokens": 1, "temperature": 0, "seed": 1234}


def cpu_seconds(pid: int) -> float:
    """user + system CPU time of a process, all its threads."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def timed(fn, pid: int = 0) -> tuple[float, float]:
    """(wall seconds, CPU seconds of process `pid`, this one by default). The CPU time
    is what the measured work cost: on a machine loaded by other jobs it varies far
    less than the wall time does."""
    pid = pid or os.getpid()
    c0, t0 = cpu_seconds(pid), time.perf_counter()
    fn()
    return time.perf_counter() - t0, cpu_seconds(pid) - c0


def show(prof: cProfile.Profile, n: int = 35) -> None:
    s = io.StringIO()
    pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(n)
    print(s.getvalue())


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batches", type=int, default=3, help="batches of 8 x 100 per round")
    ap.add_argument("--profile", default="none", choices=["none", "api", "torch"])
    ap.add_argument("--out")
    a = ap.parse_args()
    import fastdecode

    # No prefix reuse: repeated prompts would skip their prefill (prompt logprobs never reuse).
    llm = fastdecode.load(a.model, max_batch_size=8, prefix_cache=False)
    bs = batches(llm.args.vocab_size, a.batches)
    ntok = sum(len(p) for b in bs for p in b)

    def plain():
        for b in bs:
            llm.generate(b, max_new_tokens=1, temperature=0)

    # `fastdecode bench`'s prefill figure: one 512-token prompt at batch 1, B * P / TTFT
    long_prompt = [random.Random(1).randrange(100, llm.args.vocab_size) for _ in range(512)]

    def bench_shape():
        llm.generate([long_prompt], max_new_tokens=1, temperature=0)

    def scored():
        for b in bs:
            llm.generate(b, max_new_tokens=1, temperature=0, prompt_logprobs=1)

    if a.profile in ("api", "torch"):
        plain(), scored()  # warm
        if a.profile == "torch":
            import torch.profiler as tp
            with tp.profile(activities=[tp.ProfilerActivity.CPU]) as p:
                scored()
            print(p.key_averages().table(sort_by="self_cpu_time_total", row_limit=30))
            return 0
        prof = cProfile.Profile()
        print("plain (wall, cpu)", timed(plain), "scored", timed(scored))
        prof.enable()
        scored()
        prof.disable()
        show(prof)
        return 0

    port = free_port()
    tmp = Path(tempfile.mkdtemp(prefix="fd-speed-"))
    server = start_server(a.model, port, tmp / "serve.log")
    client = httpx.Client(timeout=600)

    def served():
        for b in bs:
            client.post(f"http://127.0.0.1:{port}/v1/completions", json=body(b)).raise_for_status()

    report = {"model": a.model, "cpu": os.popen("lscpu | grep 'Model name'").read().split(":")[-1].strip(),
              "load_before": os.getloadavg(), "tokens_per_round": ntok}
    try:
        served(), plain(), scored()  # warm
        bench_shape()
        t = {"api_prefill": [], "api_prompt_logprobs": [], "server_echo": []}
        bench_s = []
        for _ in range(a.rounds):
            bench_s.append(timed(bench_shape)[0])
            t["api_prefill"].append(timed(plain))
            t["api_prompt_logprobs"].append(timed(scored))
            t["server_echo"].append(timed(served, server.pid))
    finally:
        server.terminate()
        server.wait(30)
    report["load_after"] = os.getloadavg()
    report["wall_s"] = {k: [w for w, _ in v] for k, v in t.items()}
    report["cpu_s"] = {k: [c for _, c in v] for k, v in t.items()}
    report["bench_shape_prefill_s"] = bench_s
    report["bench_shape_prefill_tokens_per_s"] = len(long_prompt) / statistics.median(bench_s)
    for kind, col in (("wall", 0), ("cpu", 1)):
        rate = {k: ntok / statistics.median(x[col] for x in v) for k, v in t.items()}
        report[f"tokens_per_{kind}_s"] = rate
        report[f"ratio_server_echo_{kind}"] = rate["server_echo"] / rate["api_prefill"]
        report[f"ratio_api_prompt_logprobs_{kind}"] = rate["api_prompt_logprobs"] / rate["api_prefill"]
    report["ratio_server_echo_vs_bench_shape_wall"] = (report["tokens_per_wall_s"]["server_echo"]
                                                       / report["bench_shape_prefill_tokens_per_s"])
    print(json.dumps(report, indent=1))
    if a.out:
        Path(a.out).write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
