"""Kimi Linear (model_type "kimi_linear": moonshotai/Kimi-Linear-48B-A3B-Instruct / -Base), as transformers'
KimiLinearConfig reads its config.json -- the released remote-code keys (linear_attn_config, num_experts,
num_experts_per_token, model_max_length, ...) included -- turned into ModelConfig fields.

The maths (transformers' modeling_kimi_linear): Llama's pre-norm layer whose mixer is either Kimi Delta Attention
(KDA, most layers) or DeepSeek's multi-head latent attention without any rope (the rope part of each key is shared
by the heads but never rotated: MLAConfig.rope False), and DeepSeek-V3's mixture (sigmoid router with a correction
bias, routed_scaling_factor, one shared expert) after the first dense layer(s).

KDA is the gated delta rule with a decay per key channel rather than per head: per head, with state S [d_k, d_v],
    S <- diag(exp(g)) S;  u = beta (v - S^T k);  S <- S + k u^T;  o = S^T q
with q, k, v from q/k/v_proj through a causal depthwise convolution each (SiLU), q and k l2-normed (q times
d_k^-0.5), g = -exp(A_log) softplus(f_b(f_a(x)) + dt_bias) per channel, beta = sigmoid(b_proj(x)); the output is
RMS-normed per head times o_norm's weight times sigmoid(g_b(g_a(x))), then o_proj. Each sequence keeps the
convolutions' last inputs and S per KDA layer (a recurrent-state slot, as Qwen3-Next's gated delta net).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from lantern.app.models.errors import refuse
from lantern.app.models.family_deepseek import DeepSeekMoEConfig, MLAConfig
from lantern.app.models.family_qwen3_next import join_qkv_convs
from lantern.app.models.spec import UnsupportedModelError


@dataclass(frozen=True)
class KdaConfig:
    """Kimi Delta Attention's layers and shapes (ModelConfig.linear_attn: the engine's recurrent-state slots)."""

    linear_layers: tuple[bool, ...]  # per layer: True for KDA, False for latent attention
    num_heads: int
    head_dim: int  # d_k = d_v
    conv_kernel: int
    # Ling 3.0 (family_bailing_hybrid): full-rank f_proj / g_proj instead of the f_a/f_b, g_a/g_b pairs, and its
    # bounded forget gate g = gate_bound x sigmoid(exp(A_log) (f + dt_bias)) where gate_bound is set (kda_safe_gate)
    full_rank: bool = False
    gate_bound: float | None = None

    @property
    def width(self) -> int:
        """q, k and v's width each: heads x head_dim."""
        return self.num_heads * self.head_dim

    @property
    def conv_dim(self) -> int:
        """Channels the convolutions see: q, k and v side by side."""
        return 3 * self.width

    def state_elements(self) -> tuple[int, int]:
        """Per KDA layer and sequence: (convolution window values, recurrent state values)."""
        return self.conv_dim * (self.conv_kernel - 1), self.num_heads * self.head_dim * self.head_dim

    def attention_layers(self) -> list[int]:
        """The latent-attention layers, in order: the paged KV pool holds only theirs."""
        return [i for i, linear in enumerate(self.linear_layers) if not linear]


# What the released (remote-code) config says differently from transformers' maths: refused unless as transformers
# computes it (key -> the value transformers' code implies)
_REMOTE_CODE = {"mla_use_nope": True, "moe_router_activation_func": "sigmoid", "moe_layer_freq": 1}


def _transformers_config(cfg: dict[str, Any]) -> Any:
    try:
        from transformers import KimiLinearConfig
    except ImportError:  # (its config class is what reads the released keys)
        raise UnsupportedModelError(
            "kimi_linear is read by transformers' KimiLinearConfig, which this transformers lacks: "
            "pip install -U transformers"
        ) from None
    skip = ("model_type", "transformers_version", "architectures", "auto_map")
    try:
        return KimiLinearConfig(**{k: v for k, v in cfg.items() if k not in skip})
    except (TypeError, ValueError) as exc:
        raise UnsupportedModelError(f"kimi_linear config.json: transformers cannot read it ({exc})") from None


