"""Qwen3-Next and Qwen3.5 (dense and MoE): hybrid decoders whose layers are mostly gated DeltaNet
linear attention, with a full (gated) attention layer every few layers.

What differs from Qwen3 (transformers 5's Qwen3NextForCausalLM / Qwen3_5ForCausalLM / Qwen3_5MoeForCausalLM):
- RMSNorms scale by (1 + weight) (Gemma's), the q/k norms too; the gated delta net's output norm scales
  by its weight and multiplies by SiLU(z).
- Full-attention layers: q_proj yields each head's query and an output gate side by side; the attention
  output is multiplied by sigmoid(gate) before o_proj; rope on the first 25% of each head (rotate_half).
  Qwen3.5's multimodal rope is the plain one for text (all three position ids are the token's).
- Linear-attention layers (`layer_types` "linear_attention", or every layer but each
  full_attention_interval-th): a causal depthwise convolution (kernel linear_conv_kernel_dim) with SiLU
  over the q/k/v projections, l2-normed q and k, and the gated delta rule
  S <- exp(g) S + k (beta (v - exp(g) S^T k))^T, o = S^T q / sqrt(d_k), with
  g = -exp(A_log) softplus(a + dt_bias), beta = sigmoid(b). Each sequence keeps the convolution's
  last inputs and S per layer: the engine gives it a recurrent-state slot (ScheduledBatch.state_slots).
- Qwen3-Next stores q/k/v/z and b/a fused per key-head group (in_proj_qkvz, in_proj_ba); Qwen3.5
  stores them apart (in_proj_qkv, in_proj_z, in_proj_b, in_proj_a); llama.cpp's GGUFs hold Qwen3-Next
  with q/k/v and z apart but b/a fused, and Qwen3.5's value heads tiled. The model files read all of these.
- MoE (Qwen3-Next, Qwen3.5-MoE): Qwen2-MoE's routing with a sigmoid-gated shared expert.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from lantern.app.models.errors import UnsupportedModelError
from lantern.app.models.errors import refuse as _refuse
from lantern.app.models.family_moe import MoEConfig
from lantern.app.models.rope_config import rope_scaling

MODEL_TYPES = ("qwen3_next", "qwen3_5_text", "qwen3_5_moe_text")
_WRAPPED = {"qwen3_5": "qwen3_5_text", "qwen3_5_moe": "qwen3_5_moe_text"}  # vision-language folders


@dataclass(frozen=True)
class LinearAttnConfig:
    linear_layers: tuple[bool, ...]  # per layer: True for a gated delta net, False for full attention
    num_k_heads: int
    num_v_heads: int
    k_dim: int
    v_dim: int
    conv_kernel: int
    fused_qkvz: bool  # Qwen3-Next's in_proj_qkvz (grouped by key head), else in_proj_qkv and in_proj_z
    fused_ba: bool  # Qwen3-Next's in_proj_ba (grouped by key head), else in_proj_b and in_proj_a
    # Value heads in llama.cpp's Qwen3.5 order (v head i reads key head i % key heads), not grouped
    # by key head (i // (value heads / key heads)): its converter reorders every value-head tensor so.
    v_heads_tiled: bool = False
    beta_scale: float = 1.0  # OLMo Hybrid's allow_neg_eigval: beta = 2 * sigmoid(b)
    norm_eps: float | None = None  # the gated output norm's eps where not the model's (OLMo Hybrid's 1e-5)
    norm_fp32: bool = False  # the gated norm's weight applied in float32, rounded once (Lara Mini's RMSNormGated)

    @property
    def conv_dim(self) -> int:
        """Channels the convolution sees: q, k and v."""
        return 2 * self.num_k_heads * self.k_dim + self.num_v_heads * self.v_dim

    def state_elements(self) -> tuple[int, int]:
        """Per linear layer and sequence: (convolution window values, recurrent state values)."""
        return self.conv_dim * (self.conv_kernel - 1), self.num_v_heads * self.k_dim * self.v_dim

    def attention_layers(self) -> list[int]:
        """The full-attention layers, in order: the paged KV pool holds only theirs."""
        return [i for i, linear in enumerate(self.linear_layers) if not linear]


def text_config_of(cfg: dict[str, Any]) -> dict[str, Any]:
    """The language model's config inside a Qwen3.5 vision-language config.json."""
    from lantern.app.models.spec import wrapped_text_config

    # The wrapper's tying decides (Qwen3_5Config's default: untied).
    return wrapped_text_config(cfg, _WRAPPED[cfg["model_type"]], cfg.get("tie_word_embeddings", False))


