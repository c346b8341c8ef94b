"""gpt-oss decoder in torch over a flattened token batch (the same layout as the MLX file; maths in
app/models/family_gptoss.py): attention with an o_proj bias and a sink logit per head, alternating
sliding and full layers, and the mixture of experts with router and expert biases, a softmax over
the top-k logits and the clamped SwiGLU (moe.SparseMoE options, moe.BiasedExperts).

The rope table (runner: layers.rope_tables) is transformers' own YaRN, given truncate=false. The
weight stream hands the experts stacked in the [E, out, in] layout BiasedExperts holds; MXFP4
checkpoints arrive dequantized (no fp4 kernel for torch on CPU). Tensor parallelism is refused, as
for every mixture of experts.
"""

from __future__ import annotations

from lantern.app.models.spec import ModelConfig
from lantern.backends.torch.layers import Attention
from lantern.backends.torch.models import llama
from lantern.backends.torch.moe import SparseMoE, clamped_swiglu
from lantern.backends.torch.parallel import TPGroup


class DecoderLayer(llama.DecoderLayer):
    """Llama's layer over gpt-oss's attention (sinks, o bias) and mixture."""

    def __init__(self, cfg: ModelConfig, layer_idx: int, tp: TPGroup):
        moe = cfg.moe
        glu = clamped_swiglu(moe.swiglu_alpha, moe.swiglu_limit)
        super().__init__(
            cfg,
            layer_idx,
            tp,
            attn=Attention(cfg, layer_idx, tp, o_bias=cfg.attention_bias, sinks=True),
            mlp=SparseMoE(cfg, tp, router_bias=True, expert_bias=True, glu=glu, softmax_after_topk=True),
        )


class CausalLM(llama.CausalLM):
    decoder_layer = DecoderLayer
