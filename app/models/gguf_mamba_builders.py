"""GGUF config builders of the Mamba-2 hybrids (family_mamba2's mixer among attention layers): Granite 4.0-H,
Nemotron-H, Nemotron 3 and Falcon-H1 as llama.cpp's GraniteHybridModel, NemotronHModel and FalconH1Model write
them; and the mixer-only models, Mamba / Falcon-Mamba (MambaModel, arch mamba) and Mamba-2 (Mamba2Model)."""

from __future__ import annotations

from typing import Any

from lantern.app.models.gguf_config import _head_dim, _Meta
from lantern.app.models.gguf_granite_builders import granite_scalars
from lantern.app.models.gguf_rope import stated_rope_scaling
from lantern.app.models.spec import UnsupportedModelError


def _granite_hybrid(meta: _Meta, tensors: dict[str, Any], cfg: dict[str, Any]) -> dict[str, Any]:
    """Granite 4.0-H (llama.cpp's GraniteHybridModel): a layer without KV heads is a Mamba-2 mixer, sized by
    ssm.inner_size, ssm.time_step_rank (its heads), ssm.state_size, ssm.group_count and ssm.conv_kernel;
    rope only where rope.scaling.finetuned says so (the released models have none); the dense shared_mlp
    (ffn_gate, or ffn_gate_shexp beside experts) and the experts sized by their tensors."""
    kv = meta.get("attention.head_count_kv")
    layers = cfg["num_hidden_layers"]
    kinds = ["mamba" if not h else "attention" for h in kv][:layers] if isinstance(kv, (list, tuple)) else None
    kinds = kinds or ["attention"] * layers
    heads, inner, hidden = int(meta.need("ssm.time_step_rank")), int(meta.need("ssm.inner_size")), cfg["hidden_size"]
    first = f"blk.{kinds.index('mamba')}." if "mamba" in kinds else "blk.0."
    attn = f"blk.{kinds.index('attention')}." if "attention" in kinds else "blk.0."
    experts = int(meta.get("expert_count") or 0)
    shared = tensors.get(f"{attn}ffn_gate{'_shexp' if experts else ''}.weight")
    out: dict[str, Any] = {
        "model_type": "granitemoehybrid",
        **granite_scalars(meta, cfg),
        "layer_types": kinds,
        "position_embedding_type": "rope" if meta.get("rope.scaling.finetuned", True) else "nope",
        "mamba_n_heads": heads,
        "mamba_d_head": inner // heads,
        # (family_mamba2 takes int(expand * hidden) as transformers does: a ratio a half step above lands on inner)
        "mamba_expand": inner // hidden if inner % hidden == 0 else (inner + 0.5) / hidden,
        "mamba_d_state": int(meta.need("ssm.state_size")),
        "mamba_n_groups": int(meta.need("ssm.group_count")),
        "mamba_d_conv": int(meta.need("ssm.conv_kernel")),
        "mamba_conv_bias": f"{first}ssm_conv1d.bias" in tensors,
        "mamba_proj_bias": f"{first}ssm_in.bias" in tensors,
        "time_step_limit": [0.0, float("inf")],  # llama.cpp's scan clamps nothing
        "shared_intermediate_size": int(shared.shape[1]) if shared is not None else cfg["intermediate_size"],
        "num_local_experts": experts,
        "attention_bias": f"{attn}attn_q.bias" in tensors,  # refused by family_granite
    }
    if experts:
        gate = tensors.get(f"{attn}ffn_gate_exps.weight")  # [hidden, expert width, experts] in ggml's order
        out["num_experts_per_tok"] = int(meta.need("expert_used_count"))
        out["intermediate_size"] = int(gate.shape[1]) if gate is not None else cfg["intermediate_size"]
    rotated = meta.get("rope.dimension_count")  # (Bamba's files rotate part of each head: not computed here)
    if out["position_embedding_type"] == "rope" and rotated not in (None, out["head_dim"]):
        raise UnsupportedModelError(
            f"{meta.label}granitehybrid.rope.dimension_count={rotated} (a partial rope) is not implemented"
        )
    rope = stated_rope_scaling(meta)
    if rope:
        out["rope_parameters"] = {**rope, "rope_theta": cfg["rope_theta"]}
    return out


