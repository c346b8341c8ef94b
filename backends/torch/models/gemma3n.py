"""Gemma 3n (text) decoder in torch over a flattened token batch (maths in app/models/family_gemma3n.py; the
same layout as the MLX file). Gemma 4's attention (K/V shared by the last layers), norms and per-layer
embeddings (models/gemma4.py), under AltUp: the residual is [streams, T, hidden], each layer predicts every
stream, computes on the active one and corrects them all; LAuReL beside attention; a sparse MLP gate in the
first layers.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from lantern.app.models.spec import ModelConfig
from lantern.backends.torch.attention import TorchAttentionMetadata
from lantern.backends.torch.layers import ACTIVATIONS, MLP
from lantern.backends.torch.models import gemma4, llama
from lantern.backends.torch.models.gemma4 import RMSNorm, Rope, SharedKV
from lantern.backends.torch.parallel import TPGroup, parallel_embed


class SparseGateMLP(MLP):
    """The gated MLP; where the layer is sparse, its gate keeps only what lies above mean + cutoff * std of
    the row (relu of the difference), as Gemma3nTextMLP._gaussian_topk in the activations' dtype."""

    def __init__(self, cfg: ModelConfig, tp: TPGroup, width: int, cutoff: float | None):
        super().__init__(cfg, tp, width)
        self.cutoff = cutoff

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        if self.cutoff is not None:
            std, mean = torch.std_mean(gate, dim=-1, keepdim=True, correction=0)
            gate = F.relu(gate - (mean + std * torch.tensor(self.cutoff, dtype=gate.dtype)))
        return self.tp.all_reduce(self.down_proj(self.act(gate) * up))


class Laurel(nn.Module):
    """x + norm(right(left(x))): a low-rank residual beside attention."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        d, rank = cfg.hidden_size, cfg.gemma3n.laurel_rank
        self.linear_left = nn.Linear(d, rank, bias=False)
        self.linear_right = nn.Linear(rank, d, bias=False)
        self.post_laurel_norm = RMSNorm(d, cfg.rms_norm_eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.post_laurel_norm(self.linear_right(self.linear_left(x)))


class AltUp(nn.Module):
    """Predicts every stream from all of them and corrects them by the active stream's innovation, with
    coefficients a tanh router makes from the active stream (Gemma3nTextAltUp)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        n, d = cfg.gemma3n.altup_inputs, cfg.hidden_size
        self.n, self.active = n, cfg.gemma3n.altup_active
        self.correct_output_scale = nn.Parameter(torch.zeros(d), requires_grad=False)
        self.correction_coefs = nn.Linear(n, n, bias=False)
        self.prediction_coefs = nn.Linear(n, n * n, bias=False)
        self.modality_router = nn.Linear(d, n, bias=False)
        self.router_norm = RMSNorm(d, cfg.rms_norm_eps)

    def _modalities(self, x: torch.Tensor) -> torch.Tensor:
        routed = self.modality_router(self.router_norm(x) * (x.shape[-1] ** -1.0))
        return torch.tanh(routed.float()).to(x.dtype)

    def predict(self, streams: torch.Tensor) -> torch.Tensor:
        """[n, T, d]: stream j plus sum_i coef[t, j, i] * stream i."""
        coefs = self.prediction_coefs(self._modalities(streams[self.active])).reshape(-1, self.n, self.n)
        return torch.einsum("tji,itd->jtd", coefs, streams) + streams

    def correct(self, predictions: torch.Tensor, activated: torch.Tensor) -> torch.Tensor:
        innovation = activated - predictions[self.active]
        coefs = self.correction_coefs(self._modalities(activated)) + 1.0  # [T, n]
        return predictions + coefs.t()[:, :, None] * innovation

    def scale_corrected(self, x: torch.Tensor) -> torch.Tensor:
        return (x.to(self.correct_output_scale.dtype) * self.correct_output_scale).to(x.dtype)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int, tp: TPGroup):
        super().__init__()
        g4, g3n, d, eps = cfg.gemma4, cfg.gemma3n, cfg.hidden_size, cfg.rms_norm_eps
        self.self_attn = gemma4.Attention(cfg, layer_idx)
        self.sliding = self.self_attn.sliding
        self.mlp = SparseGateMLP(cfg, tp, g4.mlp_widths[layer_idx], g3n.sparsity_cutoffs[layer_idx])
        self.input_layernorm = RMSNorm(d, eps)
        self.post_attention_layernorm = RMSNorm(d, eps)
        self.pre_feedforward_layernorm = RMSNorm(d, eps)
        self.post_feedforward_layernorm = RMSNorm(d, eps)
        self.post_per_layer_input_norm = RMSNorm(d, eps)
        self.altup = AltUp(cfg)
        self.laurel = Laurel(cfg)
        self.per_layer_input_gate = nn.Linear(d, g4.ple_dim, bias=False)
        self.per_layer_projection = nn.Linear(g4.ple_dim, d, bias=False)
        self.act = ACTIVATIONS[cfg.hidden_act]
        self.correct_scale = g3n.altup_correct_scale

    def forward(
        self, streams: torch.Tensor, meta: TorchAttentionMetadata, rope: Rope, shared: SharedKV, ple: torch.Tensor
    ) -> torch.Tensor:
        predictions = self.altup.predict(streams)
        active = predictions[self.altup.active]
        normed = self.input_layernorm(active)
        laurel = self.laurel(normed)
        attn = self.post_attention_layernorm(self.self_attn(normed, meta, rope, shared))
        h = (active + attn + laurel) / math.sqrt(2)
        h = h + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(h)))
        corrected = self.altup.correct(predictions, h)
        first = corrected[self.altup.active]
        if self.correct_scale:
            first = self.altup.scale_corrected(first)
        gated = self.act(self.per_layer_input_gate(first)) * ple
        extra = self.post_per_layer_input_norm(self.per_layer_projection(gated))
        # transformers adds it to streams 1.. (not "all but the active one"), whatever altup_active_idx is
        return torch.cat([corrected[:1], corrected[1:] + extra])


