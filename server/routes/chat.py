"""POST /v1/chat/completions: tools rendered through the model's template, tool calls and
reasoning parsed out of the output (server/tool_parsers), streamed as OpenAI deltas."""

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
    vllm_prompt_logprobs,
)
from lantern.server.protocol import ChatCompletionRequest, ChatMessage
from lantern.server.request_fields import effort_template_kwargs
from lantern.server.structured import compile_structured
from lantern.server.tool_parsers.request import ChatFormats, ChatSetup, chat_setup

router = APIRouter()
logger = logging.getLogger(__name__)


def chat_formats(request: Request) -> ChatFormats:
    """The served model's tool-call and reasoning formats, resolved on first use."""
    app_state = request.app.state
    formats = getattr(app_state, "chat_formats", None)
    if formats is None:
        settings = app_state.settings
        formats = ChatFormats.resolve(
            app_state.lantern.engine,
            getattr(settings, "tool_call_parser", None),
            getattr(settings, "reasoning_parser", None),
        )
        app_state.chat_formats = formats
    return formats


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


async def prepare_chat(
    state: ServerState, request: Request, body: ChatCompletionRequest
) -> tuple[list[int], Any, ChatSetup]:
    """Prompt ids, sampling parameters (grammars compiled) and the tool/reasoning setup of a
    chat request, every field checked: what every chat-shaped route runs before generating."""
    params = body.sampling_params()
    state.check_choices(params.n)
    setup = chat_setup(chat_formats(request), body)
    if params.thinking_token_budget is not None and setup.formats.channels is not None:
        raise InvalidRequestError(  # the engine budgets <think> blocks; harmony reasons in a channel
            "thinking_token_budget cannot be enforced on this model: it reasons in harmony's analysis channel, "
            "not in a <think> block",
            param="thinking_token_budget",
        )
    counted = state.engine.reasoning_markup if params.thinking_token_budget is not None else None
    if counted is not None and setup.formats.reasoning not in (None, counted):
        raise InvalidRequestError(
            f"thinking_token_budget cannot be enforced here: the engine counts {counted.start!r} blocks (read from the "
            f"chat template) but --reasoning-parser names {setup.formats.reasoning.start!r} ones",
            param="thinking_token_budget",
        )
    user_kwargs = effort_template_kwargs(state.engine.chat_template, body.reasoning_effort, body.chat_template_kwargs)
    kwargs = setup.template_kwargs(user_kwargs)
    ids = encode_messages(state, body.messages, body.add_generation_prompt, kwargs)
    setup.after_encode(state.engine.tokenizer, ids, params)  # the forced-call grammar, if any
    await compile_structured(state.engine, params, setup.answer_spec)  # response_format etc.: off the event loop
    validated(state, ids, params, prompt_param="messages")
    state.check_capacity()
    return ids, params, setup


@router.post("/v1/chat/completions")
async def chat_completions(body: ChatCompletionRequest, request: Request):
    state: ServerState = request.app.state.lantern
    state.check_model(body.model)
    mcp = getattr(request.app.state, "mcp", None)
    if mcp is not None and mcp.tools and body.tool_choice != "none":
        if body.prompt_logprobs is not None:  # (several generations, each with its own prompt)
            raise InvalidRequestError("prompt_logprobs is not returned when MCP tools run", param="prompt_logprobs")
        from lantern.server.mcp_loop import chat_with_mcp_tools

        return await chat_with_mcp_tools(state, request, body, mcp)
    ids, params, setup = await prepare_chat(state, request, body)
    rid = new_id("chatcmpl")
    created = int(time.time())
    stream = generate(state, ids, params, rid, request, body.cache_salt)
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        events = _stream(state, stream, rid, created, len(ids), params.n, bool(body.logprobs), include_usage, setup)
        return StreamingResponse(guarded(events, rid), media_type="text/event-stream")
    final = (await collect(merge([stream]), request))[0]
    tokenizer = state.engine.tokenizer
    choices = []
    for o in final.outputs:
        parsed = setup.new_choice()
        parsed.feed(parsed.visible(o.text, o, tokenizer))
        parsed.finish()
        choices.append(
            {
                "index": o.index,
                "message": parsed.message(),
                "logprobs": chat_logprobs(tokenizer, o.logprobs or []) if body.logprobs else None,
                "finish_reason": parsed.finish_reason(o.finish_reason),
                "stop_reason": o.stop_reason,
            }
        )
    return {
        "id": rid,
        "object": "chat.completion",
        "created": created,
        "model": state.model_name,
        "choices": choices,
        "usage": usage([len(ids)], [final], final.num_cached_tokens),
        **(
            {"prompt_logprobs": vllm_prompt_logprobs(tokenizer, final.prompt_logprobs, body.prompt_logprobs)}
            if body.prompt_logprobs is not None
            else {}
        ),
    }


async def _stream(
    state: ServerState,
    stream,
    rid: str,
    created: int,
    prompt_len: int,
    n: int,
    logprobs: bool,
    include_usage: bool,
    setup: ChatSetup,
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
    parsers = [setup.new_choice() for _ in range(n)]
    async for out in stream:
        final = out
        for o in out.outputs:
            if o.index in done:
                continue
            parsed = parsers[o.index]
            lps = chat_logprobs(tokenizer, o.logprobs_delta) if logprobs and o.logprobs_delta else None
            pieces = parsed.feed(parsed.visible(o.text_delta, o, tokenizer))
            if o.finished:  # what the parsers held back (a partial marker, layout) goes out now
                pieces = pieces.then(parsed.finish())
            delta = pieces.as_delta()
            if delta or lps:
                yield chunk(o.index, delta or {"content": ""}, lps=lps)
            if o.finished:
                done.add(o.index)
                yield chunk(o.index, {}, finish=parsed.finish_reason(o.finish_reason))
    if final is not None and include_usage:
        yield sse({**base, "choices": [], "usage": usage([prompt_len], [final], final.num_cached_tokens)})
    yield sse("[DONE]")
