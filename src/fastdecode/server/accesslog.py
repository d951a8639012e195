"""One log line and one metrics count per HTTP request, once its response has ended.

A pure ASGI middleware, so a streamed response is logged when its last
event is sent, not when its headers are. Generation handlers add their
fields (id, tokens, time to first token, finish reasons) to
scope["fastdecode"].
"""

from __future__ import annotations

import logging
import time
from typing import Any

from .state import ServerState

log = logging.getLogger("fastdecode.server")
_QUIET = ("/health", "/metrics")  # polled by monitors: logged at debug level only


class AccessLog:
    def __init__(self, app: Any, state: ServerState):
        self.app, self.state = app, state

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        t0 = time.perf_counter()
        fields = scope.setdefault("fastdecode", {})
        status = [500]

        async def send_status(message: dict) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        self.state.active += 1
        try:
            await self.app(scope, receive, send_status)
        finally:
            self.state.active -= 1
            code = fields.get("status", status[0])
            route = getattr(scope.get("route"), "path", None) or "other"
            self.state.metrics.requests.labels(route, str(code)).inc()
            level = logging.DEBUG if scope["path"] in _QUIET else logging.INFO
            if log.isEnabledFor(level):
                log.log(level, "%s", _line(scope, code, time.perf_counter() - t0, fields))


def _line(scope: dict, status: int, seconds: float, f: dict) -> str:
    parts = [f.get("id", "-"), f"{scope['method']} {scope['path']}", f"status={status}"]
    if "prompt_tokens" in f:
        parts.append(f"prompt_tokens={f['prompt_tokens']} completion_tokens={f.get('completion_tokens', 0)}")
    if "ttft_s" in f:
        parts.append(f"ttft={f['ttft_s'] * 1e3:.0f}ms")
    parts.append(f"total={seconds * 1e3:.0f}ms")
    if f.get("finish"):
        parts.append(f"finish={f['finish']}")
    if f.get("error"):
        parts.append(f"error={' '.join(f['error'].split())[:200]!r}")
    return " ".join(parts)
