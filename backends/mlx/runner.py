"""The MLX backend: weights, the paged KV pool and one forward+sample per scheduled batch."""

from __future__ import annotations

import logging
import os
import platform

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

from lantern.app.engine.contract import ModelInfo, ModelSpec, ScheduledBatch, StepOutput
from lantern.backends.base import kv_layer_layouts, kv_layout_of
from lantern.backends.mlx import layers as _layers  # noqa: F401  (mlx_lm's rope: imported with the backend, not mid-load)
from lantern.backends.mlx.models import build_model
from lantern.backends.mlx.paged_attention import PagedKVPool, build_metadata
from lantern.backends.mlx.sampler import DrawnTokens, draw, prompt_logprobs
from lantern.backends.mlx.weights import load_weights
from lantern.backends.paged_plan import plan_attention

logger = logging.getLogger(__name__)

DTYPES = {"float32": mx.float32, "float16": mx.float16, "bfloat16": mx.bfloat16}


def _count_params(model: nn.Module) -> int:
    """Logical parameter count: packed quantized words hold 32 / bits weights each."""
    total = 0
    for _, module in model.named_modules():
        bits = getattr(module, "bits", None)
        for name, value in module.parameters().items():
            if not isinstance(value, mx.array) or (name in ("scales", "biases", "perm", "global_scale") and bits):
                continue
            total += value.size * (32 // bits if bits and value.dtype == mx.uint32 else 1)
    return total


class MLXBackend:
    name = "mlx"
    kv_memory_is_lazy = True  # the pool grows with the blocks written (PagedKVPool.reserve)

    steps_run_async = True  # base.LaunchingBackend: mx.async_eval returns while MLX evaluates the step
    carries_tokens = True

    def __init__(self) -> None:
        # base.Backend says why: MLX on a CPU (mlx[cpu]) prefills ~100x slower than on Metal or CUDA
        self.default_step_tokens = 512 if mx.default_device().type == mx.cpu else 2048
        self.model: nn.Module | None = None
        self.pool: PagedKVPool | None = None
        self.block_size = 0
        self.weight_bytes = 0

    def load(self, spec: ModelSpec) -> ModelInfo:
        if spec.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPES)}; got {spec.dtype!r}")
        self.dtype = DTYPES[spec.dtype]
        self.cfg = spec.config
        model = build_model(spec.config)
        load_weights(model, spec, self.dtype)
        model.eval()
        self.model = model
        self.kv_layout = kv_layout_of(model, spec.config)  # what the pool holds per token and layer
        self.weight_bytes = sum(v.nbytes for _, v in tree_flatten(model.parameters()))
        num_params = _count_params(model)
        return ModelInfo(
            num_params=num_params,
            weight_bytes=self.weight_bytes,
            max_model_len=spec.config.servable_context,
            vocab_size=spec.config.vocab_size,
        )

    def kv_bytes_per_block(self, block_size: int) -> int:
        per_token = sum(layout.elements_per_token() for layout in kv_layer_layouts(self.kv_layout, self.cfg))
        return block_size * per_token * self.dtype.size

    def state_bytes_per_seq(self) -> int:
        return self.model.state_bytes_per_seq(self.dtype) if self.cfg.recurrent else 0

    def available_memory_bytes(self) -> int:
        if platform.system() == "Darwin" and mx.metal.is_available():
            info = mx.metal.device_info()
            return int(info["max_recommended_working_set_size"]) - mx.get_active_memory()
        try:
            return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError):
            return 4 << 30

    def allocate_kv(self, num_blocks: int, block_size: int, max_num_seqs: int, state_slots: int) -> None:
        if self.cfg.recurrent:  # a recurrent-state slot per sequence a step may hold, then the snapshots
            self.model.allocate_state(state_slots, self.dtype)
        kvh, k_dim, v_dim, v_in_k = self.kv_layout
        self.block_size = block_size
        self.pool = PagedKVPool(
            self.cfg.num_kv_layers,
            num_blocks * block_size,
            kvh,
            k_dim,
            self.dtype,
            block_size=block_size,
            v_dim=v_dim,
            v_is_k_prefix=v_in_k,
            layer_shapes=None if self.cfg.kv_shapes is None else list(self.cfg.kv_shapes),
        )

    def copy_state_slots(self, pairs: list[tuple[int, int]]) -> None:
        src, dst = mx.array([p[0] for p in pairs]), mx.array([p[1] for p in pairs])
        for a in self.model.state_arrays():
            a[dst] = a[src]

    def compute_logits(self, batch: ScheduledBatch, after: DrawnTokens | None = None) -> mx.array:
        """Forward pass; logits [num sampled seqs, vocab] (float32) for the sampled sequences. after: the launched
        step whose (lazy) tokens the batch's carried rows take (launch())."""
        plan = plan_attention(batch)
        meta = build_metadata(self.pool, batch, plan)
        ids = mx.array(batch.input_ids)
        if batch.carried is not None:
            if after is None:
                raise ValueError("a batch with carried token ids needs the step it follows (launch's `after`)")
            rows = mx.array(batch.carried)
            picked = after.tokens[mx.maximum(rows, 0)].astype(ids.dtype)
            ids = mx.where(rows >= 0, picked, ids)
        logits = self.model(ids, meta, mx.array(plan.logits_idx))
        return logits.astype(mx.float32)

    def execute(self, batch: ScheduledBatch) -> StepOutput:
        return self.launch(batch).result()

    def launch(self, batch: ScheduledBatch, after: DrawnTokens | None = None) -> DrawnTokens:
        """The step's graph built and handed to MLX to evaluate in the background (base.LaunchingBackend)."""
        logits = self.compute_logits(batch, after)
        n = len(batch.sampling)  # (the rows past them score prompt tokens: prompt_logprobs)
        scored = prompt_logprobs(logits[n:], batch.prompt_rows) if batch.prompt_rows else None
        drawn = draw(logits[:n], batch.sampling) if n else DrawnTokens(mx.zeros((0,), dtype=mx.uint32), [])
        drawn.scored = scored
        # The pools (and recurrent state) are evaluated every step, or the lazy graph would grow without end.
        mx.async_eval(drawn.arrays(), self.pool.k, self.pool.v, getattr(self.model, "state_arrays", list)())
        return drawn

    def embed(self, batch: ScheduledBatch, rows: list) -> list:
        """Pooled final hidden states instead of samples (backends/base.EmbeddingBackend)."""
        from lantern.backends.mlx.embed import embed_step  # only embedding servers pay its import

        return embed_step(self, batch, rows)

    def shutdown(self) -> None:
        """Drop the weights and the pools (nothing else to release: MLX runs in this process)."""
        self.model = None
        self.pool = None
