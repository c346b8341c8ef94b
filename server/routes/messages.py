"""POST /v1/messages and /v1/messages/count_tokens: Anthropic's Messages API over the chat path.

A request is translated into a ChatCompletionRequest (server/anthropic_protocol.py) and runs
through the same preparation as /v1/chat/completions (prepare_chat: template, tools, grammars,
validation); the reply's text is split by the same per-choice parser into thinking, text and
tool-use blocks. Every error on these routes is in Anthropic's envelope.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import APIRouter, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import StreamingResponse
from fastapi.routing import APIRoute
from pydantic import ValidationError
from pydantic_core import from_json
from starlette.exceptions import HTTPException as StarletteHTTPException

from lantern.app.engine import CompletionOutput, InvalidRequestError, RequestOutput
from lantern.server.anthropic_protocol import (
    BLOCK_TYPES,
    CountTokensRequest,
    MessagesRequest,
    anthropic_error,
    anthropic_error_body,
)
from lantern.server.errors import engine_error
from lantern.server.generation import ServerState, collect, generate, merge, validated
from lantern.server.protocol import ChatCompletionRequest
from lantern.server.routes.chat import chat_formats, encode_messages
from lantern.server.structured import compile_structured
from lantern.server.tool_parsers.base import assemble
from lantern.server.tool_parsers.request import ChatSetup, ChoiceDelta, ChoiceOutput, chat_setup

logger = logging.getLogger(__name__)
# Pydantic's names of union members in error locations: not fields.
_TYPE_TAGS = {"str", "int", "float", "bool", "none", "list", "dict"}


def _param(loc: tuple[Any, ...]) -> str | None:
    """`messages.0.content.1.text` from pydantic's location (union members and block tags dropped)."""
    parts: list[str] = []
    prev: Any = None
    for p in loc:
        if p == "body" and not parts:
            continue
        if isinstance(p, int):
            parts.append(str(p))
        elif isinstance(p, str) and p.isidentifier() and p not in _TYPE_TAGS and not p[0].isupper():
            # Right after a block's index: the tag pydantic picked the block's model by, not a field.
            if not (isinstance(prev, int) and p in BLOCK_TYPES and parts[-2:-1] == ["content"]):
                parts.append(p)
        prev = p
    return ".".join(parts) or None


def _validation_error(errors: list[Any]):
    if any(e.get("type") == "json_invalid" for e in errors):
        return anthropic_error(400, "request body is not valid JSON")
    # The deepest location says most: a block's bad field, not "content is not a string".
    errors = sorted(errors, key=lambda e: -len((_param(e.get("loc", ())) or "").split(".")))
    first = errors[0] if errors else {}
    return anthropic_error(400, str(first.get("msg", "invalid request")), _param(first.get("loc", ())))


class AnthropicRoute(APIRoute):
    """Answers every failure of its handler in Anthropic's envelope instead of OpenAI's."""

    def get_route_handler(self) -> Callable:
        handler = super().get_route_handler()

        async def wrapped(request: Request):
            try:
                return await handler(request)
            except RequestValidationError as exc:
                return _validation_error(list(exc.errors()))
            except ValidationError as exc:  # the translated chat request refused a value
                return _validation_error(list(exc.errors()))
            except StarletteHTTPException as exc:  # FastAPI's own: a body it cannot read (not UTF-8), ...
                return anthropic_error(exc.status_code, str(exc.detail), headers=getattr(exc, "headers", None))
            except Exception as exc:
                err = engine_error(exc)  # APIError, InvalidRequestError (400), engine failures
                return anthropic_error(err.status, err.message, err.param)

        return wrapped


router = APIRouter(route_class=AnthropicRoute)


def message_id() -> str:
    return "msg_" + uuid.uuid4().hex[:24]


def _stop(o: CompletionOutput, has_calls: bool) -> tuple[str, str | None]:
    """(stop_reason, stop_sequence) for a finished output."""
    if o.finish_reason == "length":
        return "max_tokens", None
    if isinstance(o.stop_reason, str):
        return "stop_sequence", o.stop_reason
    return ("tool_use" if has_calls else "end_turn"), None


