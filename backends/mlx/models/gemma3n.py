"""Gemma 3n (text) decoder over a flattened token batch (maths in app/models/family_gemma3n.py; the same
layout as the torch file). Gemma 4's attention (K/V shared by the last layers), norms and per-layer
embeddings (models/gemma4.py), under AltUp: the residual is [streams, T, hidden], each layer predicts every
stream, computes on the active one and corrects them all; LAuReL beside attention; a sparse MLP gate in the
first layers.
"""

from __future__ import annotations

import math

import mlx.core as mx
import mlx.nn as nn

from lantern.app.models.spec import ModelConfig
from lantern.backends.mlx.layers import ACTIVATIONS, MLP
from lantern.backends.mlx.models import gemma4
from lantern.backends.mlx.models.gemma4 import RMSNorm, SharedKV
from lantern.backends.mlx.paged_attention import AttentionMetadata


class SparseGateMLP(MLP):
    """The gated MLP; where the layer is sparse, its gate keeps only what lies above mean + cutoff * std of
    the row (relu of the difference), as Gemma3nTextMLP._gaussian_topk in the activations' dtype."""

    def __init__(self, cfg: ModelConfig, width: int, cutoff: float | None):
        super().__init__(cfg, width)
        self.cutoff = cutoff

    def __call__(self, x: mx.array) -> mx.array:
        gate = self.gate_proj(x)
        if self.cutoff is not None:
            mean = gate.mean(axis=-1, keepdims=True)
            std = mx.sqrt(mx.var(gate, axis=-1, keepdims=True))
            gate = nn.relu(gate - (mean + std * mx.array(self.cutoff, dtype=gate.dtype)))
        return self.down_proj(self.act(gate) * self.up_proj(x))


class Laurel(nn.Module):
    """x + norm(right(left(x))): a low-rank residual beside attention."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        d, rank = cfg.hidden_size, cfg.gemma3n.laurel_rank
        self.linear_left = nn.Linear(d, rank, bias=False)
        self.linear_right = nn.Linear(rank, d, bias=False)
        self.post_laurel_norm = RMSNorm(d, cfg.rms_norm_eps)

    def __call__(self, x: mx.array) -> mx.array:
        return x + self.post_laurel_norm(self.linear_right(self.linear_left(x)))


class AltUp(nn.Module):
    """Predicts every stream from all of them and corrects them by the active stream's innovation, with
    coefficients a tanh router makes from the active stream (Gemma3nTextAltUp)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        n, d = cfg.gemma3n.altup_inputs, cfg.hidden_size
        self.n, self.active = n, cfg.gemma3n.altup_active
        self.correct_output_scale = mx.zeros((d,))
        self.correction_coefs = nn.Linear(n, n, bias=False)
        self.prediction_coefs = nn.Linear(n, n * n, bias=False)
        self.modality_router = nn.Linear(d, n, bias=False)
        self.router_norm = RMSNorm(d, cfg.rms_norm_eps)

    def _modalities(self, x: mx.array) -> mx.array:
        routed = self.modality_router(self.router_norm(x) * (x.shape[-1] ** -1.0))
        return mx.tanh(routed.astype(mx.float32)).astype(x.dtype)

    def predict(self, streams: mx.array) -> mx.array:
        """[n, T, d]: stream j plus sum_i coef[t, j, i] * stream i."""
        coefs = self.prediction_coefs(self._modalities(streams[self.active])).reshape(-1, self.n, self.n)
        mixed = (coefs @ streams.transpose(1, 0, 2)).transpose(1, 0, 2)  # [T, n, n] @ [T, n, d]
        return mixed + streams

    def correct(self, predictions: mx.array, activated: mx.array) -> mx.array:
        innovation = activated - predictions[self.active]
        coefs = self.correction_coefs(self._modalities(activated)) + 1.0  # [T, n]
        return predictions + coefs.T[:, :, None] * innovation

    def scale_corrected(self, x: mx.array) -> mx.array:
        scale = self.correct_output_scale
        return (x.astype(scale.dtype) * scale).astype(x.dtype)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int):
        super().__init__()
        g4, g3n, d, eps = cfg.gemma4, cfg.gemma3n, cfg.hidden_size, cfg.rms_norm_eps
        self.self_attn = gemma4.Attention(cfg, layer_idx)
        self.mlp = SparseGateMLP(cfg, g4.mlp_widths[layer_idx], g3n.sparsity_cutoffs[layer_idx])
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

    def __call__(self, streams: mx.array, meta: AttentionMetadata, shared: SharedKV, ple: mx.array) -> mx.array:
        predictions = self.altup.predict(streams)
        active = predictions[self.altup.active]
        normed = self.input_layernorm(active)
        laurel = self.laurel(normed)
        attn = self.post_attention_layernorm(self.self_attn(normed, meta, shared))
        h = (active + attn + laurel) / math.sqrt(2)
        h = h + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(h)))
        corrected = self.altup.correct(predictions, h)
        first = corrected[self.altup.active]
        if self.correct_scale:
            first = self.altup.scale_corrected(first)
        gated = self.act(self.per_layer_input_gate(first)) * ple
        extra = self.post_per_layer_input_norm(self.per_layer_projection(gated))
        # transformers adds it to streams 1.. (not "all but the active one"), whatever altup_active_idx is
        return mx.concatenate([corrected[:1], corrected[1:] + extra])


def rescaled(x: mx.array, target: mx.array) -> mx.array:
    """x with the RMS of `target` (an RMS [T, 1]), as Gemma3nTextModel matches the streams' magnitudes."""
    return x * target / mx.sqrt(mx.maximum(mx.square(x).mean(axis=-1, keepdims=True), 1e-5))


class CausalLM(gemma4.CausalLM):
    decoder_layer = DecoderLayer

    def __init__(self, cfg: ModelConfig):
        super().__init__(cfg)
        d, extra = cfg.hidden_size, cfg.gemma3n.altup_inputs - 1
        self.model.altup_projections = [nn.Linear(d, d, bias=False) for _ in range(extra)]
        self.model.altup_unembed_projections = [nn.Linear(d, d, bias=False) for _ in range(extra)]

    def hidden_states(self, input_ids: mx.array, meta: AttentionMetadata, rows: mx.array) -> mx.array:
        cfg, m = self.cfg, self.model
        h = m.embed_tokens(input_ids)
        h = h * mx.array(cfg.hidden_size**0.5, dtype=h.dtype)
        ple = self._per_layer_inputs(input_ids, h)
        target = mx.sqrt(mx.square(h).mean(axis=-1, keepdims=True))
        streams = mx.stack([h, *(rescaled(p(h), target) for p in m.altup_projections)])
        shared: SharedKV = {}
        for i, layer in enumerate(m.layers):
            streams = layer(streams, meta, shared, ple[:, i])
        if rows.size == 0:
            return mx.zeros((0, cfg.hidden_size), dtype=h.dtype)
        streams = streams[:, rows]
        target = mx.sqrt(mx.square(streams[0]).mean(axis=-1, keepdims=True))
        outs = [streams[0], *(rescaled(p(s), target) for p, s in zip(m.altup_unembed_projections, streams[1:]))]
        return m.norm(mx.stack(outs).mean(axis=0))
