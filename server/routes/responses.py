"""POST /v1/responses (OpenAI's Responses API), GET and DELETE /v1/responses/{id}.

A response runs as the chat request it translates to (server/responses_protocol.py) through the
chat route's own preparation, so tools, grammars, reasoning and the prefix cache behave as on
/v1/chat/completions; the chat parsers' pieces (reasoning, text, call deltas) become output items
and, streaming, the Responses events in the order the openai SDK's accumulator checks.
"""

from __future__ import annotations

import json
import logging
import secrets
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse

from lantern.app.engine import InvalidRequestError
from lantern.server.errors import APIError, engine_error
from lantern.server.generation import ServerState, collect, generate, merge, new_id
from lantern.server.protocol import ChatMessage
from lantern.server.response_store import ResponseStore
from lantern.server.responses_protocol import ResponsesRequest, renamed_param
from lantern.server.routes.chat import prepare_chat
from lantern.server.tenancy import request_tenant
from lantern.server.tool_parsers.request import ChoiceDelta, ChoiceOutput

router = APIRouter()
logger = logging.getLogger(__name__)


def _store(request: Request) -> ResponseStore:
    store = getattr(request.app.state, "response_store", None)
    if store is None:
        store = request.app.state.response_store = ResponseStore()
    return store


@contextmanager
def _renamed_errors() -> Iterator[None]:
    """Errors of the chat pipeline named by this API's fields (messages -> input, ...)."""
    try:
        yield
    except (InvalidRequestError, APIError) as exc:
        new = renamed_param(exc.param)
        if new != exc.param:
            if exc.message.startswith(f"{exc.param}"):
                exc.message = new + exc.message[len(exc.param or "") :]
                exc.args = (exc.message,)
            exc.param = new
        raise


class OutputItems:
    """One choice's pieces as Responses output items, plus the stream events that build them.

    Items follow each other: reasoning, a message, function calls; a piece of another kind (or
    another call) closes the open item. Events are dicts without sequence_number."""

    def __init__(self, obfuscate: bool = False) -> None:
        self.items: list[dict[str, Any]] = []
        self.open: dict[str, Any] | None = None
        self.open_call: int | None = None  # the parser's index of the open function call
        self.obfuscate = obfuscate

    def feed(self, piece: ChoiceDelta) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        if piece.reasoning:
            events += self._text("reasoning", piece.reasoning)
        if piece.content:
            events += self._text("message", piece.content)
        for call in piece.calls:
            events += self._call(call.index, call.id, call.name, call.arguments)
        return events

    def finish(self, status: str) -> list[dict[str, Any]]:
        """Close the open item with `status`; an output with no item gets an empty message."""
        events: list[dict[str, Any]] = []
        if not self.items:
            events += self._start("message")
        return events + self._close(status)

    def _where(self) -> dict[str, Any]:
        return {"item_id": self.open["id"], "output_index": len(self.items) - 1}  # type: ignore[index]

    def _start(self, kind: str, **fields: Any) -> list[dict[str, Any]]:
        events = self._close("completed")
        if kind == "function_call":
            item = {"id": "fc_" + secrets.token_hex(12), "type": kind, "status": "in_progress", **fields}
        else:
            prefix = "rs_" if kind == "reasoning" else "msg_"
            item = {"id": prefix + secrets.token_hex(12), "type": kind, "status": "in_progress", "content": []}
            if kind == "message":
                item["role"] = "assistant"
            else:
                item["summary"] = []
        self.open = item
        self.items.append(item)
        events.append({"type": "response.output_item.added", "output_index": len(self.items) - 1, "item": _copy(item)})
        if kind != "function_call":
            events.append({"type": "response.content_part.added", **self._where(), "content_index": 0,
                           "part": _part(kind, "")})  # fmt: skip
            item["content"].append(_part(kind, ""))
        return events

    def _text(self, kind: str, text: str) -> list[dict[str, Any]]:
        events = [] if self.open is not None and self.open["type"] == kind else self._start(kind)
        self.open["content"][0]["text"] += text  # type: ignore[index]
        name = "response.output_text.delta" if kind == "message" else "response.reasoning_text.delta"
        event = {"type": name, **self._where(), "content_index": 0, "delta": text}
        if kind == "message":
            event["logprobs"] = []
        return [*events, self._obfuscated(event)]

    def _call(self, index: int, call_id: str | None, name: str | None, arguments: str) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        if self.open is None or self.open["type"] != "function_call" or self.open_call != index:
            events = self._start("function_call", call_id=call_id or "", name=name or "", arguments="")
            self.open_call = index
        if arguments:
            self.open["arguments"] += arguments  # type: ignore[index]
            delta = {"type": "response.function_call_arguments.delta", **self._where(), "delta": arguments}
            events.append(self._obfuscated(delta))
        return events

    def _close(self, status: str) -> list[dict[str, Any]]:
        item = self.open
        if item is None:
            return []
        where = self._where()
        self.open, self.open_call = None, None
        item["status"] = status
        events: list[dict[str, Any]] = []
        if item["type"] == "function_call":
            done = {"type": "response.function_call_arguments.done", **where, "name": item["name"]}
            events.append({**done, "arguments": item["arguments"]})
        else:
            part = item["content"][0]
            name = "response.output_text.done" if item["type"] == "message" else "response.reasoning_text.done"
            event = {"type": name, **where, "content_index": 0, "text": part["text"]}
            if item["type"] == "message":
                event["logprobs"] = []
            events.append(event)
            events.append({"type": "response.content_part.done", **where, "content_index": 0, "part": _copy(part)})
        events.append({"type": "response.output_item.done", "output_index": where["output_index"], "item": _copy(item)})
        return events

    def _obfuscated(self, event: dict[str, Any]) -> dict[str, Any]:
        # OpenAI pads delta events with random characters so that their sizes say nothing of the
        # text (stream_options.include_obfuscation); only on request here.
        if self.obfuscate:
            event["obfuscation"] = secrets.token_urlsafe(secrets.randbelow(12) + 1)
        return event