def _usage(prompt_len: int, cached: int, output_tokens: int) -> dict[str, int]:
    # Anthropic counts prompt tokens read from the cache apart from the others.
    return {
        "input_tokens": prompt_len - cached,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": cached,
        "output_tokens": output_tokens,
    }


def _tool_input(arguments: str) -> dict[str, Any]:
    """A call's arguments as an object; a call cut by max_tokens is read as far as it got."""
    try:
        value = from_json(arguments or "{}", allow_partial=True)
    except ValueError:
        logger.info("tool call arguments are not JSON: %r", arguments[:200])
        return {}
    return value if isinstance(value, dict) else {}


def _encode(state: ServerState, request: Request, chat: ChatCompletionRequest) -> tuple[list[int], ChatSetup]:
    """Prompt ids and tool/reasoning setup. A last assistant message is a prefill, as in
    Anthropic's API: the reply continues its text, so the conversation before it gets the
    generation prompt and the prefill's tokens follow it."""
    chat.refuse_unsupported()
    setup = chat_setup(chat_formats(request), chat)
    kwargs = setup.template_kwargs(chat.chat_template_kwargs)
    history, last = chat.messages, chat.messages[-1]
    prefill = last.role == "assistant" and not last.tool_calls
    if prefill:
        if last.text() != last.text().rstrip():
            raise InvalidRequestError("final assistant content cannot end with trailing whitespace", param="messages")
        history = history[:-1]
    ids = encode_messages(state, history, True, kwargs) if history else []
    if prefill:
        ids += state.engine.tokenizer.encode(last.text(), add_special_tokens=False)
    return ids, setup


@router.post("/v1/messages/count_tokens")
async def count_tokens(body: CountTokensRequest, request: Request) -> dict[str, int]:
    state: ServerState = request.app.state.lantern
    state.check_model(body.model)
    ids, _ = _encode(state, request, body.chat_request(max_tokens=1))
    return {"input_tokens": len(ids)}


@router.post("/v1/messages")
async def messages(body: MessagesRequest, request: Request):
    state: ServerState = request.app.state.lantern
    state.check_model(body.model)
    chat = body.to_chat()
    params = chat.sampling_params()
    ids, setup = _encode(state, request, chat)
    setup.after_encode(state.engine.tokenizer, ids, params)  # the forced-call grammar, if any
    await compile_structured(state.engine, params)  # off the event loop
    validated(state, ids, params, prompt_param="messages")
    state.check_capacity()
    rid = message_id()
    stream = generate(state, ids, params, rid, request, None)
    shown = body.thinking_shown
    if body.stream:
        events = _stream(state, stream, rid, len(ids), setup, shown)
        return StreamingResponse(_guarded(events, rid), media_type="text/event-stream")
    final = (await collect(merge([stream]), request))[0]
    o = final.outputs[0]
    parsed = setup.new_choice()
    parsed.feed(parsed.visible(o.text, o, state.engine.tokenizer))
    parsed.finish()
    content: list[dict[str, Any]] = []
    if shown and parsed.reasoning_text:
        content.append({"type": "thinking", "thinking": parsed.reasoning_text, "signature": ""})
    if parsed.content or not (content or parsed.calls):  # nothing said: one empty text block
        content.append({"type": "text", "text": parsed.content})
    for c in assemble(parsed.calls):
        content.append({"type": "tool_use", "id": c.id, "name": c.name, "input": _tool_input(c.arguments)})
    reason, sequence = _stop(o, bool(parsed.calls))
    return {
        "id": rid,
        "type": "message",
        "role": "assistant",
        "model": state.model_name,
        "content": content,
        "stop_reason": reason,
        "stop_sequence": sequence,
        "usage": _usage(len(ids), final.num_cached_tokens, final.num_generated_tokens),
    }


def _event(kind: str, data: dict[str, Any]) -> str:
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **data}, ensure_ascii=False)}\n\n"


