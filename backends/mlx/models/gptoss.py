"""gpt-oss decoder for MLX over a flattened token batch (maths: app/models/family_gptoss.py).

What differs from the Llama file: attention with an o_proj bias and a sink logit per head
(layers.Attention options), sliding and full layers alternating (ModelConfig.layer_windows), YaRN
without truncation of its correction range (rope.py reads truncate=false), and a mixture of
experts with router and expert biases, a softmax over the top-k logits and the clamped SwiGLU
(moe.SparseMoE options).

The weight stream hands the experts stacked (`mlp.experts.gate_up_proj` [E, 2I, H], gate rows
first, `down_proj` [E, H, I], `..._bias`); CausalLM.load_weights splits gate_up into the gate_proj /
up_proj expert layers. MXFP4 experts arrive as packed uint32 codes plus uint8 `..._scales`: their
layers become QuantExpertLinear in mode "mxfp4", so gather_qmm reads the codes as they are.
"""

from __future__ import annotations

import re
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from lantern.app.models.spec import ModelConfig
from lantern.backends.mlx.layers import Attention
from lantern.backends.mlx.models import llama
from lantern.backends.mlx.moe import QuantExpertLinear, SparseMoE, clamped_swiglu
from lantern.backends.mlx.quant import get_module, set_module

_STACKED = re.compile(r"^(.*\.mlp\.experts)\.(gate_up_proj|down_proj)(_bias|_scales)?$")
_KIND = {"": "weight", "_bias": "bias", "_scales": "scales"}


class DecoderLayer(llama.DecoderLayer):
    """Llama's layer over gpt-oss's attention (sinks, o bias) and mixture."""

    def __init__(self, cfg: ModelConfig, layer_idx: int):
        moe = cfg.moe
        glu = clamped_swiglu(moe.swiglu_alpha, moe.swiglu_limit)
        super().__init__(
            cfg,
            layer_idx,
            attn=Attention(cfg, layer_idx, o_bias=cfg.attention_bias, sinks=True),
            mlp=SparseMoE(cfg, router_bias=True, expert_bias=True, glu=glu, softmax_after_topk=True),
        )


class CausalLM(llama.CausalLM):
    decoder_layer = DecoderLayer

    def load_weights(self, file_or_weights: Any, strict: bool = True) -> nn.Module:
        """Module.load_weights with the stacked expert tensors mapped onto the expert layers."""
        return super().load_weights([item for pair in file_or_weights for item in self._expert_arrays(*pair)], strict)

    def _expert_arrays(self, name: str, value: mx.array) -> list[tuple[str, mx.array]]:
        m = _STACKED.match(name)
        if m is None:
            return [(name, value)]
        path, proj, suffix = m.group(1), m.group(2), m.group(3) or ""
        targets = ("gate_proj", "up_proj") if proj == "gate_up_proj" else ("down_proj",)
        if suffix == "" and value.dtype == mx.uint32:  # MXFP4 codes: quantized expert layers
            for target in targets:
                old = get_module(self, f"{path}.{target}")
                e, rows, cols = old.weight.shape
                if not isinstance(old, QuantExpertLinear):
                    set_module(self, f"{path}.{target}", QuantExpertLinear(e, cols, rows, 4, 32, "mxfp4", bias=True))
        parts = mx.split(value, len(targets), axis=1)
        return [(f"{path}.{target}.{_KIND[suffix]}", part) for target, part in zip(targets, parts)]
