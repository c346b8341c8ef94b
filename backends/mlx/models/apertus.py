"""Apertus decoder for MLX (maths in app/models/family_apertus.py; the torch file has the same layout): Llama's
decoder layer and attention (per-head q/k norms) over an ungated MLP with the xIELU activation."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn

from lantern.app.models.family_apertus import XIELU_BETA, XIELU_EPS
from lantern.app.models.spec import ModelConfig
from lantern.backends.mlx.models import llama


class XIELU(nn.Module):
    """xIELU with its two trained scalars (alpha_p, alpha_n: one-element arrays, as checkpoints hold them)."""

    def __init__(self) -> None:
        super().__init__()
        self.alpha_p = mx.zeros((1,))
        self.alpha_n = mx.zeros((1,))

    def __call__(self, x: mx.array) -> mx.array:
        a_p = nn.softplus(self.alpha_p).astype(x.dtype)
        a_n = (XIELU_BETA + nn.softplus(self.alpha_n)).astype(x.dtype)
        negative = (mx.expm1(mx.minimum(x, XIELU_EPS)) - x) * a_n
        return mx.where(x > 0, a_p * x * x, negative) + XIELU_BETA * x


class XIELUMLP(nn.Module):
    """down(xIELU(up(x))): no gate."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)
        self.act_fn = XIELU()

    def __call__(self, x: mx.array) -> mx.array:
        return self.down_proj(self.act_fn(self.up_proj(x)))


class DecoderLayer(llama.DecoderLayer):
    def __init__(self, cfg: ModelConfig, layer_idx: int):
        super().__init__(cfg, layer_idx, mlp=XIELUMLP(cfg))


class CausalLM(llama.CausalLM):
    decoder_layer = DecoderLayer
