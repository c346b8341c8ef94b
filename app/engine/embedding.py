"""Embeddings (`--task embed`): prompts pooled into vectors instead of continued.

The shape: each input is one Sequence that the ordinary scheduler runs like any prompt (token
budget, chunked prefill, preemption by recompute, KV blocks from the one pool, freed when it
ends). A decoder's last-token pooled input uses the prefix cache like a prompt (in its tenant's
namespace: a shared instruction or reranker prompt is computed once); the others are flagged
`cacheable=False`: never looked up in nor published to the prefix cache.
It never decodes: the engine asks the backend for pooled final hidden states
(backends/base.EmbeddingBackend.embed with one PoolingRow per sequence that needs them) instead
of a sampled token, and the sequence finishes after its last chunk. Mean pooling sums each chunk's
states as it runs and divides at the end; a chunk at position 0 restarts the sum (a preempted
input is recomputed from its start). A bidirectional encoder (BERT) attends over its whole input
at once, so the scheduler runs its inputs in one piece (SchedulerConfig.whole_prompts).

A model serves generation, embeddings or scores, never two: each side refuses the others' requests
in one line naming the task served. Vectors are float32 and L2-normalized. A cross-encoder (task
score, app/engine/scoring.py) runs the same way on (query, document) pairs, each pair one input
with its token types, and its classifier head (app/models/score_head.py) turns the pooled state
into the score instead of the normalization.
"""

from __future__ import annotations

import dataclasses
import logging
import uuid
from collections.abc import Callable
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
# An encoder's default tokens per step: it never decodes, so a step is a batch of whole inputs, and bigger batches
# use the matmuls better (bench_embed.py, bge-reranker-base shape, 256-token pairs: 0.88x transformers' batches of
# 32 at 512 tokens a step, 1.02x at 8192). Its padded attention for 8192 tokens stays within a few hundred MB.
ENCODER_STEP_TOKENS = 8192


@dataclass
class EmbeddingOutput:
    request_id: str
    # float32 [Embedder.size]: the L2-normalized vector (task embed) or the classifier head's activated
    # logits (task score: [1], the relevance score; task classify: one probability per label); None when
    # aborted or failed
    embedding: np.ndarray | None
    num_prompt_tokens: int
    finished: bool = True
    error: str | None = None  # set when the engine failed this input
    logits: np.ndarray | None = None  # float32: a score or classifier head's logits before its activation

    @property
    def probs(self) -> list[float]:
        """A classifier's probabilities, one per label (task classify)."""
        assert self.embedding is not None, "no probabilities: the input was aborted or failed"
        return [float(p) for p in self.embedding]

    @property
    def score(self) -> float:
        """A cross-encoder's relevance score (task score)."""
        assert self.embedding is not None, "no score: the input was aborted or failed"
        return float(self.embedding[0])


def wrong_task(served: str, model: str, wanted: str = "embed") -> InvalidRequestError:
    """The 400 for a request of a task (wanted) this model does not serve (it serves `served`)."""
    if served == "embed":
        why = f"this server serves embeddings with {model} (task embed): use /v1/embeddings"
    elif served == "score":
        why = f"this server serves relevance scores with {model} (task score): use /v1/rerank or /v1/score"
    elif served == "classify":
        why = f"this server serves classification with {model} (task classify): use /classify"
    else:
        why = f"this server serves text generation with {model} (task generate)"
    needs = {
        "embed": "embeddings need a model served with --task embed",
        "score": "scores need a cross-encoder or reranker served with --task score",
        "classify": "classification needs a sequence classifier served with --task classify",
        "generate": "text generation needs a model served with --task generate",
    }[wanted]
    return InvalidRequestError(f"{why}; {needs}", param="model", code="wrong_task")


def embedding_task(config: EngineConfig, spec: ModelSpec) -> tuple[str, str | None]:
    """("generate", None) or ("embed" / "score", pooling) for the model being loaded. A decoder serving
    embeddings or scores never runs its LM head, so it is not loaded (Qwen3-Embedding-8B ships none)."""
    from lantern.app.models.pooling import resolve_task

    task, pooling = resolve_task(config.task, config.pooling, spec)
    if task != "generate":
        if config.backend_options.tensor_parallel_size > 1:
            raise ValueError(f"--task {task} with tensor parallelism is not implemented")
        if spec.config.encoder is None:
            spec.config = dataclasses.replace(spec.config, tie_word_embeddings=True)
    return task, pooling


@dataclass
class _Pending:
    seq: Sequence
    pooled: np.ndarray | None = None  # the pool so far: a running sum (mean), the [CLS] or last state
    token_types: list[int] | None = None  # a cross-encoder pair's segments (None: all 0)


# An input's pooled state -> (its output, the head's logits before the activation or None)
Finish = Callable[[np.ndarray], tuple[np.ndarray, np.ndarray | None]]


