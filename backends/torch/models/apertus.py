"""Apertus decoder in torch (maths in app/models/family_apertus.py; the MLX file has the same layout): Llama's
decoder layer and attention (per-head q/k norms) over an ungated MLP with the xIELU activation."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from lantern.app.models.family_apertus import XIELU_BETA, XIELU_EPS
from lantern.app.models.spec import ModelConfig
from lantern.backends.torch.models import llama
from lantern.backends.torch.parallel import TPGroup


class XIELU(nn.Module):
    """xIELU with its two trained scalars (alpha_p, alpha_n: one-element parameters, as checkpoints hold them)."""

    def __init__(self) -> None:
        super().__init__()
        self.alpha_p = nn.Parameter(torch.zeros(1), requires_grad=False)
        self.alpha_n = nn.Parameter(torch.zeros(1), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a_p = F.softplus(self.alpha_p)
        a_n = XIELU_BETA + F.softplus(self.alpha_n)
        negative = (torch.expm1(torch.clamp(x, max=XIELU_EPS)) - x) * a_n
        return torch.where(x > 0, a_p * x * x, negative) + XIELU_BETA * x


class XIELUMLP(nn.Module):
    """down(xIELU(up(x))): no gate."""

    def __init__(self, cfg: ModelConfig, tp: TPGroup):
        super().__init__()
        self.tp = tp
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)
        self.act_fn = XIELU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.tp.all_reduce(self.down_proj(self.act_fn(self.up_proj(x))))


class DecoderLayer(llama.DecoderLayer):
    def __init__(self, cfg: ModelConfig, layer_idx: int, tp: TPGroup):
        super().__init__(cfg, layer_idx, tp, mlp=XIELUMLP(cfg, tp))


class CausalLM(llama.CausalLM):
    decoder_layer = DecoderLayer
