"""Errors in OpenAI's shape, `{"error": {"message", "type", "param", "code"}}`, one line each."""

from __future__ import annotations

import logging
import re
from typing import Optional

from pydantic import ValidationError
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse

from ..engine import GenerationConfig
from ..errors import FastDecodeError
from ..sampling import SamplingParams
from .protocol import ErrorInfo, ErrorResponse

log = logging.getLogger("fastdecode.server")

_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
          405: "invalid_request_error", 413: "invalid_request_error", 503: "service_unavailable",
          500: "server_error"}


class APIError(Exception):
    """An error answered to the client: status, one-line message, and the field at fault."""

    def __init__(self, status: int, message: str, *, param: Optional[str] = None, code: Optional[str] = None,
                 type: Optional[str] = None, headers: Optional[dict[str, str]] = None):
        super().__init__(message)
        self.status, self.param, self.code, self.headers = status, param, code, headers
        self.type = type or _TYPES.get(status, "invalid_request_error")

    @property
    def message(self) -> str:
        return _one_line(str(self))

    def body(self) -> ErrorResponse:
        return ErrorResponse(error=ErrorInfo(message=self.message, type=self.type, param=self.param, code=self.code))

    def response(self) -> JSONResponse:
        return JSONResponse(self.body().model_dump(), status_code=self.status, headers=self.headers)


def _one_line(text: str) -> str:
    return " ".join(text.split()) or "(no message)"


def from_validation(e: ValidationError) -> APIError:
    """The first problem pydantic found, as `param: message`."""
    err = e.errors(include_url=False)[0]
    if err["type"] == "json_invalid":
        return APIError(400, f"the body is not valid JSON: {err.get('ctx', {}).get('error', err['msg'])}",
                        code="invalid_json")
    param = _param(err["loc"])
    msg = str(err["ctx"]["error"]) if err["type"] == "value_error" else err["msg"]
    if err["type"] not in ("missing", "value_error") and param is not None:
        msg += f", got {_short(err.get('input'))}"
    if param is None:
        return APIError(400, f"the body must be a JSON object of request fields: {msg}")
    return APIError(400, f"{param}: {msg}", param=param)


def _param(loc: tuple) -> Optional[str]:
    """('messages', 0, 'role') -> 'messages[0].role'."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out or None


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


_ENGINE_FIELDS = {f for cls in (SamplingParams, GenerationConfig) for f in cls.__dataclass_fields__} | {"prompt"}


def from_fastdecode(e: FastDecodeError, names: Optional[dict[str, str]] = None,
                    param: Optional[str] = None) -> APIError:
    """A FastDecodeError as a 400. Messages of the engine's dataclasses start with the
    field's name: that becomes `param`, renamed to the request's field by `names`."""
    text = str(e)
    word = re.match(r"(?:the )?(\w+)", text)  # "the prompt is empty": a lone prompt
    if word and word.group(1) in _ENGINE_FIELDS:
        param = (names or {}).get(word.group(1), word.group(1))
        text = text[:word.start(1)] + param + text[word.end(1):]
    return APIError(400, text, param=param)


async def handle_api_error(request: Request, exc: APIError) -> JSONResponse:
    request.scope.setdefault("fastdecode", {})["error"] = str(exc)  # for the request's log line
    return exc.response()


async def handle_http_error(request: Request, exc: HTTPException) -> JSONResponse:
    """Starlette's own errors (unknown route, wrong method) in OpenAI's shape."""
    if exc.status_code == 404:
        err = APIError(404, f"unknown route: {request.method} {request.url.path}", code="not_found")
    elif exc.status_code == 405:
        err = APIError(405, f"method {request.method} is not allowed on {request.url.path}",
                       code="method_not_allowed", headers=exc.headers)
    else:
        err = APIError(exc.status_code, str(exc.detail), headers=exc.headers)
    return err.response()


async def handle_validation_error(request: Request, exc: Exception) -> JSONResponse:
    # FastAPI's own request validation (handlers read the body themselves, so this is a backstop): 400, not 422.
    return APIError(400, f"invalid request: {_one_line(str(exc))[:200]}").response()


async def handle_unexpected(request: Request, exc: Exception) -> JSONResponse:
    log.error("internal error on %s %s: %s: %s", request.method, request.url.path, type(exc).__name__, exc)
    return APIError(500, "internal server error").response()
