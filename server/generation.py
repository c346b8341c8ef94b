"""Shared request plumbing for the generation routes: state, validation, metrics, SSE, merging."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from fastapi import Request

from lantern.app.engine import (
    AsyncEngine,
    InvalidRequestError,
    RequestOutput,
    SamplingParams,
    TokenLogprob,
)
from lantern.server import tenancy
from lantern.server.errors import APIError, ClientDisconnected, engine_error, error_body
from lantern.server.metrics import ServerMetrics

logger = logging.getLogger(__name__)


@dataclass
class ServerState:
    engine: AsyncEngine
    model_name: str
    metrics: ServerMetrics
    max_waiting: int = 1024
    max_n: int = 128  # choices per request: n x number of prompts (ServerSettings.max_n)

    def check_model(self, model: str | None) -> None:
        if model is not None and model != self.model_name:
            raise APIError(
                404,
                f"The model `{model}` does not exist; this server serves `{self.model_name}`.",
                param="model",
                code="model_not_found",
            )

    def check_capacity(self) -> None:
        reason = self.engine.dead_reason
        if reason is not None:  # before a stream's 200 goes out: say it with the status
            raise APIError(503, f"the engine has stopped and cannot serve requests: {reason}", code="engine_dead")
        if self.engine.stats()["num_waiting"] >= self.max_waiting:
            raise APIError(503, "the server is at capacity (waiting queue full); retry shortly")

    def check_choices(self, n: int, num_prompts: int = 1) -> None:
        """Bound the sequences one request may start, before any prompt is tokenized."""
        if n * num_prompts > self.max_n:
            per = f" x {num_prompts} prompts" if num_prompts > 1 else ""
            raise APIError(
                400,
                f"n ({n}){per} asks for {n * num_prompts} choices; this server allows at most {self.max_n} per request",
                param="n",
            )


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def validated(state: ServerState, ids: list[int], params: SamplingParams, prompt_param: str = "prompt") -> list[int]:
    """Check prompt ids and params against the model before anything is queued, so a bad request
    is a 400 even when it asked for a stream (whose 200 goes out before the engine sees it)."""
    try:
        state.engine.validate(ids, params)
    except InvalidRequestError as exc:
        if exc.param == "prompt":  # the engine's name for the prompt; chat calls it messages
            exc.param = prompt_param
        raise
    return ids


async def generate(
    state: ServerState,
    ids: list[int],
    params: SamplingParams,
    request_id: str,
    request: Request,
    cache_salt: str | None,
) -> AsyncIterator[RequestOutput]:
    """AsyncEngine.generate in this tenant's cache namespace, plus latency metrics."""
    m = state.metrics
    start = time.monotonic()
    last: float | None = None
    salt = tenancy.cache_salt_for(request, cache_salt)
    # The routes ran validated() on these ids: the prompt is checked once.
    stream = state.engine.generate(ids, params, request_id, prompt_token_ids=ids, cache_salt=salt, validated=True)
    async for out in stream:
        now = time.monotonic()
        new_tokens = sum(len(o.token_ids_delta) for o in out.outputs)
        if new_tokens:
            if last is None:
                m.ttft.observe(now - start)
            else:
                m.itl.observe((now - last) / new_tokens)
            last = now
        if out.finished:
            m.e2e.observe(now - start)
            for o in out.outputs:
                m.requests.labels(m.model, o.finish_reason or "abort").inc()
        yield out


async def merge(streams: list[AsyncIterator[RequestOutput]]) -> AsyncIterator[tuple[int, RequestOutput]]:
    """Interleave several requests' outputs as they come; cancelling this cancels them all."""
    if len(streams) == 1:
        async for out in streams[0]:
            yield 0, out
        return
    queue: asyncio.Queue = asyncio.Queue()
    done = object()

    async def pump(i: int, stream: AsyncIterator[RequestOutput]) -> None:
        try:
            async for out in stream:
                await queue.put((i, out))
        except Exception as exc:
            await queue.put((i, exc))
        finally:
            await queue.put((i, done))

    tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(streams)]
    remaining = len(tasks)
    try:
        while remaining:
            i, item = await queue.get()
            if item is done:
                remaining -= 1
            elif isinstance(item, Exception):
                raise item
            else:
                yield i, item
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def collect(
    stream: AsyncIterator[tuple[int, RequestOutput]], request: Any, poll_s: float = 0.25
) -> dict[int, RequestOutput]:
    """Run a non-streaming request to the end, aborting it if the client goes away meanwhile."""
    finals: dict[int, RequestOutput] = {}

    async def consume() -> None:
        async for i, out in stream:
            finals[i] = out

    task = asyncio.create_task(consume())
    left = False
    try:
        while not task.done():
            await asyncio.wait({task}, timeout=poll_s)
            if not task.done() and await request.is_disconnected():
                task.cancel()  # closing the streams aborts their requests in the engine
                left = True
                break
        if left:
            with contextlib.suppress(asyncio.CancelledError):
                await task
            raise ClientDisconnected("the client left before the reply was complete")
        await task
    finally:
        if not task.done():
            task.cancel()
    return finals


