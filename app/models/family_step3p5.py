"""StepFun Step 3.5 Flash (model_type "step3p5": stepfun-ai/Step-3.5-Flash, remote code) and Step 3.7 Flash's
language model (step3p7: transformers' Step3p7ForConditionalGeneration, its vision tower not loaded): what the
config.json means, as mlx_lm's step3p5, StepFun's code and transformers' Step3p7TextConfig read it (StepFun's keys or
transformers'), turned into ModelConfig fields.

The maths: Llama's pre-norm layer under zero-centred RMSNorms (x / rms(x) * (1 + w), in float32; the per-head q/k
norms too); sliding and full layers (layer_types) with heads of their own (attention_other_setting's for the sliding
ones, one K/V count), each layer type on its own rope (rope_theta and partial_rotary_factors per layer, the scaling
only on yarn_only_types' layers: the full ones), the attention's output times sigmoid(g_proj(x)), one gate per head;
the layers moe_layers_enum names are a sigmoid router whose choice adds the router's bias, the chosen scores
renormalised (norm_expert_weight) and scaled by moe_router_scaling_factor, beside an always-on shared expert
(share_expert_dim wide); the others a dense MLP. Per layer, swiglu_limits clamps the routed experts and
swiglu_limits_shared the shared expert / dense MLP: min(silu(gate), limit) * clip(up, -limit, limit). Its
multi-token-prediction layers (num_nextn_predict_layers, stored after the stack; their entries in the per-layer
lists) are skipped.

Folders: the released layout (experts stacked under `moe.{gate,up,down}_proj`, the router `moe.gate` and its
`moe.router_bias`, `share_expert`, norms stored centred on 0) and mlx_lm's (`mlp.switch_mlp`, `mlp.gate.gate`,
`mlp.gate.router_bias`, `mlp.share_expert`; its norms stored with the 1 added, which checkpoint_tensors takes back).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from lantern.app.models.errors import check_silu, refuse
from lantern.app.models.family_deepseek import DeepSeekMoEConfig
from lantern.app.models.family_laguna import typed_ropes
from lantern.app.models.family_olmo import typed_windows

# mlx_lm's ModelArgs defaults for the keys ModelConfig.from_hf reads (spec.ARCHITECTURES "defaults")
DEFAULTS: dict[str, Any] = {
    "rms_norm_eps": 1e-5,
    "max_position_embeddings": 262144,
}


@dataclass(frozen=True)
class SwigluLimits:
    """Per layer: the routed experts' clamp and the shared expert's / dense MLP's (None: none)."""

    routed: tuple[float | None, ...]
    shared: tuple[float | None, ...]


def step3p7_text_config(cfg: dict[str, Any]) -> dict[str, Any]:
    """Step 3.7 Flash (model_type step3p7: Step 3.5's language model beside a vision tower, which is not loaded): its
    text_config, in StepFun's keys or transformers' (Step3p7TextConfig's, read by prepare)."""
    from lantern.app.models.spec import wrapped_text_config

    text = cfg.get("text_config") or {}
    tie = text.get("tie_word_embeddings", cfg.get("tie_word_embeddings", False))
    return wrapped_text_config(cfg, "step3p5", bool(tie))


def _from_transformers(cfg: dict[str, Any]) -> dict[str, Any]:
    """transformers' Step3p7TextConfig keys (what its save_pretrained writes) as StepFun's: the experts' counts,
    the sliding layers' heads, mlp_layer_types, rope_parameters nested by layer type."""
    out = dict(cfg)
    for ours, theirs in (("moe_num_experts", "n_routed_experts"), ("moe_top_k", "num_experts_per_tok")):
        if ours not in out and theirs in cfg:
            out[ours] = cfg[theirs]
    if "attention_other_setting" not in out and cfg.get("num_sliding_attention_heads") is not None:
        out["attention_other_setting"] = {"num_attention_heads": cfg["num_sliding_attention_heads"]}
    if "moe_layers_enum" not in out and isinstance(cfg.get("mlp_layer_types"), list):
        out["moe_layers_enum"] = ",".join(str(i) for i, k in enumerate(cfg["mlp_layer_types"]) if k == "sparse")
    nested = cfg.get("rope_parameters") or {}
    if isinstance(nested.get("full_attention", nested.get("sliding_attention")), dict) and "rope_theta" not in cfg:
        types = cfg.get("layer_types") or []
        by_type = {t: dict(nested.get(t) or {}) for t in dict.fromkeys(types)}
        out["rope_theta"] = [float(by_type[t].get("rope_theta", 10000.0)) for t in types]
        out["partial_rotary_factors"] = [float(by_type[t].get("partial_rotary_factor", 1.0)) for t in types]
        full = by_type.get("full_attention") or {}
        if (full.get("rope_type") or "default") != "default":  # (transformers scales the full layers only)
            out["rope_scaling"] = {k: v for k, v in full.items() if k not in ("rope_theta", "partial_rotary_factor")}
            out["yarn_only_types"] = ["full_attention"]
        if (by_type.get("sliding_attention") or {}).get("rope_type", "default") != "default":
            raise refuse("rope_parameters.sliding_attention.rope_type", nested["sliding_attention"]["rope_type"])
        out.pop("rope_parameters")  # (read)
    return out


