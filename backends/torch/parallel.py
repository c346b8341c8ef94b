"""Tensor parallelism on torch.distributed (NCCL on GPUs, gloo on CPU), Megatron style.

Column-parallel: q/k/v (split by heads), gate/up (split by rows). Row-parallel: o_proj, down_proj
(split by columns, then all-reduce). Vocab-parallel embedding (each rank owns a vocab slice; ids
outside it embed to zero; all-reduce) and head (local logits, all-gather). Norms are replicated.
Rank 0 runs the engine and samples; other ranks mirror each step's forward pass.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from lantern.app.models.spec import ModelConfig

COLUMN_PARALLEL = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")
ROW_PARALLEL = ("o_proj", "down_proj")


@dataclasses.dataclass(frozen=True)
class TPGroup:
    rank: int = 0
    world: int = 1
    # The process group of the forward collectives, with the short timeout (runner._tp_timeout);
    # None: the default group.
    group: Any = dataclasses.field(default=None, compare=False)

    @property
    def active(self) -> bool:
        return self.world > 1

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        if self.active:
            dist.all_reduce(x, group=self.group)
        return x

    def all_gather_last(self, x: torch.Tensor) -> torch.Tensor:
        if not self.active:
            return x
        parts = [torch.empty_like(x) for _ in range(self.world)]
        dist.all_gather(parts, x.contiguous(), group=self.group)
        return torch.cat(parts, dim=-1)


def _bitnet(cfg: ModelConfig) -> bool | None:
    scheme = cfg.quantization
    return True if scheme is not None and scheme.method.startswith("bitnet") else None


def local_config(cfg: ModelConfig, world: int) -> ModelConfig:
    """The per-rank shapes: heads, kv heads and FFN width divided by the world size.

    The runner calls this before it starts any worker, so a model tensor parallelism cannot
    split is refused here, in one line, rather than by a model file on every rank."""
    if world == 1:
        return cfg
    # Only heads and the dense MLP's rows are sharded: experts would need expert or row sharding
    # of the stacked [E, out, in] tensors, and the latent of multi-head latent attention is shared
    # by every head (one KV "head" that cannot be divided).
    # OLMo's q/k norms read every head of a token (EXAONE 4's, in the same model file, are per head)
    whole_qk_norms = cfg.family == "olmo" and not cfg.qk_norm
    parts = (
        ("multi-head latent attention", cfg.mla),
        ("mixture-of-experts", cfg.moe),
        ("whole-projection q/k norm (OLMo)", True if whole_qk_norms else None),
        ("linear-attention (gated DeltaNet)", cfg.linear_attn),
        ("short-convolution (LFM2)", cfg.short_conv),
        ("Mamba-2 mixer (Granite 4.0-H, Bamba, Nemotron-H, Falcon-H1)", cfg.mamba),
        ("Mamba-1 mixer (Mamba, Falcon-Mamba, Jamba)", cfg.mamba1),
        ("RG-LRU (RecurrentGemma)", cfg.rglru),
        ("RWKV-7 time mix (per-head state and vectors)", cfg.rwkv7),
        ("per-head query gains (Talkie)", True if cfg.family == "talkie" else None),
        ("per-head loop gates (IQuest-Coder Loop)", cfg.loop_window),
        ("ALiBi (BLOOM, MPT: slopes per head)", cfg.alibi_slopes),
        ("per-layer KV pool (Gemma 4, Gemma 3n, Nemotron-NAS)", cfg.kv_shapes),
        ("per-head q/k LayerNorm (Command R+)", True if cfg.family == "cohere" and cfg.qk_norm else None),
        ("per-layer query heads (Laguna)", cfg.layer_heads),
        ("subln norms over whole projections (BitNet)", True if cfg.sub_norms else None),
        # (each rank would take max|x| over its own columns of o_proj's / down_proj's input, not the whole row)
        ("per-token activation quantization (BitNet)", _bitnet(cfg)),
        ("a head narrower than the vocabulary (Apertus 1.5)", cfg.head_rows),
        ("stacks run in cycles (HRM-Text)", cfg.hrm),
        ("nGPT's whole-projection norms (Dory)", cfg.dory),
    )
    unsplit = [what for what, present in parts if present is not None]
    if unsplit:
        raise ValueError(
            f"tensor parallelism is not implemented for {' and '.join(unsplit)} models ({cfg.architecture}); "
            "serve this model with --tensor-parallel-size 1"
        )
    for name, value in (
        ("num_attention_heads", cfg.num_heads),
        ("num_key_value_heads", cfg.num_kv_heads),
        ("intermediate_size", cfg.intermediate_size),
    ):
        if value % world:
            raise ValueError(f"tensor parallel size {world} does not divide {name} ({value})")
    return dataclasses.replace(
        cfg,
        num_heads=cfg.num_heads // world,
        num_kv_heads=cfg.num_kv_heads // world,
        intermediate_size=cfg.intermediate_size // world,
    )


def vocab_shard(vocab: int, tp: TPGroup) -> tuple[int, int, int]:
    """(first id, end id, rows per rank) of this rank's vocabulary slice."""
    per = -(-vocab // tp.world)
    return tp.rank * per, min((tp.rank + 1) * per, vocab), per


def parallel_embed(
    lookup: Callable[[torch.Tensor], torch.Tensor], ids: torch.Tensor, tp: TPGroup, vocab: int
) -> torch.Tensor:
    """lookup: this rank's embedding rows for local ids (a float table or a quantized one)."""
    if not tp.active:
        return lookup(ids)
    start, end, _ = vocab_shard(vocab, tp)
    inside = (ids >= start) & (ids < end)
    h = lookup(torch.where(inside, ids - start, 0))
    return tp.all_reduce(h * inside[:, None].to(h.dtype))


def parallel_logits(
    h: torch.Tensor, project: Callable[[torch.Tensor], torch.Tensor], tp: TPGroup, vocab: int
) -> torch.Tensor:
    return tp.all_gather_last(project(h))[..., :vocab]


def broadcast_command(tp: TPGroup, command: Any = None, group: Any = None) -> Any:
    """Rank 0 sends (kind, payload); the others receive it. Everyone returns it."""
    box = [command]
    dist.broadcast_object_list(box, src=0, group=group)
    return box[0]
