"""LFM2 (Liquid AI's LFM2-350M / 700M / 1.2B / 2.6B): a hybrid of gated short-convolution layers and
grouped-query attention layers (transformers 5's Lfm2ForCausalLM).

- Short-conv layers: in_proj gives B, C and x (thirds of 3 x hidden); h = B * x goes through a causal
  depthwise convolution (kernel conv_L_cache, optional bias, no activation) and the output is
  out_proj(C * conv(h)). Each sequence keeps the convolution's last K-1 inputs per layer: the engine
  gives it a state slot as for Qwen3-Next (family_qwen3_next).
- Attention layers (`layer_types` "full_attention", or the indices in full_attn_idxs): Llama's, with
  per-head q/k RMSNorms (q_layernorm / k_layernorm) and o_proj named out_proj.
- Pre-norm blocks (operator_norm, ffn_norm), a SwiGLU MLP (w1 gate, w3 up, w2 down) whose width is
  adjusted as block_auto_adjust_ff_dim says, a final norm named embedding_norm, tied embeddings.

The checkpoints' names are read as Llama's (checkpoint_name), so the attention and MLP layers are the
shared ones on both backends. LFM3 (family_lfm3) is these layers with its own additions, in the same files.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from lantern.app.models.errors import UnsupportedModelError
from lantern.app.models.errors import refuse as _refuse


@dataclass(frozen=True)
class ShortConvConfig:
    conv_layers: tuple[bool, ...]  # per layer: True for a short-conv layer, False for attention
    kernel: int  # conv_L_cache
    bias: bool  # conv_bias: on in_proj, the convolution and out_proj

    def attention_layers(self) -> list[int]:
        return [i for i, conv in enumerate(self.conv_layers) if not conv]


def mlp_width(cfg: dict[str, Any]) -> int:
    """Lfm2MLP's intermediate size: 2/3 of the stated one, times the multiplier, rounded up to a multiple."""
    inner = int(cfg.get("block_ff_dim", cfg.get("intermediate_size", 12288)))
    if not cfg.get("block_auto_adjust_ff_dim", True):
        return inner
    inner = int(2 * inner / 3)
    multiplier = cfg.get("block_ffn_dim_multiplier", 1.0)
    if multiplier is not None:
        inner = int(multiplier * inner)
        step = int(cfg.get("block_multiple_of", 256))
        inner = step * ((inner + step - 1) // step)
    return inner


def text_config_of(cfg: dict[str, Any]) -> dict[str, Any]:
    """The language model's config inside an LFM2-VL config.json (Lfm2VlConfig: the wrapper ties, by
    default yes; its token ids and quantization apply when text_config lacks them)."""
    from lantern.app.models.spec import wrapped_text_config

    kind = "lfm2_moe" if (cfg.get("text_config") or {}).get("model_type") == "lfm2_moe" else "lfm2"
    return wrapped_text_config(cfg, kind, cfg.get("tie_embedding", cfg.get("tie_word_embeddings", True)))


def configure(model_type: str, cfg: dict[str, Any], fields: dict[str, Any]) -> dict[str, Any]:
    if model_type not in ("lfm2", "lfm2_moe"):
        raise UnsupportedModelError(f"{model_type!r} is not an LFM2 model")
    layers = fields["num_layers"]
    types = cfg.get("layer_types")
    if types is None:
        full = cfg.get("full_attn_idxs")
        full = set(range(layers)) if full is None else {int(i) for i in full}
        types = ["full_attention" if i in full else "conv" for i in range(layers)]
    if len(types) != layers or any(t not in ("conv", "full_attention") for t in types):
        raise _refuse("layer_types", types, f" (conv or full_attention for each of the {layers} layers)")
    conv = ShortConvConfig(
        tuple(t == "conv" for t in types), int(cfg.get("conv_L_cache", 3)), bool(cfg.get("conv_bias"))
    )
    if conv.kernel < 2:
        raise _refuse("conv_L_cache", conv.kernel, " (must be at least 2)")
    if all(conv.conv_layers):
        raise _refuse("layer_types", types, " (no full_attention layer at all)")
    moe = _experts(cfg, layers) if model_type == "lfm2_moe" else None
    return {
        "short_conv": conv if any(conv.conv_layers) else None,  # every layer attends: a plain decoder
        # (LFM2-MoE's dense MLPs are as wide as stated: Lfm2MoeMLP adjusts nothing)
        "intermediate_size": int(cfg["intermediate_size"]) if model_type == "lfm2_moe" else mlp_width(cfg),
        "moe": moe,
        "rms_norm_eps": float(cfg.get("norm_eps", 1e-5)),
        "qk_norm": True,
        "attention_bias": False,
        "tie_word_embeddings": bool(cfg.get("tie_embedding", cfg.get("tie_word_embeddings", True))),
        "layer_windows": None,
    }


def _experts(cfg: dict[str, Any], layers: int) -> Any:
    """LFM2-MoE's experts past the first num_dense_layers: a sigmoid router whose choice adds expert_bias
    (use_expert_bias), the chosen scores renormalised with 1e-6 in the sum (norm_topk_prob) and scaled by
    routed_scaling_factor, cast to the model dtype (Lfm2MoeTopKRouter) - DeepSeek-V3's router without groups.
    The router's logits are computed in float32 (transformers: in the model dtype; llama.cpp: float32), so
    in bfloat16 a near tie may choose another expert than transformers does."""
    from lantern.app.models.family_deepseek import DeepSeekMoEConfig

    experts, top_k = int(cfg.get("num_experts", 32)), int(cfg.get("num_experts_per_tok", 4))
    if not 1 <= top_k <= experts:
        raise _refuse("num_experts_per_tok", top_k, f" (must be between 1 and the {experts} experts)")
    dense = int(cfg.get("num_dense_layers", 2))
    if dense >= layers:
        return None  # every layer a dense MLP
    return DeepSeekMoEConfig(
        num_experts=experts,
        top_k=top_k,
        intermediate_size=int(cfg.get("moe_intermediate_size", 1792)),
        norm_topk_prob=bool(cfg.get("norm_topk_prob", True)),
        scoring="sigmoid",
        topk_method="noaux_tc",  # one group: the top-k of the (biased) scores
        routed_scaling_factor=float(cfg.get("routed_scaling_factor") or 1.0),
        first_dense=dense,
        correction_bias=bool(cfg.get("use_expert_bias", True)),
        norm_eps=1e-6,
    )


_RENAMES = (
    (re.compile(r"\.self_attn\.out_proj\."), ".self_attn.o_proj."),
    (re.compile(r"\.self_attn\.q_layernorm\."), ".self_attn.q_norm."),
    (re.compile(r"\.self_attn\.k_layernorm\."), ".self_attn.k_norm."),
    (re.compile(r"\.self_attn\.g_proj\."), ".self_attn.gate_proj."),  # LFM3 gate, by transformers in-memory name
    # LFM2-MoE's experts, router and its bias
    (re.compile(r"\.feed_forward\.experts\.(\d+)\.w1\."), r".mlp.experts.\1.gate_proj."),
    (re.compile(r"\.feed_forward\.experts\.(\d+)\.w3\."), r".mlp.experts.\1.up_proj."),
    (re.compile(r"\.feed_forward\.experts\.(\d+)\.w2\."), r".mlp.experts.\1.down_proj."),
    (re.compile(r"\.feed_forward\.expert_bias$"), ".mlp.gate.e_score_correction_bias"),
    (re.compile(r"\.feed_forward\.w1\."), ".mlp.gate_proj."),
    (re.compile(r"\.feed_forward\.w3\."), ".mlp.up_proj."),
    (re.compile(r"\.feed_forward\.w2\."), ".mlp.down_proj."),
    # the router, mlx_lm's switch_mlp and its gate/up/down_proj names for w1/w3/w2
    (re.compile(r"\.feed_forward\."), ".mlp."),
    (re.compile(r"\.operator_norm\."), ".input_layernorm."),
    (re.compile(r"\.ffn_norm\."), ".post_attention_layernorm."),
    (re.compile(r"^model\.embedding_norm\."), "model.norm."),
)


def checkpoint_tensors(source: Iterator[tuple[str, Any]]) -> Iterator[tuple[str, Any]]:
    """The convolution's weight as Hugging Face's [C, 1, K]: llama.cpp squeezes it to [C, K], mlx_lm
    stores MLX's [C, K, 1]."""
    for name, value in source:
        if name.endswith(".conv.conv.weight"):
            if len(value.shape) == 2:
                value = value[:, None, :]
            elif value.shape[-1] == 1 and value.shape[1] > 1:
                value = value.swapaxes(1, 2)
        yield name, value


def checkpoint_name(name: str) -> str:
    """An LFM2 checkpoint name in the model files' (Llama's) terms; conv layers keep theirs."""
    for pattern, replacement in _RENAMES:
        name = pattern.sub(replacement, name)
    return name
