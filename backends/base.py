"""The contract every backend implements. The scheduler decides what runs; a backend decides how.

A backend never sees a queue, a request or a tokenizer; it gets a ModelSpec once and a
ScheduledBatch per step, and returns the sampled tokens. The KV pool's layout is the backend's
business: the engine only asks how many bytes a block takes and hands out block ids.

What one layer's pool holds per token is a property of the model (KVLayout): a model file's
CausalLM may declare `kv_layout(cfg) -> KVLayout`; without it, K and V of num_kv_heads x head_dim
each. DeepSeek's multi-head latent attention declares one "head" of kv_lora_rank + rope dims whose
first kv_lora_rank columns are also the value (v_is_k_prefix: stored once). The runners size
`kv_bytes_per_block` and allocate the pools from it; paged attention reads V as K's first v_dim
columns where the layout says so.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Protocol, runtime_checkable

from lantern.app.engine.contract import ModelInfo, ModelSpec, PendingStep, PoolingRow, ScheduledBatch, StepOutput


class KVLayout(NamedTuple):
    """Per layer and token: kv_heads heads of a k_dim key and a v_dim value. v_is_k_prefix: the
    value is the key's first v_dim columns and is not stored separately."""

    kv_heads: int
    k_dim: int
    v_dim: int
    v_is_k_prefix: bool = False

    def elements_per_token(self) -> int:
        """Stored values per token and layer (K, plus V unless it lies inside K)."""
        return self.kv_heads * (self.k_dim + (0 if self.v_is_k_prefix else self.v_dim))


def kv_layout_of(model: Any, cfg: Any) -> KVLayout:
    """The layout the model declares (its `kv_layout(cfg)`), else plain K/V of cfg's kv heads."""
    declared = getattr(model, "kv_layout", None)
    if declared is not None:
        return KVLayout(*declared(cfg))
    return KVLayout(cfg.num_kv_heads, cfg.head_dim, cfg.head_dim)


def kv_layer_layouts(layout: KVLayout, cfg: Any) -> list[KVLayout]:
    """Each KV-pool layer's layout: the model's one for every layer, or, where layers differ in shape
    (cfg.kv_shapes: Gemma 4's sliding and full layers), K and V of each layer's own heads and width."""
    if cfg.kv_shapes is None:
        return [layout] * cfg.num_kv_layers
    return [KVLayout(heads, dim, dim) for heads, dim in cfg.kv_shapes]


@runtime_checkable
class Backend(Protocol):
    name: str
    # True when the KV pool takes memory only as blocks are written (a lazily committed CPU
    # allocation, or a pool that grows): the block manager then reuses written blocks first.
    kv_memory_is_lazy: bool
    # Tokens one step computes when the user sets no max_num_batched_tokens. A step's prefill holds
    # back every running stream's next token until it ends, and prefill rates differ ~100x between
    # devices (a 2048-token step: ~1.7 s for a 135M model on two CPU cores, milliseconds on a GPU):
    # a CPU backend asks for smaller steps than an accelerator.
    default_step_tokens: int

    def load(self, spec: ModelSpec) -> ModelInfo:
        """Put the weights on the device; report sizes and the longest context it can compute."""

    def kv_bytes_per_block(self, block_size: int) -> int:
        """Bytes of the KV cache, all layers, for one block of block_size tokens."""

    def state_bytes_per_seq(self) -> int:
        """Bytes of recurrent state one running sequence holds (a model with linear-attention layers:
        each such layer's convolution window and state matrix); 0 for attention-only models."""

    def available_memory_bytes(self) -> int:
        """Memory the KV cache may still take on this device (after weights)."""

    def allocate_kv(self, num_blocks: int, block_size: int, max_num_seqs: int, state_slots: int) -> None:
        """Create the paged pools for num_blocks blocks of block_size tokens. max_num_seqs: the most
        sequences one step holds; a backend may prepare its decode step for them here, before the
        first request (the torch backend captures its CUDA graphs). A model with recurrent state
        gets `state_slots` state slots too: one per running sequence (ScheduledBatch.state_slots
        index them), then the prefix cache's snapshots."""

    def copy_state_slots(self, pairs: list[tuple[int, int]]) -> None:
        """For each (src, dst): every recurrent layer's state of slot src copied into slot dst, before
        the next forward pass (a snapshot taken for the prefix cache, or restored from it)."""

    def compute_logits(self, batch: ScheduledBatch) -> Any:
        """The forward pass alone: float32 logits [sampled sequences, vocab] (tests read them)."""

    def execute(self, batch: ScheduledBatch) -> StepOutput:
        """Forward pass over the flattened batch, then sampling; results are plain lists."""

    def shutdown(self) -> None:
        """Release worker processes and device memory; the backend is unusable afterwards."""


@runtime_checkable
class LaunchingBackend(Protocol):
    """What a backend adds so the engine can schedule decode steps ahead (app/engine/step_ahead.py): step N+1 is
    queued on the device behind step N, its input ids taken there from N's sampled tokens, while the host collects
    and processes step N's tokens -- the host's work per step (scheduling, batch building, detokenizing) then
    overlaps the device's instead of adding to it."""

    # True where a launch returns before the device has finished the step (CUDA, MLX's lazy evaluation): scheduling
    # ahead pays. False where it runs to the end (torch on a CPU): the engine then schedules ahead only when told to.
    steps_run_async: bool
    # Whether launch() can take a batch whose ids come from an earlier launch's tokens (`carried`); False where the
    # step's inputs must be known on the host (tensor-parallel workers in other processes).
    carries_tokens: bool

    def launch(self, batch: ScheduledBatch, after: PendingStep | None = None) -> PendingStep:
        """Queue the forward pass and the sampling of `batch` and return at once (as far as the device allows).
        `after`: the launched step whose sampled tokens the batch's `carried` rows name (None when it has none)."""


@runtime_checkable
class EmbeddingBackend(Protocol):
    """What a backend adds to serve embeddings (`--task embed`); the engine asks for it only then.

    An embedding step is an ordinary ScheduledBatch of prompt chunks (the scheduler runs them like
    prefills, writing the KV pool as usual) whose sequences are pooled instead of sampled."""

    def embed(self, batch: ScheduledBatch, rows: list[PoolingRow]) -> list[Any]:
        """The forward pass over the batch; per row a float32 numpy vector [hidden_size] as
        PoolingRow.mode says (same order as rows). A bidirectional encoder (a model with
        `is_encoder = True`) gets whole sequences only and attends over each one both ways."""
