"""One generated sequence: its tokens, KV blocks and progress through prefill and decode."""

from __future__ import annotations

import enum
import itertools
import time
from dataclasses import dataclass, field
from typing import Any

from lantern.app.engine.sampling_params import SamplingParams
from lantern.app.engine.state_cache import Snapshot

_seq_counter = itertools.count()


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass
class TokenLogprob:
    """Log-probability of the chosen token plus the top alternatives (token id -> logprob)."""

    token_id: int
    logprob: float
    top: dict[int, float] = field(default_factory=dict)
    rank: int | None = None  # among the vocabulary (1: the most likely); set for prompt tokens (prompt_logprobs)


@dataclass
class Sequence:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    index: int = 0  # which of the request's n samples this is
    seed: int = 0  # per-sequence sampling seed; with (seed, step) the draw is batch-independent
    seq_id: int = field(default_factory=lambda: next(_seq_counter))
    arrival_time: float = field(default_factory=time.monotonic)
    output_token_ids: list[int] = field(default_factory=list)
    output_logprobs: list[TokenLogprob] = field(default_factory=list)
    # SamplingParams.prompt_logprobs: per prompt position, that token's logprob given those before it (the first
    # has none), filled as the prompt's chunks are computed; empty when not asked for.
    prompt_logprobs: list[TokenLogprob | None] = field(default_factory=list)
    status: SequenceStatus = SequenceStatus.WAITING
    block_table: list[int] = field(default_factory=list)
    # Chained digests of this sequence's full blocks, computed once per block (prefix caching).
    block_hashes: list[bytes] = field(default_factory=list)
    # Who may share this sequence's cached prefix: the tenant (API key) and the request's
    # cache_salt. Part of every block digest, so different salts never see each other's blocks.
    cache_salt: bytes = b""
    # False: never looked up in nor published to the prefix cache (embedding inputs: their blocks
    # are freed at the end, and a mean pooling needs every token's hidden state computed).
    cacheable: bool = True
    # Penalty inputs kept up to date token by token (set by the batch builder when needed).
    penalty: Any = None
    num_computed_tokens: int = 0
    num_registered_blocks: int = 0  # leading blocks already published to the prefix cache
    # Leading block_table entries that are -1: behind every layer's sliding window, back in the pool.
    num_released_blocks: int = 0
    num_cached_tokens: int = 0  # prompt tokens served by the prefix cache at first admission
    num_preemptions: int = 0
    # The recurrent-state slot it holds while running (models with recurrent layers); None otherwise.
    state_slot: int | None = None
    # Prefix caching of recurrent state (app/engine/state_cache.py): token counts at which a prefill
    # chunk ends so the state there is snapshotted, and the snapshot this sequence started from
    # (its digest, slot and token count), if any.
    state_checkpoints: list[int] = field(default_factory=list)
    state_restore: Snapshot | None = None
    # The snapshot it keeps of its own state at its last block boundary while decoding (moved forward a block
    # at a time, so a follow-up turn that repeats the reply starts near its end); None when it has none.
    decode_snapshot: Snapshot | None = None
    finish_reason: str | None = None
    stop_reason: str | int | None = None

    def append_token(self, token: int) -> None:
        self.output_token_ids.append(token)
        if self.penalty is not None:
            self.penalty.append(token)

    @property
    def scores_prompt(self) -> bool:
        """It computes its prompt's log-probabilities (SamplingParams.prompt_logprobs: the request's first sample):
        every prompt position is computed, none read from the prefix cache (its blocks are published)."""
        return self.params.prompt_logprobs is not None and self.index == 0

    @property
    def token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    @property
    def last_token_id(self) -> int:
        return self.output_token_ids[-1] if self.output_token_ids else self.prompt_token_ids[-1]

    def token_at(self, pos: int) -> int:
        n = len(self.prompt_token_ids)
        return self.prompt_token_ids[pos] if pos < n else self.output_token_ids[pos - n]

    def tokens_range(self, start: int, end: int) -> list[int]:
        n = len(self.prompt_token_ids)
        if end <= n:
            return self.prompt_token_ids[start:end]
        if start >= n:
            return self.output_token_ids[start - n : end - n]
        return self.prompt_token_ids[start:] + self.output_token_ids[: end - n]