def _nemotron_h(meta: _Meta, tensors: dict[str, Any], cfg: dict[str, Any]) -> dict[str, Any]:
    """Nemotron-H (llama.cpp's NemotronHModel): a layer with KV heads attends, one with a feed_forward_length
    is a relu^2 MLP, the rest are Mamba-2 mixers (ssm.* as Granite 4.0-H's); no rope, no scalars, no dt clamp."""
    layers = cfg["num_hidden_layers"]
    kv, ff = meta.get("attention.head_count_kv"), meta.get("feed_forward_length")
    if not isinstance(kv, (list, tuple)) or not isinstance(ff, (list, tuple)) or meta.get("expert_count"):
        raise UnsupportedModelError(
            f"{meta.label}nemotron_h without per-layer KV heads and MLP widths (or with experts)"
        )
    kinds = "".join("*" if h else "-" if f else "M" for h, f in zip(kv[:layers], ff[:layers]))
    return _nemotron_fields(meta, tensors, cfg, kinds)


def _nemotron_fields(meta: _Meta, tensors: dict[str, Any], cfg: dict[str, Any], kinds: str) -> dict[str, Any]:
    heads, inner = int(meta.need("ssm.time_step_rank")), int(meta.need("ssm.inner_size"))
    first = f"blk.{kinds.find('M')}."
    return {
        "model_type": "nemotron_h",
        "hybrid_override_pattern": kinds,
        "head_dim": _head_dim(meta, cfg),
        "mamba_num_heads": heads,
        "mamba_head_dim": inner // heads,
        "ssm_state_size": int(meta.need("ssm.state_size")),
        "n_groups": int(meta.need("ssm.group_count")),
        "conv_kernel": int(meta.need("ssm.conv_kernel")),
        "use_conv_bias": f"{first}ssm_conv1d.bias" in tensors,
        "use_bias": f"{first}ssm_in.bias" in tensors,
        "layer_norm_epsilon": cfg["rms_norm_eps"],
        "attention_bias": f"blk.{kinds.find('*')}.attn_q.bias" in tensors,  # refused by family_nemotron_h
    }


# A Nemotron 3 layer's kind by the tensor only it has (its feed_forward_length is 0 on a dense MLP layer too).
_KIND_TENSORS = (("ffn_gate_inp", "E"), ("attn_q", "*"), ("ssm_in", "M"), ("ffn_up", "-"))


def _layer_kind(meta: _Meta, tensors: dict[str, Any], layer: int) -> str:
    for stem, kind in _KIND_TENSORS:
        if f"blk.{layer}.{stem}.weight" in tensors:
            return kind
    raise UnsupportedModelError(f"{meta.label}nemotron_h_moe layer {layer} is neither Mamba, attention nor an MLP")


