"""POST /v1/embeddings: input as a string, a list of strings, token ids, or lists of token ids.

Each input is one engine request (AsyncEngine.embed) run through the shared scheduler; the
vectors come back L2-normalized. `dimensions` keeps the first N components and normalizes them
again (Matryoshka truncation, as OpenAI's text-embedding-3 models do); `encoding_format` base64 is
the float32 little-endian bytes of the vector, which the openai SDK asks for by default.
"""

from __future__ import annotations

import asyncio
import base64
import time
from typing import Any

import numpy as np
from fastapi import APIRouter, Request

from lantern.app.engine import AsyncEngine, EmbeddingOutput, InvalidRequestError
from lantern.server.errors import APIError
from lantern.server.generation import ServerState, new_id
from lantern.server.protocol import EmbeddingRequest
from lantern.server.tenancy import cache_salt_for

router = APIRouter()


@router.post("/v1/embeddings")
async def embeddings(body: EmbeddingRequest, request: Request) -> dict:
    state: ServerState = request.app.state.lantern
    state.check_model(body.model)
    engine = state.engine
    engine.require_task("embed")
    inputs = body.inputs()
    size = engine.embedding_size
    if body.dimensions is not None and not 1 <= body.dimensions <= size:
        raise APIError(
            400, f"dimensions must be in [1, {size}] (this model's embedding size); got {body.dimensions}", "dimensions"
        )
    ids = validated_ids(engine, inputs, "embed")
    state.check_capacity()
    started = time.monotonic()
    outs = await embed_all(engine, [(one, None) for one in ids], new_id("embd"), request)
    state.metrics.e2e.observe(time.monotonic() - started)
    data = [
        {"object": "embedding", "index": i, "embedding": _encode(_truncated(o.embedding, body.dimensions), body)}
        for i, o in enumerate(outs)
    ]
    tokens = sum(len(one) for one in ids)
    return {
        "object": "list",
        "data": data,
        "model": state.model_name,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }


def validated_ids(engine: AsyncEngine, inputs: list[str | list[int]], task: str) -> list[list[int]]:
    """Each `input` item's ids (texts tokenized), validated for the task's model; an error says which item."""
    ids = [engine.encode(x) if isinstance(x, str) else x for x in inputs]
    for i, one in enumerate(ids):
        try:
            engine.validate_embedding(one, task)
        except InvalidRequestError as exc:
            if len(ids) > 1:  # say which item
                exc.message = exc.message.replace("input", f"input[{i}]", 1)
                exc.args = (exc.message,)
            raise
    return ids


def _truncated(vector: Any, dimensions: int | None) -> np.ndarray:
    v = np.asarray(vector, dtype=np.float32)
    if dimensions is None or dimensions >= v.shape[0]:
        return v
    v = v[:dimensions].astype(np.float64)
    return (v / max(float(np.linalg.norm(v)), 1e-12)).astype(np.float32)


def _encode(vector: np.ndarray, body: EmbeddingRequest) -> list[float] | str:
    if body.encoding_format == "base64":
        return base64.b64encode(vector.astype("<f4").tobytes()).decode("ascii")
    return vector.tolist()


async def embed_all(
    engine: AsyncEngine,
    inputs: list[tuple[list[int], list[int] | None]],
    rid: str,
    request: Request,
    poll_s: float = 0.25,
) -> list[EmbeddingOutput]:
    """Every (ids, token types) input through the engine at once (embeddings, or a cross-encoder's pairs); all of
    them aborted if one fails or the client leaves."""
    salt = cache_salt_for(request, None)  # (a decoder's last-token inputs share cached prefixes within a tenant)
    tasks = [
        asyncio.ensure_future(engine.embed(ids, f"{rid}-{i}", token_types=types, cache_salt=salt))
        for i, (ids, types) in enumerate(inputs)
    ]
    together = asyncio.gather(*tasks)
    try:
        while not together.done():
            await asyncio.wait({together}, timeout=poll_s)
            if not together.done() and await request.is_disconnected():
                raise APIError(400, "the client disconnected")  # nobody reads it: the inputs are aborted below
        outs = together.result()
    finally:
        for task in tasks:
            task.cancel()  # a no-op for finished ones; a waiting embed() aborts its input
        await asyncio.gather(*tasks, return_exceptions=True)
        if not together.done():
            together.cancel()
    return outs
