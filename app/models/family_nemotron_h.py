"""NVIDIA Nemotron-H (model_type "nemotron_h": Nemotron-H 4B / 8B / 47B / 56B, Nemotron-Nano-9B-v2 / 12B-v2):
what its config.json means, as transformers' NemotronHConfig and modeling_nemotron_h read it.

The maths: a stack of blocks, each `x + mixer(RMSNorm(x))` with ONE mixer per block, named by its pattern
letter — M a Mamba-2 mixer (family_mamba2: mamba_num_heads x mamba_head_dim channels, ssm_state_size, n_groups
of B/C and of the gated norm, dt clamped to time_step_limit), * attention without any positional encoding
(NoPE, head_dim per head), - an MLP down(relu(up(x))^2) without a gate. No final scalars; the final norm is
norm_f. Released configs state the pattern as `hybrid_override_pattern` ("M-M-M-MM*-..."); transformers 5 saves
`layers_block_type` (linear_attention / full_attention / mlp / moe) and no num_hidden_layers.

E (Nemotron 3 Nano / Super / Ultra) is a mixture of experts: DeepSeek-V3's router (family_deepseek: a sigmoid in
float32, the choice biased by e_score_correction_bias within the topk_group best of n_group groups, weights the
unbiased scores renormalised when norm_topk_prob, times routed_scaling_factor) over n_routed_experts ungated experts
down(relu(up(x))^2) of moe_intermediate_size, plus one relu^2 shared expert of moe_shared_expert_intermediate_size on
the block's input (transformers builds one whatever n_shared_experts says; other counts are refused). LatentMoE
models (Super, Ultra: moe_latent_size) run the routed experts on fc1_latent_proj(x), moe_latent_size wide, and add
fc2_latent_proj of their sum (summed in float32); the router and shared expert read x itself.
Multi-token-prediction layers (`mtp.*`) are skipped unread.
Checkpoints name every block's mixer `mixer` under `backbone.`; checkpoint_name gives the model files' names.
"""

from __future__ import annotations

import math
import re
from typing import Any

from lantern.app.models.errors import UnsupportedModelError, refuse
from lantern.app.models.family_deepseek import DeepSeekMoEConfig
from lantern.app.models.family_mamba2 import Mamba2Config, _json_float

_LETTERS = {"linear_attention": "M", "mamba": "M", "full_attention": "*", "attention": "*", "mlp": "-", "moe": "E"}


def prepare(cfg: dict[str, Any]) -> dict[str, Any]:
    """config.json with its layer count (transformers 5 saves only layers_block_type) and head_dim stated: the
    first Nemotron-H configs name it attention_head_dim (Nemotron-H-4B: 128, not hidden / heads = 96), and
    NemotronHConfig's default is 128."""
    head_dim = cfg.get("head_dim") or cfg.get("attention_head_dim") or 128
    return {**cfg, "num_hidden_layers": len(layer_kinds(cfg)), "head_dim": head_dim}


def _kinds_key(cfg: dict[str, Any]) -> str:
    """The config key the layer pattern is read from."""
    if cfg.get("layers_block_type") is not None:
        return "layers_block_type"
    return "layer_types" if cfg.get("layer_types") is not None else "hybrid_override_pattern"


def layer_kinds(cfg: dict[str, Any]) -> str:
    """One pattern letter per layer, from layers_block_type or hybrid_override_pattern."""
    key = _kinds_key(cfg)
    if key != "hybrid_override_pattern":
        types = cfg[key]
        if not isinstance(types, list) or any(t not in _LETTERS for t in types):
            raise refuse(key, types, " (linear_attention, full_attention, mlp or moe per layer)")
        return "".join(_LETTERS[t] for t in types)
    pattern = cfg.get(key)
    if not isinstance(pattern, str) or not pattern or set(pattern) - set("M*-E"):
        raise refuse(key, pattern, " (one of M, *, - and E per layer)")
    return pattern


def configure(model_type: str, cfg: dict[str, Any], fields: dict[str, Any]) -> dict[str, Any]:
    if model_type != "nemotron_h":
        raise UnsupportedModelError(f"{model_type!r} is not a Nemotron-H model")
    kinds, key = layer_kinds(cfg), _kinds_key(cfg)
    if "*" not in kinds:
        raise refuse(key, cfg[key], " (no attention layer at all)")
    for key, want in (("mlp_hidden_act", "relu2"), ("mamba_hidden_act", "silu")):
        if cfg.get(key, want) != want:
            raise refuse(key, cfg[key], f" ({want})")
    for key in ("attention_bias", "mlp_bias"):
        if cfg.get(key):
            raise refuse(key, cfg[key], " (biases on the projections)")
    if cfg.get("sliding_window"):
        raise refuse("sliding_window", cfg["sliding_window"], " (Nemotron-H's attention layers attend to all)")
    eps = float(cfg.get("layer_norm_epsilon", 1e-5))
    return {
        "rms_norm_eps": eps,
        "hidden_act": "relu2",
        "rope_layers": (False,) * len(kinds),  # NoPE
        "rope_scaling": None,
        "mamba": mamba2_mixer(cfg, kinds, eps),
        "layer_windows": None,
        "moe": _experts(cfg, kinds) if "E" in kinds else None,
    }