class _Blocks:
    """Opens and closes content blocks as the pieces of the reply change kind."""

    def __init__(self) -> None:
        self.index = -1
        self.kind: str | None = None  # "thinking" | "text" | "tool_use"
        self.call: int | None = None  # the tool call the open tool_use block holds

    def close(self) -> list[str]:
        if self.kind is None:
            return []
        self.kind = self.call = None
        return [_event("content_block_stop", {"index": self.index})]

    def open(self, block: dict[str, Any]) -> list[str]:
        events = self.close()
        self.index += 1
        self.kind = block["type"]
        return [*events, _event("content_block_start", {"index": self.index, "content_block": block})]

    def delta(self, delta: dict[str, Any]) -> str:
        return _event("content_block_delta", {"index": self.index, "delta": delta})

    def pieces(self, piece: ChoiceDelta, shown: bool) -> list[str]:
        out: list[str] = []
        if piece.reasoning and shown:
            if self.kind != "thinking":
                out += self.open({"type": "thinking", "thinking": "", "signature": ""})
            out.append(self.delta({"type": "thinking_delta", "thinking": piece.reasoning}))
        if piece.content:
            if self.kind != "text":
                out += self.open({"type": "text", "text": ""})
            out.append(self.delta({"type": "text_delta", "text": piece.content}))
        for c in piece.calls:
            if c.id is not None:  # a call's first piece: its block opens with id and name
                out += self.open({"type": "tool_use", "id": c.id, "name": c.name, "input": {}})
                self.call = c.index
            if c.arguments and self.call == c.index:
                out.append(self.delta({"type": "input_json_delta", "partial_json": c.arguments}))
        return out


async def _stream(
    state: ServerState,
    stream: AsyncIterator[RequestOutput],
    rid: str,
    prompt_len: int,
    setup: ChatSetup,
    shown: bool,
) -> AsyncIterator[str]:
    """Anthropic's event sequence: message_start, per block content_block_start / _delta / _stop,
    message_delta (stop_reason, usage), message_stop."""
    tokenizer = state.engine.tokenizer
    parsed: ChoiceOutput = setup.new_choice()
    blocks = _Blocks()
    started = False
    async for out in stream:
        if not started:  # after the first step: the prefix-cache hit is known by then
            started = True
            message = {
                "id": rid,
                "type": "message",
                "role": "assistant",
                "model": state.model_name,
                "content": [],
                "stop_reason": None,
                "stop_sequence": None,
                "usage": _usage(prompt_len, out.num_cached_tokens, 0),
            }
            yield _event("message_start", {"message": message})
        o = out.outputs[0]
        piece = parsed.feed(parsed.visible(o.text_delta, o, tokenizer))
        if o.finished:
            piece = piece.then(parsed.finish())
        for event in blocks.pieces(piece, shown):
            yield event
        if o.finished:
            if blocks.index < 0:  # nothing was said: one empty text block, as the non-streamed reply has
                for event in blocks.open({"type": "text", "text": ""}):
                    yield event
            for event in blocks.close():
                yield event
            reason, sequence = _stop(o, bool(parsed.calls))
            usage = _usage(prompt_len, out.num_cached_tokens, out.num_generated_tokens)
            yield _event("message_delta", {"delta": {"stop_reason": reason, "stop_sequence": sequence}, "usage": usage})
            yield _event("message_stop", {})
            return


async def _guarded(events: AsyncIterator[str], rid: str) -> AsyncIterator[str]:
    """A failure after the 200 went out ends the stream with Anthropic's error event."""
    try:
        async for event in events:
            yield event
    except Exception as exc:
        err = engine_error(exc)
        if isinstance(exc, InvalidRequestError) and exc.param:
            err.message = f"{exc.param}: {err.message}"
        logger.warning("stream %s failed (%d): %s", rid, err.status, err.message)
        body = anthropic_error_body(err.status, err.message)
        yield f"event: error\ndata: {json.dumps(body, ensure_ascii=False)}\n\n"
