"""GET /v1/models."""

from __future__ import annotations

from fastapi import APIRouter, Request

router = APIRouter()


@router.get("/v1/models")
async def list_models(request: Request) -> dict:
    state = request.app.state.lantern
    return {
        "object": "list",
        "data": [
            {
                "id": state.model_name,
                "object": "model",
                "created": request.app.state.started,
                "owned_by": "lantern",
                "max_model_len": state.engine.max_model_len,
                # what the model serves: generate (chat / completions), embed, score (rerank) or classify
                "task": state.engine.task,
            }
        ],
    }
