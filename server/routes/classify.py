"""POST /classify, /v1/classify: a sequence classifier's labels for texts (vLLM's classification API), served with
--task classify.

Each input is one engine request through the shared scheduler, like an embedding; `data` holds per input the
probabilities over the model's labels (softmax, or a sigmoid each for a multi-label classifier, as transformers'
pipeline), the most probable label and the label count.
"""

from __future__ import annotations

import asyncio
import time

from fastapi import APIRouter, Request

from lantern.server.generation import ServerState, new_id
from lantern.server.routes.embeddings import embed_all, validated_ids
from lantern.server.scoring_protocol import ClassifyRequest

router = APIRouter()


@router.post("/v1/classify")
@router.post("/classify")
async def classify(body: ClassifyRequest, request: Request) -> dict:
    state: ServerState = request.app.state.lantern
    state.check_model(body.model)
    engine = state.engine
    engine.require_task("classify")
    ids = await asyncio.to_thread(validated_ids, engine, body.inputs(), "classify")  # (tokenized off the loop)
    state.check_capacity()
    started = time.monotonic()
    outs = await embed_all(engine, [(one, None) for one in ids], new_id("classify"), request)
    state.metrics.e2e.observe(time.monotonic() - started)
    labels = engine.labels
    data = []
    for i, out in enumerate(outs):
        probs = out.probs
        best = max(range(len(probs)), key=probs.__getitem__)
        data.append({"index": i, "label": labels[best], "probs": probs, "num_classes": len(probs)})
    tokens = sum(len(one) for one in ids)
    return {
        "id": new_id("classify"),
        "object": "list",
        "created": int(time.time()),
        "model": state.model_name,
        "data": data,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens, "completion_tokens": 0},
    }
