"""Poolside Laguna decoder in MLX (maths in app/models/family_laguna.py): the DeepSeek-mixture Llama layer of
llama_moe.py, whose layers.Attention reads the rest from the config -- per-layer query heads, the softplus output
gate, the sliding layers' window and rope of their own base and width."""

from __future__ import annotations

from lantern.backends.mlx.models.llama_moe import CausalLM, DecoderLayer

__all__ = ["CausalLM", "DecoderLayer"]
