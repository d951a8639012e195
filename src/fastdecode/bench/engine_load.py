"""`fastdecode bench-engine`: concurrent requests through the engine's async interface.

For each N in `concurrency`, N requests with mixed prompt lengths and
max_new_tokens are submitted at once; the report gives aggregate tokens/s,
time to first token and inter-token latency (p50, p99). A second measure,
`interference`, starts `streams` greedy streams, then submits one long prompt,
and compares the streams' largest gap while it is prefilled with the time of
one prefill chunk.
"""

from __future__ import annotations

import asyncio
import json
import random
import shlex
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Optional

from ..config import LoadOptions
from ..errors import FastDecodeError
from ..cli.command import run_command
from ..cli.keys import ModelKeys
from .report import machine_info, write_json


@dataclass
class EngineBenchSettings(ModelKeys):
    compile: str = field(default=LoadOptions.compile, metadata={"help": "compile strategy, as load(compile=...)"})
    compiled: Optional[str] = field(default=LoadOptions.compiled, metadata={"help": "package, as load(compiled=...)"})
    concurrency: list[int] = field(default_factory=lambda: [1, 4, 8, 16], metadata={
        "help": "concurrent requests per measurement"})
    prompt_min: int = field(default=16, metadata={"help": "shortest prompt, tokens"})
    prompt_max: int = field(default=256, metadata={"help": "longest prompt, tokens"})
    new_min: int = field(default=32, metadata={"help": "fewest new tokens per request (EOS ignored)"})
    new_max: int = field(default=128, metadata={"help": "most new tokens per request"})
    rounds: int = field(default=2, metadata={"help": "measurements per N (the best aggregate is kept)"})
    max_seq_len: int = field(default=2048, metadata={"help": "positions per slot"})
    prefill_chunk: int = field(default=LoadOptions.prefill_chunk, metadata={"help": "load(prefill_chunk=...)"})
    streams: int = field(default=3, metadata={"help": "interference: streams decoding when the long prompt arrives"})
    long_prompt: int = field(default=1000, metadata={"help": "interference: the long prompt's tokens; 0 skips"})
    threads: Optional[int] = field(default=None, metadata={"help": "torch threads; none keeps the default"})
    out: str = field(default="bench-results/engine.json", metadata={"help": "results file (JSON)"})

    def __post_init__(self) -> None:
        for name in ("prompt_min", "prompt_max", "new_min", "new_max", "rounds", "max_seq_len", "prefill_chunk"):
            if getattr(self, name) < 1:
                raise FastDecodeError(f"{name}={getattr(self, name)} is out of range; accepted: an integer >= 1")
        if not self.concurrency or min(self.concurrency) < 1:
            raise FastDecodeError(f"concurrency={self.concurrency} is out of range; accepted: integers >= 1")
        if self.prompt_min > self.prompt_max or self.new_min > self.new_max:
            raise FastDecodeError("prompt_min/new_min must not exceed prompt_max/new_max")
        if self.prompt_max + self.new_max > self.max_seq_len or self.long_prompt + 1 > self.max_seq_len:
            raise FastDecodeError(f"max_seq_len={self.max_seq_len} is too small for prompt_max + new_max "
                                  f"({self.prompt_max + self.new_max}) or long_prompt ({self.long_prompt})")


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    v = sorted(values)
    return v[min(len(v) - 1, round(q / 100 * (len(v) - 1)))]


async def _one(engine, prompt, params, config):
    """Submit one request; return (submit time, [(arrival time, tokens in that output)])."""
    t0 = time.perf_counter()
    arrivals = []
    async for out in engine.generate_async(prompt, params, config):
        if out.token_ids:
            arrivals.append((time.perf_counter(), len(out.token_ids)))
    return t0, arrivals


def summarize(results, wall: float) -> dict:
    tokens = sum(n for _, arr in results for _, n in arr)
    ttft = [arr[0][0] - t0 for t0, arr in results if arr]
    itl = [(b - a) / n for _, arr in results for (a, _), (b, n) in zip(arr, arr[1:])]
    return {"requests": len(results), "tokens": tokens, "wall_s": round(wall, 3),
            "tokens_per_s": round(tokens / wall, 1),
            "ttft_p50_s": round(percentile(ttft, 50), 3), "ttft_p99_s": round(percentile(ttft, 99), 3),
            "itl_p50_ms": round(1000 * percentile(itl, 50), 2), "itl_p99_ms": round(1000 * percentile(itl, 99), 2)}