def prepare(cfg: dict[str, Any]) -> dict[str, Any]:
    """The keys spec.ModelConfig.from_hf reads: the K/V heads (num_attention_groups), the full layers' scalar rope
    base (the per-layer ones: configure), the per-layer lists cut to the decoder's layers."""
    cfg = _from_transformers(cfg)
    layers = int(cfg["num_hidden_layers"])
    out = {**cfg, "num_key_value_heads": cfg.get("num_attention_groups", cfg.get("num_key_value_heads"))}
    for key in ("layer_types", "rope_theta", "partial_rotary_factors", "swiglu_limits", "swiglu_limits_shared"):
        if isinstance(cfg.get(key), list):
            out[key] = cfg[key][:layers]  # (past the stack: the prediction layers')
    if out["num_key_value_heads"] is None:
        raise refuse("num_attention_groups", None, " (the K/V heads)")
    thetas = out.get("rope_theta", 10000.0)
    out["rope_theta"] = float(thetas[0] if isinstance(thetas, list) else thetas)
    out["per_layer_rope_theta"] = thetas if isinstance(thetas, list) else [thetas] * layers
    flat = {k: v for k, v in (out.pop("rope_parameters", None) or {}).items() if k != "rope_theta"}
    if flat and flat != {"rope_type": "default"}:  # (transformers drops a flat one, other readers take it as scaling)
        raise refuse("rope_parameters", flat, " (a scaling stated outside rope_scaling: its readers disagree)")
    return out


def configure(model_type: str, cfg: dict[str, Any], fields: dict[str, Any]) -> dict[str, Any]:
    """ModelConfig field overrides for a step3p5 config; refuses, naming the key, what it does not compute."""
    if model_type != "step3p5":
        raise refuse("model_type", model_type, " for family_step3p5")
    check_silu(cfg, "Step 3.5")
    for key in ("attention_bias", "mlp_bias", "use_bidirectional_attention"):
        if cfg.get(key):
            raise refuse(key, cfg[key], " for step3p5")
    sparse_attention = (cfg.get("sparse_attention_config") or {}).get("sparse_attention_freq") or []
    if any(sparse_attention) or set(cfg.get("layer_types") or []) - {"full_attention", "sliding_attention"}:
        raise refuse("sparse_attention_config", cfg.get("sparse_attention_config"), " (its sparse attention layers)")
    rope_layers = cfg.get("use_rope_layers") or []  # (StepFun's vLLM code: NoPE where false; mlx_lm ignores it)
    if not all(rope_layers[: fields["num_layers"]]):
        raise refuse("use_rope_layers", rope_layers, " (rope-less layers: its readers disagree)")
    if cfg.get("gating", True) not in (True, "per-head"):  # (transformers' per-element gate does not compute)
        raise refuse("gating", cfg["gating"], " (one gate per head)")
    if "moe_router_scaling_factor" not in cfg:  # (mlx_lm's default 3, transformers' 1: state it)
        raise refuse("moe_router_scaling_factor", None, " (its readers' defaults differ: state it)")
    layers, kv, head_dim = fields["num_layers"], fields["num_kv_heads"], fields["head_dim"]
    if cfg.get("query_pre_attn_scalar") not in (None, head_dim):  # (mlx_lm: head_dim ** -0.5 always)
        raise refuse("query_pre_attn_scalar", cfg["query_pre_attn_scalar"], f" other than head_dim ({head_dim})")
    types = cfg.get("layer_types") or ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(layers)]
    windows = typed_windows({**cfg, "layer_types": types}, layers, types, 512)
    other = cfg.get("attention_other_setting") or {}
    local_heads = int(other.get("num_attention_heads", fields["num_heads"]))
    if int(other.get("num_attention_groups", kv)) != kv:  # (one K/V head count across the pool)
        raise refuse("attention_other_setting.num_attention_groups", other["num_attention_groups"], f" (not {kv})")
    if int(other.get("head_dim", head_dim)) != head_dim:
        raise refuse("attention_other_setting.head_dim", other["head_dim"], f" (the full layers' {head_dim})")
    heads = [local_heads if t == "sliding_attention" else fields["num_heads"] for t in types]
    if any(h % kv for h in heads):
        raise refuse("attention_other_setting.num_attention_heads", local_heads, f" (a multiple of {kv} K/V heads)")
    gate = cfg.get("use_head_wise_attn_gate", True)
    return {
        "qk_norm": True,
        "norm_offset": True,
        "attn_output_gate": "sigmoid_head" if gate else None,
        "layer_heads": tuple(heads) if len(set(heads)) > 1 else None,
        "num_heads": max(heads),
        "layer_windows": windows,
        "moe": _experts(cfg, layers),
        "swiglu_limits": _limits(cfg, layers),
        "mtp_layers": int(cfg.get("num_nextn_predict_layers") or 0),
        **typed_ropes(_rope_by_type(cfg, types, head_dim), head_dim, windows, (10000.0, 10000.0), "step3p5"),
    }


