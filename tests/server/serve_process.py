"""`fastdecode serve` in a subprocess on the tiny model, for the server tests.

Its output goes to a file (a full pipe would block the server); each test
module shares one server, and the log is shown when a start fails.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]
EOS = 257  # the tiny model's byte tokenizer: ids 0-255 are bytes, then <bos> 256, <eos> 257
NO_EOS = {str(EOS): -100}  # generations then run to max_tokens, so their lengths are known


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServeProcess:
    def __init__(self, log_path: Path, *keys: str, env: dict | None = None, port: int | None = None):
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        self._log = open(log_path, "wb")
        full_env = {**os.environ, "FASTDECODE_NO_PACKAGE": "1", **(env or {})}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "fastdecode", "serve", "model=tiny", f"port={self.port}", *keys],
            stdout=self._log, stderr=subprocess.STDOUT, env=full_env, cwd=ROOT)

    def wait_ready(self, timeout: float = 90) -> "ServeProcess":
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log()}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"server not ready after {timeout} s:\n{self.log()}")

    def openai(self, asynchronous: bool = False, **options):
        """The official client on this server (no retries: a failure shows at once)."""
        import openai

        cls = openai.AsyncOpenAI if asynchronous else openai.OpenAI
        return cls(base_url=self.url + "/v1", **{"api_key": "unused", "max_retries": 0, **options})

    def log(self) -> str:
        if not self._log.closed:
            self._log.flush()
        return self.log_path.read_text(errors="replace")

    def signal(self, sig: int = signal.SIGTERM) -> None:
        self.proc.send_signal(sig)

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return self.proc.returncode


def serve(tmp_path_factory, *keys: str, env: dict | None = None) -> ServeProcess:
    return ServeProcess(tmp_path_factory.mktemp("serve") / "server.log", *keys, env=env).wait_ready()


def error_of(response: httpx.Response) -> dict:
    """The OpenAI error object of a 4xx/5xx answer, checked for shape."""
    body = response.json()
    assert set(body) == {"error"}, body
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"}, err
    assert isinstance(err["message"], str) and err["message"] and "\n" not in err["message"], err
    assert "Traceback" not in err["message"]
    return err
