"""Relevance scores from a cross-encoder or reranker served with --task score (app/engine/scoring.py).

- POST /v1/rerank, /rerank, /v2/rerank: a query against documents, answered as Cohere's (v1 and v2), Jina's and
  vLLM's rerank APIs answer: `results` sorted by `relevance_score`, best first, each with its `index` in the request
  and (unless return_documents is false) its `document` {"text"}; `top_n` keeps the best n; `usage.total_tokens`.
- POST /v1/score, /score: vLLM's score API: `data` [{index, object "score", score}] in the pairs' order.
- POST /rerank with `texts` instead of `documents`: Hugging Face TEI's rerank API, answered as TEI does (a bare list
  of {index, score, text?}, best first; `raw_scores` the logits; an input past the context refused unless
  `truncate`).

Each (query, document) pair is one engine input run through the shared scheduler like an embedding; all of a
request's pairs are aborted when the client leaves or one fails.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from fastapi import APIRouter, Body, Request
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError

from lantern.app.engine import AsyncEngine, EmbeddingOutput, InvalidRequestError
from lantern.server.generation import ServerState, new_id
from lantern.server.routes.embeddings import embed_all
from lantern.server.scoring_protocol import RerankRequest, ScoreRequest, TEIRerankRequest

router = APIRouter()


def _pairs(
    engine: AsyncEngine,
    pairs: list[tuple[str, str]],
    names: tuple[str, str],
    max_document_tokens: int | None = None,
    truncate: bool = True,
    instruction: str | None = None,
    queries: int = 1,
) -> list[tuple[list[int], list[int] | None]]:
    """Each pair's engine input, validated; an error names the request's field and item (`documents[3]`; the
    query's field: `query`, or `text_1[2]` when the request gave `queries` of them)."""
    inputs = []
    for i, (query, document) in enumerate(pairs):
        try:
            ids, types = engine.encode_pair(query, document, max_document_tokens, truncate, instruction)
            engine.validate_embedding(ids, "score")
        except InvalidRequestError as exc:
            renamed = {"input": (names[1], len(pairs)), "query": (names[0], queries)}.get(exc.param or "")
            if renamed is not None:  # (the engine's names for the pair's two texts)
                field, count = renamed
                where = f"{field}[{i}]" if count > 1 else field
                exc.message, exc.param = exc.message.replace(exc.param or "", where, 1), where
                exc.args = (exc.message,)
            raise
        inputs.append((ids, types))
    return inputs


async def _scored(
    state: ServerState,
    request: Request,
    pairs: list[tuple[str, str]],
    names: tuple[str, str],
    max_document_tokens: int | None,
    truncate: bool = True,
    instruction: str | None = None,
    queries: int = 1,
) -> tuple[list[EmbeddingOutput], int]:
    engine = state.engine
    engine.require_task("score")
    work = (engine, pairs, names, max_document_tokens, truncate, instruction, queries)
    inputs = await asyncio.to_thread(_pairs, *work)
    state.check_capacity()
    started = time.monotonic()
    outs = await embed_all(engine, inputs, new_id("score"), request)
    state.metrics.e2e.observe(time.monotonic() - started)
    return outs, sum(len(ids) for ids, _ in inputs)


@router.post("/rerank")
async def rerank_any(request: Request, body: Any = Body(...)) -> Any:
    """/rerank: TEI's body (`texts`) or the Cohere / Jina / vLLM one (`documents`)."""
    shape = TEIRerankRequest if isinstance(body, dict) and "texts" in body else RerankRequest
    try:
        parsed = shape.model_validate(body)
    except ValidationError as exc:
        raise RequestValidationError([{**e, "loc": ("body", *e["loc"])} for e in exc.errors()]) from None
    if isinstance(parsed, TEIRerankRequest):
        return await _tei_rerank(parsed, request)
    return await rerank(parsed, request)


async def _tei_rerank(body: TEIRerankRequest, request: Request) -> list[dict]:
    """TEI's answer: a bare list, best first, of {index, score} (+ text); its logits with raw_scores."""
    state: ServerState = request.app.state.lantern
    state.check_model(body.model)
    texts = body.checked()
    pairs = [(body.query, t) for t in texts]
    outs, _ = await _scored(state, request, pairs, ("query", "texts"), None, truncate=bool(body.truncate))
    scores = [float(o.logits[0]) if body.raw_scores and o.logits is not None else o.score for o in outs]
    ranked = []
    for i in sorted(range(len(scores)), key=lambda i: -scores[i]):
        item: dict = {"index": i, "score": scores[i]}
        if body.return_text:
            item["text"] = texts[i]
        ranked.append(item)
    return ranked


@router.post("/v1/rerank")
@router.post("/v2/rerank")
async def rerank(body: RerankRequest, request: Request) -> dict:
    state: ServerState = request.app.state.lantern
    state.check_model(body.model)
    documents = body.texts()
    pairs = [(body.query, d) for d in documents]
    outs, tokens = await _scored(
        state, request, pairs, ("query", "documents"), body.max_tokens_per_doc, instruction=body.instruction
    )
    scores = [o.score for o in outs]
    order = sorted(range(len(scores)), key=lambda i: -scores[i])[: body.top_n or None]  # (top_n 0: all, as vLLM)
    results = []
    for i in order:
        result: dict = {"index": i, "relevance_score": scores[i]}
        if body.return_documents:
            result["document"] = {"text": documents[i]}
        results.append(result)
    return {"id": new_id("rerank"), "model": state.model_name, "results": results, "usage": {"total_tokens": tokens}}


@router.post("/v1/score")
@router.post("/score")
async def score(body: ScoreRequest, request: Request) -> dict:
    state: ServerState = request.app.state.lantern
    state.check_model(body.model)
    queries = 1 if isinstance(body.text_1, str) else len(body.text_1)
    names = ("text_1", "text_2")
    outs, tokens = await _scored(
        state, request, body.pairs(), names, None, instruction=body.instruction, queries=queries
    )
    return {
        "id": new_id("score"),
        "object": "list",
        "created": int(time.time()),
        "model": state.model_name,
        "data": [{"index": i, "object": "score", "score": o.score} for i, o in enumerate(outs)],
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens, "completion_tokens": 0},
    }