def prepare(cfg: dict[str, Any]) -> dict[str, Any]:
    """The config as KimiLinearConfig reads it (its aliases and linear_attn_config resolved), for from_hf."""
    for key, value in _REMOTE_CODE.items():
        if key in cfg and cfg[key] != value:
            raise refuse(key, cfg[key], f" (transformers' Kimi Linear computes {key}={value!r})")
    if cfg.get("use_grouped_topk") is False and cfg.get("num_expert_group", cfg.get("n_group", 1)) != 1:
        raise refuse("use_grouped_topk", False, " with expert groups")
    built = _transformers_config(cfg)
    out = {k: v for k, v in built.to_dict().items() if k not in ("architectures", "transformers_version")}
    for name in ("max_position_embeddings", "norm_topk_prob", "n_group", "num_local_experts", "n_shared_experts"):
        out[name] = getattr(built, name)  # (attribute_map aliases: to_dict writes the released names)
    out["num_experts_per_tok"] = built.num_experts_per_tok
    return {**out, "model_type": "kimi_linear"}


def configure(model_type: str, cfg: dict[str, Any], fields: dict[str, Any]) -> dict[str, Any]:
    """ModelConfig field overrides for a (prepared) kimi_linear config; refuses, naming the key, what it does not
    compute."""
    if model_type != "kimi_linear":
        raise UnsupportedModelError(f"family_kimi_linear does not configure model_type {model_type!r}")
    if cfg.get("hidden_act", "silu") not in ("silu", "swish"):
        raise refuse("hidden_act", cfg["hidden_act"], "; Kimi Linear's MLPs and convolutions are SiLU here")
    if cfg.get("attention_bias"):
        raise refuse("attention_bias", cfg["attention_bias"], " for kimi_linear")
    heads, layers = int(cfg["num_attention_heads"]), int(fields["num_layers"])
    if cfg.get("num_key_value_heads") not in (None, heads):  # (its latent attention expands to every head)
        raise refuse("num_key_value_heads", cfg["num_key_value_heads"], f" (MLA needs num_attention_heads={heads})")
    types = cfg["layer_types"]
    if len(types) != layers or set(types) - {"linear_attention", "full_attention"}:
        raise refuse("layer_types", types, f" (linear_attention / full_attention for each of {layers} layers)")
    kda = KdaConfig(
        linear_layers=tuple(t == "linear_attention" for t in types),
        num_heads=int(cfg["linear_num_heads"]),
        head_dim=int(cfg["linear_head_dim"]),
        conv_kernel=int(cfg["linear_conv_kernel_dim"]),
    )
    if all(kda.linear_layers):
        raise refuse("layer_types", types, " (no full_attention layer: the KV pool needs one)")
    if kda.conv_kernel < 2:
        raise refuse("linear_conv_kernel_dim", kda.conv_kernel, " (must be at least 2)")
    q_lora = cfg.get("q_lora_rank")
    mla = MLAConfig(
        kv_lora_rank=int(cfg["kv_lora_rank"]),
        q_lora_rank=None if q_lora is None else int(q_lora),
        qk_nope_head_dim=int(cfg["qk_nope_head_dim"]),
        qk_rope_head_dim=int(cfg["qk_rope_head_dim"]),
        v_head_dim=int(cfg["v_head_dim"]),
        rope_interleave=False,
        rope=False,
        norm_eps=float(cfg.get("latent_norm_eps") or 1e-6),  # (a GGUF's: the model's eps, as llama.cpp norms them)
    )
    return {
        "num_kv_heads": 1,  # the pool's one latent "head"
        "head_dim": mla.qk_rope_head_dim,
        "attn_scale": mla.qk_head_dim**-0.5,
        "rope_scaling": None,
        "layer_windows": None,
        "mla": mla,
        "linear_attn": kda,
        "moe": _experts(cfg, layers),
    }


