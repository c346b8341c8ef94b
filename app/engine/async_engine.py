"""AsyncEngine: one background thread runs engine steps; callers get async iterators of outputs.

Adds and aborts are queued and applied between steps, so the engine is only ever touched by its
own thread. A caller that stops iterating (client disconnect) aborts its request, which frees its
KV blocks before the next step.
"""
from __future__ import annotations

import asyncio
import logging
import threading
import uuid
from collections import deque
from typing import Any, AsyncIterator

from app.config import EngineConfig
from app.engine.engine import LLMEngine, Prompt
from app.engine.request import RequestOutput
from app.engine.sampling_params import SamplingParams

logger = logging.getLogger(__name__)


class AsyncEngine:
    def __init__(self, engine: LLMEngine | None = None, **config: Any):
        self.engine = engine or LLMEngine(EngineConfig(**config))
        self._commands: deque[tuple[str, Any]] = deque()
        self._queues: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue]] = {}
        self._wake = threading.Event()
        self._stop = False
        self._thread = threading.Thread(target=self._run, name="lantern-engine", daemon=True)
        self._thread.start()

    @property
    def tokenizer(self) -> Any:
        return self.engine.tokenizer

    async def generate(
        self, prompt: Prompt, params: SamplingParams | None = None, request_id: str | None = None,
        prompt_token_ids: list[int] | None = None,
    ) -> AsyncIterator[RequestOutput]:
        """Yields a RequestOutput each time the request makes progress; the last has finished=True.

        Raises ValueError at once for an invalid request (bad prompt, too long)."""
        params = params or SamplingParams()
        request_id = request_id or uuid.uuid4().hex
        ids = prompt_token_ids if prompt_token_ids is not None else self.engine.tokenize_prompt(prompt)
        self.engine.validate(ids, params)
        queue: asyncio.Queue = asyncio.Queue()
        self._queues[request_id] = (asyncio.get_running_loop(), queue)
        self._submit("add", (request_id, prompt, params, ids))
        finished = False
        try:
            while True:
                item = await queue.get()
                if isinstance(item, Exception):
                    raise item
                yield item
                if item.finished:
                    finished = True
                    return
        finally:
            self._queues.pop(request_id, None)
            if not finished:
                self._submit("abort", request_id)

    def abort(self, request_id: str) -> None:
        self._submit("abort", request_id)

    def stats(self) -> dict:
        return self.engine.stats_snapshot()

    def shutdown(self) -> None:
        self._stop = True
        self._wake.set()
        self._thread.join(timeout=10)
        self.engine.shutdown()

    # ---- engine thread -------------------------------------------------------------------
    def _submit(self, kind: str, payload: Any) -> None:
        self._commands.append((kind, payload))
        self._wake.set()

    def _deliver(self, request_id: str, item: RequestOutput | Exception) -> None:
        target = self._queues.get(request_id)
        if target is not None:
            loop, queue = target
            loop.call_soon_threadsafe(queue.put_nowait, item)

    def _apply_commands(self) -> None:
        while self._commands:
            kind, payload = self._commands.popleft()
            if kind == "add":
                request_id, prompt, params, ids = payload
                try:
                    self.engine.add_request(request_id, prompt, params, prompt_token_ids=ids)
                except Exception as exc:  # validation raced with config; report to the caller
                    self._deliver(request_id, exc)
            elif kind == "abort":
                self.engine.abort_request(payload)

    def _run(self) -> None:
        while not self._stop:
            self._apply_commands()
            if not self.engine.has_unfinished_requests():
                self._wake.wait(timeout=0.5)
                self._wake.clear()
                continue
            try:
                outputs = self.engine.step()
            except Exception:
                logger.exception("engine step failed; aborting the requests in flight")
                for rid in list(self.engine.requests):
                    self.engine.abort_request(rid)
                    self._deliver(rid, RuntimeError("the engine failed while running this request"))
                continue
            for out in outputs:
                self._deliver(out.request_id, out)
