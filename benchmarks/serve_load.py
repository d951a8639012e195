"""Client load on an OpenAI-compatible server: N concurrent streaming clients.

    python benchmarks/serve_load.py --url http://127.0.0.1:8000 --clients 1 4 16 64 --rounds 2

Each client sends `rounds` streamed /v1/completions requests in turn, with prompts
of mixed lengths and mixed max_tokens (greedy, or --temperature). Reports, per N: aggregate
generated tokens/s, requests/s, time to first token p50/p99, inter-token latency
p50/p99 (between content chunks, spread over the tokens they carry), and errors.
The same load runs against `fastdecode serve` or llama.cpp's `llama-server`
(which reads the same fields); --json writes the figures. A request counts as an
error when it fails, ends without a finish_reason, or sends no usage chunk; with
--ignore-eos, `short` counts the requests that generated fewer than max_tokens.
benchmarks/serve/README.md records both servers under this load (issue 12).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import time
from dataclasses import dataclass, field

import httpx

WORDS = ("the quick brown fox jumps over a lazy dog while seven wizards quietly judge boxing matches "
         "near an old river bank full of bright stones and tall green reeds").split()


@dataclass
class Result:
    ttft: float = 0.0
    gaps: list[float] = field(default_factory=list)
    tokens: int = 0
    max_tokens: int = 0
    finish_reason: str = ""
    error: str = ""


def prompt(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


async def one(client: httpx.AsyncClient, model: str, text: str, max_tokens: int, ignore_eos: bool,
              temperature: float = 0.0) -> Result:
    body = {"model": model, "prompt": text, "max_tokens": max_tokens, "temperature": temperature, "stream": True,
            "stream_options": {"include_usage": True}}
    if ignore_eos:
        body["ignore_eos"] = True
    r = Result(max_tokens=max_tokens)
    t0 = last = time.perf_counter()
    try:
        async with client.stream("POST", "/v1/completions", json=body) as resp:
            if resp.status_code != 200:
                return Result(error=f"HTTP {resp.status_code}: {(await resp.aread())[:200]!r}")
            usage = False
            async for line in resp.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    if line.startswith("event: error"):
                        r.error = "error event"
                    continue
                chunk = json.loads(line[6:])
                if chunk.get("usage"):
                    usage = True
                    r.tokens = chunk["usage"]["completion_tokens"]
                for c in chunk.get("choices", []):
                    now = time.perf_counter()
                    if c.get("text"):
                        if not r.ttft:
                            r.ttft = now - t0
                        else:
                            r.gaps.append(now - last)
                        last = now
                    r.finish_reason = r.finish_reason or (c.get("finish_reason") or "")
            if not r.finish_reason and not r.error:
                r.error = "no finish_reason"
            elif not usage and not r.error:
                r.error = "no usage chunk"
    except httpx.HTTPError as e:
        r.error = f"{type(e).__name__}: {e}"
    return r


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q / 100 * (len(values) - 1))))]


async def level(url: str, model: str, n: int, rounds: int, args: argparse.Namespace) -> dict:
    rng = random.Random(n)
    limits = httpx.Limits(max_connections=n + 4, max_keepalive_connections=0 if args.no_keepalive else n + 4)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits, headers=args.headers) as client:
        async def client_loop(i: int) -> list[Result]:
            out = []
            for _ in range(rounds):
                words = rng.randint(args.min_words, args.max_words)
                max_tokens = rng.choice(args.max_tokens)
                out.append(await one(client, model, prompt(rng, words), max_tokens, args.ignore_eos, args.temperature))
            return out

        t0 = time.perf_counter()
        results = [r for rs in await asyncio.gather(*(client_loop(i) for i in range(n))) for r in rs]
        wall = time.perf_counter() - t0
    ok = [r for r in results if not r.error]
    gaps = [g for r in ok for g in r.gaps]
    tokens = sum(r.tokens for r in ok)
    reasons: dict[str, int] = {}
    for r in ok:
        reasons[r.finish_reason] = reasons.get(r.finish_reason, 0) + 1
    return {"clients": n, "requests": len(results), "errors": len(results) - len(ok),
            "first_error": next((r.error for r in results if r.error), ""),
            "finish_reasons": reasons, "short": sum(r.tokens < r.max_tokens for r in ok),
            "completion_tokens": tokens, "wall_s": wall,
            "tokens_per_s": tokens / wall, "requests_per_s": len(ok) / wall,
            "ttft_p50_s": pct([r.ttft for r in ok], 50), "ttft_p99_s": pct([r.ttft for r in ok], 99),
            "itl_p50_ms": pct(gaps, 50) * 1e3, "itl_p99_ms": pct(gaps, 99) * 1e3,
            "itl_mean_ms": statistics.fmean(gaps) * 1e3 if gaps else float("nan")}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", default="http://127.0.0.1:8000")
    p.add_argument("--model", default=None, help="model id to send; default: the first of /v1/models")
    p.add_argument("--clients", type=int, nargs="+", default=[1, 4, 16, 64])
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--min-words", type=int, default=40, help="prompt length range, in words")
    p.add_argument("--max-words", type=int, default=200)
    p.add_argument("--max-tokens", type=int, nargs="+", default=[64])
    p.add_argument("--ignore-eos", action="store_true", help="generate exactly max_tokens (both servers accept it)")
    p.add_argument("--temperature", type=float, default=0.0,
                   help="sent with every request (default 0: greedy); the OpenAI API's own default is 1")
    p.add_argument("--no-keepalive", action="store_true",
                   help="a new connection for every request (no reuse of kept-alive ones)")
    p.add_argument("--api-key", default=None)
    p.add_argument("--json", default=None, help="write the figures to this file")
    args = p.parse_args()
    args.headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    model = args.model or httpx.get(args.url + "/v1/models", headers=args.headers).json()["data"][0]["id"]
    load0 = os.getloadavg()
    rows = []
    print(f"{'N':>4} {'tok/s':>8} {'req/s':>7} {'ttft p50':>9} {'ttft p99':>9} {'itl p50':>8} {'itl p99':>8} "
          "errors short")
    for n in args.clients:
        row = asyncio.run(level(args.url, model, n, args.rounds, args))
        rows.append(row)
        print(f"{n:>4} {row['tokens_per_s']:>8.1f} {row['requests_per_s']:>7.2f} {row['ttft_p50_s']:>8.2f}s "
              f"{row['ttft_p99_s']:>8.2f}s {row['itl_p50_ms']:>6.1f}ms {row['itl_p99_ms']:>6.1f}ms "
              f"{row['errors']} {row['short']} {row['first_error']}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"url": args.url, "model": model, "date": time.strftime("%Y-%m-%d %H:%M:%S %z"),
                       "loadavg_before": load0, "args": {k: v for k, v in vars(args).items()
                                                                  if k not in ("headers", "api_key")},
                       "results": rows}, f, indent=2)


if __name__ == "__main__":
    main()