def _rope_by_type(cfg: dict[str, Any], types: list[str], head_dim: int) -> dict[str, Any]:
    """rope_parameters nested by layer type (what typed_ropes reads) from the per-layer bases and factors; refuses
    a base or factor that differs within a type, or a scaling on the sliding layers (their rope is plain here)."""
    thetas = cfg["per_layer_rope_theta"]
    factors = cfg.get("partial_rotary_factors") or [1.0] * len(types)
    if len(thetas) != len(types) or len(factors) != len(types):
        raise refuse("rope_theta", thetas, f" (one base and partial_rotary_factor for each of {len(types)} layers)")
    scaling = dict(cfg.get("rope_scaling") or {})
    scaled = cfg.get("yarn_only_types") or ["full_attention", "sliding_attention"]
    if scaling and "sliding_attention" in scaled and "sliding_attention" in types:
        raise refuse("yarn_only_types", cfg.get("yarn_only_types"), " (a scaled rope on the sliding layers)")
    nested: dict[str, Any] = {}
    for kind in dict.fromkeys(types):
        idx = [i for i, t in enumerate(types) if t == kind]
        if len({float(thetas[i]) for i in idx}) > 1 or len({float(factors[i]) for i in idx}) > 1:
            raise refuse("rope_theta", thetas, f" (bases or partial_rotary_factors differ among the {kind} layers)")
        rope = {"rope_type": "default", "rope_theta": float(thetas[idx[0]])}
        rope["partial_rotary_factor"] = float(factors[idx[0]])
        if kind == "full_attention" and scaling:
            rope |= {k: v for k, v in scaling.items() if k != "type"}
            rope["rope_type"] = scaling.get("rope_type") or scaling.get("type") or "default"
        nested[kind] = rope
    return {**cfg, "rope_parameters": nested, "rope_scaling": None}


def _moe_layers(cfg: dict[str, Any], layers: int) -> set[int]:
    stated = cfg.get("moe_layers_enum")
    if stated is None:  # (mlx_lm and StepFun's code: every layer but the first; transformers': from the fourth)
        raise refuse("moe_layers_enum", None, " (its readers' defaults differ: state the mixture's layers)")
    items = stated.split(",") if isinstance(stated, str) else stated
    try:
        return {int(i) for i in items if str(i).strip()}
    except ValueError:
        raise refuse("moe_layers_enum", stated, " (layer indices)") from None


