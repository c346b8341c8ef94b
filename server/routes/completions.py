"""POST /v1/completions: prompt as a string, a list of strings, token ids, or lists of token ids."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse

from lantern.app.engine import RequestOutput
from lantern.server.generation import (
    ServerState,
    collect,
    completion_logprobs,
    echo_logprobs,
    generate,
    guarded,
    merge,
    new_id,
    sse,
    usage,
    validated,
    vllm_prompt_logprobs,
)
from lantern.server.protocol import CompletionRequest
from lantern.server.structured import compile_structured

router = APIRouter()


@router.post("/v1/completions")
async def completions(body: CompletionRequest, request: Request):
    state: ServerState = request.app.state.lantern
    state.check_model(body.model)
    params = body.sampling_params()
    prompts = body.prompts()
    state.check_choices(params.n, len(prompts))  # before tokenizing: a huge prompt list costs nothing
    await compile_structured(state.engine, params)  # off the event loop; an invalid grammar is a 400
    prompt_ids = [validated(state, state.engine.encode(p) if isinstance(p, str) else list(p), params) for p in prompts]
    state.check_capacity()
    rid = new_id("cmpl")
    created = int(time.time())
    streams = [generate(state, ids, params, f"{rid}-{i}", request, body.cache_salt) for i, ids in enumerate(prompt_ids)]
    tokenizer = state.engine.tokenizer
    echo = [tokenizer.decode(ids) if body.echo else "" for ids in prompt_ids]
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        events = _stream(state, streams, rid, created, prompt_ids, params.n, body, echo, include_usage)
        return StreamingResponse(guarded(events, rid), media_type="text/event-stream")
    finals = await collect(merge(streams), request)
    choices = []
    for i in range(len(prompts)):
        for o in finals[i].outputs:
            choices.append(
                {
                    "index": i * params.n + o.index,
                    "text": echo[i] + o.text,
                    "logprobs": _logprobs(tokenizer, body, prompt_ids[i], finals[i], o.logprobs, len(echo[i])),
                    "finish_reason": o.finish_reason,
                    "stop_reason": o.stop_reason,
                    **_prompt_logprobs(tokenizer, body, finals[i]),
                }
            )
    outs = [finals[i] for i in range(len(prompts))]
    return {
        "id": rid,
        "object": "text_completion",
        "created": created,
        "model": state.model_name,
        "choices": choices,
        "usage": usage([len(x) for x in prompt_ids], outs, sum(o.num_cached_tokens for o in outs)),
    }


async def _stream(
    state: ServerState,
    streams,
    rid: str,
    created: int,
    prompt_ids: list[list[int]],
    n: int,
    body: CompletionRequest,
    echo: list[str],
    include_usage: bool,
) -> AsyncIterator[str]:
    tokenizer = state.engine.tokenizer
    base = {"id": rid, "object": "text_completion", "created": created, "model": state.model_name}
    sent_echo: set[int] = set()
    done: set[int] = set()  # outputs repeat finished choices; each finishes exactly once
    finals: dict[int, RequestOutput] = {}
    async for i, out in merge(streams):
        finals[i] = out
        for o in out.outputs:
            index = i * n + o.index
            if index in done:
                continue
            first = body.echo and index not in sent_echo  # (with its prompt's logprobs, even if its text is empty)
            text = echo[i] + o.text_delta if first else o.text_delta
            if not (text or o.token_ids_delta or o.finished or first):
                continue
            if first:
                sent_echo.add(index)
            if first:  # the echoed prompt's logprobs come with it
                lps = _logprobs(tokenizer, body, prompt_ids[i], out, o.logprobs_delta, len(echo[i]))
            elif body.logprobs is not None and o.logprobs_delta:
                lps = completion_logprobs(tokenizer, o.logprobs_delta)
            else:
                lps = None
            finish = o.finish_reason if o.finished else None
            if o.finished:
                done.add(index)
            yield sse({**base, "choices": [{"index": index, "text": text, "logprobs": lps, "finish_reason": finish}]})
    if include_usage and finals:
        outs = list(finals.values())
        yield sse(
            {
                **base,
                "choices": [],
                "usage": usage([len(x) for x in prompt_ids], outs, sum(o.num_cached_tokens for o in outs)),
            }
        )
    yield sse("[DONE]")


def _logprobs(tokenizer, body: CompletionRequest, prompt_ids: list[int], out: RequestOutput, lps, echoed: int):
    """A choice's logprobs object: None unless asked for; with echo, the prompt's tokens and theirs first."""
    if body.logprobs is None:
        return None
    if body.echo:
        return echo_logprobs(tokenizer, prompt_ids, out.prompt_logprobs, lps or [])
    return completion_logprobs(tokenizer, lps or [], echoed)


def _prompt_logprobs(tokenizer, body: CompletionRequest, out: RequestOutput) -> dict:
    """vLLM's per-choice prompt_logprobs, when asked for."""
    if body.prompt_logprobs is None:
        return {}
    return {"prompt_logprobs": vllm_prompt_logprobs(tokenizer, out.prompt_logprobs, body.prompt_logprobs)}
