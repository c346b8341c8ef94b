"""Embeddings (`--task embed`): prompts pooled into vectors instead of continued.

The shape: each input is one Sequence that the ordinary scheduler runs like any prompt (token
budget, chunked prefill, preemption by recompute, KV blocks from the one pool, freed when it
ends) but flagged `cacheable=False`: it is never looked up in nor published to the prefix cache.
It never decodes: the engine asks the backend for pooled final hidden states
(backends/base.EmbeddingBackend.embed with one PoolingRow per sequence that needs them) instead
of a sampled token, and the sequence finishes after its last chunk. Mean pooling sums each chunk's
states as it runs and divides at the end; a chunk at position 0 restarts the sum (a preempted
input is recomputed from its start). A bidirectional encoder (BERT) attends over its whole input
at once, so the scheduler runs its inputs in one piece (SchedulerConfig.whole_prompts).

A model serves generation or embeddings, never both: each side refuses the other's requests in
one line naming the task served. Vectors are float32 and L2-normalized.
"""

from __future__ import annotations

import dataclasses
import logging
import uuid
from dataclasses import dataclass
from typing import Any

import numpy as np

from lantern.app.config import EngineConfig
from lantern.app.engine.batch import build_batch
from lantern.app.engine.contract import ModelSpec, PoolingRow, ScheduledBatch
from lantern.app.engine.errors import InvalidRequestError, RequestFailedError
from lantern.app.engine.sampling_params import SamplingParams
from lantern.app.engine.scheduler import SchedulerOutput
from lantern.app.engine.sequence import Sequence

logger = logging.getLogger(__name__)

_PARAMS = SamplingParams(max_tokens=1)  # never sampled: build_batch reads a few fields of it


@dataclass
class EmbeddingOutput:
    request_id: str
    embedding: np.ndarray | None  # float32 [Embedder.size], L2-normalized; None when aborted or failed
    num_prompt_tokens: int
    finished: bool = True
    error: str | None = None  # set when the engine failed this input


def wrong_task(served: str, model: str) -> InvalidRequestError:
    """The 400 for a request of the task this model does not serve."""
    if served == "embed":
        why = f"this server serves embeddings with {model} (task embed): use /v1/embeddings or serve --task generate"
    else:
        why = f"this server serves text generation with {model} (task generate): embeddings need --task embed"
    return InvalidRequestError(why, param="model", code="wrong_task")


def embedding_task(config: EngineConfig, spec: ModelSpec) -> tuple[str, str | None]:
    """("generate", None) or ("embed", pooling) for the model being loaded. A decoder serving
    embeddings never runs its head, so it is not loaded (Qwen3-Embedding-8B ships none)."""
    from lantern.app.models.pooling import resolve_task

    task, pooling = resolve_task(config.task, config.pooling, spec)
    if task == "embed":
        if config.backend_options.tensor_parallel_size > 1:
            raise ValueError("embeddings (--task embed) with tensor parallelism are not implemented")
        if spec.config.encoder is None:
            spec.config = dataclasses.replace(spec.config, tie_word_embeddings=True)
    return task, pooling


@dataclass
class _Pending:
    seq: Sequence
    pooled: np.ndarray | None = None  # the pool so far: a running sum (mean), the [CLS] or last state


