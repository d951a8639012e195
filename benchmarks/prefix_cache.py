"""Prefix caching against no prefix caching, and against llama-server, in one run.

    python benchmarks/prefix_cache.py [--model PATH] [--llama-server PATH] [--out benchmarks/prefix_cache.json]
        [--parts 1,2,3,4] [--repeats 1]

1. Multi-turn chat through the Python API: a ~1,500-token document as the system
   message, 6 user turns, 32 greedy tokens each; time to first token per turn with
   prefix_cache on and off, and the cold time of a prompt of just each turn's new tokens;
   --repeats R times R hits a turn (R - 1 with other questions) and reports their median.
2. Shared system prompt through the server: 16 chat requests with one ~1,000-token system
   prompt and different questions, 4 concurrent clients, 16 tokens each; wall time, on/off.
3. No hits: 8 concurrent requests with unique random prompts, 64 tokens each; aggregate
   decode tokens/s, on/off, interleaved rounds.
4. The same multi-turn chat as streamed /v1/chat/completions against `fastdecode serve`
   and llama-server (-np 4, cache_prompt on by default) on the same GGUF: TTFT per turn.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

import fastdecode
from fastdecode.checkpoints import resolve_checkpoint_name

DOC = (Path(fastdecode.__file__).parent / "data" / "perplexity.txt").read_text(encoding="utf-8")
QUESTIONS = ["Who is the story about?", "What did she see first?", "Where did the rabbit go?",
             "What was written on the jar?", "How did she feel while falling?", "Summarize it in one line."]


def doc_tokens(llm, n: int) -> str:
    ids = llm.tokenizer.encode(DOC, add_special_tokens=False)[:n]
    return llm.tokenizer.decode(ids)


def ttft(llm, messages, n=32) -> tuple[float, list[int], int, int]:
    prompt = llm.chat_prompt(messages)
    t0 = time.perf_counter()
    run = llm.start([prompt], *fastdecode.api.llm.split_options(dict(max_new_tokens=n, temperature=0)))
    it = iter(run)
    next(it)
    first = time.perf_counter() - t0
    for _ in it:
        pass
    c = run.completions[0]
    return first, c.token_ids, c.cached_tokens, len(prompt)


def cold_new(off, ids) -> float:
    t0 = time.perf_counter()
    off.generate([ids], max_new_tokens=1, temperature=0)
    return time.perf_counter() - t0


def multi_turn(model: str, repeats: int = 1) -> dict:
    """Per turn after the first, `repeats` hits over the same history: repeats - 1 probes
    that ask another question, then the turn's own, each timed beside a cold prompt of its
    own new tokens (a single hit of 20-50 ms moved by half between runs)."""
    on = fastdecode.load(model, max_batch_size=4, max_seq_len=4096)
    off = fastdecode.load(model, max_batch_size=4, max_seq_len=4096, prefix_cache=False)
    doc = doc_tokens(on, 1500)
    rows = []
    hist_on = [{"role": "system", "content": doc}]
    for i, q in enumerate(QUESTIONS):
        ratios = []
        for r in range(1, repeats if i else 1):  # turn 1 stays a cold prompt
            probe = hist_on + [{"role": "user", "content": f"{QUESTIONS[(i + r) % len(QUESTIONS)]} ({r})"}]
            t_hit, _, cached, _ = ttft(on, probe, n=1)
            ratios.append(t_hit / cold_new(off, on.chat_prompt(probe)[cached:]))
        hist_on.append({"role": "user", "content": q})
        t_on, ids, cached, n_prompt = ttft(on, hist_on)
        t_off, ids_off, _, _ = ttft(off, hist_on)
        t_new = cold_new(off, on.chat_prompt(hist_on)[cached:])
        ratios.append(t_on / t_new)
        rows.append({"prompt_tokens": n_prompt, "cached_tokens": cached, "ttft_on_s": t_on, "ttft_off_s": t_off,
                     "speedup": t_off / t_on, "cold_new_tokens_s": t_new, "on_over_cold_new": t_on / t_new,
                     "on_over_cold_new_median": statistics.median(ratios), "on_over_cold_new_all": ratios,
                     "same_tokens": ids == ids_off})
        hist_on.append({"role": "assistant", "content": on.tokenizer.decode(ids)})
        print(json.dumps(rows[-1]), file=sys.stderr)
    return {"repeats": repeats, "turns": rows}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, cmd: list[str], port: int, log: Path):
        self.url = f"http://127.0.0.1:{port}"
        self.log = open(log, "w")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + 300
        while time.time() < deadline:
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if self.proc.poll() is not None:
                break
            time.sleep(0.3)
        raise RuntimeError(f"server {cmd[0]} did not start; see {log}")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


def fastdecode_server(model: str, tmp: Path, *keys: str) -> Server:
    port = free_port()
    return Server([sys.executable, "-m", "fastdecode", "serve", f"model={model}", f"port={port}",
                   "max_batch_size=4", "max_seq_len=4096", "log_level=warning", *keys], port,
                  tmp / f"fd-{port}.log")


def served_model(url: str) -> str:
    return httpx.get(url + "/v1/models", timeout=30).json()["data"][0]["id"]


def chat_stream(url: str, messages, n: int) -> tuple[float, str, float]:
    model = served_model(url)  # before the clock starts
    t0 = time.perf_counter()
    first, text = None, ""
    with httpx.stream("POST", url + "/v1/chat/completions", timeout=600, json={
            "model": model, "messages": messages, "max_tokens": n, "temperature": 0, "stream": True}) as r:
        if r.status_code != 200:
            raise RuntimeError(f"{url}: HTTP {r.status_code}: {r.read().decode()[:300]}")
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            delta = json.loads(line[6:])["choices"]
            if delta and delta[0]["delta"].get("content"):
                first = first or time.perf_counter() - t0
                text += delta[0]["delta"]["content"]
    return first or float("nan"), text, time.perf_counter() - t0


def shared_prompt(model: str, tmp: Path, doc: str) -> dict:
    out = {}
    for flag in ("true", "false"):
        s = fastdecode_server(model, tmp, f"prefix_cache={flag}")
        try:
            system = {"role": "system", "content": doc}
            work = [[system, {"role": "user", "content": f"Question {i}: {QUESTIONS[i % 6]}"}] for i in range(16)]
            chat_stream(s.url, work[0], 1)  # warm the system prompt in once, as a deployed server would have
            t0 = time.perf_counter()
            with cf.ThreadPoolExecutor(4) as pool:
                list(pool.map(lambda m: chat_stream(s.url, m, 16), work))
            out[f"prefix_cache_{flag}_s"] = time.perf_counter() - t0
        finally:
            s.stop()
    out["speedup"] = out["prefix_cache_false_s"] / out["prefix_cache_true_s"]
    return out


def no_hits(model: str) -> dict:
    on = fastdecode.load(model, max_batch_size=8, max_seq_len=1024)
    off = fastdecode.load(model, max_batch_size=8, max_seq_len=1024, prefix_cache=False)
    rng = random.Random(0)
    rates = {"on": [], "off": []}
    for rnd in range(6):
        for name, llm in (("on", on), ("off", off)) if rnd % 2 == 0 else (("off", off), ("on", on)):
            prompts = [[rng.randrange(100, 40000) for _ in range(64)] for _ in range(8)]
            outs = llm.generate(prompts, max_new_tokens=64, temperature=0, ignore_eos=True)
            rates[name].append(sum(c.decode_tokens_per_s for c in outs))
    best = {k: max(v) for k, v in rates.items()}
    return {"aggregate_decode_tokens_per_s": rates, "ratio_on_over_off_best": best["on"] / best["off"]}


def servers_multi_turn(model: str, tmp: Path, doc: str, llama_server: str | None) -> dict:
    out = {}
    contenders = [("fastdecode", lambda: fastdecode_server(model, tmp))]
    if llama_server:
        port = free_port()
        contenders.append(("llama-server", lambda: Server(
            [llama_server, "-m", model, "--port", str(port), "-np", "4", "-c", str(4 * 4096), "-t", "2",
             "--no-webui"], port, tmp / "llama-server.log")))
    for name, start in contenders:
        s = start()
        try:
            hist = [{"role": "system", "content": doc}]
            turns = []
            for q in QUESTIONS:
                hist.append({"role": "user", "content": q})
                first, text, total = chat_stream(s.url, hist, 32)
                turns.append({"ttft_s": first, "total_s": total})
                hist.append({"role": "assistant", "content": text})
            out[name] = turns
        finally:
            s.stop()
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=str(resolve_checkpoint_name("smollm2-135m-instruct")))
    ap.add_argument("--llama-server", default=os.environ.get("LLAMA_SERVER"))
    ap.add_argument("--out", default=str(Path(__file__).parent / "prefix_cache.json"))
    ap.add_argument("--parts", default="1,2,3,4")
    ap.add_argument("--repeats", type=int, default=1,
                    help="part 1: hits timed per turn (repeats - 1 probes with other questions, then the turn's "
                         "own); the median ratio is reported beside the turn's own")
    a = ap.parse_args()
    if a.repeats < 1:
        ap.error(f"--repeats {a.repeats}: accepted: 1 or more")
    parts = set(a.parts.split(","))
    tmp = Path(tempfile.mkdtemp(prefix="fd-prefix-"))
    report = {"model": a.model, "load_before": os.getloadavg()}
    doc1000 = doc_tokens(fastdecode.load(a.model, max_batch_size=1, max_seq_len=256), 1000)
    if "1" in parts:
        report["multi_turn_api"] = multi_turn(a.model, a.repeats)
    if "2" in parts:
        report["shared_system_prompt_server"] = shared_prompt(a.model, tmp, doc1000)
    if "3" in parts:
        report["no_hits"] = no_hits(a.model)
    if "4" in parts:
        doc1500 = doc_tokens(fastdecode.load(a.model, max_batch_size=1, max_seq_len=256), 1500)
        report["multi_turn_servers"] = servers_multi_turn(a.model, tmp, doc1500, a.llama_server)
    report["load_after"] = os.getloadavg()
    Path(a.out).write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
