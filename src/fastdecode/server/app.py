"""The FastAPI app: routes, the API key check, CORS, errors in OpenAI's shape, the chat page.

The routes read their bodies themselves (serving.read_body) so that size
limits, JSON errors and validation all answer in one shape, with 400 rather
than FastAPI's 422.
"""

from __future__ import annotations

import hmac
from typing import Optional

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException
from starlette.middleware.cors import CORSMiddleware
from starlette.responses import JSONResponse, Response

from .accesslog import AccessLog
from .errors import APIError, handle_api_error, handle_http_error, handle_unexpected, handle_validation_error
from .protocol import ModelCard, ModelList
from .serving import handle
from .tokenizing import tokenizer_router
from .state import ServerState
from .ui import ui_router


def create_app(state: ServerState, lifespan=None) -> FastAPI:
    # No /docs or /openapi.json: the API is OpenAI's, and the docs page would load scripts from a CDN.
    app = FastAPI(title="fastdecode", docs_url=None, redoc_url=None, openapi_url=None, lifespan=lifespan)
    app.state.fastdecode = state
    app.add_exception_handler(APIError, handle_api_error)
    app.add_exception_handler(HTTPException, handle_http_error)
    app.add_exception_handler(RequestValidationError, handle_validation_error)
    app.add_exception_handler(Exception, handle_unexpected)

    def authorized(request: Request) -> None:
        key = state.settings.api_key
        if key is None:
            return
        given = _presented_key(request)
        if given is None:
            raise APIError(401, "missing API key: send 'Authorization: Bearer KEY' or 'X-Api-Key: KEY'",
                           code="missing_api_key", headers={"WWW-Authenticate": "Bearer"})
        if not hmac.compare_digest(given.encode(), key.encode()):
            raise APIError(401, "incorrect API key", code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})

    api = APIRouter(dependencies=[Depends(authorized)])

    @app.api_route("/health", methods=["GET", "HEAD"])  # HEAD: probes that read only the status
    async def health() -> Response:
        if state.draining:
            return JSONResponse({"status": "shutting down"}, status_code=503)
        if state.llm is None:
            return JSONResponse({"status": "loading"}, status_code=503, headers={"Retry-After": "1"})
        return JSONResponse({"status": "ok"})

    @api.get("/metrics")
    async def metrics() -> Response:
        return Response(state.metrics.render(), media_type=state.metrics.content_type)

    @api.get("/v1/models")
    async def models() -> Response:
        return JSONResponse(ModelList(data=[_card(state)]).model_dump())

    @api.get("/v1/models/{model_id:path}")
    async def model(model_id: str) -> Response:
        if model_id != state.model_name:
            raise APIError(404, f"the model {model_id!r} does not exist; this server serves {state.model_name!r}",
                           code="model_not_found")
        return JSONResponse(_card(state).model_dump())

    @api.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await handle(state, request, chat=False)

    @api.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await handle(state, request, chat=True)

    api.include_router(tokenizer_router(state))
    app.include_router(api)
    if state.settings.ui:
        app.include_router(ui_router())  # the page itself needs no key: its API calls do
    if state.settings.cors_origins:
        app.add_middleware(CORSMiddleware, allow_origins=list(state.settings.cors_origins),
                           allow_methods=["GET", "POST"], allow_headers=["Authorization", "Content-Type", "X-Api-Key"])
    app.add_middleware(AccessLog, state=state)
    return app


def _card(state: ServerState) -> ModelCard:
    llm = state.ready_llm()
    return ModelCard(id=state.model_name, created=state.created, max_model_len=llm.max_seq_len)


def _presented_key(request: Request) -> Optional[str]:
    auth = request.headers.get("authorization")
    if auth:
        scheme, _, token = auth.partition(" ")
        if scheme.lower() == "bearer" and token.strip():
            return token.strip()
    return request.headers.get("x-api-key") or None