def _layer_kinds(cfg: dict[str, Any], num_layers: int) -> tuple[bool, ...]:
    types = cfg.get("layer_types")
    if types is None:
        interval = int(cfg.get("full_attention_interval", 4))
        if interval < 1:
            raise _refuse("full_attention_interval", interval, " (must be at least 1)")
        return tuple(bool((i + 1) % interval) for i in range(num_layers))
    if len(types) != num_layers or any(t not in ("linear_attention", "full_attention") for t in types):
        raise _refuse(
            "layer_types", types, f" (one of linear_attention / full_attention per each of {num_layers} layers)"
        )
    return tuple(t == "linear_attention" for t in types)


def _moe(model_type: str, cfg: dict[str, Any], num_layers: int) -> MoEConfig | None:
    if model_type == "qwen3_5_text":
        return None
    experts = int(cfg.get("num_experts", 512 if model_type == "qwen3_next" else 256))
    step = int(cfg.get("decoder_sparse_step", 1)) if model_type == "qwen3_next" else 1
    if step < 1:
        raise _refuse("decoder_sparse_step", step, " (must be at least 1)")
    moe = MoEConfig(
        num_experts=experts,
        top_k=int(cfg.get("num_experts_per_tok", 10 if model_type == "qwen3_next" else 8)),
        intermediate_size=int(cfg.get("moe_intermediate_size", 512)),
        # Qwen3.5-MoE's router always renormalises (its config has no key for it)
        norm_topk_prob=bool(cfg.get("norm_topk_prob", True)) if model_type == "qwen3_next" else True,
        shared_expert_size=int(cfg.get("shared_expert_intermediate_size", 512)),
        sparse_step=step,
        dense_layers=tuple(int(i) for i in cfg.get("mlp_only_layers") or ()) if model_type == "qwen3_next" else (),
    )
    if experts > 0 and not 1 <= moe.top_k <= experts:
        raise _refuse("num_experts_per_tok", moe.top_k, f" (must be between 1 and the {experts} experts)")
    return moe if any(moe.is_sparse(i) for i in range(num_layers)) else None


def configure(model_type: str, cfg: dict[str, Any], fields: dict[str, Any]) -> dict[str, Any]:
    """ModelConfig overrides for a Qwen3-Next / Qwen3.5 config.json; refuses what is not computed."""
    if model_type not in MODEL_TYPES:
        raise UnsupportedModelError(f"{model_type!r} is not a Qwen3-Next / Qwen3.5 family model")
    if cfg.get("hidden_act", "silu") not in ("silu", "swish"):
        raise _refuse("hidden_act", cfg["hidden_act"], "; this family's MLP and convolution are SiLU")
    if cfg.get("attn_output_gate", True) is not True:  # Qwen3.5 states it; the gate is always computed
        raise _refuse("attn_output_gate", cfg["attn_output_gate"], " (full attention without its output gate)")
    if cfg.get("attention_bias"):
        raise _refuse("attention_bias", cfg["attention_bias"], " (biases on the attention projections)")
    num_layers = fields["num_layers"]
    layout = cfg.get("gguf_linear_layout")  # a GGUF's (gguf_builders._qwen3next)
    linear = LinearAttnConfig(
        linear_layers=_layer_kinds(cfg, num_layers),
        num_k_heads=int(cfg.get("linear_num_key_heads", 16)),
        num_v_heads=int(cfg.get("linear_num_value_heads", 32)),
        k_dim=int(cfg.get("linear_key_head_dim", 128)),
        v_dim=int(cfg.get("linear_value_head_dim", 128)),
        conv_kernel=int(cfg.get("linear_conv_kernel_dim", 4)),
        # llama.cpp splits Qwen3-Next's qkvz (its first files kept it whole, as ssm_in) and keeps its ba.
        fused_qkvz=model_type == "qwen3_next" and layout in (None, "qwen3next-ssm_in"),
        fused_ba=model_type == "qwen3_next",
        v_heads_tiled=layout in ("qwen35", "qwen35moe")
        and cfg.get("linear_num_key_heads") != cfg.get("linear_num_value_heads"),
    )
    if linear.num_v_heads % linear.num_k_heads:
        raise _refuse("linear_num_value_heads", linear.num_v_heads, " (must be a multiple of linear_num_key_heads)")
    if all(linear.linear_layers):  # (every real release has some; the KV pool needs one)
        raise _refuse("layer_types", ["linear_attention"] * num_layers, " (no full_attention layer at all)")
    if linear.conv_kernel < 2:
        raise _refuse("linear_conv_kernel_dim", linear.conv_kernel, " (must be at least 2)")
    rope = {k: v for k, v in (cfg.get("rope_parameters") or {}).items() if not k.startswith("mrope_")}
    partial = rope.pop("partial_rotary_factor", None) or cfg.get("partial_rotary_factor") or 0.25
    max_pos = fields["max_position_embeddings"]
    out: dict[str, Any] = {
        "linear_attn": linear if any(linear.linear_layers) else None,
        "qk_norm": True,
        "norm_offset": True,
        "attention_bias": False,
        "rope_scaling": rope_scaling({**cfg, "partial_rotary_factor": partial}, rope, max_pos),
        "moe": _moe(model_type, cfg, num_layers),
        # Qwen3-Next / 3.5 full-attention layers attend to the whole context.
        "layer_windows": None,
    }
    if linear.num_k_heads * linear.k_dim == 0 or linear.num_v_heads * linear.v_dim == 0:
        raise _refuse("linear_num_key_heads", linear.num_k_heads, " (the linear layers need heads)")
    return out


