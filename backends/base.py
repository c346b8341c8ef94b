"""The contract every backend implements. The scheduler decides what runs; a backend decides how.

A backend never sees a queue, a request or a tokenizer; it gets a ModelSpec once and a
ScheduledBatch per step, and returns the sampled tokens. The KV pool's layout is the backend's
business: the engine only asks how many bytes a block takes and hands out block ids.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from lantern.app.engine.contract import ModelInfo, ModelSpec, ScheduledBatch, StepOutput


@runtime_checkable
class Backend(Protocol):
    name: str
    # True when the KV pool takes memory only as blocks are written (a lazily committed CPU
    # allocation, or a pool that grows): the block manager then reuses written blocks first.
    kv_memory_is_lazy: bool

    def load(self, spec: ModelSpec) -> ModelInfo:
        """Put the weights on the device; report sizes and the longest context it can compute."""

    def kv_bytes_per_block(self, block_size: int) -> int:
        """Bytes of the KV cache, all layers, for one block of block_size tokens."""

    def available_memory_bytes(self) -> int:
        """Memory the KV cache may still take on this device (after weights)."""

    def allocate_kv(self, num_blocks: int, block_size: int) -> None:
        """Create the paged pools for num_blocks blocks of block_size tokens."""

    def compute_logits(self, batch: ScheduledBatch) -> Any:
        """The forward pass alone: float32 logits [sampled sequences, vocab] (tests read them)."""

    def execute(self, batch: ScheduledBatch) -> StepOutput:
        """Forward pass over the flattened batch, then sampling; results are plain lists."""

    def shutdown(self) -> None:
        """Release worker processes and device memory; the backend is unusable afterwards."""
