"""The engine <-> backend contract: every type a backend consumes or returns, in one module.

It imports nothing from the scheduler or the block manager: a backend (backends/base.py says what
it must implement) needs only this module, SamplingParams and the model's config.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import numpy as np

from lantern.app.config import BackendOptions
from lantern.app.engine.penalty_state import PenaltyState
from lantern.app.engine.sampling_params import SamplingParams
from lantern.app.models.spec import ModelConfig

__all__ = [
    "BackendOptions",
    "FinishedStep",
    "ModelInfo",
    "ModelSpec",
    "PendingStep",
    "PoolingRow",
    "SamplingRow",
    "ScheduledBatch",
    "StepOutput",
]


@dataclass
class ModelSpec:
    """A resolved model: config, weight files and their format ("safetensors" or "gguf")."""

    name: str
    config: ModelConfig
    weight_format: str
    weight_files: list[Path]
    dtype: str = "float32"
    isq: str | None = None  # "q4" | "q8": quantize float weights while loading (--isq)


@dataclass
class ModelInfo:
    """What the backend reports after loading."""

    num_params: int
    weight_bytes: int
    max_model_len: int
    vocab_size: int


@dataclass
class SamplingRow:
    """What the backend needs to draw one token for one sequence."""

    params: SamplingParams
    seed: int
    step: int  # number of tokens this sequence generated so far: the draw index
    banned_token_ids: list[int] = field(default_factory=list)  # e.g. EOS before min_tokens
    # Incremental penalty inputs (set only when params.uses_penalties): no full histories here.
    penalty: PenaltyState | None = None
    # Constrained decoding: packed allowed-token bits, [ceil(V / 32)] int32 (bit i of word w =
    # token 32w + i; ids past the mask are forbidden). None: every token allowed.
    token_bitmask: np.ndarray | None = None


@dataclass
class ScheduledBatch:
    input_ids: np.ndarray  # [T] int32
    positions: np.ndarray  # [T] int32
    query_start_loc: np.ndarray  # [S+1] int32
    seq_lens: np.ndarray  # [S] int32, KV length after this step
    block_tables: list[list[int]]
    slot_mapping: np.ndarray  # [T] int32, pool slot each new token's K/V goes to
    block_size: int
    sample_seq_indices: list[int]  # which sequences draw a token this step
    sampling: list[SamplingRow]  # one per sampled sequence, same order
    # [S] int32: each sequence's recurrent-state slot, for models with recurrent layers (None
    # for the others). A sequence whose chunk starts at position 0 starts from a zero state.
    state_slots: np.ndarray | None = None
    # [T] int32: each token's segment for an encoder with a token-type table (a cross-encoder's pair: 0 the
    # query, 1 the document); None: all 0. Set by the embedding side only (app/engine/embedding.py).
    token_types: np.ndarray | None = None
    # Prompt tokens whose log-probabilities this step computes (SamplingParams.prompt_logprobs): their logits rows
    # come after the sampled ones (backends/paged_plan.logits_idx).
    prompt_rows: list[PromptRows] = field(default_factory=list)
    # [T] int32, a step scheduled ahead (app/engine/step_ahead.py): for each token whose id the host does not know
    # yet, the row of the step it follows (Backend.launch's `after`) whose sampled token it is; -1 where input_ids
    # holds the id. None: input_ids holds every id.
    carried: np.ndarray | None = None

    @property
    def num_seqs(self) -> int:
        return len(self.seq_lens)

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])

    def query_lens(self) -> np.ndarray:
        return np.diff(self.query_start_loc)


@dataclass
class PromptRows:
    """One sequence's chunk rows whose logits score the next prompt token: the logits at flattened rows
    start .. start + len(targets) - 1 (positions position .. ) give the log-probabilities of `targets`, the prompt
    tokens at the positions after them, plus the `top` most likely tokens at each."""

    seq_index: int  # into the batch's sequences
    start: int  # first row in the flattened batch
    position: int  # that row's position in the sequence
    targets: list[int]
    top: int


# Per PromptRows entry: for each target, (its log-probability, its rank among the vocabulary (1: the most likely),
# the top alternatives as (token id, logprob)).
PromptLogprobs = list[list[tuple[float, int, list[tuple[int, float]]]]]


@dataclass
class StepOutput:
    """Per sampled sequence (same order as ScheduledBatch.sampling)."""

    token_ids: list[int]
    logprobs: list[float] | None = None  # log-probability of each chosen token
    top_logprobs: list[list[tuple[int, float]]] | None = None
    prompt_logprobs: PromptLogprobs | None = None  # per ScheduledBatch.prompt_rows entry, same order


class PendingStep(Protocol):
    """A launched step (Backend.launch): its work queued on the device, its tokens not yet on the host."""

    def result(self) -> StepOutput:
        """Wait for the step and hand over its sampled tokens as plain lists."""


class FinishedStep:
    """A step that ran to the end when it was launched (a backend whose work is synchronous)."""

    def __init__(self, output: StepOutput) -> None:
        self.output = output

    def result(self) -> StepOutput:
        return self.output


@dataclass
class PoolingRow:
    """One sequence of a batch whose final hidden states (after the model's last norm) an
    embedding needs from this step (backends/base.EmbeddingBackend.embed):
    "last": the state of the chunk's last token; "first": of its first token (a [CLS] pooling,
    asked on the chunk at position 0); "sum": the sum over the chunk's tokens (mean pooling adds
    the chunks up and divides by the length)."""

    seq_index: int  # index into the batch's sequences (query_start_loc)
    mode: str  # "last" | "first" | "sum"
