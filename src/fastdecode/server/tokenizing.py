"""The tokenizer over HTTP, as vLLM serves it (lm-eval's remote tokenizer reads these):
POST /tokenize, POST /detokenize, GET /tokenizer_info. Under the API key, like /v1/*."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Request
from starlette.responses import JSONResponse, Response

from ..errors import FastDecodeError
from ..text.tokenizer import ByteTokenizer, Tokenizer
from .errors import APIError
from .prepare import template_flags, template_kwargs
from .protocol import (DetokenizeRequest, DetokenizeResponse, TokenizeRequest, TokenizeResponse, TokenizerInfo)
from .serving import parse, read_body
from .state import ServerState
from .tools.formats import detect as detect_format
from .tools.prompt import template_input
from .tools.spec import tool_spec


def special_tokens(tok: Tokenizer) -> dict:
    """bos_token / eos_token / pad_token strings."""
    names = getattr(tok, "special_tokens_map", None)
    if names is not None:
        return {k: names.get(k) for k in ("bos_token", "eos_token", "pad_token")}
    if isinstance(tok, ByteTokenizer):
        return {"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>"}
    return {"bos_token": None, "eos_token": None, "pad_token": None}


def tokenizer_router(state: ServerState) -> APIRouter:
    router = APIRouter()

    def check_model(model) -> None:
        if model is not None and model != state.model_name:
            raise APIError(404, f"the model {model!r} does not exist; this server serves {state.model_name!r}",
                           param="model", code="model_not_found")

    @router.post("/tokenize")
    async def tokenize(request: Request) -> Response:
        llm = state.ready_llm()
        req = parse(await read_body(request, state.settings.max_body_bytes), TokenizeRequest)
        check_model(req.model)
        if (req.prompt is None) == (req.messages is None):
            raise APIError(400, "give exactly one of prompt (text) or messages (a chat)", param="prompt")
        tok = llm.tokenizer

        def run() -> list[int]:
            if req.prompt is not None:
                return tok.encode(req.prompt, add_special_tokens=bool(req.add_special_tokens))
            if tok.chat_template is None:
                raise APIError(400, "this model has no chat template; tokenize a prompt instead", param="messages")
            # As /v1/chat/completions renders them: earlier tool calls and results, and the tools offered.
            spec = tool_spec(req.tools, None, None)
            messages, tools = template_input(req.messages, detect_format(tok.template_for(spec is not None)), spec)
            try:
                text = tok.apply_chat_template(messages, tools=tools, variables=template_kwargs(req),
                                               **template_flags(req))
            except FastDecodeError as e:
                raise APIError(400, str(e), param="messages") from None
            # The template writes the special tokens it wants: add_special_tokens adds BOS only if asked.
            return tok.encode(text, add_special_tokens=bool(req.add_special_tokens) and "add_special_tokens"
                              in req.model_fields_set)

        ids = await asyncio.to_thread(run)
        return JSONResponse(TokenizeResponse(tokens=ids, count=len(ids), max_model_len=llm.max_seq_len).model_dump())

    @router.post("/detokenize")
    async def detokenize(request: Request) -> Response:
        llm = state.ready_llm()
        req = parse(await read_body(request, state.settings.max_body_bytes), DetokenizeRequest)
        check_model(req.model)
        V = llm.args.vocab_size
        bad = next((t for t in req.tokens if not 0 <= t < V), None)
        if bad is not None:
            raise APIError(400, f"tokens has id {bad}, outside the vocabulary [0, {V})", param="tokens")
        text = await asyncio.to_thread(llm.tokenizer.decode, req.tokens)
        return JSONResponse(DetokenizeResponse(prompt=text).model_dump())

    @router.get("/tokenizer_info")
    async def tokenizer_info() -> Response:
        llm = state.ready_llm()
        tok = llm.tokenizer
        eos = min(tok.eos_ids) if tok.eos_ids else None
        info = TokenizerInfo(tokenizer_class=type(tok).__name__, **special_tokens(tok), eos_token_id=eos,
                             bos_token_id=tok.bos_id, pad_token_id=tok.pad_id, chat_template=tok.chat_template,
                             model_max_length=llm.max_seq_len, max_model_len=llm.max_seq_len,
                             vocab_size=llm.args.vocab_size, add_bos_token=bool(tok.add_bos))
        return JSONResponse(info.model_dump())

    return router
