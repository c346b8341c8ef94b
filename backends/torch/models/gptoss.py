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

from torch import nn

from lantern.app.models.spec import ModelConfig
from lantern.backends.torch.layers import Attention, RMSNorm
from lantern.backends.torch.models import llama
from lantern.backends.torch.moe import SparseMoE, clamped_swiglu
from lantern.backends.torch.parallel import TPGroup


class DecoderLayer(llama.DecoderLayer):
    """Llama's forward over this family's own sublayers."""

    def __init__(self, cfg: ModelConfig, layer_idx: int, tp: TPGroup):
        nn.Module.__init__(self)  # not llama's: it would build the llama sublayers first
        self.self_attn = Attention(cfg, layer_idx, tp, o_bias=cfg.attention_bias, sinks=True)
        moe = cfg.moe
        glu = clamped_swiglu(moe.swiglu_alpha, moe.swiglu_limit)
        self.mlp = SparseMoE(cfg, tp, router_bias=True, expert_bias=True, glu=glu, softmax_after_topk=True)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class CausalLM(llama.CausalLM):
    decoder_layer = DecoderLayer
