"""Mixture-of-experts families: Mixtral, Qwen2-MoE (with its gated shared expert) and Qwen3-MoE.

The routing maths both backends implement (transformers 5's MixtralTopKRouter / Qwen2MoeTopKRouter /
Qwen3MoeTopKRouter): router logits = x @ gate.T in the model dtype, softmax over all experts in
float32, the top-k probabilities, renormalised to sum to 1 when `norm_topk_prob` (Mixtral always);
each token's output is the weighted sum of its k experts' SiLU-gated MLPs. Mixtral scales the
expert outputs by float32 weights, the Qwen routers cast the weights to the model dtype first.
Qwen2-MoE adds sigmoid(x @ shared_expert_gate.T) * shared_expert(x).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from lantern.app.models.spec import UnsupportedModelError

MOE_TYPES = ("mixtral", "qwen2_moe", "qwen3_moe")
# Keys of other MoE designs (DeepSeek's grouped routing, scaled weights, shared experts) with the
# values that leave this routing unchanged.
_OTHER_ROUTING: dict[str, tuple[Any, ...]] = {
    "n_group": (None, 1),
    "topk_group": (None, 1),
    "n_shared_experts": (None, 0),
    "routed_scaling_factor": (None, 1, 1.0),
    "moe_layer_freq": (None, 1),
}


@dataclass(frozen=True)
class MoEConfig:
    num_experts: int
    top_k: int  # experts per token
    intermediate_size: int  # of each routed expert's MLP
    norm_topk_prob: bool  # renormalise the top-k probabilities to sum to 1
    shared_expert_size: int | None = None  # Qwen2-MoE: an always-on MLP gated by sigmoid(shared_expert_gate)
    router_weights_fp32: bool = False  # Mixtral scales expert outputs by float32 weights
    sparse_step: int = 1  # Qwen: every sparse_step-th layer is sparse ((i + 1) % step == 0)
    dense_layers: tuple[int, ...] = ()  # plain MLPs whatever else says (Qwen's mlp_only_layers, GLM's mlp_layer_types)
    softmax_after_topk: bool = False  # GraniteMoE: weights are a softmax over the k chosen logits
    gated: bool = True  # False: each expert is down(act(up(x))), no gate_proj (Nemotron 3's relu^2 experts)
    latent_size: int | None = None  # Nemotron 3's LatentMoE: the experts work on fc1_latent_proj(x), this wide
    sparsemixer_eps: float | None = (
        None  # PhiMoE: SparseMixer's top-2 choice with this jitter margin (not softmax top-k)
    )

    def is_sparse(self, layer_idx: int) -> bool:
        """True where the layer's MLP is the mixture of experts (transformers' decoder-layer rule)."""
        return layer_idx not in self.dense_layers and self.num_experts > 0 and (layer_idx + 1) % self.sparse_step == 0


def _refuse(key: str, value: Any, why: str) -> UnsupportedModelError:
    return UnsupportedModelError(f"{key}={json.dumps(value)} in config.json is not implemented{why}")


def _int(cfg: dict[str, Any], key: str, default: Any = None) -> int:
    value = cfg.get(key, default)
    if value is None:
        raise UnsupportedModelError(f"{key} is missing from config.json (a mixture of experts needs it)")
    return int(value)


def configure(model_type: str, cfg: dict[str, Any], fields: dict[str, Any]) -> dict[str, Any]:
    """ModelConfig field overrides for an MoE config.json (`moe`, and Qwen2-MoE's qkv_bias);
    refuses, in one line naming the key, what Lantern does not compute."""
    if model_type not in MOE_TYPES:
        raise UnsupportedModelError(f"{model_type!r} is not a mixture-of-experts family Lantern knows")
    out: dict[str, Any] = {}
    if model_type == "mixtral":
        # Every layer is sparse; the experts' size is intermediate_size; weights always renormalised.
        moe = MoEConfig(
            num_experts=_int(cfg, "num_local_experts", cfg.get("num_experts", 8)),
            top_k=_int(cfg, "num_experts_per_tok", 2),
            intermediate_size=_int(cfg, "intermediate_size"),
            norm_topk_prob=True,
            router_weights_fp32=True,
        )
    else:
        # Qwen3-MoE's config class aliases num_experts to num_local_experts (either may be saved).
        experts = cfg.get("num_experts", cfg.get("num_local_experts", 60 if model_type == "qwen2_moe" else 128))
        step = _int(cfg, "decoder_sparse_step", 1)
        if step < 1:
            raise _refuse("decoder_sparse_step", step, " (must be at least 1)")
        shared = None
        if model_type == "qwen2_moe":
            shared = _int(cfg, "shared_expert_intermediate_size", 5632)
            out["attention_bias"] = bool(cfg.get("qkv_bias", True))  # Qwen2-MoE names it qkv_bias
        moe = MoEConfig(
            num_experts=int(experts or 0),
            top_k=_int(cfg, "num_experts_per_tok", 4 if model_type == "qwen2_moe" else 8),
            intermediate_size=_int(cfg, "moe_intermediate_size", 1408 if model_type == "qwen2_moe" else 768),
            norm_topk_prob=bool(cfg.get("norm_topk_prob", False)),
            shared_expert_size=shared,
            sparse_step=step,
            dense_layers=tuple(int(i) for i in cfg.get("mlp_only_layers") or ()),
        )
    if moe.num_experts > 0 and not 1 <= moe.top_k <= moe.num_experts:
        raise _refuse("num_experts_per_tok", moe.top_k, f" (must be between 1 and the {moe.num_experts} experts)")
    # Keys of other MoE designs that would change the routing if a converted config carried them.
    for key, harmless in _OTHER_ROUTING.items():
        if cfg.get(key) not in harmless:
            raise _refuse(key, cfg[key], f" for {model_type} (another MoE family's routing)")
    if cfg.get("scoring_func", "softmax") != "softmax":
        raise _refuse("scoring_func", cfg["scoring_func"], " (the router is a softmax)")
    num_layers = fields.get("num_layers", cfg.get("num_hidden_layers", 0))
    if not any(moe.is_sparse(i) for i in range(num_layers)):
        out["moe"] = None  # no sparse layer: a dense model with extra config keys
    else:
        out["moe"] = moe
    return out


# ---- checkpoint names ---------------------------------------------------------------------------------------
# Checkpoints store experts one by one; both backends stack them into [E, out, in] tensors named
# `<layer>.mlp.experts.<gate_proj|up_proj|down_proj>`. Mixtral's `block_sparse_moe` is the `mlp` of
# the model files, its w1/w3/w2 the gate/up/down projections.
_MIXTRAL_PROJ = {"w1": "gate_proj", "w3": "up_proj", "w2": "down_proj"}
_EXPERT = re.compile(r"^(.*\.mlp\.experts)\.(\d+)\.(\w+)\.(weight|bias)$")
EXPERT_PROJS = ("gate_proj", "up_proj", "down_proj")


def mlp_kinds(cfg: dict[str, Any], num_layers: int, default: list[str]) -> list[str]:
    """mlp_layer_types ("dense" / "sparse" per layer; the config class's default where absent), checked."""
    kinds = cfg.get("mlp_layer_types") or default
    if len(kinds) != num_layers or set(kinds) - {"dense", "sparse"}:
        raise _refuse("mlp_layer_types", kinds, f" ('dense' or 'sparse' for each of the {num_layers} layers)")
    return list(kinds)


def moe_name(name: str) -> str:
    """A checkpoint name in the model files' terms (Mixtral's block_sparse_moe -> mlp, w1/w3/w2 ->
    gate/up/down_proj); other names unchanged."""
    if ".block_sparse_moe." not in name:
        return name
    name = name.replace(".block_sparse_moe.", ".mlp.")
    m = _EXPERT.match(name)
    if m and m.group(3) in _MIXTRAL_PROJ:
        name = f"{m.group(1)}.{m.group(2)}.{_MIXTRAL_PROJ[m.group(3)]}.{m.group(4)}"
    return name


def expert_part(name: str) -> tuple[str, int, str, str] | None:
    """(experts module path, expert index, projection, "weight"|"bias") for one expert's tensor
    named as moe_name() returns; None for every other tensor."""
    m = _EXPERT.match(name)
    if m is None:
        return None
    if m.group(3) not in EXPERT_PROJS:
        raise ValueError(f"unexpected expert tensor {name}")
    return m.group(1), int(m.group(2)), m.group(3), m.group(4)


_ROUTERS = (
    ".mlp.gate.weight",
    ".mlp.shared_expert_gate.weight",
    # Gemma 3n's AltUp: the router over its streams and the coefficients it mixes them by (4 or 16 rows)
    ".altup.modality_router.weight",
    ".altup.prediction_coefs.weight",
    ".altup.correction_coefs.weight",
    # DeepSeek-V3.2's indexer: its per-head weights choose the keys each query reads (transformers keeps it float32)
    ".indexer.weights_proj.weight",
    ".self_attn.router.weight",  # JetMoE's mixture of attention heads
    ".mlp.coefficient.weight",  # Klear's mix of the routed and shared outputs
)


def is_router(name: str) -> bool:
    """A router (experts', Qwen2-MoE's shared-expert gate, Gemma 3n's AltUp): small matrices kept in float,
    so the choice is made at activation precision."""
    return name.endswith(_ROUTERS)
