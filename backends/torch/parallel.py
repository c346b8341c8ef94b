"""Tensor parallelism on torch.distributed (NCCL on GPUs, gloo on CPU), Megatron style.

Column-parallel: q/k/v (split by heads), gate/up (split by rows). Row-parallel: o_proj, down_proj
(split by columns, then all-reduce). Vocab-parallel embedding (each rank owns a vocab slice; ids
outside it embed to zero; all-reduce) and head (local logits, all-gather). Norms are replicated.
Rank 0 runs the engine and samples; other ranks mirror each step's forward pass.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from lantern.app.models.spec import ModelConfig

_COLUMN = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")
_ROW = ("o_proj", "down_proj")


@dataclasses.dataclass(frozen=True)
class TPGroup:
    rank: int = 0
    world: int = 1

    @property
    def active(self) -> bool:
        return self.world > 1

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        if self.active:
            dist.all_reduce(x)
        return x

    def all_gather_last(self, x: torch.Tensor) -> torch.Tensor:
        if not self.active:
            return x
        parts = [torch.empty_like(x) for _ in range(self.world)]
        dist.all_gather(parts, x.contiguous())
        return torch.cat(parts, dim=-1)


def local_config(cfg: ModelConfig, world: int) -> ModelConfig:
    """The per-rank shapes: heads, kv heads and FFN width divided by the world size."""
    if world == 1:
        return cfg
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


def shard_weights(weights: dict[str, torch.Tensor], cfg: ModelConfig, tp: TPGroup) -> dict[str, torch.Tensor]:
    if not tp.active:
        return weights
    out = {}
    for name, w in weights.items():
        module = name.rsplit(".", 2)[-2]
        if module in _COLUMN:
            out[name] = w.chunk(tp.world, dim=0)[tp.rank].clone()
        elif module in _ROW and name.endswith(".weight"):
            out[name] = w.chunk(tp.world, dim=1)[tp.rank].clone()
        elif name in ("model.embed_tokens.weight", "lm_head.weight"):
            start, end, per = vocab_shard(cfg.vocab_size, tp)
            shard = torch.zeros(per, w.shape[1], dtype=w.dtype)
            shard[: end - start] = w[start:end]
            out[name] = shard
        else:
            out[name] = w
    return out


def parallel_embed(weight: torch.Tensor, ids: torch.Tensor, tp: TPGroup, vocab: int) -> torch.Tensor:
    if not tp.active:
        return F.embedding(ids, weight)
    start, end, _ = vocab_shard(vocab, tp)
    inside = (ids >= start) & (ids < end)
    h = F.embedding(torch.where(inside, ids - start, 0), weight) * inside[:, None].to(weight.dtype)
    return tp.all_reduce(h)


def parallel_logits(h: torch.Tensor, head: torch.Tensor, tp: TPGroup, vocab: int) -> torch.Tensor:
    return tp.all_gather_last(F.linear(h, head))[..., :vocab]


def broadcast_command(tp: TPGroup, command: Any = None, group: Any = None) -> Any:
    """Rank 0 sends (kind, payload); the others receive it. Everyone returns it."""
    box = [command]
    dist.broadcast_object_list(box, src=0, group=group)
    return box[0]


_FUSED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}


def fuse_projections(weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """q/k/v into one qkv_proj and gate/up into one gate_up_proj (weights and biases), after
    sharding, so each rank stacks its own heads. One wide matmul reads the input once and
    launches once instead of three (or two) times."""
    out = dict(weights)
    for name in weights:
        if name.count(".") < 2:
            continue
        prefix, module, kind = name.rsplit(".", 2)
        for fused, parts in _FUSED.items():
            names = [f"{prefix}.{part}.{kind}" for part in parts]
            if module == parts[0] and all(n in out for n in names):  # else load_state_dict names the gap
                out[f"{prefix}.{fused}.{kind}"] = torch.cat([out.pop(n) for n in names], dim=0)
    return out
