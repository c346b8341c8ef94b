"""POST /v1/chat/completions."""
from __future__ import annotations

import time
from typing import AsyncIterator

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse

from server.errors import APIError
from server.generation import (
    ServerState, build_params, chat_logprobs, collect, generate, merge, new_id, prepare_prompt, sse, usage,
)
from server.protocol import ChatCompletionRequest

router = APIRouter()


def render_chat(state: ServerState, body: ChatCompletionRequest) -> str:
    engine = state.engine.engine
    messages = [{"role": m.role if m.role != "developer" else "system", "content": m.text()} for m in body.messages]
    try:
        return engine.apply_chat_template(
            messages, add_generation_prompt=body.add_generation_prompt, **(body.chat_template_kwargs or {})
        )
    except ValueError as exc:
        raise APIError(400, str(exc), param="messages") from None
    except Exception as exc:  # a template that raises on these messages (jinja2 errors)
        raise APIError(400, f"chat template failed on these messages: {exc}", param="messages") from None


@router.post("/v1/chat/completions")
async def chat_completions(body: ChatCompletionRequest, request: Request):
    state: ServerState = request.app.state.lantern
    state.check_model(body.model)
    params = build_params(body)
    prompt = render_chat(state, body)
    # The template already holds the special tokens the model expects.
    ids = prepare_prompt(state, prompt, params, add_special_tokens=False)
    state.check_capacity()
    rid = new_id("chatcmpl")
    created = int(time.time())
    tokenizer = state.engine.tokenizer
    stream = generate(state, ids, params, rid)
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        return StreamingResponse(
            _stream(state, stream, rid, created, len(ids), params.n, body.logprobs, include_usage),
            media_type="text/event-stream",
        )
    final = (await collect(merge([stream]), request))[0]
    choices = [
        {
            "index": o.index,
            "message": {"role": "assistant", "content": o.text},
            "logprobs": chat_logprobs(tokenizer, o.logprobs) if body.logprobs else None,
            "finish_reason": o.finish_reason,
            "stop_reason": o.stop_reason,
        }
        for o in final.outputs
    ]
    return {
        "id": rid, "object": "chat.completion", "created": created, "model": state.model_name,
        "choices": choices, "usage": usage([len(ids)], [final], final.num_cached_tokens),
    }


async def _stream(state: ServerState, stream, rid: str, created: int, prompt_len: int, n: int,
                  logprobs: bool, include_usage: bool) -> AsyncIterator[str]:
    tokenizer = state.engine.tokenizer
    base = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": state.model_name}

    def chunk(index: int, delta: dict, finish=None, lps=None) -> str:
        choice = {"index": index, "delta": delta, "logprobs": lps, "finish_reason": finish}
        return sse({**base, "choices": [choice]})

    for i in range(n):
        yield chunk(i, {"role": "assistant", "content": ""})
    final = None
    async for out in stream:
        final = out
        for o in out.outputs:
            lps = chat_logprobs(tokenizer, o.logprobs_delta) if logprobs and o.logprobs_delta else None
            if o.text_delta or lps:
                yield chunk(o.index, {"content": o.text_delta}, lps=lps)
            if o.finished and o.token_ids_delta:  # each choice finishes exactly once
                yield chunk(o.index, {}, finish=o.finish_reason)
    if final is not None and include_usage:
        yield sse({**base, "choices": [], "usage": usage([prompt_len], [final], final.num_cached_tokens)})
    yield sse("[DONE]")
