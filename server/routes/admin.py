"""GET /health, POST /tokenize and /detokenize, GET /metrics."""
from __future__ import annotations

from fastapi import APIRouter, Request, Response

from server.errors import APIError
from server.generation import ServerState
from server.protocol import DetokenizeRequest, TokenizeRequest
from server.routes.chat import render_chat

router = APIRouter()


@router.get("/health")
async def health(request: Request) -> dict:
    s = request.app.state.lantern.engine.stats()
    return {"status": "ok", "running": s["num_running"], "waiting": s["num_waiting"]}


@router.post("/tokenize")
async def tokenize(body: TokenizeRequest, request: Request) -> dict:
    state: ServerState = request.app.state.lantern
    state.check_model(body.model)
    tokenizer = state.engine.tokenizer
    if body.messages is not None:
        text = render_chat(state, body)  # same fields the chat route reads
        ids = tokenizer.encode(text, add_special_tokens=False)
    elif body.prompt is not None:
        ids = tokenizer.encode(body.prompt, add_special_tokens=body.add_special_tokens)
    else:
        raise APIError(400, "either prompt or messages is required", param="prompt")
    return {"tokens": ids, "count": len(ids), "max_model_len": state.engine.engine.max_model_len}


@router.post("/detokenize")
async def detokenize(body: DetokenizeRequest, request: Request) -> dict:
    state: ServerState = request.app.state.lantern
    state.check_model(body.model)
    vocab = state.engine.engine.vocab_size
    bad = [t for t in body.tokens if not 0 <= t < vocab]
    if bad:
        raise APIError(400, f"tokens must be ids in [0, {vocab}); got {bad[0]}", param="tokens")
    return {"prompt": state.engine.tokenizer.decode(body.tokens)}


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    body = request.app.state.lantern.metrics.render()
    return Response(body, media_type="text/plain; version=0.0.4; charset=utf-8")
