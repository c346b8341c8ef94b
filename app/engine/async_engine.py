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
        """Builds the engine (loads the model) on the engine thread and returns once it is ready;
        loading errors are raised here. All model work then stays on that one thread: with torch
        on a CPU, a second thread running OpenMP work (the loader) made every later step ~25%
        slower, because OpenMP stops spinning when it sees more threads than cores."""
        self._commands: deque[tuple[str, Any]] = deque()
        self._queues: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue]] = {}
        self._wake = threading.Event()
        self._stop = False
        self._ready = threading.Event()
        self._load_error: BaseException | None = None
        self.engine: LLMEngine = engine  # type: ignore[assignment]  # set on the thread when None
        self._thread = threading.Thread(target=self._run, args=(config,), name="lantern-engine", daemon=True)
        self._thread.start()
        self._ready.wait()
        if self._load_error is not None:
            raise self._load_error

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
        self._thread.join(timeout=30)
        if self._thread.is_alive():  # a step is stuck: release the backend from here
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

    def _deliver_step(self, outputs: list[RequestOutput]) -> None:
        """One wake-up per event loop per step, not one per request: with 32 streams the loop
        thread would otherwise wake 32 times a step and compete with the model for the CPU."""
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Queue, RequestOutput]]] = {}
        for out in outputs:
            target = self._queues.get(out.request_id)
            if target is not None:
                by_loop.setdefault(target[0], []).append((target[1], out))
        for loop, items in by_loop.items():
            loop.call_soon_threadsafe(_put_all, items)

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

    def _run(self, config: dict[str, Any]) -> None:
        try:
            if self.engine is None:
                self.engine = LLMEngine(EngineConfig(**config))
        except BaseException as exc:  # noqa: BLE001 - handed to the constructor's caller
            self._load_error = exc
            return
        finally:
            self._ready.set()
        try:
            self._serve()
        finally:
            self.engine.shutdown()

    def _serve(self) -> None:
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
            self._deliver_step(outputs)


def _put_all(items: list[tuple[asyncio.Queue, RequestOutput]]) -> None:
    for queue, item in items:
        queue.put_nowait(item)
