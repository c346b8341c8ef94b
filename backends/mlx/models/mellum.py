"""JetBrains Mellum 2 decoder in MLX (maths in app/models/family_mellum.py): Llama's layer as layers.Attention and
layers.feed_forward build it from the config -- Qwen3's per-head q/k norms, the sliding layers' window and plain rope
of their own base, Qwen3-MoE's mixture -- so the Llama file's classes serve it as they are."""

from __future__ import annotations

from lantern.backends.mlx.models.llama import CausalLM, DecoderLayer

__all__ = ["CausalLM", "DecoderLayer"]
