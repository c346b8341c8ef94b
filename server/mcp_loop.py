"""Chat completions with the tools of `--mcp-config` servers: the model's calls of those tools are
run by this server and fed back, round after round, until the model answers (or calls a tool of
the client's own, which goes back to the client as usual).

Visible in the response: `choices[0].message.mcp_calls` lists every call the server ran (name,
arguments, result, is_error); usage counts every round's tokens. Rounds are bounded by
`--mcp-max-rounds`. A streamed request gets its answer after the tool rounds, as whole pieces in
the usual chunk shapes: the rounds before it are not streamed.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request
from fastapi.responses import StreamingResponse

from lantern.server.errors import APIError
from lantern.server.generation import ServerState, collect, generate, guarded, merge, new_id, sse
from lantern.server.mcp_bridge import MCPToolset
from lantern.server.protocol import ChatCompletionRequest, ChatMessage, ToolDefinition
from lantern.server.routes.chat import prepare_chat

logger = logging.getLogger(__name__)


def with_mcp_tools(body: ChatCompletionRequest, mcp: MCPToolset) -> ChatCompletionRequest:
    """The request with the MCP tools appended to its own (a client tool of the same name wins)."""
    own = {t.function.name for t in body.tools or []}
    extra = [ToolDefinition.model_validate(t) for t in mcp.openai_tools() if t["function"]["name"] not in own]
    shadowed = [name for name in mcp.tools if name in own]
    if shadowed:
        logger.info("MCP tools %s are shadowed by the request's own tools of the same name", shadowed)
    return body.model_copy(update={"tools": list(body.tools or []) + extra})


async def _run_calls(mcp: MCPToolset, calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    done = []
    for call in calls:
        name, raw = call["function"]["name"], call["function"]["arguments"]
        try:
            arguments = json.loads(raw or "{}")
            if not isinstance(arguments, dict):
                raise ValueError("the arguments are not a JSON object")
        except ValueError as exc:  # the model is told, and may call again
            result, failed = f"invalid arguments for {name}: {exc}", True
            arguments = raw
        else:
            result, failed = await mcp.call(name, arguments)
        logger.info("MCP call %s -> %s", name, "error" if failed else f"{len(result)} characters")
        done.append({"id": call["id"], "name": name, "arguments": arguments, "result": result, "is_error": failed})
    return done


async def chat_with_mcp_tools(
    state: ServerState, request: Request, body: ChatCompletionRequest, mcp: MCPToolset
) -> Any:
    if (body.n or 1) > 1:
        raise APIError(400, "n > 1 is not supported while the server runs MCP tools (--mcp-config)", param="n")
    max_rounds = getattr(request.app.state.settings, "mcp_max_rounds", 8)
    body = with_mcp_tools(body, mcp)
    rid, created = new_id("chatcmpl"), int(time.time())
    ran: list[dict[str, Any]] = []
    prompt_tokens = completion_tokens = cached = 0
    for round_no in range(max_rounds + 1):
        ids, params, setup = await prepare_chat(state, request, body)
        stream = generate(state, ids, params, f"{rid}-{round_no}", request, body.cache_salt)
        final = (await collect(merge([stream]), request))[0]
        out = final.outputs[0]
        parsed = setup.new_choice()
        parsed.feed(parsed.visible(out.text, out, state.engine.tokenizer))
        parsed.finish()
        message = parsed.message()
        finish = parsed.finish_reason(out.finish_reason)
        prompt_tokens += len(ids)
        completion_tokens += final.num_generated_tokens
        cached += final.num_cached_tokens
        calls = message.get("tool_calls") or []
        if not calls or any(c["function"]["name"] not in mcp.tools for c in calls) or finish == "length":
            break  # an answer, a call for the client to run, or calls cut short by max_tokens
        if round_no == max_rounds:
            logger.warning("MCP: the model still calls tools after %d rounds; its last calls are returned", max_rounds)
            break
        results = await _run_calls(mcp, calls)
        ran += results
        turn = [ChatMessage.model_validate({k: v for k, v in message.items() if k != "reasoning_content"})]
        turn += [ChatMessage(role="tool", tool_call_id=r["id"], content=r["result"]) for r in results]
        # A forced call is satisfied once: the next rounds may answer in text.
        choice = body.tool_choice if body.tool_choice in (None, "auto") else "auto"
        body = body.model_copy(update={"messages": list(body.messages) + turn, "tool_choice": choice})
    message["mcp_calls"] = ran
    use = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached},
    }
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        events = _as_stream(rid, created, state.model_name, message, finish, use if include_usage else None)
        return StreamingResponse(guarded(events, rid), media_type="text/event-stream")
    return {
        "id": rid,
        "object": "chat.completion",
        "created": created,
        "model": state.model_name,
        "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": finish}],
        "usage": use,
    }


async def _as_stream(
    rid: str, created: int, model: str, message: dict[str, Any], finish: str | None, use: dict | None
) -> AsyncIterator[str]:
    base = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model}

    def chunk(delta: dict[str, Any], finish_reason: str | None = None) -> str:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        return sse({**base, "choices": [choice]})

    yield chunk({"role": "assistant", "content": ""})
    delta: dict[str, Any] = {"mcp_calls": message["mcp_calls"]}
    if message.get("reasoning_content"):
        delta["reasoning_content"] = message["reasoning_content"]
    if message.get("content"):
        delta["content"] = message["content"]
    if message.get("tool_calls"):
        delta["tool_calls"] = [{"index": i, **c} for i, c in enumerate(message["tool_calls"])]
    yield chunk(delta)
    yield chunk({}, finish)
    if use is not None:
        yield sse({**base, "choices": [], "usage": use})
    yield sse("[DONE]")