def _experts(cfg: dict[str, Any], kinds: str) -> DeepSeekMoEConfig:
    """The E layers' experts and router, with NemotronHConfig's defaults for absent keys."""
    experts, top_k = int(cfg.get("n_routed_experts", 8)), int(cfg.get("num_experts_per_tok", 2))
    n_group, topk_group = int(cfg.get("n_group") or 1), int(cfg.get("topk_group") or 1)
    if n_group < 1 or experts % n_group or experts // n_group < 2 or not 1 <= topk_group <= n_group:
        # (groups are ranked by their two best scores)
        raise refuse("n_group", n_group, f" with topk_group={topk_group} and {experts} n_routed_experts")
    if not 1 <= top_k <= topk_group * experts // n_group:
        raise refuse("num_experts_per_tok", top_k, f" (the routable experts are {topk_group * experts // n_group})")
    if cfg.get("n_shared_experts", 1) not in (None, 1):  # (mlx_lm builds none for None, transformers one)
        raise refuse("n_shared_experts", cfg["n_shared_experts"], " (one shared expert of its intermediate size)")
    latent = cfg.get("moe_latent_size")
    return DeepSeekMoEConfig(
        num_experts=experts,
        top_k=top_k,
        intermediate_size=int(cfg.get("moe_intermediate_size", 7688)),
        norm_topk_prob=bool(cfg.get("norm_topk_prob", True)),
        router_weights_fp32=True,  # each expert's output scaled by its float32 weight
        dense_layers=tuple(i for i, kind in enumerate(kinds) if kind != "E"),
        gated=False,
        latent_size=int(latent) if latent else None,
        scoring="sigmoid",
        topk_method="noaux_tc",
        n_group=n_group,
        topk_group=topk_group,
        routed_scaling_factor=float(cfg.get("routed_scaling_factor") or 1.0),
        shared_size=int(cfg.get("moe_shared_expert_intermediate_size", 7688)),
        correction_bias=True,
    )


def mamba2_mixer(cfg: dict[str, Any], kinds: str, eps: float) -> Mamba2Config:
    """The Mamba-2 mixers' sizes under NemotronHConfig's names (family_mamba's mamba2 configs renamed so too)."""
    heads, head_dim = int(cfg.get("mamba_num_heads", 128)), int(cfg.get("mamba_head_dim", 64))
    groups = int(cfg.get("n_groups", 8))
    if groups < 1 or heads % groups:
        raise refuse("n_groups", groups, f" (must divide the {heads} mamba_num_heads)")
    conv = int(cfg.get("conv_kernel", 4))
    if conv < 2:
        raise refuse("conv_kernel", conv, " (must be at least 2)")
    # dt clamped to time_step_limit as mlx_lm computes it (the released [0, Infinity]: no clamp, as llama.cpp and
    # transformers' decode step); transformers' prefill alone clamps below at time_step_min instead.
    low, high = (_json_float(v) for v in cfg.get("time_step_limit") or (0.0, math.inf))
    return Mamba2Config(
        mamba_layers=tuple(k == "M" for k in kinds),
        num_heads=heads,
        head_dim=head_dim,
        state_size=int(cfg.get("ssm_state_size", 128)),
        groups=groups,
        conv_kernel=conv,
        conv_bias=bool(cfg.get("use_conv_bias", True)),
        proj_bias=bool(cfg.get("use_bias", False)),
        dt_limit=(low, high),
        norm_eps=eps,
        layer_kinds=kinds,
    )


_BLOCK = re.compile(r"^(?:backbone|model)\.layers\.(\d+)\.(mixer|norm)\.(.*)$")
_MIXER_NAMES = {"M": "mamba", "*": "self_attn", "-": "mlp", "E": "mlp"}


def checkpoint_name(name: str, kinds: str) -> str:
    """A Nemotron-H checkpoint name in the model files' terms: backbone.* as model.*, the embedding and final
    norm as Llama's, each block's norm as input_layernorm and its mixer under its kind's name (mamba,
    self_attn, mlp)."""
    if name.startswith(("model.backbone.", "model.lm_head.")):  # (Mamba-Codestral's names, as llama.cpp strips them)
        name = name.removeprefix("model.")
    m = _BLOCK.match(name)
    if m is not None:
        layer, part, rest = m.groups()
        if int(layer) >= len(kinds):  # (a layer past the stack: the stream skips it)
            return name
        if part == "norm":
            return f"model.layers.{layer}.input_layernorm.{rest}"
        for old, new in (("switch_mlp.fc1.", "switch_mlp.up_proj."), ("switch_mlp.fc2.", "switch_mlp.down_proj.")):
            rest = rest.replace(old, new)  # mlx_lm's stacked experts
        return f"model.layers.{layer}.{_MIXER_NAMES[kinds[int(layer)]]}.{rest}"
    for old, new in (("backbone.embeddings.", "model.embed_tokens."), ("backbone.norm_f.", "model.norm.")):
        if name.startswith(old):
            return new + name[len(old) :]
    return name.replace("backbone.", "model.", 1) if name.startswith("backbone.") else name
