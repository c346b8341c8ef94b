"""The contract every backend implements. The scheduler decides what runs; a backend decides how.

A backend never sees a queue, a request or a tokenizer; it gets a ModelSpec once and a
ScheduledBatch per step, and returns the sampled tokens.
"""
from __future__ import annotations

from typing import Protocol, runtime_checkable

from app.engine.batch import ScheduledBatch, StepOutput
from app.models.spec import ModelInfo, ModelSpec


@runtime_checkable
class Backend(Protocol):
    name: str

    def load(self, spec: ModelSpec) -> ModelInfo:
        """Put the weights on the device; report sizes."""

    def kv_bytes_per_block(self, block_size: int) -> int:
        """Bytes of K and V, all layers, for one block of block_size tokens."""

    def available_memory_bytes(self) -> int:
        """Memory the KV cache may still take on this device (after weights)."""

    def allocate_kv(self, num_blocks: int, block_size: int) -> None:
        """Create the paged pools: per layer [num_blocks * block_size, kv_heads, head_dim] for K and V."""

    def execute(self, batch: ScheduledBatch) -> StepOutput:
        """Copy blocks (copy-on-write), run the forward pass over the flattened batch, sample."""

    def copy_blocks(self, pairs: list[tuple[int, int]]) -> None:
        """Copy whole KV blocks src -> dst in every layer."""
