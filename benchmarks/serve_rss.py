"""Server memory over many requests: RSS after the 100th and the 1,000th request.

    fastdecode serve port=8766 max_batch_size=16 &
    python benchmarks/serve_rss.py --url http://127.0.0.1:8766 --pid $! --json rss.json

Drives --requests short requests (default 1,000) from --concurrency clients (default 8)
against a running OpenAI-compatible server, cycling through /v1/completions and
/v1/chat/completions, streamed and not, with short prompts and small max_tokens. The
server's resident set (VmRSS in /proc/PID/status, the server's own process) is read
before the first request and each time the count of finished requests reaches a
multiple of --every; the growth reported is from the --base-th finished request (100)
to the last. A run passes when the growth is under --target percent (5) and no request
failed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import time

import httpx

WORDS = ("a small red boat drifts past the harbour lights as gulls circle over fishing nets "
         "and the evening tide turns slowly toward the sea wall").split()


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for pid {pid}")


def body_for(i: int, rng: random.Random, model: str, max_tokens: int) -> tuple[str, dict]:
    text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 24)))
    stream = i % 2 == 0
    body: dict = {"model": model, "max_tokens": max_tokens, "temperature": 0 if i % 3 else 0.8,
                  "seed": i, "stream": stream}
    if stream:
        body["stream_options"] = {"include_usage": True}
    if (i // 2) % 2 == 0:
        return "/v1/completions", {**body, "prompt": text}
    return "/v1/chat/completions", {**body, "messages": [{"role": "user", "content": text}]}


async def send(client: httpx.AsyncClient, path: str, body: dict) -> str:
    """One request; returns '' on success, else what went wrong."""
    try:
        if not body["stream"]:
            resp = await client.post(path, json=body)
            if resp.status_code != 200:
                return f"HTTP {resp.status_code}: {resp.text[:200]}"
            data = resp.json()
            if not data.get("choices") or not data["choices"][0].get("finish_reason"):
                return "no finish_reason"
            return ""
        finished = usage = False
        async with client.stream("POST", path, json=body) as resp:
            if resp.status_code != 200:
                return f"HTTP {resp.status_code}: {(await resp.aread())[:200]!r}"
            async for line in resp.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                usage = usage or bool(chunk.get("usage"))
                finished = finished or any(c.get("finish_reason") for c in chunk.get("choices", []))
        return "" if finished and usage else ("no finish_reason" if not finished else "no usage chunk")
    except (httpx.HTTPError, ValueError) as e:
        return f"{type(e).__name__}: {e}"


async def drive(args: argparse.Namespace, model: str) -> dict:
    rng = random.Random(0)
    jobs = [body_for(i, rng, model, args.max_tokens) for i in range(args.requests)]
    queue: asyncio.Queue = asyncio.Queue()
    for job in jobs:
        queue.put_nowait(job)
    samples = [{"requests": 0, "rss_kib": rss_kib(args.pid), "t_s": 0.0}]
    errors: list[str] = []
    done = 0
    t0 = time.perf_counter()
    limits = httpx.Limits(max_connections=args.concurrency + 2, max_keepalive_connections=args.concurrency + 2)
    async with httpx.AsyncClient(base_url=args.url, timeout=300, limits=limits, headers=args.headers) as client:
        async def worker() -> None:
            nonlocal done
            while not queue.empty():
                path, body = queue.get_nowait()
                err = await send(client, path, body)
                if err:
                    errors.append(err)
                done += 1
                if done % args.every == 0 or done == args.requests:
                    samples.append({"requests": done, "rss_kib": rss_kib(args.pid),
                                    "t_s": time.perf_counter() - t0})
                    print(f"{done:>6} requests  RSS {samples[-1]['rss_kib'] / 1024:8.1f} MiB  "
                          f"errors {len(errors)}", flush=True)

        await asyncio.gather(*(worker() for _ in range(args.concurrency)))
    base = next(s for s in samples if s["requests"] >= args.base)
    last = samples[-1]
    growth = 100.0 * (last["rss_kib"] - base["rss_kib"]) / base["rss_kib"]
    return {"requests": args.requests, "errors": len(errors), "first_error": errors[0] if errors else "",
            "wall_s": time.perf_counter() - t0, "base_request": base["requests"], "base_rss_kib": base["rss_kib"],
            "last_request": last["requests"], "last_rss_kib": last["rss_kib"], "growth_pct": growth,
            "target_pct": args.target, "passed": growth < args.target and not errors, "samples": samples}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", default="http://127.0.0.1:8000")
    p.add_argument("--pid", type=int, required=True, help="the server's process id (its RSS is read)")
    p.add_argument("--model", default=None, help="model id to send; default: the first of /v1/models")
    p.add_argument("--requests", type=int, default=1000)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--every", type=int, default=100, help="read the RSS every this many finished requests")
    p.add_argument("--base", type=int, default=100, help="growth is measured from this request on")
    p.add_argument("--target", type=float, default=5.0, help="largest growth in percent that passes")
    p.add_argument("--api-key", default=None)
    p.add_argument("--json", default=None, help="write the figures to this file")
    args = p.parse_args()
    if args.base > args.requests:
        p.error("--base must not exceed --requests")
    args.headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    model = args.model or httpx.get(args.url + "/v1/models", headers=args.headers).json()["data"][0]["id"]
    load0 = os.getloadavg()
    out = asyncio.run(drive(args, model))
    print(f"RSS {out['base_rss_kib'] / 1024:.1f} MiB after request {out['base_request']}, "
          f"{out['last_rss_kib'] / 1024:.1f} MiB after request {out['last_request']}: "
          f"{out['growth_pct']:+.2f}% (target < {args.target}%), errors {out['errors']} "
          f"{out['first_error']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"url": args.url, "model": model, "pid": args.pid,
                       "date": time.strftime("%Y-%m-%d %H:%M:%S %z"), "loadavg_before": load0,
                       "args": {k: v for k, v in vars(args).items() if k not in ("headers", "api_key")},
                       **out}, f, indent=2)
    sys.exit(0 if out["passed"] else 1)


if __name__ == "__main__":
    main()
