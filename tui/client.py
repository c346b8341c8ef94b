"""One small client interface for the terminal chat: an in-process engine or a running server.

Both stream reply pieces for a list of chat messages, the model's reasoning apart from its answer,
and report live stats with the same keys (tokens are counted by the chat app itself).
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

import httpx

from lantern.app.engine import (
    AsyncEngine,
    CompletionOutput,
    EngineDeadError,
    InvalidRequestError,
    RequestFailedError,
    SamplingParams,
    reasoning,
)


@dataclass
class ChatSettings:
    system_prompt: str = ""
    temperature: float = 0.7
    top_p: float = 1.0
    max_tokens: int = 512


class ChatDelta(NamedTuple):
    """One streamed piece of a reply: answer text, and reasoning (`<think>` text / the server's
    reasoning_content), which is shown apart and never sent back to the model."""

    content: str = ""
    reasoning: str = ""


class ChatError(RuntimeError):
    """A failure to show the user (unreachable server, bad key, context too long...)."""


class ChatClient(Protocol):
    model_name: str

    def stream_chat(self, messages: list[dict], settings: ChatSettings) -> AsyncIterator[ChatDelta]: ...

    async def stats(self) -> dict: ...

    async def close(self) -> None: ...


class EngineClient:
    """Runs the model in this process through the public AsyncEngine API."""

    def __init__(self, engine: AsyncEngine, model_name: str | None = None):
        task = getattr(engine, "task", "generate")
        if task != "generate":  # an embedder, reranker or classifier: say so once, before any message
            engine.shutdown()
            served = {"embed": "embeddings", "score": "relevance scores", "classify": "classification"}.get(task, task)
            raise ChatError(
                f"{engine.model_name} serves {served} (task {task}), not chat: serve it with `lantern serve` "
                "for its endpoints, or pick a model that generates"
            )
        self.engine = engine
        self.model_name = model_name or engine.model_name

    async def stream_chat(self, messages: list[dict], settings: ChatSettings) -> AsyncIterator[ChatDelta]:
        request_id = uuid.uuid4().hex
        try:
            # Tokenized once here; the engine validates the ids (length, sampling bounds).
            ids = self.engine.encode_chat(messages)
            params = SamplingParams(
                temperature=settings.temperature, top_p=settings.top_p, max_tokens=settings.max_tokens
            )
            reasoner = self._reasoner(ids, params)
            async for out in self.engine.generate(ids, params, request_id, prompt_token_ids=ids):
                text = self._visible(out.outputs[0], params)
                thought, content = reasoner.feed(text) if reasoner else ("", text)
                if thought or content:
                    yield ChatDelta(content, thought)
            if reasoner:  # a held-back tail (whitespace, a partial marker) belongs to the reply
                thought, content = reasoner.finish()
                if thought or content:
                    yield ChatDelta(content, thought)
        except InvalidRequestError as exc:  # prompt too long, a bad setting, a template error
            raise ChatError(exc.message) from None
        except RequestFailedError as exc:  # this reply failed inside the engine; the engine lives on
            raise ChatError(f"the reply failed: {exc}") from None
        except EngineDeadError as exc:  # nothing more can run: say so rather than crash the app
            raise ChatError(f"{exc}; restart `lantern chat` to go on") from None

    def _reasoner(self, ids: list[int], params: SamplingParams) -> reasoning.ReasoningParser | None:
        """A reasoning splitter when the chat template writes reasoning blocks, started inside one
        when the rendered prompt opened it (the same rule as the server's chat route)."""
        markup = reasoning.detect(self.engine.chat_template)
        if markup is None:
            return None
        state = reasoning.prompt_state(self.engine.tokenizer, ids, markup)
        if state == "closed":  # thinking switched off by the template: all answer
            return None
        if reasoning.markers_are_special(self.engine.tokenizer, markup):
            params.skip_special_tokens = False  # else the markers vanish from the decoded text
        return reasoning.ReasoningParser(in_reasoning=state == "open", markup=markup)

    def _visible(self, out: CompletionOutput, params: SamplingParams) -> str:
        """The text delta without the end-of-turn token's text, which shows once special tokens
        are decoded for the markers' sake."""
        text = out.text_delta
        if params.skip_special_tokens or not (out.finished and out.finish_reason == "stop" and out.token_ids):
            return text
        if isinstance(out.stop_reason, str):
            return text  # a stop string: the engine already cut it
        last = self.engine.tokenizer.decode([out.token_ids[-1]], skip_special_tokens=False)
        return text[: -len(last)] if last and text.endswith(last) else text

    async def stats(self) -> dict:
        if self.engine.dead_reason is not None:  # shown in the app even before the next prompt
            raise ChatError(f"the engine has stopped: {self.engine.dead_reason}; restart `lantern chat` to go on")
        s = self.engine.stats()
        return {"kv_usage": s["kv_usage"], "running": s["num_running"], "waiting": s["num_waiting"]}

    async def close(self) -> None:
        self.engine.shutdown()


class HTTPClient:
    """Talks to a running `lantern serve` (or any OpenAI-compatible server) over HTTP."""

    def __init__(self, url: str, api_key: str | None = None, timeout: float = 600.0):
        self.base = url.rstrip("/").removesuffix("/v1")
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.http = httpx.AsyncClient(base_url=self.base, headers=headers, timeout=timeout)
        self.model_name = ""

    async def connect(self) -> None:
        try:
            r = await self.http.get("/v1/models")
        except httpx.HTTPError as exc:
            raise ChatError(f"cannot reach {self.base}: {exc}") from None
        if r.status_code != 200:
            raise ChatError(_error_message(r))
        self.model_name = r.json()["data"][0]["id"]

    async def stream_chat(self, messages: list[dict], settings: ChatSettings) -> AsyncIterator[ChatDelta]:
        body = {
            "model": self.model_name,
            "messages": messages,
            "stream": True,
            "temperature": settings.temperature,
            "top_p": settings.top_p,
            "max_tokens": settings.max_tokens,
        }
        try:
            async with self.http.stream("POST", "/v1/chat/completions", json=body) as r:
                if r.status_code != 200:
                    await r.aread()
                    raise ChatError(_error_message(r))
                # A server that does not split reasoning out leaves `<think>` in the content:
                # split it here, the same way, so history never carries it.
                inline = reasoning.ReasoningParser()
                async for line in r.aiter_lines():
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    choices = json.loads(line[6:]).get("choices") or [{}]
                    delta: dict[str, Any] = choices[0].get("delta") or {}
                    thought, content = inline.feed(delta.get("content") or "")
                    piece = ChatDelta(content, (delta.get("reasoning_content") or "") + thought)
                    if piece.content or piece.reasoning:
                        yield piece
                thought, content = inline.finish()
                if thought or content:
                    yield ChatDelta(content, thought)
        except httpx.HTTPError as exc:
            raise ChatError(f"connection to {self.base} failed: {exc}") from None

    async def stats(self) -> dict:
        try:
            text = (await self.http.get("/metrics")).text
        except httpx.HTTPError:
            return {}

        def read(name: str) -> float | None:
            m = re.search(rf"^lantern:{name}\{{[^}}]*\}} ([0-9.e+-]+)", text, re.M)
            return float(m.group(1)) if m else None

        return {
            "kv_usage": read("kv_cache_usage_perc"),
            "running": read("num_requests_running"),
            "waiting": read("num_requests_waiting"),
        }

    async def close(self) -> None:
        await self.http.aclose()


def _error_message(r: httpx.Response) -> str:
    try:
        message = r.json()["error"]["message"]
    except (ValueError, KeyError, TypeError):
        message = r.text[:200]
    if r.status_code == 401:
        return f"the server needs a valid API key (--api-key): {message}"
    return f"server answered {r.status_code}: {message}"
