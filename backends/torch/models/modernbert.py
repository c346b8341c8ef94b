"""ModernBERT encoder in torch (app/models/family_modernbert.py has the maths and the tensor names).

No KV cache: each sequence arrives whole (the engine schedules an encoder's prompts in one piece) and is padded
into one [S, L] batch, as models/bert.py does; every sequence starts at position 0, so one rope table of L
positions serves the batch. Local layers add |query - key| <= half_window to the padding mask.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from lantern.app.models.spec import ModelConfig
from lantern.backends.torch.models.bert import ACTIVATIONS, EncoderInputs, _embedding, rope_table, rotate
from lantern.backends.torch.parallel import TPGroup


def _norm(cfg: ModelConfig) -> nn.LayerNorm:
    return nn.LayerNorm(cfg.hidden_size, eps=cfg.encoder.norm_eps, bias=cfg.encoder.norm_bias)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        d = cfg.hidden_size
        self.n_heads, self.head_dim = cfg.num_heads, d // cfg.num_heads
        self.Wqkv = nn.Linear(d, 3 * d, bias=cfg.encoder.attention_bias)
        self.Wo = nn.Linear(d, d, bias=cfg.encoder.attention_bias)

    def forward(self, x: torch.Tensor, inputs: EncoderInputs, rope: tuple, mask: torch.Tensor) -> torch.Tensor:
        t = x.shape[0]
        s, length = inputs.gather.shape
        qkv = self.Wqkv(x).reshape(t, 3, self.n_heads, self.head_dim)[inputs.gather]  # [S, L, 3, H, D]
        q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))  # [S, H, L, D]
        cos, sin = rope
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.Wo(out.transpose(1, 2).reshape(s * length, -1)[inputs.scatter])


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.act = ACTIVATIONS[cfg.encoder.hidden_act]
        self.Wi = nn.Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=cfg.encoder.mlp_bias)
        self.Wo = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=cfg.encoder.mlp_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, g = self.Wi(x).chunk(2, dim=-1)
        return self.Wo(self.act(a) * g)


class EncoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, index: int):
        super().__init__()
        self.local = cfg.encoder.local[index]
        self.attn_norm = nn.Identity() if index == 0 else _norm(cfg)
        self.attn = Attention(cfg)
        self.mlp_norm = _norm(cfg)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor, inputs: EncoderInputs, ropes: dict, masks: dict) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x), inputs, ropes[self.local], masks[self.local])
        return x + self.mlp(self.mlp_norm(x))


class Embeddings(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.tok_embeddings = _embedding(cfg.vocab_size, cfg.hidden_size)
        self.norm = _norm(cfg)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.norm(self.tok_embeddings(input_ids))


class ModernBertModel(nn.Module):
    is_encoder = True  # the engine schedules whole sequences; backends/torch/embed.py runs it

    def __init__(self, cfg: ModelConfig, tp: TPGroup = TPGroup()):
        super().__init__()
        if tp.active:
            raise ValueError("tensor parallelism is not implemented for ModernBERT encoders")
        self.cfg = cfg
        self.embeddings = Embeddings(cfg)
        self.layers = nn.ModuleList([EncoderLayer(cfg, i) for i in range(cfg.num_layers)])
        self.final_norm = _norm(cfg)

    def kv_layout(self, cfg: ModelConfig) -> tuple[int, int, int, bool]:
        """An encoder keeps no KV cache (see models/bert.py)."""
        return (1, 1, 1, True)

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, inputs: EncoderInputs) -> torch.Tensor:
        """The final norm's output [T, hidden_size] for every token of the batch."""
        enc, length = self.cfg.encoder, inputs.gather.shape[1]
        device, dim = input_ids.device, self.cfg.hidden_size // self.cfg.num_heads
        ropes = {
            False: rope_table(length, dim, enc.global_theta, device),
            True: rope_table(length, dim, enc.local_theta, device),
        }
        pos = torch.arange(length, device=device)
        near = (pos[:, None] - pos[None, :]).abs() <= enc.half_window  # [L, L]
        masks = {False: inputs.key_mask, True: inputs.key_mask & near}  # [S, 1, L, L] for local layers
        h = self.embeddings(input_ids)
        for layer in self.layers:
            h = layer(h, inputs, ropes, masks)
        return self.final_norm(h)


CausalLM = ModernBertModel  # the name models.build_model looks up in a family's file