def _experts(cfg: dict[str, Any], layers: int) -> DeepSeekMoEConfig | None:
    sparse = _moe_layers(cfg, layers)
    if not sparse & set(range(layers)):
        return None
    experts, top_k = int(cfg.get("moe_num_experts", 288)), int(cfg.get("moe_top_k", 8))
    if not 1 <= top_k <= experts or experts < 2:
        raise refuse("moe_top_k", top_k, f" (must be between 1 and the {experts} experts)")
    return DeepSeekMoEConfig(
        num_experts=experts,
        top_k=top_k,
        intermediate_size=int(cfg.get("moe_intermediate_size", 1280)),
        norm_topk_prob=bool(cfg.get("norm_expert_weight", True)),
        router_weights_fp32=True,
        dense_layers=tuple(i for i in range(layers) if i not in sparse),
        scoring="sigmoid",
        topk_method="noaux_tc",  # (V3's choice with its bias, in one group)
        correction_bias=bool(cfg.get("use_moe_router_bias", True)),
        routed_scaling_factor=float(cfg["moe_router_scaling_factor"]),
        shared_size=int(cfg.get("share_expert_dim", 1280)),
    )


def _limits(cfg: dict[str, Any], layers: int) -> SwigluLimits | None:
    def each(key: str) -> tuple[float | None, ...]:
        stated = cfg.get(key) or []
        if not isinstance(stated, list) or any(v is not None and not isinstance(v, (int, float)) for v in stated):
            raise refuse(key, stated, " (a clamp, or null, per layer)")
        values = [float(v) if v else None for v in stated[:layers]]  # (0 or null: no clamp)
        if any(v is not None and v < 0 for v in values):
            raise refuse(key, stated, " (non-negative clamps)")
        return tuple(values + [None] * (layers - len(values)))

    limits = SwigluLimits(each("swiglu_limits"), each("swiglu_limits_shared"))
    return limits if any(limits.routed) or any(limits.shared) else None


# checkpoint name -> the model files' (DeepSeek's router, bias and shared expert; the attention's gate)
_NAMES = (
    (re.compile(r"\.moe\.(gate|up|down)_proj\."), r".mlp.experts.\1_proj."),  # (stacked: weight_stream splits them)
    (re.compile(r"\.moe\.gate\."), ".mlp.gate."),
    (re.compile(r"\.moe\.router_bias$"), ".mlp.gate.e_score_correction_bias"),
    (re.compile(r"\.mlp\.gate\.gate\."), ".mlp.gate."),  # (mlx_lm's)
    (re.compile(r"\.mlp\.gate\.router_bias$"), ".mlp.gate.e_score_correction_bias"),
    (re.compile(r"\.(mlp\.)?share_expert\."), ".mlp.shared_experts."),
    (re.compile(r"\.self_attn\.g_proj\."), ".self_attn.gate_proj."),
)
_LAYER = re.compile(r"^model\.layers\.(\d+)\.")
_MLX_NAMES = (".mlp.switch_mlp.", ".mlp.gate.gate.", ".mlp.share_expert.")
_VISION = ("vision_model.", "vit_large_projector.", "model.vision_model.", "model.multi_modal_projector.")


def name_map(spec: Any) -> Any:
    """The checkpoint's names as the model files', its prediction layers (past the stack) skipped."""
    layers = spec.config.num_layers

    def rename(name: str) -> str | None:
        if name.startswith(_VISION):  # (Step 3.7's vision tower and projector)
            return None
        name = name.replace("model.language_model.", "model.", 1)
        m = _LAYER.match(name)
        if ".mtp" in name or (m and int(m.group(1)) >= layers):
            return None
        for pattern, new in _NAMES:
            name = pattern.sub(new, name)
        return name

    return rename


def checkpoint_tensors(source: Iterator[tuple[str, Any]], spec: Any) -> Iterator[tuple[str, Any]]:
    """An mlx_lm-made folder and llama.cpp's GGUF store the norms with the 1 added (mlx_lm's sanitize and the converter
    add it to the released weights): taken back, so that every layout holds them centred on 0 as the model files
    read them."""
    if spec.weight_format != "gguf" and not _mlx_layout(spec):
        yield from source
        return
    for name, value in source:
        yield name, (value - 1 if name.endswith("norm.weight") else value)


def _mlx_layout(spec: Any) -> bool:
    from safetensors import safe_open

    for path in spec.weight_files:
        with safe_open(str(path), framework="numpy") as f:  # (the header only: its tensor names)
            if any(marker in name for name in f.keys() for marker in _MLX_NAMES):
                return True
    return False
