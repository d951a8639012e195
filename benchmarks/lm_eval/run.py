"""lm-evaluation-harness against `fastdecode serve`, end to end, on local tasks.

    pip install "lm-eval[api]"   # into the same venv (torch stays as it is)
    python benchmarks/lm_eval/run.py [--model NAME_OR_PATH] [--out benchmarks/lm_eval/results.json]

Starts the server, runs lm-eval's `local-completions` model (token-id requests, the
server's own tokenizer) on two tasks written here with local data files
(tasks/fd_mc.yaml: multiple choice by loglikelihood; tasks/fd_gen.yaml: generate_until),
then scores every multiple-choice continuation again through fastdecode's Python API
(`prompt_logprobs`) on the same token ids and reports the largest difference. Also
times loglikelihood requests of 8 prompts x ~100 tokens against the model's prefill rate.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

HERE = Path(__file__).resolve().parent
TASKS = HERE / "tasks"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(model: str, port: int, log: Path) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-m", "fastdecode", "serve", f"model={model}", f"port={port}",
                             "served_model_name=m", "log_level=warning"], stdout=open(log, "w"),
                            stderr=subprocess.STDOUT)
    deadline = time.time() + 300
    while time.time() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return proc
        except httpx.TransportError:
            pass
        if proc.poll() is not None:
            raise RuntimeError(f"server exited; see {log}")
        time.sleep(0.3)
    raise RuntimeError(f"server not ready; see {log}")


def run_lm_eval(port: int, out: Path) -> dict:
    env = {**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "OPENAI_API_KEY": "unused"}
    args = ("model=m,base_url=http://127.0.0.1:%d/v1/completions,tokenized_requests=True,"
            "tokenizer_backend=remote,num_concurrent=1,max_retries=1" % port)
    cmd = [sys.executable, "-m", "lm_eval", "--model", "local-completions", "--model_args", args,
           "--include_path", str(TASKS), "--tasks", "fd_mc,fd_gen", "--batch_size", "8",
           "--output_path", str(out), "--log_samples"]
    t0 = time.perf_counter()
    p = subprocess.run(cmd, cwd=TASKS, env=env, capture_output=True, text=True, timeout=1800)
    took = time.perf_counter() - t0
    if p.returncode != 0:
        raise RuntimeError(f"lm_eval failed ({p.returncode}):\n{p.stderr[-3000:]}")
    results = next(out.rglob("results_*.json"))
    samples = {t: next(out.rglob(f"samples_{t}_*.jsonl")) for t in ("fd_mc", "fd_gen")}
    return {"command": " ".join(cmd), "seconds": took, "results": json.loads(results.read_text())["results"],
            "samples": {t: [json.loads(line) for line in p.read_text().splitlines()] for t, p in samples.items()}}


def agreement(model: str, samples: list[dict]) -> dict:
    """Each choice's loglikelihood from lm-eval against our API's prompt_logprobs on the same ids
    (tokenized as lm-eval's local-completions does: context, then the rest of context+continuation)."""
    import fastdecode

    llm = fastdecode.load(model)
    worst, n = 0.0, 0
    for s in samples:
        pairs = [(a["arg_0"], a["arg_1"]) for a in s["arguments"].values()]
        for (ctx, cont), resp in zip(pairs, s["resps"]):
            whole = llm.tokenizer.encode(ctx + cont, add_special_tokens=False)
            ctx_ids = llm.tokenizer.encode(ctx, add_special_tokens=False)
            ids = ctx_ids + whole[len(ctx_ids):]
            lps = llm.generate([ids], max_new_tokens=1, temperature=0, prompt_logprobs=0)[0].prompt_logprobs
            ours = sum(e.logprob for e in lps[len(ctx_ids):])
            theirs = float(resp[0][0])
            worst = max(worst, abs(ours - theirs))
            n += 1
    return {"choices_compared": n, "max_abs_diff_nats": worst}


def loglikelihood_speed(port: int, model: str) -> dict:
    """Batches of 8 prompts x 100 tokens as lm-eval sends them, against bench's prefill rate."""
    import random

    import fastdecode

    llm = fastdecode.load(model, max_batch_size=8)
    rng = random.Random(0)
    V = llm.args.vocab_size
    batches = [[[rng.randrange(100, V) for _ in range(100)] for _ in range(8)] for _ in range(3)]
    t0 = time.perf_counter()
    for b in batches:
        r = httpx.post(f"http://127.0.0.1:{port}/v1/completions", timeout=600, json={
            "model": "m", "prompt": b, "echo": True, "logprobs": 1, "max_tokens": 1, "temperature": 0, "seed": 1234})
        r.raise_for_status()
    served = 3 * 8 * 100 / (time.perf_counter() - t0)
    t0 = time.perf_counter()
    for b in batches:
        llm.generate(b, max_new_tokens=1, temperature=0)
    api = 3 * 8 * 100 / (time.perf_counter() - t0)
    return {"server_loglikelihood_tokens_per_s": served, "api_prefill_tokens_per_s": api, "ratio": served / api}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--out", default=str(HERE / "results.json"))
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="fd-lmeval-"))
    port = free_port()
    report = {"model": a.model, "load_before": os.getloadavg()}
    server = start_server(a.model, port, tmp / "serve.log")
    try:
        ev = run_lm_eval(port, tmp / "out")
        report["lm_eval"] = {"command": ev["command"], "seconds": ev["seconds"], "results": ev["results"]}
        report["agreement"] = agreement(a.model, ev["samples"]["fd_mc"])
        report["speed"] = loglikelihood_speed(port, a.model)
    finally:
        server.terminate()
        server.wait(30)
    report["load_after"] = os.getloadavg()
    Path(a.out).write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
