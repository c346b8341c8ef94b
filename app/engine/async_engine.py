"""AsyncEngine: one background thread runs engine steps; callers get async iterators of outputs.

Adds and aborts are queued and applied between steps, so the engine is only ever touched by its
own thread. A caller that stops iterating (client disconnect) aborts its request, which frees its
KV blocks before the next step. Every request ends: with its last output, with an abort output,
or with an exception (its own failure, or the engine loop's death, which is also reported by
`dead_reason` so a health check can say why).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import uuid
from collections import deque
from collections.abc import AsyncIterator
from typing import Any

from lantern.app.config import EngineConfig
from lantern.app.engine.embedding import EmbeddingOutput, require_embedder
from lantern.app.engine.engine import LLMEngine, Prompt
from lantern.app.engine.errors import EngineDeadError, InvalidRequestError, RequestFailedError
from lantern.app.engine.request import RequestOutput
from lantern.app.engine.sampling_params import SamplingParams, StructuredSpec

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
        self._dead: str | None = None
        self._engine: LLMEngine = engine  # type: ignore[assignment]  # set on the thread when None
        self._thread = threading.Thread(target=self._run, args=(config,), name="lantern-engine", daemon=True)
        self._thread.start()
        self._ready.wait()
        if self._load_error is not None:
            raise self._load_error

    # ---- what front ends read --------------------------------------------------------------
    @property
    def model_name(self) -> str:
        return self._engine.model_name

    @property
    def max_model_len(self) -> int:
        return self._engine.max_model_len

    @property
    def vocab_size(self) -> int:
        return self._engine.vocab_size

    @property
    def tokenizer(self) -> Any:
        return self._engine.tokenizer

    @property
    def chat_template(self) -> str | None:
        """The template chats are rendered with (--chat-template's, else the model's)."""
        return self._engine.chat_template

    @property
    def reasoning_markup(self) -> Any:
        """The reasoning markup thinking_token_budget counts in (reasoning.ReasoningMarkup, from the template)."""
        return self._engine.budgets.markup

    @property
    def backend_name(self) -> str:
        return self._engine.backend.name

    @property
    def task(self) -> str:
        """What this model serves, "generate", "embed", "score" or "classify" (the others' requests get a 400)."""
        return self._engine.task

    @property
    def embedding_size(self) -> int:
        """Length of the vectors embed() returns (the hidden size, or the last Dense module's width)."""
        embedder = self._engine.embedder
        return embedder.size if embedder is not None else self._engine.model_config.hidden_size

    @property
    def labels(self) -> list[str]:
        """A classifier's labels in id order (task classify; empty otherwise)."""
        embedder = self._engine.embedder
        return list(embedder.labels) if embedder is not None else []

    @property
    def dead_reason(self) -> str | None:
        """Why the engine loop stopped, or None while it runs."""
        return self._dead

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self._engine.tokenizer.encode(text, add_special_tokens=add_special_tokens)

    def encode_chat(
        self, messages: list[dict], add_generation_prompt: bool = True, chat_template_kwargs: dict | None = None
    ) -> list[int]:
        return self._engine.encode_chat(messages, add_generation_prompt, chat_template_kwargs)

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True, **kwargs: Any) -> str:
        return self._engine.apply_chat_template(messages, add_generation_prompt, **kwargs)

    def validate(self, prompt_ids: list[int], params: SamplingParams) -> None:
        self._engine.validate(prompt_ids, params)

    def compile_grammar(self, spec: StructuredSpec) -> None:
        """Compile (and cache) a structured-output spec on the calling thread; thread-safe."""
        self._engine.compile_grammar(spec)

    def require_task(self, task: str) -> None:
        """InvalidRequestError (param "model", code "wrong_task") unless the model serves task ("embed" or "score")."""
        require_embedder(self._engine, task)

    def validate_embedding(self, prompt_ids: list[int], task: str = "embed") -> None:
        """InvalidRequestError (param "input", or "model" when the model serves another task) for an input
        embed() refuses."""
        require_embedder(self._engine, task).validate(prompt_ids)

    def encode_pair(
        self,
        query: str,
        document: str,
        max_document_tokens: int | None = None,
        truncate: bool = True,
        instruction: str | None = None,
    ) -> tuple[list[int], list[int] | None]:
        """A cross-encoder's or reranker's input for (query, document): ids and token types (app/engine/scoring.py)."""
        from lantern.app.engine.scoring import tokenize_pair

        return tokenize_pair(self._engine, query, document, max_document_tokens, truncate, instruction)

    def stats(self) -> dict:
        return self._engine.stats_snapshot()

    # ---- requests --------------------------------------------------------------------------
    async def generate(
        self,
        prompt: Prompt,
        params: SamplingParams | None = None,
        request_id: str | None = None,
        prompt_token_ids: list[int] | None = None,
        cache_salt: str | None = None,
        validated: bool = False,
    ) -> AsyncIterator[RequestOutput]:
        """Yields a RequestOutput each time the request makes progress; the last has finished=True.

        Raises InvalidRequestError at once for an invalid request (bad prompt, too long, an id
        in use), EngineDeadError when the engine loop has stopped, RequestFailedError when the
        engine failed this request. validated=True: the caller has just run validate() on these
        very prompt_token_ids and params (a server does, to answer 400 before a stream starts),
        so they are not checked a second time."""
        if self._dead is not None or self._stop:
            raise EngineDeadError(f"the engine has stopped: {self._dead or 'the engine was shut down'}")
        params = params or SamplingParams()
        request_id = request_id or uuid.uuid4().hex
        if request_id in self._queues:
            raise InvalidRequestError(f"request_id {request_id!r} is already in use", param="request_id")
        ids = prompt_token_ids if prompt_token_ids is not None else self._engine.tokenize_prompt(prompt)
        if not (validated and prompt_token_ids is not None):
            self._engine.validate(ids, params)
        queue: asyncio.Queue = asyncio.Queue()
        target = (asyncio.get_running_loop(), queue)
        self._queues[request_id] = target
        self._submit("add", (request_id, prompt, params, ids, cache_salt))
        finished = False
        try:
            if self._dead is not None:  # the loop ended while this was queued: nobody will run it
                raise EngineDeadError(f"the engine has stopped: {self._dead}")
            while True:
                item = await queue.get()
                if isinstance(item, BaseException):
                    finished = True  # the engine already dropped it
                    raise item
                if item.error is not None:
                    finished = True
                    item.raise_error()
                yield item
                if item.finished:
                    finished = True
                    return
        finally:
            if finished or self._dead is not None:
                if self._queues.get(request_id) is target:
                    del self._queues[request_id]
            else:
                # The entry stays until the engine thread has dropped the request, so the id
                # cannot be reused meanwhile (a new caller would get this request's outputs).
                self._submit("abort", (request_id, target))

    async def embed(
        self,
        prompt_token_ids: list[int],
        request_id: str | None = None,
        token_types: list[int] | None = None,
        cache_salt: str | None = None,
    ) -> EmbeddingOutput:
        """The L2-normalized embedding of one input (task embed), a pair's score (task score: the ids and
        token_types from encode_pair) or an input's class probabilities (task classify), validated by
        validate_embedding. cache_salt: the prefix-cache namespace, as generate()'s. Raises like generate(); a
        caller cancelled while waiting aborts the input."""
        if self._dead is not None or self._stop:
            raise EngineDeadError(f"the engine has stopped: {self._dead or 'the engine was shut down'}")
        request_id = request_id or uuid.uuid4().hex
        if request_id in self._queues:
            raise InvalidRequestError(f"request_id {request_id!r} is already in use", param="request_id")
        queue: asyncio.Queue = asyncio.Queue()
        target = (asyncio.get_running_loop(), queue)
        self._queues[request_id] = target
        self._submit("embed", (request_id, list(prompt_token_ids), token_types, cache_salt))
        finished = False
        try:
            if self._dead is not None:
                raise EngineDeadError(f"the engine has stopped: {self._dead}")
            item = await queue.get()
            finished = True
            if isinstance(item, BaseException):
                raise item
            if item.error is not None:
                raise RequestFailedError(item.error)
            return item
        finally:
            if finished or self._dead is not None:
                if self._queues.get(request_id) is target:
                    del self._queues[request_id]
            else:
                self._submit("abort", (request_id, target))  # as in generate(): the id stays taken until dropped

    def abort(self, request_id: str) -> None:
        """Stop a request; its iterator then yields a final output with finish_reason "abort"."""
        self._submit("abort", (request_id, None))

    def shutdown(self) -> None:
        self._stop = True
        self._wake.set()
        self._thread.join(timeout=30)
        if self._thread.is_alive():  # a step is stuck: release the backend from here
            self._engine.shutdown()

    # ---- engine thread -------------------------------------------------------------------
    def _submit(self, kind: str, payload: Any) -> None:
        self._commands.append((kind, payload))
        self._wake.set()

    def _deliver(self, request_id: str, item: RequestOutput | BaseException) -> None:
        target = self._queues.get(request_id)
        if target is not None:
            loop, queue = target
            try:
                loop.call_soon_threadsafe(queue.put_nowait, item)
            except RuntimeError:  # the caller's event loop has closed: nobody is waiting
                pass

    def _deliver_step(self, outputs: list[RequestOutput]) -> None:
        """One wake-up per event loop per step, not one per request: with 32 streams the loop
        thread would otherwise wake 32 times a step and compete with the model for the CPU."""
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Queue, RequestOutput]]] = {}
        for out in outputs:
            target = self._queues.get(out.request_id)
            if target is not None:
                by_loop.setdefault(target[0], []).append((target[1], out))
        for loop, items in by_loop.items():
            try:
                loop.call_soon_threadsafe(_put_all, items)
            except RuntimeError:
                pass

    def _apply_commands(self) -> None:
        while self._commands:
            kind, payload = self._commands.popleft()
            if kind == "add":
                request_id, prompt, params, ids, salt = payload
                try:
                    self._engine.add_request(
                        request_id, prompt, params, prompt_token_ids=ids, cache_salt=salt, validated=True
                    )
                except Exception as exc:  # validation raced with config; report to the caller
                    self._deliver(request_id, exc)
            elif kind == "embed":
                request_id, ids, types, salt = payload
                try:
                    require_embedder(self._engine, self._engine.task).add(request_id, ids, types, salt)
                except Exception as exc:
                    self._deliver(request_id, exc)
            elif kind == "abort":
                request_id, left = payload
                final = self._engine.abort_request(request_id)
                if left is not None:  # its caller has gone: free the id
                    if self._queues.get(request_id) is left:
                        del self._queues[request_id]
                elif final is not None:
                    self._deliver(request_id, final)

    def _run(self, config: dict[str, Any]) -> None:
        try:
            if self._engine is None:
                self._engine = LLMEngine(EngineConfig.from_options(**config))
        except BaseException as exc:
            self._load_error = exc
            return
        finally:
            self._ready.set()
        try:
            self._serve()
            self._fail_all("the engine was shut down")
        except BaseException as exc:
            self._die(exc)
        finally:
            try:
                self._engine.shutdown()
            except Exception:
                logger.exception("backend shutdown failed")

    def _serve(self) -> None:
        while not self._stop:
            self._apply_commands()
            if not self._engine.has_unfinished_requests():
                self._wake.wait(timeout=0.5)
                self._wake.clear()
                continue
            self._deliver_step(self._engine.step())

    def _fail_all(self, reason: str) -> None:
        """The loop is over: every waiting caller gets EngineDeadError. Later callers see
        `_dead` in generate(), which also checks it after queueing, so none can slip between."""
        self._dead = reason
        error = EngineDeadError(f"the engine has stopped: {reason}")
        for request_id in list(self._queues):
            self._deliver(request_id, error)

    def _die(self, exc: BaseException) -> None:
        logger.critical("the engine loop stopped: %s: %s", type(exc).__name__, exc, exc_info=exc)
        self._fail_all(f"{type(exc).__name__}: {exc}")


def _put_all(items: list[tuple[asyncio.Queue, RequestOutput]]) -> None:
    for queue, item in items:
        queue.put_nowait(item)
