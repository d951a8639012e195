"""`fastdecode serve tp=2` under torchrun (gloo, CPU) on the tiny model: rank 0
serves and broadcasts each step's new and cancelled requests, rank 1 follows.
Answers must equal one process's (tp=1) answers, with requests joining,
leaving and being cancelled mid-stream; SIGTERM ends both ranks."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

import fastdecode

openai = pytest.importorskip("openai")

ROOT = Path(__file__).resolve().parents[2]
PROMPTS = ["hello there", "the cat sat on the mat", "0123456789" * 3]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    port = free_port()
    log_path = tmp_path_factory.mktemp("tpserve") / "server.log"
    log = open(log_path, "wb")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "FASTDECODE_NO_PACKAGE": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                             "-m", "fastdecode", "serve", "model=tiny", "tp=2", f"port={port}",
                             "max_batch_size=3"], stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT,
                            start_new_session=True)  # its own process group: teardown kills the ranks too
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail("tp=2 server exited:\n" + log_path.read_text(errors="replace"))
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                break
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    else:
        os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail("tp=2 server not ready:\n" + log_path.read_text(errors="replace"))
    yield proc, url, log_path
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # torchrun and both ranks, whatever the tests left
    except ProcessLookupError:
        pass
    log.close()


@pytest.fixture(scope="module")
def tp1():
    return fastdecode.load("tiny", max_batch_size=3)


def complete(url: str, prompt: str, **opts) -> str:
    client = openai.OpenAI(base_url=url + "/v1", api_key="none")
    opts = dict(opts)
    extra = {"top_k": opts.pop("top_k")} if "top_k" in opts else None
    return client.completions.create(model="tiny", prompt=prompt, extra_body=extra, **opts).choices[0].text


def test_answers_equal_one_process(server, tp1):
    _, url, _ = server
    cases = [dict(max_tokens=24, temperature=0), dict(max_tokens=16, temperature=0.8, seed=5),
             dict(max_tokens=30, temperature=0), dict(max_tokens=9, temperature=1.1, top_k=20, seed=11)]
    jobs = [(p, o) for p in PROMPTS for o in cases]  # 12 requests on 3 slots: they queue, join and leave
    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(lambda j: complete(url, j[0], **j[1]), jobs))
    want = [tp1.generate([p], max_new_tokens=o["max_tokens"], temperature=o["temperature"], seed=o.get("seed"),
                         top_k=o.get("top_k"))[0].text for p, o in jobs]
    assert got == want


def test_cancelled_streams_free_their_slots(server, tp1):
    _, url, _ = server
    for _ in range(3):  # clients that leave after the first chunk
        with httpx.stream("POST", url + "/v1/completions", json={"model": "tiny", "prompt": PROMPTS[1],
                                                                  "max_tokens": 200, "stream": True,
                                                                  "logit_bias": {"257": -100}}) as r:
            next(r.iter_lines())
    deadline = time.monotonic() + 20
    while "fastdecode_slots_in_use 0.0" not in httpx.get(url + "/metrics").text:
        assert time.monotonic() < deadline, "slots still in use after the streams were cut"
        time.sleep(0.2)
    want = tp1.generate([PROMPTS[0]], max_new_tokens=20, temperature=0)[0].text
    assert complete(url, PROMPTS[0], max_tokens=20, temperature=0) == want


def test_sigterm_ends_both_ranks(server):
    proc, url, log_path = server
    proc.send_signal(signal.SIGTERM)
    proc.wait(60)
    log = log_path.read_text(errors="replace")
    assert "shutting down" in log
    # No rank is left behind (torchrun's children).
    ps = subprocess.run(["ps", "-eo", "ppid="], capture_output=True, text=True).stdout.split()
    assert str(proc.pid) not in ps