def normalized(dense: list[Any]) -> Finish:
    """An embedding's last steps: the folder's Dense projections (st_dense.DenseLayer), then the L2 norm."""

    def finish(vector: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        for layer in dense:
            vector = layer(vector)
        return (vector / max(float(np.linalg.norm(vector)), 1e-12)).astype(np.float32), None

    return finish


class Embedder:
    """The engine's embedding side: pending inputs, their partial pools, the pooled outputs.
    finish turns an input's pooled state into its output (the normalized vector, or a score head's
    activated logits, with the logits themselves); size is that output's length."""

    def __init__(self, pooling: str, engine: Any, finish: Finish, size: int):
        from lantern.backends.base import EmbeddingBackend

        if not isinstance(engine.backend, EmbeddingBackend):
            raise ValueError(f"the {engine.backend.name} backend cannot compute embeddings")
        self.pooling = pooling
        self.engine = engine
        self.finish = finish
        self.size = size
        self.pair_template: str | None = None  # task score: a prompt reranker's text around each pair
        self.labels: list[str] = []  # task classify: the classifier's labels, in id order
        self.pair_tokenizer: Any = None  # task score: scoring.pair_tokenizer's private copy, made on first use
        self.pending: dict[str, _Pending] = {}
        # A decoder's last-token pooling reads only the last position's state, which a cached prefix does not
        # change: such inputs use the prefix cache (a reranker's prompt head, an embedder's instruction, shared
        # by every input). Mean pooling needs every position's state, an encoder attends both ways, and a
        # recurrent layer's state is not snapshotted for embeddings: those inputs are never cached.
        self.prefix_cacheable = (
            pooling == "last"
            and engine.model_config.encoder is None
            and not engine.model_config.recurrent
            and engine.config.enable_prefix_caching
        )
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

    def add(
        self, request_id: str, ids: list[int], token_types: list[int] | None = None, cache_salt: str | None = None
    ) -> None:
        """Queue an input; cache_salt: its prefix-cache namespace (the tenant's, as a generation request's)."""
        if request_id in self.pending:
            raise InvalidRequestError(f"request_id {request_id!r} is already in use", param="request_id")
        if token_types is not None and len(token_types) != len(ids):
            raise InvalidRequestError("token_types must give one segment per token", param="token_types")
        salt = (cache_salt or "").encode("utf-8", "surrogatepass")
        cacheable = self.prefix_cacheable and not token_types
        seq = Sequence(request_id, list(ids), _PARAMS, cache_salt=salt, cacheable=cacheable)
        self.pending[request_id] = _Pending(seq, token_types=list(token_types) if token_types else None)
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

    def _token_types(self, sched: SchedulerOutput, batch: ScheduledBatch) -> np.ndarray | None:
        """[T] int32 segments of the batch's tokens when a scheduled input is a pair (None: all 0)."""
        entries = [self.pending.get(item.seq.request_id) for item in sched.scheduled]
        if not any(e is not None and e.token_types for e in entries):
            return None
        out = np.zeros(batch.num_tokens, dtype=np.int32)
        qs = batch.query_start_loc
        for i, entry in enumerate(entries):
            if entry is None or not entry.token_types:
                continue
            start, end = int(qs[i]), int(qs[i + 1])
            first = int(batch.positions[start])
            out[start:end] = entry.token_types[first : first + end - start]
        return out

    def execute(self, sched: SchedulerOutput) -> tuple[ScheduledBatch, Any]:
        """The step's forward pass; changes no state (the engine may retry it sequence by sequence)."""
        batch = build_batch(sched, self.engine.config.block_size, {})
        batch.token_types = self._token_types(sched, batch)
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
            vector, logits = self.finish(vector)
            del self.pending[seq.request_id]
            self.engine.scheduler.finish(seq, "stop")
            stats.prompt_tokens += seq.num_prompt_tokens
            stats.requests_finished += 1
            outputs.append(EmbeddingOutput(seq.request_id, vector, seq.num_prompt_tokens, logits=logits))
        return outputs


def make_embedder(engine: Any, spec: ModelSpec, task: str, pooling: str) -> Embedder:
    """The engine's Embedder for task embed (the folder's Dense projections, then the L2 norm) or score (the
    checkpoint's classifier head)."""
    if task in ("score", "classify"):
        from lantern.app.models.score_head import load_score_head

        head = load_score_head(spec, engine.tokenizer, task)
        embedder = Embedder(head.pooling, engine, head.outputs, head.num_labels)
        embedder.pair_template, embedder.labels = head.template, list(head.labels or [])
        return embedder
    from lantern.app.models.pooling import embedding_folder
    from lantern.app.models.st_dense import dense_layers, gguf_dense_layers

    if spec.weight_format == "gguf":  # (EmbeddingGemma's dense_2 / dense_3 tensors)
        dense = gguf_dense_layers(spec.weight_files[0])
    else:
        dense = dense_layers(embedding_folder(spec), engine.model_config.hidden_size)
    size = dense[-1].weight.shape[0] if dense else engine.model_config.hidden_size
    return Embedder(pooling, engine, normalized(dense), size)


def require_embedder(engine: Any, task: str = "embed") -> Embedder:
    """The engine's Embedder when the model serves `task` (embed or score); a 400 naming the task served if not."""
    if engine.embedder is None or engine.task != task:
        raise wrong_task(engine.task, engine.model_name, task)
    return engine.embedder


def embed_offline(engine: Any, prompts: list[str | list[int]], task: str = "embed") -> list[EmbeddingOutput]:
    """LLM.embed / LLM.classify: every input to the end on the calling thread; RequestFailedError if one failed."""
    embedder = require_embedder(engine, task)
    ids = [engine.tokenize_prompt(p) for p in prompts]
    return run_offline(engine, embedder, [(one, None) for one in ids])


def run_offline(
    engine: Any, embedder: Embedder, inputs: list[tuple[list[int], list[int] | None]]
) -> list[EmbeddingOutput]:
    """Validated (ids, token types) inputs to the end on the calling thread; RequestFailedError if one failed."""
    for ids, _ in inputs:
        embedder.validate(ids)
    rids = [uuid.uuid4().hex for _ in inputs]
    final: dict[str, EmbeddingOutput] = {}
    try:
        for rid, (ids, types) in zip(rids, inputs):
            embedder.add(rid, ids, types)
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
