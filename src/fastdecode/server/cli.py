"""`fastdecode serve [--config FILE] [key=value ...]`: settings, the socket, and the lifecycle.

The socket is bound before the model loads, so a port in use fails at once,
and /health answers 503 while the model loads in a background thread.
SIGTERM (or Ctrl-C) drains: new requests get 503, running ones get
`shutdown_grace_s` to finish, the rest end with finish_reason "abort",
then the process exits 0. A second signal exits at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import signal
import socket
import sys
import time
from typing import Any, Optional

from ..config import DEFAULT_MODEL
from ..errors import FastDecodeError
from ..cli.command import run_command
from .settings import ServeSettings, is_loopback

log = logging.getLogger("fastdecode.server")

USAGE = """usage: fastdecode serve [--config FILE] [key=value ...]

Serve the model over HTTP with OpenAI's API: POST /v1/completions and
/v1/chat/completions (streamed or not), GET /v1/models, /health, /metrics,
and a chat page for a browser at GET / (ui=false turns it off).
Settings come from --config FILE, then key=value arguments, which win.

keys (defaults shown):
"""


def main(argv: list[str]) -> int:
    """Run by `fastdecode serve`."""
    return run_command(argv, ServeSettings, USAGE, _serve)


def _serve(s: ServeSettings) -> int:
    if s.tp != 1:
        from ..parallel.launch import join_torchrun

        if join_torchrun(s.tp, s.device, "serve") != 0:
            _setup_logging(s.log_level)
            return _follow(s)  # ranks other than 0 run rank 0's steps; only rank 0 listens
    _setup_logging(s.log_level)
    if not is_loopback(s.host) and s.api_key is None:
        print(f"fastdecode: warning: host={s.host} without api_key: anyone who can reach this machine can use "
              "the server; set api_key=... or $FASTDECODE_API_KEY", file=sys.stderr)
    # The model loads after the server listens (/health answers 503 meanwhile): check the settings and
    # that the model exists first, so that a typo fails in one line and never reaches "listening".
    from ..api.build import check_model_name
    from ..config import LoadOptions

    check_model_name(LoadOptions.from_settings(s).model)
    sock = bind_socket(s.host, s.port)
    import uvicorn  # after the checks above: bad settings fail fast

    from .app import create_app
    from .state import ServerState

    state = ServerState(s)
    server: Optional[_Server] = None

    @contextlib.asynccontextmanager
    async def lifespan(app: Any):
        from ..engine import EngineThread

        server.loop = asyncio.get_running_loop()
        # The model loads in the engine's thread (the event loop keeps answering /health
        # with 503 meanwhile), and that thread then runs the engine's loop.
        EngineThread(lambda: _load_model(s), on_loaded=_on_loaded(state, server, time.perf_counter())).start()
        yield
        if state.llm is not None:
            await asyncio.to_thread(state.llm.engine.close)

    app = create_app(state, lifespan=lifespan)
    # uvicorn's own logging is kept to warnings: the request lines come from AccessLog.
    cfg = uvicorn.Config(app, log_level="debug" if s.log_level == "debug" else "warning", access_log=False,
                         timeout_graceful_shutdown=5, lifespan="on")
    server = _Server(cfg, state)
    host, port = sock.getsockname()[:2]
    base = f"http://{_url_host(host)}:{port}"
    page = f"; chat page: {base}/" if s.ui else ""
    print(f"fastdecode: listening on {base}/v1 (loading {s.model or DEFAULT_MODEL}){page}", file=sys.stderr)
    server.run(sockets=[sock])
    if state.load_error is not None:
        raise state.load_error
    return 0


def bind_socket(host: str, port: int) -> socket.socket:
    """A listening socket, or a one-line error (port in use, unknown host)."""
    try:
        family, kind, proto, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                          flags=socket.AI_PASSIVE)[0]
    except socket.gaierror as e:
        raise FastDecodeError(f"host={host!r} cannot be resolved: {e.strerror}") from None
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a restart need not wait out TIME_WAIT
    try:
        sock.bind(addr)
        sock.listen(2048)
    except OSError as e:
        sock.close()
        if e.errno == errno.EADDRINUSE:
            raise FastDecodeError(f"port {port} on {host} is already in use; stop the other server or pick "
                                  "another with port=N") from None
        raise FastDecodeError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    return sock


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def _setup_logging(level: str) -> None:
    logger = logging.getLogger("fastdecode")
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("fastdecode: %(message)s"))
        logger.addHandler(handler)
    logger.setLevel(level.upper())


def _on_loaded(state: Any, server: Any, t0: float):
    """What the engine's thread does once loading has ended: publish the LLM, or stop
    the server (main() raises the error once it has stopped)."""
    def done(llm: Any, error: Optional[BaseException]) -> None:
        if error is not None:
            state.load_error = error
            server.loop.call_soon_threadsafe(server.stop_now)
            return
        state.llm = llm
        log.info("ready: %s (%s), %d slots x %d positions, loaded in %.1f s", state.settings.served_model_name,
                 llm.source, llm.max_batch_size, llm.max_seq_len, time.perf_counter() - t0)
    return done


def _load_model(s: Any, warm_up: bool = True) -> Any:
    from ..api.build import build
    from ..config import LoadOptions

    sync = None
    if s.tp != 1:
        import torch.distributed as dist

        from ..parallel.lockstep import StepSync

        sync = StepSync(dist.group.WORLD)
    llm = build(LoadOptions.from_settings(s), sync=sync)
    if warm_up:
        # One token now, so compiling and kernel warm-up happen before /health says ok
        # (in lockstep the other ranks run it as rank 0's step).
        llm.generate([[0]], max_new_tokens=1, temperature=0)
    return llm


def _follow(s: Any) -> int:
    """A tensor-parallel rank other than 0: load the same shard set-up, then run
    rank 0's engine steps (its warm-up first) until it stops. torchrun passes a
    SIGTERM to every rank; this one leaves when rank 0, draining, tells it to (or is gone)."""
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, signal.SIG_IGN)
    llm = _load_model(s, warm_up=False)
    llm.engine.follow()
    return 0


class _Server:
    """uvicorn's Server with a draining shutdown on SIGTERM/SIGINT."""

    def __init__(self, config: Any, state: Any):
        import uvicorn

        outer = self

        class Server(uvicorn.Server):
            def handle_exit(self, sig: int, frame: Any) -> None:
                outer.signal(sig)

        self.server = Server(config)
        self.state = state
        self._drain: Optional[asyncio.Future] = None
        self.loop: Optional[asyncio.AbstractEventLoop] = None  # set by the lifespan, once running

    def run(self, sockets: list[socket.socket]) -> None:
        self.server.run(sockets=sockets)

    def stop_now(self) -> None:
        self.server.should_exit = True

    def signal(self, sig: int) -> None:
        # A signal handler: it may interrupt the loop's select(), so hand over through the self-pipe.
        self.loop.call_soon_threadsafe(self._on_signal)

    def _on_signal(self) -> None:
        if self._drain is not None or self.state.llm is None:  # a second signal, or nothing to drain
            self.server.force_exit = self._drain is not None
            self.stop_now()
            return
        self._drain = asyncio.ensure_future(self._draining())

    async def _draining(self) -> None:
        state = self.state
        state.draining = True
        grace = state.settings.shutdown_grace_s
        log.info("shutting down: no new requests; up to %.0f s for the %d running", grace, state.active)
        deadline = time.monotonic() + grace
        while state.active and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        if state.active:
            log.info("ending %d requests with finish_reason abort", state.active)
        await asyncio.to_thread(state.llm.engine.close)  # aborts what is left; their streams end normally
        deadline = time.monotonic() + 5
        while state.active and time.monotonic() < deadline:  # let them send their last events
            await asyncio.sleep(0.05)
        self.stop_now()