def usage(prompt_lens: list[int], outputs: list[RequestOutput], cached: int) -> dict:
    prompt = sum(prompt_lens)
    completion = sum(o.num_generated_tokens for o in outputs)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    }


def token_text(tokenizer: Any, token_id: int) -> str:
    return tokenizer.decode([token_id])


def chat_logprobs(tokenizer: Any, lps: list[TokenLogprob]) -> dict:
    def entry(tid: int, lp: float) -> dict:
        t = token_text(tokenizer, tid)
        return {"token": t, "logprob": lp, "bytes": list(t.encode("utf-8"))}

    return {
        "content": [
            {**entry(lp.token_id, lp.logprob), "top_logprobs": [entry(t, v) for t, v in lp.top.items()]} for lp in lps
        ]
    }


def completion_logprobs(tokenizer: Any, lps: list[TokenLogprob], offset: int = 0) -> dict:
    tokens = [token_text(tokenizer, lp.token_id) for lp in lps]
    offsets, pos = [], offset
    for t in tokens:
        offsets.append(pos)
        pos += len(t)
    return {
        "tokens": tokens,
        "token_logprobs": [lp.logprob for lp in lps],
        "top_logprobs": [{token_text(tokenizer, t): v for t, v in lp.top.items()} for lp in lps],
        "text_offset": offsets,
    }


def echo_logprobs(
    tokenizer: Any, prompt_ids: list[int], scored: list[TokenLogprob | None] | None, generated: list[TokenLogprob]
) -> dict:
    """A completion's logprobs object with the echoed prompt's tokens first (OpenAI's echo with logprobs): each
    prompt token's logprob given those before it (None for the first), then the generated tokens', text offsets
    counted over both. A logprob of -inf (a token the model's head cannot produce) is sent as -9999.0, as vLLM does:
    JSON has no infinity."""
    tokens = [token_text(tokenizer, t) for t in prompt_ids]
    offsets = list(itertools.accumulate((len(t) for t in tokens[:-1]), initial=0))
    lps = scored or [None] * len(prompt_ids)
    then = completion_logprobs(tokenizer, generated, sum(map(len, tokens)))
    return {
        "tokens": tokens + then["tokens"],
        "token_logprobs": [None if lp is None else max(lp.logprob, -9999.0) for lp in lps] + then["token_logprobs"],
        "top_logprobs": [
            None if lp is None else {token_text(tokenizer, t): max(v, -9999.0) for t, v in lp.top.items()} for lp in lps
        ]
        + then["top_logprobs"],
        "text_offset": offsets + then["text_offset"],
    }


def vllm_prompt_logprobs(tokenizer: Any, scored: list[TokenLogprob | None] | None, k: int) -> list[dict | None]:
    """vLLM's prompt_logprobs: per prompt position None (the first) or {token id: {logprob, rank, decoded_token}}
    for the prompt's token and the k most likely there (-inf sent as -9999.0, as vLLM does)."""
    out: list[dict | None] = []
    for lp in scored or []:
        if lp is None:
            out.append(None)
            continue
        text = token_text(tokenizer, lp.token_id)
        entry = {str(lp.token_id): {"logprob": max(lp.logprob, -9999.0), "rank": lp.rank, "decoded_token": text}}
        for rank, (t, v) in enumerate(sorted(lp.top.items(), key=lambda kv: -kv[1])[:k], start=1):
            entry.setdefault(
                str(t), {"logprob": max(v, -9999.0), "rank": rank, "decoded_token": token_text(tokenizer, t)}
            )
        out.append(entry)
    return out


def sse(data: dict | str) -> str:
    payload = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)
    return f"data: {payload}\n\n"


async def guarded(events: AsyncIterator[str], request_id: str) -> AsyncIterator[str]:
    """An SSE body that always ends well-formed: if producing it fails (the engine failed this
    request, the engine died, a bug here), the client gets an error event and then [DONE], as
    OpenAI's streams do, instead of a connection cut mid-body."""
    try:
        async for event in events:
            yield event
    except Exception as exc:
        err = engine_error(exc)
        logger.warning("stream %s failed (%d): %s", request_id, err.status, err.message)
        yield sse(error_body(err.status, err.message, err.param, err.code))
        yield sse("[DONE]")