def _experts(cfg: dict[str, Any], layers: int) -> DeepSeekMoEConfig | None:
    kinds = cfg.get("mlp_layer_types") or ["dense"] + ["sparse"] * (layers - 1)
    if len(kinds) != layers or set(kinds) - {"dense", "sparse"}:
        raise refuse("mlp_layer_types", kinds, f" (dense / sparse for each of {layers} layers)")
    experts, top_k = int(cfg["num_local_experts"]), int(cfg["num_experts_per_tok"])
    if experts == 0 or "sparse" not in kinds:
        return None
    n_group, topk_group = int(cfg["n_group"]), int(cfg.get("topk_group") or 1)
    if experts % n_group or not 1 <= topk_group <= n_group or experts // n_group < 2:
        raise refuse("num_expert_group", n_group, f" with topk_group={topk_group} and {experts} experts")
    if not 1 <= top_k <= topk_group * (experts // n_group):
        raise refuse("num_experts_per_token", top_k, f" (between 1 and the experts routable of {experts})")
    inner = int(cfg["moe_intermediate_size"])
    return DeepSeekMoEConfig(
        num_experts=experts,
        top_k=top_k,
        intermediate_size=inner,
        norm_topk_prob=bool(cfg["norm_topk_prob"]),
        router_weights_fp32=True,
        scoring="sigmoid",
        topk_method="noaux_tc",
        n_group=n_group,
        topk_group=topk_group,
        routed_scaling_factor=float(cfg.get("routed_scaling_factor") or 1.0),
        dense_layers=tuple(i for i, kind in enumerate(kinds) if kind == "dense"),
        correction_bias=True,
        shared_size=int(cfg.get("n_shared_experts") or 0) * inner,
    )


_EXPERT = re.compile(r"^(.*\.mlp\.experts\.\d+)\.(w1|w2|w3)\.(\w+)$")
_EXPERT_PROJ = {"w1": "gate_proj", "w2": "down_proj", "w3": "up_proj"}
_MLX_CONV = re.compile(r"^(.*\.self_attn)\.([qkv])_conv\.conv\.weight$")


def checkpoint_name(name: str) -> str | None:
    """A Kimi Linear checkpoint's tensor under the model files' name: the mixture (block_sparse_moe) as mlp, its
    experts' w1 / w2 / w3 as gate / down / up_proj, mlx_lm's convolutions and router bias under the checkpoints'
    names; multi-token-prediction layers skipped."""
    if name.startswith("model.mtp"):
        return None
    name = name.replace(".block_sparse_moe.", ".mlp.")
    conv = _MLX_CONV.match(name)
    if conv is not None:  # mlx_lm's ShortConv1d: self_attn.q_conv.conv.weight (MLX's [C, K, 1]: joined back to HF's)
        return f"{conv.group(1)}.{conv.group(2)}_conv1d.weight"
    if name.endswith(".mlp.e_score_correction_bias"):  # (mlx_lm keeps the router's bias beside it)
        return name.replace(".mlp.e_score_correction_bias", ".mlp.gate.e_score_correction_bias")
    m = _EXPERT.match(name)
    return f"{m.group(1)}.{_EXPERT_PROJ[m.group(2)]}.{m.group(3)}" if m else name


def checkpoint_tensors(source: Iterator[tuple[str, Any]], spec: Any) -> Iterator[tuple[str, Any]]:
    """The stream with KDA's A_log [1, 1, H, 1] as [H] and dt_bias as [H x d_k] (the layouts checkpoints differ
    in), from a llama.cpp GGUF A_log back from the -exp(A_log) written and each convolution's [1, C, 1, K] as
    [C, 1, K]; then each layer's q, k and v convolutions joined into conv1d (family_qwen3_next.join_qkv_convs)."""
    import numpy as np

    gguf = spec.weight_format == "gguf"

    def normalized() -> Iterator[tuple[str, Any]]:
        for name, value in source:
            if gguf and name.endswith(".self_attn.A_log"):
                value = np.log(-np.asarray(value, dtype=np.float32))
            if name.endswith(".self_attn.A_log") or name.endswith(".self_attn.dt_bias"):
                value = value.reshape(-1)
            elif gguf and name.endswith("_conv1d.weight"):
                value = value.reshape(-1, 1, value.shape[-1])
            yield name, value

    return join_qkv_convs(normalized(), "self_attn", "kimi_linear")
