"""GET /health, POST /tokenize and /detokenize, GET /metrics."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from lantern.server.errors import APIError, error_response
from lantern.server.generation import ServerState
from lantern.server.protocol import DetokenizeRequest, TokenizeRequest
from lantern.server.routes.chat import encode_messages
from lantern.server.tenancy import ANONYMOUS, SCOPE_KEY

router = APIRouter()


@router.get("/health", response_model=None)
async def health(request: Request) -> Response | dict:
    """200 while the engine loop runs (with the load a soak or a balancer wants to see); 503 in
    the error envelope, naming the cause, once it has stopped: new requests would fail."""
    engine = request.app.state.lantern.engine
    reason = engine.dead_reason
    if reason is not None:
        return error_response(503, f"the engine has stopped: {reason}", code="engine_dead")
    if request.app.state.settings.keys() and request.scope.get("state", {}).get(SCOPE_KEY, ANONYMOUS) == ANONYMOUS:
        # Open to load balancers without a key, but the load tells one tenant about the others.
        return {"status": "ok"}
    s = engine.stats()
    return {
        "status": "ok",
        "running": s["num_running"],
        "waiting": s["num_waiting"],
        "kv_usage": s["kv_usage"],
        "kv_blocks_used": s["num_blocks"] - s["num_free_blocks"],
    }


@router.post("/tokenize")
async def tokenize(body: TokenizeRequest, request: Request) -> dict:
    state: ServerState = request.app.state.lantern
    state.check_model(body.model)
    if body.messages is not None:  # the same ids the chat route would run
        ids = encode_messages(state, body.messages, body.add_generation_prompt, body.chat_template_kwargs)
    elif body.prompt is not None:
        ids = state.engine.encode(body.prompt, add_special_tokens=body.add_special_tokens)
    else:
        raise APIError(400, "either prompt or messages is required", param="prompt")
    return {"tokens": ids, "count": len(ids), "max_model_len": state.engine.max_model_len}


@router.post("/detokenize")
async def detokenize(body: DetokenizeRequest, request: Request) -> dict:
    state: ServerState = request.app.state.lantern
    state.check_model(body.model)
    vocab = state.engine.vocab_size
    bad = [t for t in body.tokens if not 0 <= t < vocab]
    if bad:
        raise APIError(400, f"tokens must be ids in [0, {vocab}); got {bad[0]}", param="tokens")
    return {"prompt": state.engine.tokenizer.decode(body.tokens)}


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    body = request.app.state.lantern.metrics.render()
    return Response(body, media_type="text/plain; version=0.0.4; charset=utf-8")
