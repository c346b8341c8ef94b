"""POST /v1/chat/completions."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse

from lantern.app.engine import InvalidRequestError
from lantern.server.errors import APIError
from lantern.server.generation import (
    ServerState,
    chat_logprobs,
    collect,
    generate,
    guarded,
    merge,
    new_id,
    sse,
    usage,
    validated,
)
from lantern.server.protocol import ChatCompletionRequest, ChatMessage

router = APIRouter()
logger = logging.getLogger(__name__)


def encode_messages(
    state: ServerState,
    messages: list[ChatMessage],
    add_generation_prompt: bool,
    chat_template_kwargs: dict[str, Any] | None,
) -> list[int]:
    """Prompt ids through the model's chat template; the engine tokenizes message content as
    plain text, so only the template itself produces role markup."""
    try:
        return state.engine.encode_chat(
            [m.as_template_message() for m in messages],
            add_generation_prompt=add_generation_prompt,
            chat_template_kwargs=chat_template_kwargs,
        )
    except InvalidRequestError:
        raise
    except Exception as exc:
        logger.info("chat template failed: %s", exc)
        raise APIError(400, f"the chat template failed on these messages: {exc}", param="messages") from None


@router.post("/v1/chat/completions")
async def chat_completions(body: ChatCompletionRequest, request: Request):
    state: ServerState = request.app.state.lantern
    state.check_model(body.model)
    params = body.sampling_params()
    state.check_choices(params.n)
    ids = encode_messages(state, body.messages, body.add_generation_prompt, body.chat_template_kwargs)
    validated(state, ids, params, prompt_param="messages")
    state.check_capacity()
    rid = new_id("chatcmpl")
    created = int(time.time())
    stream = generate(state, ids, params, rid, request, body.cache_salt)
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        events = _stream(state, stream, rid, created, len(ids), params.n, bool(body.logprobs), include_usage)
        return StreamingResponse(guarded(events, rid), media_type="text/event-stream")
    final = (await collect(merge([stream]), request))[0]
    tokenizer = state.engine.tokenizer
    choices = [
        {
            "index": o.index,
            "message": {"role": "assistant", "content": o.text},
            "logprobs": chat_logprobs(tokenizer, o.logprobs or []) if body.logprobs else None,
            "finish_reason": o.finish_reason,
            "stop_reason": o.stop_reason,
        }
        for o in final.outputs
    ]
    return {
        "id": rid,
        "object": "chat.completion",
        "created": created,
        "model": state.model_name,
        "choices": choices,
        "usage": usage([len(ids)], [final], final.num_cached_tokens),
    }


async def _stream(
    state: ServerState, stream, rid: str, created: int, prompt_len: int, n: int, logprobs: bool, include_usage: bool
) -> AsyncIterator[str]:
    tokenizer = state.engine.tokenizer
    base = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": state.model_name}

    def chunk(index: int, delta: dict, finish=None, lps=None) -> str:
        choice = {"index": index, "delta": delta, "logprobs": lps, "finish_reason": finish}
        return sse({**base, "choices": [choice]})

    for i in range(n):
        yield chunk(i, {"role": "assistant", "content": ""})
    final = None
    done: set[int] = set()  # outputs repeat finished choices; each finishes exactly once
    async for out in stream:
        final = out
        for o in out.outputs:
            if o.index in done:
                continue
            lps = chat_logprobs(tokenizer, o.logprobs_delta) if logprobs and o.logprobs_delta else None
            if o.text_delta or lps:
                yield chunk(o.index, {"content": o.text_delta}, lps=lps)
            if o.finished:
                done.add(o.index)
                yield chunk(o.index, {}, finish=o.finish_reason)
    if final is not None and include_usage:
        yield sse({**base, "choices": [], "usage": usage([prompt_len], [final], final.num_cached_tokens)})
    yield sse("[DONE]")
