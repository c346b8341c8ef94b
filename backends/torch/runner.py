"""The torch backend: the same contract as MLX. Plain torch on CPU; CUDA when available."""
from __future__ import annotations

import logging

import torch

from app.engine.batch import ScheduledBatch, StepOutput
from app.models.spec import ModelInfo, ModelSpec
from backends.paged_plan import plan_attention
from backends.torch.attention import TorchKVPool, build_metadata
from backends.torch.model import CausalLM, rope_tables
from backends.torch.sampler import sample
from backends.torch.weights import load_weights

logger = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


class TorchBackend:
    name = "torch"

    def __init__(self, device: str | None = None) -> None:
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.pool: TorchKVPool | None = None
        self.block_size = 0

    def load(self, spec: ModelSpec) -> ModelInfo:
        if spec.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPES)}; got {spec.dtype!r}")
        self.dtype = DTYPES[spec.dtype]
        self.cfg = spec.config
        with torch.device("meta"):
            model = CausalLM(spec.config)
        model = model.to_empty(device="cpu")
        load_weights(model, spec, self.dtype, self.device)
        model.eval()
        self.model = model
        self.cos, self.sin = rope_tables(spec.config, spec.config.max_position_embeddings, self.device)
        params = list(model.parameters())
        return ModelInfo(
            num_params=sum(p.numel() for p in params),
            weight_bytes=sum(p.numel() * p.element_size() for p in params),
            max_model_len=spec.config.max_position_embeddings,
            vocab_size=spec.config.vocab_size,
        )

    def kv_bytes_per_block(self, block_size: int) -> int:
        c = self.cfg
        return 2 * c.num_layers * block_size * c.num_kv_heads * c.head_dim * self.dtype.itemsize

    def available_memory_bytes(self) -> int:
        if self.device.type == "cuda":
            free, _ = torch.cuda.mem_get_info(self.device)
            return int(free)
        import os

        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")

    def allocate_kv(self, num_blocks: int, block_size: int) -> None:
        c = self.cfg
        self.block_size = block_size
        self.pool = TorchKVPool(c.num_layers, num_blocks * block_size, c.num_kv_heads, c.head_dim,
                                self.dtype, self.device)

    def copy_blocks(self, pairs: list[tuple[int, int]]) -> None:
        if pairs:
            self.pool.copy_blocks(pairs, self.block_size)

    @torch.inference_mode()
    def compute_logits(self, batch: ScheduledBatch) -> torch.Tensor:
        self.copy_blocks(batch.copy_pairs)
        plan = plan_attention(batch)
        meta = build_metadata(self.pool, batch, plan, self.cos, self.sin)
        ids = torch.from_numpy(batch.input_ids).to(self.device, torch.long)
        logits_idx = torch.from_numpy(plan.logits_idx).to(self.device, torch.long)
        return self.model(ids, meta, logits_idx).float()

    @torch.inference_mode()
    def execute(self, batch: ScheduledBatch) -> StepOutput:
        logits = self.compute_logits(batch)
        if not batch.sampling:
            return StepOutput(token_ids=[])
        return sample(logits, batch.sampling)