async def measure_load(llm, n: int, s: EngineBenchSettings, seed: int) -> dict:
    from ..engine import GenerationConfig
    from ..sampling import SamplingParams

    rng = random.Random(seed)
    V = llm.args.vocab_size
    jobs = []
    for _ in range(n):
        prompt = [rng.randrange(min(256, V // 2), V) for _ in range(rng.randint(s.prompt_min, s.prompt_max))]
        cfg = GenerationConfig(max_new_tokens=rng.randint(s.new_min, s.new_max), ignore_eos=True)
        jobs.append((prompt, SamplingParams(temperature=0), cfg))
    t0 = time.perf_counter()
    results = await asyncio.gather(*(_one(llm.engine, *job) for job in jobs))
    return summarize(results, time.perf_counter() - t0)


async def measure_interference(llm, s: EngineBenchSettings) -> dict:
    """Largest gap of `streams` decoding streams while a long prompt is prefilled,
    against the time of one prefill chunk."""
    from ..engine import GenerationConfig
    from ..sampling import SamplingParams

    greedy = SamplingParams(temperature=0)
    V = llm.args.vocab_size
    rng = random.Random(1)
    low = min(256, V // 2)  # vocabularies keep special and byte tokens at low ids
    chunk = [rng.randrange(low, V) for _ in range(s.prefill_chunk)]
    long = [rng.randrange(low, V) for _ in range(s.long_prompt)]
    # One chunk alone (prefill time of prefill_chunk tokens, and its first token).
    one = [await _one(llm.engine, chunk, greedy, GenerationConfig(max_new_tokens=1)) for _ in range(2)][-1]
    chunk_s = one[1][0][0] - one[0]
    cfg = GenerationConfig(max_new_tokens=400, ignore_eos=True)
    tasks = [asyncio.create_task(_one(llm.engine, [low + i] * 20, greedy, cfg)) for i in range(s.streams)]
    await asyncio.sleep(1.0)  # the streams are decoding
    t_long = time.perf_counter()
    _, long_arr = await _one(llm.engine, long, greedy, GenerationConfig(max_new_tokens=1))
    t_long_done = long_arr[0][0]
    streams = await asyncio.gather(*tasks)
    gaps = [b - a for _, arr in streams for (a, _), (b, _) in zip(arr, arr[1:]) if b > t_long and a < t_long_done]
    before = [b - a for _, arr in streams for (a, _), (b, _) in zip(arr, arr[1:]) if b < t_long]
    return {"long_prompt": s.long_prompt, "prefill_chunk": s.prefill_chunk, "one_chunk_s": round(chunk_s, 3),
            "long_prefill_s": round(t_long_done - t_long, 3),
            "stream_gap_max_during_s": round(max(gaps), 3) if gaps else None,
            "stream_gap_p50_before_s": round(statistics.median(before), 4) if before else None}


def run(s: EngineBenchSettings) -> dict:
    import torch

    from ..api.build import load
    from ..engine import EngineThread

    def load_llm():
        if s.threads:
            torch.set_num_threads(s.threads)
        return load(s.model, device=s.device, dtype=s.dtype, weights=s.weights, compile=s.compile,
                    compiled=s.compiled, max_batch_size=max(max(s.concurrency), s.streams + 1),
                    max_seq_len=s.max_seq_len, prefill_chunk=s.prefill_chunk)

    # The engine's thread loads the model too (engine.engine explains why).
    thread = EngineThread(load_llm)
    thread.start()
    llm = thread.wait()
    report = {"settings": asdict(s), "source": llm.source, "weights": llm.weights_summary,
              "compiled": llm.compiled, "loads": []}

    async def main():
        await measure_load(llm, 1, s, seed=99)  # warm-up
        for n in s.concurrency:
            rounds = [await measure_load(llm, n, s, seed=1000 * n + r) for r in range(s.rounds)]
            best = max(rounds, key=lambda r: r["tokens_per_s"])
            report["loads"].append({"concurrency": n, **best})
            print(f"N={n}: {json.dumps(best)}", file=sys.stderr)
        if s.long_prompt:
            report["interference"] = await measure_interference(llm, s)
            print(f"interference: {json.dumps(report['interference'])}", file=sys.stderr)

    asyncio.run(main())
    llm.engine.close()
    one = next((r["tokens_per_s"] for r in report["loads"] if r["concurrency"] == 1), None)
    for r in report["loads"]:
        r["vs_one"] = round(r["tokens_per_s"] / one, 2) if one else None
    return report


def main(argv: list[str]) -> int:
    usage = "usage: fastdecode bench-engine [--config FILE] [key=value ...]\n\n" + (__doc__ or "") + "\nkeys:\n"
    return run_command(argv, EngineBenchSettings, usage, lambda s: _bench(s, argv))


def _bench(s: EngineBenchSettings, argv: list[str]) -> int:
    report = run(s)
    report["command"] = shlex.join(["fastdecode", "bench-engine", *argv])
    report["machine"] = machine_info(s.device)
    write_json(s.out, report)
    print("N  tokens/s  vs N=1  ttft p50/p99 s  itl p50/p99 ms")
    for r in report["loads"]:
        vs_one = "-" if r["vs_one"] is None else r["vs_one"]  # no N=1 run to compare with
        print(f"{r['concurrency']:<3}{r['tokens_per_s']:>9}  {vs_one:>6}  {r['ttft_p50_s']:>6}/{r['ttft_p99_s']:<7}"
              f"{r['itl_p50_ms']:>7}/{r['itl_p99_ms']}")
    if "interference" in report:
        print("interference:", json.dumps(report["interference"]))
    print(f"results: {s.out}")
    return 0
