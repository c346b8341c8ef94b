"""StepFun Step 3.5 Flash decoder in torch over a flattened token batch (the same layout as the MLX file; maths in
app/models/family_step3p5.py): Laguna's layer -- per-layer query heads, the sliding layers on a rope of their own
base and width, DeepSeek's sigmoid mixture beside a shared expert -- under Gemma's zero-centred norms (the q/k norms
too), its attention gated per head by a sigmoid (layers.Attention, from the config), and its SwiGLUs clamped per
layer: min(silu(gate), limit) * clip(up, -limit, limit).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from lantern.app.models.spec import ModelConfig
from lantern.backends.torch.layers import MLP, Attention
from lantern.backends.torch.models import llama, mellum
from lantern.backends.torch.models.deepseek import DeepSeekMoE
from lantern.backends.torch.models.gemma import GemmaRMSNorm
from lantern.backends.torch.parallel import TPGroup


def clamped_glu(limit: float) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    def glu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        return F.silu(gate).clamp(max=limit) * up.clamp(-limit, limit)

    return glu


class ClampedMLP(MLP):
    """The gated MLP with Step's clamp where the layer has one (limit None: layers.MLP as it is)."""

    def __init__(self, cfg: ModelConfig, tp: TPGroup, inner: int | None, limit: float | None):
        super().__init__(cfg, tp, inner)
        self.glu = clamped_glu(limit) if limit is not None else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.glu is None:
            return super().forward(x)
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.tp.all_reduce(self.down_proj(self.glu(gate, up)))


class DecoderLayer(mellum.DecoderLayer):
    def __init__(self, cfg: ModelConfig, layer_idx: int, tp: TPGroup):
        limits = cfg.swiglu_limits
        routed, shared = (limits.routed[layer_idx], limits.shared[layer_idx]) if limits else (None, None)
        mlp: torch.nn.Module
        if cfg.moe is not None and cfg.moe.is_sparse(layer_idx):
            experts = ClampedMLP(cfg, tp, cfg.moe.shared_size, shared) if cfg.moe.shared_size else None
            mlp = DeepSeekMoE(cfg, tp, shared_experts=experts)
            if routed is not None:
                mlp.glu = clamped_glu(routed)
        else:
            mlp = ClampedMLP(cfg, tp, None, shared)
        attn = Attention(cfg, layer_idx, tp, norm=GemmaRMSNorm)
        llama.DecoderLayer.__init__(self, cfg, layer_idx, tp, attn=attn, mlp=mlp)  # (mellum's forward, local rope)
        self.local_rope = self.self_attn.window is not None and cfg.local_rope_theta is not None
        self.input_layernorm = GemmaRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = GemmaRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class CausalLM(mellum.CausalLM):
    decoder_layer = DecoderLayer  # (tensor parallelism: refused for mixtures of experts by parallel.local_config)
    final_norm = GemmaRMSNorm