def _part(kind: str, text: str) -> dict[str, Any]:
    if kind == "message":
        return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
    return {"type": "reasoning_text", "text": text}


def _copy(obj: dict[str, Any]) -> dict[str, Any]:
    return json.loads(json.dumps(obj))  # events keep a snapshot, not the item mutated later


class ResponseRun:
    """What one response needs from start to end: the request, its prompt and the response object."""

    def __init__(self, state: ServerState, body: ResponsesRequest, ids: list[int], rid: str) -> None:
        self.state, self.body, self.ids, self.rid = state, body, ids, rid
        self.created = time.time()

    def response(self, status: str, output: list[dict[str, Any]], final: Any = None, reasoning: str = "",
                 error: dict[str, Any] | None = None) -> dict[str, Any]:  # fmt: skip
        b = self.body
        fmt = (b.text or {}).get("format") or {"type": "text"}
        obj: dict[str, Any] = {
            "id": self.rid,
            "object": "response",
            "created_at": self.created,
            "status": status,
            "completed_at": time.time() if status == "completed" else None,
            "background": False,
            "error": error,
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
            "instructions": b.instructions,
            "max_output_tokens": b.max_output_tokens,
            "max_tool_calls": b.max_tool_calls,
            "metadata": b.metadata or {},
            "model": self.state.model_name,
            "output": output,
            "parallel_tool_calls": b.parallel_tool_calls is not False,
            "previous_response_id": b.previous_response_id,
            "prompt_cache_key": b.prompt_cache_key,
            "reasoning": {"effort": (b.reasoning or {}).get("effort"), "summary": None},
            "safety_identifier": b.safety_identifier,
            "service_tier": "default",
            "store": b.store,
            "temperature": 1.0 if b.temperature is None else b.temperature,
            "text": {"format": fmt},
            "tool_choice": b.tool_choice if b.tool_choice is not None else "auto",
            "tools": b.tools or [],
            "top_p": 1.0 if b.top_p is None else b.top_p,
            "truncation": "disabled",
            "usage": None,
            "user": b.user,
        }
        if final is not None:
            out_tokens = final.num_generated_tokens
            # The split of the output into reasoning and answer is textual: its token count is the
            # tokenizer's count of the reasoning text (exact up to merges across the marker).
            tok = self.state.engine.tokenizer
            thought = len(tok.encode(reasoning, add_special_tokens=False)) if reasoning else 0
            obj["usage"] = {
                "input_tokens": len(self.ids),
                "input_tokens_details": {"cached_tokens": final.num_cached_tokens},
                "output_tokens": out_tokens,
                "output_tokens_details": {"reasoning_tokens": min(thought, out_tokens)},
                "total_tokens": len(self.ids) + out_tokens,
            }
        return obj


def _status(finish_reason: str | None) -> str:
    return "incomplete" if finish_reason == "length" else "completed"


def _limit_calls(parsed: ChoiceOutput, max_tool_calls: int | None) -> ChoiceOutput:
    if max_tool_calls is not None:  # calls past the limit are dropped, as parallel_tool_calls false does
        parsed.max_calls = max_tool_calls if parsed.max_calls is None else min(parsed.max_calls, max_tool_calls)
    return parsed


