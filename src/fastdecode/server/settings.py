"""The keys of `fastdecode serve`: generate's model keys plus the server's own."""

from __future__ import annotations

import dataclasses
import ipaddress
import os
from dataclasses import field
from typing import Any, Optional

from ..cli.keys import copy_fields
from ..config import DEFAULT_MODEL, LoadOptions
from ..errors import FastDecodeError

API_KEY_ENV = "FASTDECODE_API_KEY"
LOG_LEVELS = ("debug", "info", "warning", "error")
REASONING = ("auto", "none")

# load()'s keys (LoadOptions holds their defaults and help); prompts and sampling are per request here.
LOAD_KEYS = ("model", "device", "dtype", "compile", "compiled", "max_seq_len", "cache", "kv_dtype", "weights",
             "prefix_cache", "tp", "max_batch_size", "prefill_chunk", "speculative")


def _help(text: str) -> dict[str, str]:
    return {"help": text}


@dataclasses.dataclass
class _ServerKeys:
    host: str = field(default="127.0.0.1", metadata=_help(
        "address to listen on; 0.0.0.0 opens the server to the network (set api_key then)."))
    port: int = field(default=8000, metadata=_help("TCP port to listen on (0 picks a free one)."))
    api_key: Optional[str] = field(default=None, metadata=_help(
        "when set, /v1/* and /metrics need 'Authorization: Bearer KEY' or 'X-Api-Key: KEY'; none reads "
        f"${API_KEY_ENV} (unset or empty: no key)."))
    served_model_name: Optional[str] = field(default=None, metadata=_help(
        "the model id clients send and /v1/models lists; none: the model key (a path's file name)."))
    max_tokens_limit: Optional[int] = field(default=None, metadata=_help(
        "largest max_tokens a request may ask for; none: only the context (max_seq_len) limits it."))
    max_body_bytes: int = field(default=1 << 20, metadata=_help(
        "largest request body in bytes; a larger one gets 413."))
    cors_origins: tuple[str, ...] = field(default=(), metadata=_help(
        "origins allowed to call the API from a browser (repeat the key; * for any); empty: CORS off."))
    shutdown_grace_s: float = field(default=30.0, metadata=_help(
        "on SIGTERM, seconds running requests get to finish before the rest end with finish_reason abort."))
    ui: bool = field(default=True, metadata=_help(
        "serve the chat page at GET / (it calls /v1/chat/completions, with the key when there is one); "
        "false: GET / is a 404."))
    reasoning: str = field(default="auto", metadata=_help(
        "auto: with a chat template that has its model think in <think> blocks (Qwen 3, DeepSeek-R1's "
        "distills) or in harmony's analysis channel (gpt-oss), a chat reply's thinking goes to "
        "message.reasoning_content, the answer to content; none: the whole reply in content."))
    log_level: str = field(default="info", metadata=_help(
        f"{', '.join(LOG_LEVELS)}; info logs one line per request on stderr."))


def _check(self: Any) -> None:
    if not self.host:
        raise FastDecodeError("host is empty; accepted: an address such as 127.0.0.1 or 0.0.0.0")
    if not 0 <= self.port <= 65535:
        raise FastDecodeError(f"port={self.port} is out of range; accepted: 0..65535 (0 picks a free port)")
    if self.max_tokens_limit is not None and self.max_tokens_limit < 1:
        raise FastDecodeError(f"max_tokens_limit={self.max_tokens_limit} is out of range; accepted: >= 1 or none")
    if self.max_body_bytes < 1024:
        raise FastDecodeError(f"max_body_bytes={self.max_body_bytes} is out of range; accepted: >= 1024")
    if not self.shutdown_grace_s >= 0:
        raise FastDecodeError(f"shutdown_grace_s={self.shutdown_grace_s} is out of range; accepted: >= 0")
    if self.reasoning not in REASONING:
        raise FastDecodeError(f"reasoning={self.reasoning!r} is not valid; accepted: {', '.join(REASONING)}")
    if self.log_level not in LOG_LEVELS:
        raise FastDecodeError(f"log_level={self.log_level!r} is not valid; accepted: {', '.join(LOG_LEVELS)}")
    if self.api_key is None:
        self.api_key = os.environ.get(API_KEY_ENV) or None
    elif not self.api_key.strip():
        raise FastDecodeError("api_key is empty; give a key, or leave it unset to serve without one")
    if self.served_model_name is None:
        name = self.model or DEFAULT_MODEL
        self.served_model_name = os.path.basename(os.path.normpath(name)) if os.path.exists(name) else name
    if not self.served_model_name:
        raise FastDecodeError("served_model_name is empty")


ServeSettings = dataclasses.make_dataclass(
    "ServeSettings",
    copy_fields(LoadOptions, include=LOAD_KEYS) + copy_fields(_ServerKeys),
    namespace={"__module__": __name__, "__post_init__": _check})
ServeSettings.__doc__ = "Every key of `fastdecode serve`."


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to a public address