def rescaled(x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """x with the RMS of `target` (an RMS [T, 1]), as Gemma3nTextModel matches the streams' magnitudes."""
    return x * target / torch.sqrt(x.pow(2).mean(-1, keepdim=True).clamp(min=1e-5))


class CausalLM(gemma4.CausalLM):
    decoder_layer = DecoderLayer

    def __init__(self, cfg: ModelConfig, tp: TPGroup = TPGroup()):
        super().__init__(cfg, tp)
        d, extra = cfg.hidden_size, cfg.gemma3n.altup_inputs - 1
        self.model.altup_projections = nn.ModuleList(nn.Linear(d, d, bias=False) for _ in range(extra))
        self.model.altup_unembed_projections = nn.ModuleList(nn.Linear(d, d, bias=False) for _ in range(extra))

    def hidden_states(self, input_ids: torch.Tensor, meta: TorchAttentionMetadata, rows: torch.Tensor) -> torch.Tensor:
        m = self.model
        h = parallel_embed(self._embed, input_ids, self.tp, self.cfg.vocab_size)
        h = h * llama.rounded(self.cfg.hidden_size**0.5, h.dtype)
        ple = self._per_layer_inputs(input_ids, h)
        target = h.pow(2).mean(-1, keepdim=True) ** 0.5
        streams = torch.stack([h, *(rescaled(p(h), target) for p in m.altup_projections)])
        ropes = ((meta.cos, meta.sin), self._global_rope(meta))
        shared: SharedKV = {}
        for i, layer in enumerate(m.layers):
            streams = layer(streams, meta, ropes[0] if layer.sliding else ropes[1], shared, ple[:, i])
        streams = streams[:, rows]
        target = streams[0].pow(2).mean(-1, keepdim=True) ** 0.5
        outs = [streams[0], *(rescaled(p(s), target) for p, s in zip(m.altup_unembed_projections, streams[1:]))]
        return m.norm(torch.stack(outs).mean(0))