def _nemotron_h_moe(meta: _Meta, tensors: dict[str, Any], cfg: dict[str, Any]) -> dict[str, Any]:
    """Nemotron 3 Nano / Super / Ultra (llama.cpp's NemotronHModel with experts): each layer's kind from its
    tensors; the experts from the expert_* keys (the group count without a used-group count is ambiguous:
    refused), LatentMoE's width from moe_latent_size; multi-token-prediction blocks past the stack unread."""
    kinds = "".join(_layer_kind(meta, tensors, i) for i in range(cfg["num_hidden_layers"]))
    groups = int(meta.get("expert_group_count") or 1)
    used = meta.get("expert_group_used_count")
    if groups > 1 and used is None:
        raise UnsupportedModelError(
            f"{meta.label}{meta.arch}.expert_group_count={groups} without expert_group_used_count is not implemented"
        )
    latent = meta.get("moe_latent_size")
    out = {
        **_nemotron_fields(meta, tensors, cfg, kinds),
        "n_routed_experts": int(meta.need("expert_count")),
        "num_experts_per_tok": int(meta.need("expert_used_count")),
        "moe_intermediate_size": int(meta.need("expert_feed_forward_length")),
        "moe_shared_expert_intermediate_size": int(meta.need("expert_shared_feed_forward_length")),
        "norm_topk_prob": bool(meta.get("expert_weights_norm", False)),  # (llama.cpp's default)
        "routed_scaling_factor": float(meta.get("expert_weights_scale") or 1.0),
        "n_group": groups,
        "topk_group": int(used or 1),
        "moe_latent_size": int(latent) if latent else None,
    }
    if "-" in kinds:  # a dense MLP layer: its width from its tensor ([hidden, width] in ggml's order)
        out["intermediate_size"] = int(tensors[f"blk.{kinds.find('-')}.ffn_up.weight"].shape[1])
    return out


def _falcon_h1(meta: _Meta, tensors: dict[str, Any], cfg: dict[str, Any]) -> dict[str, Any]:
    """Falcon-H1 (llama.cpp's FalconH1Model, a Mamba2Model): every layer a mixer beside attention. Its converter
    folds every μP multiplier into the weights, so none is stated (FalconH1Config's defaults are 1); the mixer's
    norm is there when ssm_norm is, after the gate as llama.cpp's graph computes it."""
    heads, inner = int(meta.need("ssm.time_step_rank")), int(meta.need("ssm.inner_size"))
    return {
        "model_type": "falcon_h1",
        "head_dim": _head_dim(meta, cfg),
        "mamba_d_ssm": inner,
        "mamba_n_heads": heads,
        "mamba_d_head": inner // heads,
        "mamba_d_state": int(meta.need("ssm.state_size")),
        "mamba_n_groups": int(meta.need("ssm.group_count")),
        "mamba_d_conv": int(meta.need("ssm.conv_kernel")),
        "mamba_conv_bias": "blk.0.ssm_conv1d.bias" in tensors,
        "mamba_proj_bias": "blk.0.ssm_in.bias" in tensors,
        "projectors_bias": "blk.0.ssm_out.bias" in tensors,  # (refused unless equal to mamba_proj_bias)
        "mamba_rms_norm": "blk.0.ssm_norm.weight" in tensors,
        "mamba_norm_before_gate": False,
        "time_step_limit": [0.0, float("inf")],  # llama.cpp's scan clamps nothing
        "attention_bias": "blk.0.attn_q.bias" in tensors,  # refused by family_falcon_h1
    }


def _mamba(meta: _Meta, tensors: dict[str, Any], cfg: dict[str, Any]) -> dict[str, Any]:
    """Mamba / Falcon-Mamba (llama.cpp's MambaModel: ssm.dt_b_c_rms marks Falcon-Mamba's weightless norms, whose
    eps no key states: FalconMambaConfig's default is the model's); biases as their tensors."""
    inner, hidden = int(meta.need("ssm.inner_size")), cfg["hidden_size"]
    return {
        "model_type": "falcon_mamba" if meta.get("ssm.dt_b_c_rms") else "mamba",
        "expand": inner / hidden,
        "intermediate_size": inner,
        "state_size": int(meta.need("ssm.state_size")),
        "conv_kernel": int(meta.need("ssm.conv_kernel")),
        "time_step_rank": int(meta.need("ssm.time_step_rank")),
        "use_conv_bias": "blk.0.ssm_conv1d.bias" in tensors,
        "use_bias": "blk.0.ssm_in.bias" in tensors,
        "layer_norm_epsilon": cfg["rms_norm_eps"],
    }