# Norms mlx_lm's sanitize stores as 1 + weight (its nn.RMSNorm scales by the weight alone); the gated
# delta net's output norm is stored as is.
_SHIFTED_NORMS = (".input_layernorm.weight", ".post_attention_layernorm.weight", ".q_norm.weight", ".k_norm.weight")


def stored_by_mlx_lm(files: list[Any]) -> bool:
    """True for a folder mlx_lm converted: its convolution weights are [C, K, 1] (MLX's Conv1d layout)
    where Hugging Face's are [C, 1, K], and then its norms were shifted by one."""
    from safetensors import safe_open

    for path in files:
        with safe_open(str(path), framework="numpy") as f:
            for name in f.keys():
                if name.endswith("conv1d.weight"):
                    shape = f.get_slice(name).get_shape()
                    return len(shape) == 3 and shape[-1] == 1 and shape[1] > 1
    return False


def checkpoint_tensors(source: Iterator[tuple[str, Any]], mlx_lm_layout: bool) -> Iterator[tuple[str, Any]]:
    """The stream in Hugging Face's layout: an mlx_lm folder's convolutions transposed back and its
    shifted norms less one (exact in float32; in bfloat16 as mlx_lm's own +1 rounded them)."""
    for name, value in source:
        if mlx_lm_layout and name.endswith("conv1d.weight"):
            value = value.swapaxes(1, 2)
        elif mlx_lm_layout and (name.endswith(_SHIFTED_NORMS) or name == "model.norm.weight"):
            value = value - 1.0
        yield name, value


def gguf_tensors(source: Iterator[tuple[str, Any]]) -> Iterator[tuple[str, Any]]:
    """A llama.cpp GGUF's tensors as the checkpoint held them: norms stored as 1 + w less one (not the
    gated delta net's output norm, stored as is), A_log back from A = -exp(A_log), the convolution's
    [C, K] kernel as [C, 1, K]. These are float32 in the files llama.cpp writes."""
    import numpy as np

    for name, value in source:
        if name.endswith(_SHIFTED_NORMS) or name == "model.norm.weight":
            value = np.asarray(value, dtype=np.float32) - np.float32(1.0)
        elif name.endswith(".linear_attn.A_log"):
            value = np.log(-np.asarray(value, dtype=np.float32))
        elif name.endswith(".linear_attn.conv1d.weight"):
            value = np.asarray(value, dtype=np.float32)[:, None, :]
        yield name, value


def _hf_conv(kernel: Any) -> Any:
    """A depthwise kernel in Hugging Face's [C, 1, K] layout (mlx_lm saves MLX's [C, K, 1])."""
    return kernel.transpose(0, 2, 1) if kernel.ndim == 3 and kernel.shape[2] == 1 and kernel.shape[1] > 1 else kernel


def join_qkv_convs(source: Iterator[tuple[str, Any]], sublayer: str, family: str) -> Iterator[tuple[str, Any]]:
    """The stream with each layer's q, k and v convolution kernels (`<sublayer>.q_conv1d.weight`, ...: OLMo Hybrid's,
    Kimi Linear's) joined in that order into `<sublayer>.conv1d.weight`, as transformers' conversion mappings
    concatenate them (an mlx_lm folder's MLX layout taken back to Hugging Face's first); a checkpoint that already
    has conv1d passes as it is."""
    import numpy as np

    from lantern.app.models.quant.affine import float32_array

    pattern = re.compile(rf"^(.*\.{sublayer}\.)([qkv])_conv1d\.weight$")
    held: dict[str, dict[str, Any]] = {}
    for name, value in source:
        conv = pattern.match(name)
        if conv is None:
            yield name, value
            continue
        parts = held.setdefault(conv.group(1), {})
        parts[conv.group(2)] = value
        if len(parts) == 3:
            del held[conv.group(1)]
            # (a few kernels of a few values each: joined as float32, which every backend loads)
            joined = np.concatenate([_hf_conv(float32_array(parts[p])) for p in "qkv"], axis=0)
            yield f"{conv.group(1)}conv1d.weight", joined
    if held:
        raise UnsupportedModelError(f"{family}: {sorted(held)} lack some of q_conv1d / k_conv1d / v_conv1d")
