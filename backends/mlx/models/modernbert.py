"""ModernBERT encoder in MLX (app/models/family_modernbert.py has the maths and the tensor names).

No KV cache: each sequence arrives whole and is padded into one [S, L] batch, as models/bert.py does; every
sequence starts at position 0, so fast.rope at offset 0 serves the batch. Local layers add
|query - key| <= half_window to the padding mask.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn

from lantern.app.models.spec import ModelConfig
from lantern.backends.mlx.models.bert import ACTIVATIONS, EncoderInputs


def _norm(cfg: ModelConfig) -> nn.LayerNorm:
    return nn.LayerNorm(cfg.hidden_size, eps=cfg.encoder.norm_eps, bias=cfg.encoder.norm_bias)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, local: bool):
        super().__init__()
        d, enc = cfg.hidden_size, cfg.encoder
        self.n_heads, self.head_dim = cfg.num_heads, d // cfg.num_heads
        self.theta = enc.local_theta if local else enc.global_theta
        self.Wqkv = nn.Linear(d, 3 * d, bias=enc.attention_bias)
        self.Wo = nn.Linear(d, d, bias=enc.attention_bias)

    def __call__(self, x: mx.array, inputs: EncoderInputs, mask: mx.array) -> mx.array:
        t = x.shape[0]
        s, length = inputs.gather.shape
        qkv = self.Wqkv(x).reshape(t, 3, self.n_heads, self.head_dim)[inputs.gather]  # [S, L, 3, H, D]
        q, k, v = (qkv[:, :, i].transpose(0, 2, 1, 3) for i in range(3))  # [S, H, L, D]
        rope = dict(dims=self.head_dim, traditional=False, base=self.theta, scale=1.0, offset=0)
        q, k = mx.fast.rope(q, **rope), mx.fast.rope(k, **rope)
        out = mx.fast.scaled_dot_product_attention(q, k, v, scale=self.head_dim**-0.5, mask=mask)
        return self.Wo(out.transpose(0, 2, 1, 3).reshape(s * length, -1)[inputs.scatter])


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.act = ACTIVATIONS[cfg.encoder.hidden_act]
        self.Wi = nn.Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=cfg.encoder.mlp_bias)
        self.Wo = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=cfg.encoder.mlp_bias)

    def __call__(self, x: mx.array) -> mx.array:
        a, g = mx.split(self.Wi(x), 2, axis=-1)
        return self.Wo(self.act(a) * g)


class EncoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, index: int):
        super().__init__()
        self.local = cfg.encoder.local[index]
        if index:  # layer 0 has no attention norm (the embeddings' norm precedes it)
            self.attn_norm = _norm(cfg)
        self.attn = Attention(cfg, self.local)
        self.mlp_norm = _norm(cfg)
        self.mlp = MLP(cfg)

    def __call__(self, x: mx.array, inputs: EncoderInputs, masks: dict) -> mx.array:
        normed = self.attn_norm(x) if "attn_norm" in self else x
        x = x + self.attn(normed, inputs, masks[self.local])
        return x + self.mlp(self.mlp_norm(x))


class Embeddings(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.tok_embeddings = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.norm = _norm(cfg)

    def __call__(self, input_ids: mx.array) -> mx.array:
        return self.norm(self.tok_embeddings(input_ids))


class ModernBertModel(nn.Module):
    is_encoder = True  # the engine schedules whole sequences; backends/mlx/embed.py runs it

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.embeddings = Embeddings(cfg)
        self.layers = [EncoderLayer(cfg, i) for i in range(cfg.num_layers)]
        self.final_norm = _norm(cfg)

    def kv_layout(self, cfg: ModelConfig) -> tuple[int, int, int, bool]:
        """An encoder keeps no KV cache (see models/bert.py)."""
        return (1, 1, 1, True)

    def __call__(self, input_ids: mx.array, inputs: EncoderInputs) -> mx.array:
        """The final norm's output [T, hidden_size] for every token of the batch."""
        length = inputs.gather.shape[1]
        pos = mx.arange(length)
        near = mx.abs(pos[:, None] - pos[None, :]) <= self.cfg.encoder.half_window  # [L, L]
        masks = {False: inputs.key_mask, True: mx.logical_and(inputs.key_mask, near)}
        h = self.embeddings(input_ids)
        for layer in self.layers:
            h = layer(h, inputs, masks)
        return self.final_norm(h)


CausalLM = ModernBertModel  # the name models.build_model looks up in a family's file