def _mamba2(meta: _Meta, tensors: dict[str, Any], cfg: dict[str, Any]) -> dict[str, Any]:
    """Mamba-2 (llama.cpp's Mamba2Model: its heads as ssm.time_step_rank, head_dim inner / heads; llama.cpp's scan
    clamps no dt)."""
    heads, inner = int(meta.need("ssm.time_step_rank")), int(meta.need("ssm.inner_size"))
    return {
        "model_type": "mamba2",
        "num_heads": heads,
        "head_dim": inner // heads,
        "expand": inner / cfg["hidden_size"],
        "state_size": int(meta.need("ssm.state_size")),
        "n_groups": int(meta.need("ssm.group_count")),
        "conv_kernel": int(meta.need("ssm.conv_kernel")),
        "use_conv_bias": "blk.0.ssm_conv1d.bias" in tensors,
        "use_bias": "blk.0.ssm_in.bias" in tensors,
        "time_step_limit": [0.0, float("inf")],
        "layer_norm_epsilon": cfg["rms_norm_eps"],
    }


def _jamba(meta: _Meta, tensors: dict[str, Any], cfg: dict[str, Any]) -> dict[str, Any]:
    """Jamba (llama.cpp's JambaModel): a layer without KV heads (head_count_kv per layer) is a Mamba-1 mixer; a layer
    with a router (ffn_gate_inp) holds the experts; the mixer's sizes from the ssm.* keys, biases as their tensors."""
    kv = meta.get("attention.head_count_kv")
    layers = cfg["num_hidden_layers"]
    kinds = ["attention" if h else "mamba" for h in kv][:layers] if isinstance(kv, (list, tuple)) else None
    if kinds is None:
        raise UnsupportedModelError(f"{meta.name}: jamba.attention.head_count_kv is no per-layer list")
    experts = int(meta.get("expert_count") or 1)
    first = f"blk.{kinds.index('mamba')}." if "mamba" in kinds else "blk.0."
    inner, hidden = int(meta.need("ssm.inner_size")), cfg["hidden_size"]
    return {
        "model_type": "jamba",
        "layers_block_type": kinds,
        "layers_num_experts": [experts if f"blk.{i}.ffn_gate_inp.weight" in tensors else 1 for i in range(layers)],
        "num_experts": experts,
        "num_experts_per_tok": int(meta.get("expert_used_count") or 1),
        "mamba_expand": inner / hidden,
        "mamba_d_state": int(meta.need("ssm.state_size")),
        "mamba_d_conv": int(meta.need("ssm.conv_kernel")),
        "mamba_dt_rank": int(meta.need("ssm.time_step_rank")),
        "mamba_conv_bias": f"{first}ssm_conv1d.bias" in tensors,
        "mamba_proj_bias": f"{first}ssm_in.bias" in tensors,
    }


def _rwkv7(meta: _Meta, tensors: dict[str, Any], cfg: dict[str, Any]) -> dict[str, Any]:
    """RWKV-7 (llama.cpp's Rwkv7Model): heads of wkv.head_size, the four LoRA ranks, LayerNorms' eps, the head's rows
    as its tensor's (the converter pads the World vocabulary's 65530 tokens to the embedding's rows)."""
    return {
        "model_type": "rwkv7",
        "head_dim": int(meta.need("wkv.head_size")),
        "decay_low_rank_dim": int(meta.need("attention.decay_lora_rank")),
        "a_low_rank_dim": int(meta.need("attention.iclr_lora_rank")),
        "v_low_rank_dim": int(meta.need("attention.value_residual_mix_lora_rank")),
        "gate_low_rank_dim": int(meta.need("attention.gate_lora_rank")),
        "norm_eps": float(meta.need("attention.layer_norm_epsilon")),
        "num_attention_heads": None,  # (prepare: hidden_size / head_dim; the file states 0)
        "num_key_value_heads": None,
    }


MAMBA_BUILDERS = {
    "rwkv7": _rwkv7,
    "jamba": _jamba,
    "mamba": _mamba,
    "mamba2": _mamba2,
    "granitehybrid": _granite_hybrid,
    "nemotron_h": _nemotron_h,
    "nemotron_h_moe": _nemotron_h_moe,
    "falcon-h1": _falcon_h1,
}
