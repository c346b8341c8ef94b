"""Llama-family decoder in torch (Llama 2/3/3.1, Mistral, Qwen2/3, Phi-3, and the Mixtral /
Qwen-MoE mixtures through layers.feed_forward) over a flattened token batch: the same layout as
the MLX model file.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from lantern.app.models.spec import ModelConfig
from lantern.backends.torch.attention import TorchAttentionMetadata
from lantern.backends.torch.layers import Attention, LayerNorm, RMSNorm, feed_forward
from lantern.backends.torch.parallel import TPGroup, local_config, parallel_embed, parallel_logits, vocab_shard


class DecoderLayer(nn.Module):
    def __init__(
        self,
        cfg: ModelConfig,
        layer_idx: int,
        tp: TPGroup,
        attn: nn.Module | None = None,
        mlp: nn.Module | None = None,
    ):
        """attn / mlp: a family's own sublayers (gpt-oss, DeepSeek) under Llama's norms and forward."""
        super().__init__()
        self.self_attn = attn if attn is not None else Attention(cfg, layer_idx, tp)
        self.mlp = mlp if mlp is not None else feed_forward(cfg, layer_idx, tp)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.residual_multiplier = cfg.residual_multiplier  # Granite's; 1.0 elsewhere
        self.post_norms = cfg.post_norms  # HyperCLOVA X: each sublayer's output normed before the residual add
        if self.post_norms:
            self.post_norm1 = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
            self.post_norm2 = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None, meta: TorchAttentionMetadata
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """x is the previous sublayer's output, not yet added to the residual stream (the add is
        fused into the next norm)."""
        h, residual = self.input_layernorm(x, residual)
        attn, m = self.self_attn(h, meta), self.residual_multiplier
        if self.post_norms:
            attn = self.post_norm1(attn)[0]
        h, residual = self.post_attention_layernorm(attn if m == 1.0 else attn * m, residual)
        out = self.mlp(h)
        if self.post_norms:
            out = self.post_norm2(out)[0]
        return (out if m == 1.0 else out * m), residual


class Backbone(nn.Module):
    def __init__(
        self,
        cfg: ModelConfig,
        tp: TPGroup,
        vocab_rows: int,
        layer_cls: type[nn.Module] = DecoderLayer,
        norm_cls: type[nn.Module] = RMSNorm,
    ):
        super().__init__()
        # An explicit (meta) weight skips the random init, which imports torch._dynamo (~3 s).
        self.embed_tokens = nn.Embedding(vocab_rows, cfg.hidden_size, _weight=torch.empty(vocab_rows, cfg.hidden_size))
        if cfg.learned_positions:  # GPT-2's absolute position table (read at each token's position)
            rows = cfg.max_position_embeddings
            self.embed_positions = nn.Embedding(rows, cfg.hidden_size, _weight=torch.empty(rows, cfg.hidden_size))
        if cfg.embed_norm:  # BLOOM's word_embeddings_layernorm
            self.embed_norm = LayerNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.layers = nn.ModuleList([layer_cls(cfg, i, tp) for i in range(cfg.num_layers)])
        self.norm = norm_cls(cfg.hidden_size, cfg.rms_norm_eps)


class CausalLM(nn.Module):
    """With tp.world > 1 this is one rank's shard (see parallel.py); cfg is the full model's.

    The shell every family shares: other model files subclass it naming their decoder layer and
    final norm (and, for extra per-step layer inputs, layer_extras)."""

    decoder_layer: type[nn.Module] = DecoderLayer
    final_norm: type[nn.Module] = RMSNorm
    compiled_decode: Any = None  # compiled_decode.CompiledDecode when the runner turned it on

    def __init__(self, cfg: ModelConfig, tp: TPGroup = TPGroup()):
        super().__init__()
        self.cfg = cfg
        self.tp = tp
        rows = vocab_shard(cfg.vocab_size, tp)[2] if tp.active else cfg.vocab_size
        self.model = Backbone(local_config(cfg, tp.world), tp, rows, self.decoder_layer, self.final_norm)
        if not cfg.tie_word_embeddings:
            rows = cfg.head_rows or rows  # (Apertus 1.5's pruned head: refused with tensor parallelism)
            self.lm_head = nn.Linear(cfg.hidden_size, rows, bias=cfg.lm_head_bias)  # (PhiMoE's has one)

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, meta: TorchAttentionMetadata, logits_idx: torch.Tensor) -> torch.Tensor:
        h = self.hidden_states(input_ids, meta, logits_idx)
        logits = parallel_logits(h, self._head, self.tp, self.cfg.vocab_size)
        if self.cfg.logits_divisor != 1.0:  # Granite's logits_scaling
            logits = logits / self.cfg.logits_divisor
        cap = self.cfg.final_softcap
        logits = logits if cap is None else torch.tanh(logits / cap) * cap
        if self.cfg.head_rows:  # (the ids past a pruned head are never chosen)
            logits = F.pad(logits, (0, self.cfg.vocab_size - self.cfg.head_rows), value=float("-inf"))
        return logits

    def hidden_states(self, input_ids: torch.Tensor, meta: TorchAttentionMetadata, rows: torch.Tensor) -> torch.Tensor:
        """The final norm's output at the flattened batch's `rows`: what the head reads, and what
        an embedding pools (backends/torch/embed.py)."""
        h = parallel_embed(self._embed, input_ids, self.tp, self.cfg.vocab_size)
        if self.cfg.embed_scale:  # Gemma: sqrt(hidden_size) as the embedding's dtype holds it, like transformers
            h = h * rounded(self.cfg.hidden_size**0.5, h.dtype)
        if self.cfg.embed_multiplier != 1.0:  # Granite: a Python float times the embedding, as transformers
            h = h * self.cfg.embed_multiplier
        if self.cfg.learned_positions:
            h = h + F.embedding(meta.positions, self.model.embed_positions.weight)
        if self.cfg.embed_norm:
            h = self.model.embed_norm(h)[0]
        extras = self.layer_extras(meta)
        compiled = self.compiled_decode
        done = compiled.run(h, meta, extras) if compiled is not None and compiled.applies(meta) else None
        if done is not None:
            h, residual = done
        else:
            residual = None
            for layer in self.model.layers:
                h, residual = layer(h, residual, meta, *extras)
        return self.model.norm(h[rows], residual[rows])[0]

    def layer_extras(self, meta: TorchAttentionMetadata) -> tuple:
        """Inputs every decoder layer takes after (x, residual, meta); none for Llama."""
        return ()

    # The embedding and the head may be float (nn.Embedding / nn.Linear) or quantized layers
    # (quant_linear.py: the embedding's logits() reads its table for a tied head).
    def _embed(self, ids: torch.Tensor) -> torch.Tensor:
        table = self.model.embed_tokens
        return F.embedding(ids, table.weight) if isinstance(table, nn.Embedding) else table(ids)

    def _head(self, h: torch.Tensor) -> torch.Tensor:
        tied = self.cfg.tie_word_embeddings
        head = self.model.embed_tokens if tied else self.lm_head
        if isinstance(head, nn.Embedding):
            return F.linear(h, head.weight)
        # float32 logits where the quantized layer makes them at no cost (float_x_is_free)
        if getattr(getattr(head, "table", head), "float_x_is_free", False):
            h = h.float()
        return head.logits(h) if tied else head(h)


class RecurrentCausalLM(CausalLM):
    """The shell of the hybrids whose layers keep a state per sequence beside the paged pool (LFM2, Qwen3-Next,
    Granite 4.0-H, Nemotron-H): the runner allocates `state_cls(cfg, slots, dtype, device)` and every layer
    takes it after (x, residual, meta). Each family sizes its state. (Tensor parallelism is refused for these
    before any rank starts: parallel.local_config.)"""

    state_cls: type

    def __init__(self, cfg: ModelConfig, tp: TPGroup = TPGroup()):
        super().__init__(cfg, tp)
        self.state = None

    def state_bytes_per_seq(self, dtype: torch.dtype) -> int:
        raise NotImplementedError

    def allocate_state(self, slots: int, dtype: torch.dtype, device: torch.device) -> None:
        self.state = self.state_cls(self.cfg, slots, dtype, device)

    def layer_extras(self, meta: TorchAttentionMetadata) -> tuple:
        return (self.state,)

    def state_tensors(self) -> list[torch.Tensor]:
        """Every tensor of the state, each indexed by slot first (its lists of per-layer tensors)."""
        held = [] if self.state is None else vars(self.state).values()
        return [t for v in held if isinstance(v, list) for t in v]


def rounded(value: float, dtype: torch.dtype) -> float:
    """value as the dtype holds it (transformers multiplies by a tensor of the embedding's dtype)."""
    return float(torch.tensor(value, dtype=dtype))
