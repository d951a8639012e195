"""Starting and stopping `fastdecode serve`: bad settings, a port in use, the open-host
warning, and SIGTERM draining while streams are open."""

import asyncio
import os
import socket
import subprocess
import sys
import time

import httpx
from serve_process import NO_EOS, ROOT, ServeProcess, error_of


def serve_exits(*keys, timeout=60):
    p = subprocess.run([sys.executable, "-m", "fastdecode", "serve", *keys], capture_output=True, timeout=timeout,
                       cwd=ROOT, env={**os.environ, "FASTDECODE_NO_PACKAGE": "1"})
    return p.returncode, p.stderr.decode()


def test_port_in_use_and_bad_keys_exit_2_with_one_line():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        rc, err = serve_exits("model=tiny", f"port={port}")
    assert rc == 2 and err.count("\n") == 1 and f"port {port} on 127.0.0.1 is already in use" in err
    rc, err = serve_exits("model=tiny", "port=0", "temprature=1")
    assert rc == 2 and err.count("\n") == 1 and "unknown key 'temprature'" in err


def test_a_model_that_fails_to_load_exits_2(tmp_path):
    """A model that does not exist, or a load setting out of range, fails before the server listens:
    one line (it printed "listening on ..." first, then loaded in the background and failed)."""
    rc, err = serve_exits("model=no-such-model", "port=0")
    assert rc == 2 and err.count("\n") == 1
    assert err.startswith("fastdecode: error: model 'no-such-model' is not a preset")
    rc, err = serve_exits("model=tiny", "port=0", "prefill_chunk=0")
    assert rc == 2 and err.count("\n") == 1 and "prefill_chunk=0 is out of range" in err
    (tmp_path / "bad.gguf").write_bytes(b"GGUF")  # exists: it fails as it loads, after listening
    rc, err = serve_exits(f"model={tmp_path / 'bad.gguf'}", "port=0")
    assert rc == 2 and "bad.gguf" in err.splitlines()[-1]


def test_sigterm_drains_open_streams(tmp_path):
    # One slot. A short stream runs first; 40 long ones queue behind it (~19,000 tokens: more than
    # the grace period allows at any speed), so the late ones end with finish_reason "abort".
    server = ServeProcess(tmp_path / "server.log", "host=0.0.0.0", "max_batch_size=1", "shutdown_grace_s=3")
    try:
        server.wait_ready()
        assert "warning: host=0.0.0.0 without api_key" in server.log()
        results, refused = asyncio.run(_drain(server))
        assert server.proc.wait(30) == 0
    finally:
        server.stop()
    first, *queued = results
    assert first == ["length"]  # in flight at SIGTERM, done within the grace period
    assert all(len(r) == 1 and r[0] in ("length", "abort") for r in queued)  # each ended once, then [DONE]
    assert [r[0] for r in queued].count("abort") >= 20
    assert refused.status_code == 503 and error_of(refused)["code"] == "shutting_down"
    assert "shutting down" in server.log()


async def _drain(server):
    async def stream(c, max_tokens, chunks_seen):
        s = await c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}],
                                            max_tokens=max_tokens, stream=True, logit_bias=NO_EOS)
        reasons = []
        async for chunk in s:
            chunks_seen.put_nowait(chunk)
            reasons += [x.finish_reason for x in chunk.choices if x.finish_reason]
        return reasons

    async with server.openai(asynchronous=True) as c:
        seen = asyncio.Queue()
        first = asyncio.ensure_future(stream(c, 24, seen))
        for _ in range(2):  # the role chunk, then a token: it holds the slot
            await asyncio.wait_for(seen.get(), 60)
        queued_seen = asyncio.Queue()
        queued = [asyncio.ensure_future(stream(c, 480, queued_seen)) for _ in range(40)]
        for _ in queued:  # each one's role chunk: it has reached the engine
            await asyncio.wait_for(queued_seen.get(), 60)
        server.signal()
        t0 = time.monotonic()
        async with httpx.AsyncClient(base_url=server.url) as h:
            refused = await h.post("/v1/chat/completions",
                                   json={"messages": [{"role": "user", "content": "late"}], "max_tokens": 2})
            health = await h.get("/health")
        assert time.monotonic() - t0 < 3 and health.status_code == 503
        results = await asyncio.wait_for(asyncio.gather(first, *queued), 60)
    return results, refused