class Embedder:
    """The engine's embedding side: pending inputs, their partial pools, the pooled outputs."""

    def __init__(self, pooling: str, engine: Any, dense: list[Any] | None = None):
        from lantern.backends.base import EmbeddingBackend

        if not isinstance(engine.backend, EmbeddingBackend):
            raise ValueError(f"the {engine.backend.name} backend cannot compute embeddings")
        self.pooling = pooling
        self.engine = engine
        self.dense = list(dense or [])  # st_dense.DenseLayer: the folder's projections after the pooling
        self.size = self.dense[-1].weight.shape[0] if self.dense else engine.model_config.hidden_size
        self.pending: dict[str, _Pending] = {}
        if engine.model_config.encoder is not None:
            cfg = engine.scheduler.config
            cfg.whole_prompts = True  # any input up to the context fits one step
            cfg.prefill_chunk_size = max(cfg.prefill_chunk_size, engine.max_model_len)
            cfg.max_num_batched_tokens = max(cfg.max_num_batched_tokens, engine.max_model_len)

    @property
    def has_work(self) -> bool:
        return bool(self.pending)

    def validate(self, ids: list[int]) -> None:
        """An input the model can embed: non-empty ids of its vocabulary, at most its context."""
        vocab, limit = self.engine.vocab_size, self.engine.max_model_len
        if not ids:
            raise InvalidRequestError("input must not be empty", param="input")
        if any(type(t) is not int or not 0 <= t < vocab for t in ids):
            raise InvalidRequestError(f"input token ids must be integers in [0, {vocab})", param="input")
        if len(ids) > limit:
            raise InvalidRequestError(
                f"input is {len(ids)} tokens; this model's context is {limit} tokens",
                param="input",
                code="context_length_exceeded",
            )

    def add(self, request_id: str, ids: list[int]) -> None:
        if request_id in self.pending:
            raise InvalidRequestError(f"request_id {request_id!r} is already in use", param="request_id")
        seq = Sequence(request_id, list(ids), _PARAMS, cacheable=False)
        self.pending[request_id] = _Pending(seq)
        self.engine.scheduler.add(seq)

    def abort(self, request_id: str, error: str | None = None) -> EmbeddingOutput | None:
        entry = self.pending.pop(request_id, None)
        if entry is None:
            return None
        seq = entry.seq
        self.engine.scheduler.finish(seq, "abort" if error is None else "error")
        return EmbeddingOutput(request_id, None, seq.num_prompt_tokens, error=error)

    def _rows(self, sched: SchedulerOutput) -> list[PoolingRow]:
        rows = []
        for i, item in enumerate(sched.scheduled):
            if self.pooling == "mean":
                rows.append(PoolingRow(i, "sum"))
            elif self.pooling == "cls" and item.seq.num_computed_tokens == 0:
                rows.append(PoolingRow(i, "first"))
            elif self.pooling == "last" and item.samples:
                rows.append(PoolingRow(i, "last"))
        return rows

    def execute(self, sched: SchedulerOutput) -> tuple[ScheduledBatch, Any]:
        """The step's forward pass; changes no state (the engine may retry it sequence by sequence)."""
        batch = build_batch(sched, self.engine.config.block_size, {})
        rows = self._rows(sched)
        return batch, (rows, self.engine.backend.embed(batch, rows))

    def process(self, sched: SchedulerOutput, batch: ScheduledBatch, result: Any) -> list[EmbeddingOutput]:
        rows, vectors = result
        got = {row.seq_index: np.asarray(v, dtype=np.float32) for row, v in zip(rows, vectors)}
        # Read before after_step advances them: where each chunk starts, and which end their input.
        starts = [item.seq.num_computed_tokens == 0 for item in sched.scheduled]
        ends = [item.samples for item in sched.scheduled]
        self.engine.scheduler.after_step(sched)
        stats = self.engine.stats
        stats.steps += 1
        outputs = []
        for i, item in enumerate(sched.scheduled):
            entry = self.pending.get(item.seq.request_id)
            if entry is None or item.seq.is_finished:
                continue
            if i in got:
                before = None if starts[i] else entry.pooled  # a chunk at 0 restarts (recompute)
                entry.pooled = got[i] if before is None else before + got[i]
            if not ends[i]:
                continue
            assert entry.pooled is not None, "an input ended without its pooled states"
            seq = entry.seq
            vector = entry.pooled / seq.num_prompt_tokens if self.pooling == "mean" else entry.pooled
            for layer in self.dense:
                vector = layer(vector)
            vector = (vector / max(float(np.linalg.norm(vector)), 1e-12)).astype(np.float32)
            del self.pending[seq.request_id]
            self.engine.scheduler.finish(seq, "stop")
            stats.prompt_tokens += seq.num_prompt_tokens
            stats.requests_finished += 1
            outputs.append(EmbeddingOutput(seq.request_id, vector, seq.num_prompt_tokens))
        return outputs


def require_embedder(engine: Any) -> Embedder:
    """The engine's Embedder; a 400 naming the task when the model serves generation."""
    if engine.embedder is None:
        raise wrong_task("generate", engine.model_name)
    return engine.embedder


def embed_offline(engine: Any, prompts: list[str | list[int]]) -> list[EmbeddingOutput]:
    """LLM.embed: every input to the end on the calling thread; RequestFailedError if one failed."""
    embedder = require_embedder(engine)
    ids = [engine.tokenize_prompt(p) for p in prompts]
    for one in ids:
        embedder.validate(one)
    rids = [uuid.uuid4().hex for _ in ids]
    final: dict[str, EmbeddingOutput] = {}
    try:
        for rid, one in zip(rids, ids):
            embedder.add(rid, one)
        while len(final) < len(rids):
            for out in engine.step():
                final[out.request_id] = out
    finally:
        for rid in rids:
            if rid not in final:
                engine.abort_request(rid)
    errors = [final[rid].error for rid in rids if final[rid].error]
    if errors:
        raise RequestFailedError(errors[0])
    return [final[rid] for rid in rids]