@router.post("/v1/responses")
async def create_response(body: ResponsesRequest, request: Request):
    state: ServerState = request.app.state.lantern
    state.check_model(body.model)
    store, tenant = _store(request), request_tenant(request)
    history: list[ChatMessage] = []
    if body.previous_response_id is not None:
        prev = store.get(body.previous_response_id, tenant)
        if prev is None:
            raise APIError(
                400,
                f"Previous response with id {body.previous_response_id!r} not found: unknown, deleted, stored "
                f"with store=false, or expired (this server keeps {store.max_entries} responses, each for "
                f"{store.ttl_s / 60:g} minutes after last use)",
                param="previous_response_id",
                code="previous_response_not_found",
            )
        history = prev.conversation
    with _renamed_errors():
        chat = body.to_chat(history)
        ids, params, setup = await prepare_chat(state, request, chat)
    run = ResponseRun(state, body, ids, new_id("resp").replace("-", "_"))
    # Stored conversation: everything the model saw, less the instructions (not carried over).
    convo = chat.messages[1:] if body.instructions else list(chat.messages)
    stream = generate(state, ids, params, run.rid, request, chat.cache_salt)
    parsed = _limit_calls(setup.new_choice(), body.max_tool_calls)
    obfuscate = bool((body.stream_options or {}).get("include_obfuscation"))
    items = OutputItems(obfuscate)

    def finished(final: Any, status: str) -> dict[str, Any]:
        obj = run.response(status, items.items, final, parsed.reasoning_text)
        if body.store:
            answer = ChatMessage.model_validate(parsed.message())
            store.put(run.rid, tenant, obj, [*convo, answer])
        return obj

    if body.stream:
        events = _stream(run, stream, parsed, items, finished)
        return StreamingResponse(events, media_type="text/event-stream")
    final = (await collect(merge([stream]), request))[0]
    o = final.outputs[0]
    tokenizer = state.engine.tokenizer
    items.feed(parsed.feed(parsed.visible(o.text, o, tokenizer)).then(parsed.finish()))
    items.finish(_status(o.finish_reason))
    return finished(final, _status(o.finish_reason))


async def _stream(run: ResponseRun, stream: AsyncIterator, parsed: ChoiceOutput, items: OutputItems,
                  finished: Any) -> AsyncIterator[str]:  # fmt: skip
    seq = 0

    def event(data: dict[str, Any]) -> str:
        nonlocal seq
        data = {"type": data["type"], "sequence_number": seq, **data}
        seq += 1
        return f"event: {data['type']}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n"

    tokenizer = run.state.engine.tokenizer
    yield event({"type": "response.created", "response": run.response("in_progress", [])})
    yield event({"type": "response.in_progress", "response": run.response("in_progress", [])})
    try:
        async for out in stream:
            o = out.outputs[0]
            piece = parsed.feed(parsed.visible(o.text_delta, o, tokenizer))
            if o.finished:  # what the parsers held back (a partial marker) goes out now
                piece = piece.then(parsed.finish())
            for e in items.feed(piece):
                yield event(e)
            if o.finished:
                status = _status(o.finish_reason)
                for e in items.finish(status):
                    yield event(e)
                kind = "response.completed" if status == "completed" else "response.incomplete"
                yield event({"type": kind, "response": finished(out, status)})
                return
    except Exception as exc:  # the stream has begun: the failure goes out as events, as OpenAI's do
        err = engine_error(exc)
        logger.warning("response %s failed (%d): %s", run.rid, err.status, err.message)
        yield event({"type": "error", "code": err.code or "server_error", "message": err.message, "param": err.param})
        failed = run.response("failed", items.items, error={"code": err.code or "server_error", "message": err.message})
        yield event({"type": "response.failed", "response": failed})


def _not_found(response_id: str) -> APIError:
    return APIError(404, f"No response with id {response_id!r} is stored", param="response_id", code="not_found")


@router.get("/v1/responses/{response_id}")
async def get_response(response_id: str, request: Request) -> dict[str, Any]:
    entry = _store(request).get(response_id, request_tenant(request))
    if entry is None:
        raise _not_found(response_id)
    return entry.response


@router.delete("/v1/responses/{response_id}")
async def delete_response(response_id: str, request: Request) -> dict[str, Any]:
    if not _store(request).delete(response_id, request_tenant(request)):
        raise _not_found(response_id)
    return {"id": response_id, "object": "response.deleted", "deleted": True}
