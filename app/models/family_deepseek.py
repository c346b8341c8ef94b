"""DeepSeek V2 / V3: multi-head latent attention (MLA) and DeepSeek's routed experts.

The maths both backends implement (transformers 5's DeepseekV2* / DeepseekV3* modules):

- Attention: q = q_proj(x) (or q_b_proj(rmsnorm(q_a_proj(x))) with a q LoRA), split per head into
  q_nope [qk_nope_head_dim] and q_pe [qk_rope_head_dim]; kv_a_proj_with_mqa(x) = [c_kv, k_pe] with
  c_kv = rmsnorm(.) the compressed latent [kv_lora_rank] and k_pe one rope key shared by all heads.
  kv_b_proj expands c_kv into each head's k_nope and value. The two LoRA norms use eps 1e-6 (their
  constructor's default), not rms_norm_eps. Rope rotates pairs (x0, x1), (x2, x3), ... (V2's complex
  rope, V3's `rope_interleave`) or halves (V3 with rope_interleave false). Softmax scale:
  (qk_nope + qk_rope) ** -0.5, times mscale(factor, mscale_all_dim) ** 2 for a scaled rope. Every
  released V2/V3 config has YaRN with mscale and mscale_all_dim: besides that softmax correction
  they set the rope's attention factor, mscale(factor, mscale) / mscale(factor, mscale_all_dim)
  (1 when equal, as in V2-Lite's 0.707 / 0.707), which scales cos and sin (rope_config.rope_scaling
  keeps both keys; the rope builders of both backends apply it).
- V3 checkpoints carry num_nextn_predict_layers multi-token-prediction layers after the last
  decoder layer (model.layers.{num_hidden_layers}...); next-token decoding does not use them, so
  weight_stream skips their tensors unread (ModelConfig.mtp_layers).
- Lantern's paged pool keeps only [c_kv, rotated k_pe] per token (one KV "head" of kv_lora_rank +
  qk_rope_head_dim) and attends in the absorbed form: q_nope goes through kv_b_proj's key rows into
  the latent space, the attention output (a mix of latents: V is K's first kv_lora_rank columns) goes
  through kv_b_proj's value rows. The model files declare this layout (CausalLM.kv_layout).
- DeepSeek-V3.2 and GLM-5 add DeepSeek Sparse Attention (family_dsa): an index key beside [c_kv, k_pe] in the
  pool row (MLAConfig.pool_dim), queries past index_topk attending to the keys the indexer picks.
- Experts: router logits in float32. V2: softmax, top-k ("greedy"), or top-k within the topk_group
  groups of highest max score ("group_limited_greedy"), weights times routed_scaling_factor (V2
  ignores norm_topk_prob in transformers). V3: sigmoid; the choice adds e_score_correction_bias,
  groups ranked by the sum of their two best biased scores, top-k in the best topk_group groups;
  weights are the unbiased scores, renormalised when norm_topk_prob, times routed_scaling_factor.
  Expert outputs are scaled by the float32 weights; shared experts (one MLP of
  moe_intermediate_size * n_shared_experts, ungated) are added. Layers below first_k_dense_replace
  are dense MLPs of intermediate_size.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from lantern.app.models.family_dsa import GLM_DSA_DEFAULTS, DSAIndexer, indexer_config
from lantern.app.models.family_moe import MoEConfig
from lantern.app.models.quant.affine import float32_array
from lantern.app.models.quant.stacked import StackedWeights
from lantern.app.models.spec import UnsupportedModelError

# Families with multi-head latent attention: DeepSeek V2 / V3, GLM-4.7-Flash (glm4_moe_lite:
# transformers builds it from DeepseekV3Attention and GLM-4.5's router, which is V3's) and Mistral 4
# (V3's attention and experts, a softmax router ranking groups as V3 does, Llama 4's query temperature).
DEEPSEEK_TYPES = (
    "deepseek_v2",
    "deepseek_v3",
    "deepseek_v32",
    "glm_moe_dsa",
    "glm4_moe_lite",
    "mistral4",
    "axk1",
    "axk2",
)
# The GLM-4.5 family (glm4_moe) shares only the routed experts (routed_experts()).
_SIGMOID_ROUTED = (
    "deepseek_v3",
    "deepseek_v32",
    "glm_moe_dsa",
    "glm4_moe",
    "glm4_moe_lite",
    "dots1",
    "solar_open",
    "axk1",
    "axk2",
)
# "noaux_tc": top-k within the topk_group groups whose two best scores sum highest (V3's ranking)
_TOPK_METHODS = {"deepseek_v2": ("greedy", "group_limited_greedy"), "mistral4": ("noaux_tc",)}
_TOPK_METHODS |= {t: ("noaux_tc",) for t in _SIGMOID_ROUTED}
_SCORING = {"deepseek_v2": "softmax", "mistral4": "softmax", **{t: "sigmoid" for t in _SIGMOID_ROUTED}}
# transformers' defaults for keys a config.json may omit (DeepseekV2Config / DeepseekV3Config).
_DEFAULTS: dict[str, dict[str, Any]] = {
    "deepseek_v2": dict(
        kv_lora_rank=512, q_lora_rank=1536, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128,
        first_k_dense_replace=0, n_routed_experts=64, n_shared_experts=2, num_experts_per_tok=None,
        moe_intermediate_size=1407, routed_scaling_factor=1.0, topk_method="greedy", n_group=None,
        topk_group=None, norm_topk_prob=False,
    ),
    "deepseek_v3": dict(
        kv_lora_rank=512, q_lora_rank=1536, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128,
        first_k_dense_replace=3, n_routed_experts=256, n_shared_experts=1, num_experts_per_tok=8,
        moe_intermediate_size=2048, routed_scaling_factor=2.5, topk_method="noaux_tc", n_group=8,
        topk_group=4, norm_topk_prob=True, rope_interleave=True,
    ),
    "glm4_moe": dict(  # Glm4MoeConfig: the router's keys only (its attention is Llama's)
        first_k_dense_replace=1, n_routed_experts=128, n_shared_experts=1, num_experts_per_tok=8,
        moe_intermediate_size=1408, routed_scaling_factor=1.0, topk_method="noaux_tc", n_group=1, topk_group=1,
        norm_topk_prob=True,
    ),
    "glm4_moe_lite": dict(  # Glm4MoeLiteConfig: sparse layers from mlp_layer_types, not first_k_dense_replace
        kv_lora_rank=512, q_lora_rank=768, qk_nope_head_dim=192, qk_rope_head_dim=64, v_head_dim=256,
        first_k_dense_replace=0, n_routed_experts=64, n_shared_experts=1, num_experts_per_tok=4,
        moe_intermediate_size=1536, routed_scaling_factor=1.8, topk_method="noaux_tc", n_group=1, topk_group=1,
        norm_topk_prob=True, rope_interleave=True,
    ),
    "dots1": dict(  # Dots1Config: DeepSeek-V3's router (no topk_method key: always V3's), no experts unless stated
        first_k_dense_replace=0, n_routed_experts=None, n_shared_experts=None, num_experts_per_tok=None,
        moe_intermediate_size=1408, routed_scaling_factor=1.0, topk_method="noaux_tc", n_group=1, topk_group=1,
        norm_topk_prob=False,
    ),
    "solar_open": dict(  # SolarOpenConfig (a Glm4MoeConfig): every layer sparse
        first_k_dense_replace=0, n_routed_experts=128, n_shared_experts=1, num_experts_per_tok=8,
        moe_intermediate_size=1280, routed_scaling_factor=1.0, topk_method="noaux_tc", n_group=1, topk_group=1,
        norm_topk_prob=True,
    ),
    "mistral4": dict(  # Mistral4Config (no multi-token-prediction layers)
        kv_lora_rank=256, q_lora_rank=1024, qk_nope_head_dim=64, qk_rope_head_dim=64, v_head_dim=128,
        first_k_dense_replace=0, n_routed_experts=128, n_shared_experts=1, num_experts_per_tok=4,
        moe_intermediate_size=2048, routed_scaling_factor=1.0, topk_method="noaux_tc", n_group=1, topk_group=1,
        norm_topk_prob=True, rope_interleave=True,
    ),
}  # fmt: skip
_DEFAULTS["deepseek_v32"] = _DEFAULTS["deepseek_v3"]  # DeepseekV32Config: V3's values (the indexer's: family_dsa)
_DEFAULTS["glm_moe_dsa"] = {**_DEFAULTS["deepseek_v3"], **GLM_DSA_DEFAULTS}  # GlmMoeDsaConfig
# A.X-K1 (SK Telecom, AXK1Config): V3 with 192 experts past one dense layer and an RMSNorm on the mixture's output
_DEFAULTS["axk1"] = {**_DEFAULTS["deepseek_v3"], "n_routed_experts": 192, "first_k_dense_replace": 1}
# A.X-K2 (AXK2Config, a DeepseekV32Config): its own shapes, an ungrouped router unless n_group / topk_group are stated
_DEFAULTS["axk2"] = {
    **_DEFAULTS["deepseek_v3"],
    **dict(kv_lora_rank=128, q_lora_rank=384, qk_nope_head_dim=64, qk_rope_head_dim=32, v_head_dim=64),
    **dict(n_routed_experts=128, num_experts_per_tok=8, moe_intermediate_size=512, n_group=None, topk_group=None),
    "first_k_dense_replace": 1,
}


@dataclass(frozen=True)
class MLAConfig:
    kv_lora_rank: int  # the compressed latent c_kv each token keeps in the pool
    q_lora_rank: int | None  # None: q_proj straight from the hidden state
    qk_nope_head_dim: int
    qk_rope_head_dim: int  # one rope key per token, shared by every head
    v_head_dim: int
    rope_interleave: bool  # rope rotates adjacent pairs (x0, x1), ... rather than halves
    indexer: DSAIndexer | None = None  # DeepSeek Sparse Attention (DeepSeek-V3.2, GLM-5: family_dsa)
    # q_a_layernorm / kv_a_layernorm's eps: transformers builds them with the default 1e-6; a GGUF's are the model's
    # rms eps, as llama.cpp norms them (gguf builders state it as latent_norm_eps)
    norm_eps: float = 1e-6
    rope: bool = True  # False: q_pe and k_pe are never rotated (Kimi Linear's latent attention)
    # LongCat-Flash's LoRA scaling: the query times q_scale, the normed latent (keys' and values' source) times kv_scale
    q_scale: float = 1.0
    kv_scale: float = 1.0
    # A.X-K2: q_b_proj reads [normed q latent, raw q latent] and gives each head's query and an output gate (v wide)
    q_gate: bool = False
    # Ling 3.0 (bailing_hybrid): a sigmoid gate per head from g_proj(x) on the attention's output, before o_proj
    head_gate: bool = False

    @property
    def pool_dim(self) -> int:
        """Values per token and layer in the KV pool: [c_kv, k_pe] and the indexer's key."""
        return self.latent_dim + (self.indexer.head_dim if self.indexer is not None else 0)

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def latent_dim(self) -> int:
        """Values per token and layer in the KV pool: [c_kv, k_pe]."""
        return self.kv_lora_rank + self.qk_rope_head_dim


@dataclass(frozen=True)
class DeepSeekMoEConfig(MoEConfig):
    """MoEConfig's expert shapes (the loaders stack `mlp.experts.E.*` by them) plus DeepSeek's router."""

    scoring: str = "softmax"  # "softmax" (V2) or "sigmoid" (V3)
    topk_method: str = "greedy"  # "greedy", "group_limited_greedy" (V2) or "noaux_tc" (V3)
    n_group: int = 1
    topk_group: int = 1
    routed_scaling_factor: float = 1.0
    first_dense: int = 0  # first_k_dense_replace: layers below it are dense MLPs
    shared_size: int = 0  # the ungated shared experts' MLP width (0: none)
    shared_average: bool = False  # (routed + shared) / 2 rather than their sum (Cohere2-MoE's "average")
    post_norm: bool = False  # an RMSNorm (mlp.post_mlp_layernorm) on the mixture's output (A.X-K1)
    # noaux_tc: what the experts of the groups not chosen score (V3's -inf; A.X-K2's 0, as its router fills them)
    group_fill: float = float("-inf")
    correction_bias: bool = False  # the router adds e_score_correction_bias to the scores it chooses by
    # router weight and bias held in float32 whatever the model dtype (transformers' _keep_in_fp32_modules_strict:
    # a bias near 7 in bfloat16 is off by 0.03, enough to change most choices); Mistral 4 keeps none
    router_fp32: bool = True
    norm_eps: float = 1e-20  # added to the top-k sum before renormalising (LFM2-MoE: 1e-6, Laguna: 0)
    logit_softcap: float = 0.0  # router logits -> cap * tanh(logits / cap) first (Laguna); 0: none
    zero_experts: int = 0  # LongCat-Flash: router choices past num_experts, each adding its weight times the input
    shared_mix: bool = False  # Klear: routed and shared outputs mixed by a softmax over mlp.coefficient(x)
    choose_on_logits: bool = False  # Kolibri: the top-k of logits + bias (not of the scores + bias), scores as weights

    def is_sparse(self, layer_idx: int) -> bool:
        """Sparse from first_k_dense_replace on, except MoEConfig.dense_layers (glm4_moe_lite's mlp_layer_types)."""
        return self.num_experts > 0 and layer_idx >= self.first_dense and layer_idx not in self.dense_layers


def _refuse(key: str, value: Any, why: str = "") -> UnsupportedModelError:
    return UnsupportedModelError(f"{key}={json.dumps(value)} in config.json is not implemented{why}")


def _key(cfg: dict[str, Any], model_type: str, key: str) -> Any:
    """The config.json value, or transformers' default when the key is absent (null stays None)."""
    return cfg.get(key, _DEFAULTS[model_type][key])


def _int(cfg: dict[str, Any], model_type: str, key: str) -> int:
    value = _key(cfg, model_type, key)
    if value is None:
        raise UnsupportedModelError(f"{key} is missing from config.json ({model_type} needs it)")
    return int(value)


def axk1_tensors(source: Iterator[tuple[str, Any]], moe: Any) -> Iterator[tuple[str, Any]]:
    """A.X-K1's checkpoint stores the mixture's output norm at the decoder layer (post_mlp_layernorm): the sparse
    layers' under the mixture, where the model files hold it; a dense layer's is not used (transformers ignores it)."""
    for name, value in source:
        m = _POST_MLP_NORM.match(name)
        if m is None:
            yield name, value
        elif moe is not None and moe.is_sparse(int(m.group(1))):
            yield f"model.layers.{m.group(1)}.mlp.post_mlp_layernorm.{m.group(2)}", value


_POST_MLP_NORM = re.compile(r"^model\.layers\.(\d+)\.post_mlp_layernorm\.(\w+)$")


def softmax_scale(cfg: dict[str, Any], qk_head_dim: int) -> float:
    """transformers' yarn_apply_mscale: qk_head_dim ** -0.5, times mscale ** 2 for a scaled rope
    whose parameters name mscale_all_dim."""
    scale = qk_head_dim**-0.5
    rope = dict(cfg.get("rope_scaling") or cfg.get("rope_parameters") or {})
    rope_type = rope.get("rope_type") or rope.get("type") or "default"
    all_dim = rope.get("mscale_all_dim") or 0
    factor = float(rope.get("factor") or 1.0)
    if rope_type != "default" and all_dim and factor > 1:
        mscale = 0.1 * float(all_dim) * math.log(factor) + 1.0
        scale *= mscale * mscale
    return scale


def mtp_layers(model_type: str, cfg: dict[str, Any]) -> int:
    """Multi-token-prediction layers stored after the decoder's (config.json: num_nextn_predict_layers,
    default 1, as DeepseekV3Config and Glm4MoeConfig read it; GLM-4.7-Flash's config class has no such
    key but its checkpoint carries one: counting one that is absent skips nothing). V2 has none."""
    if model_type in ("deepseek_v2", "mistral4"):
        return 0
    count = cfg.get("num_nextn_predict_layers", cfg.get("num_mtp_layers", 1))
    if not isinstance(count, int) or count < 0:
        raise _refuse("num_nextn_predict_layers", count, " (a count of layers)")
    return count


def _dense_layers(model_type: str, cfg: dict[str, Any], num_layers: int) -> tuple[int, tuple[int, ...]]:
    """(first_k_dense_replace, other dense layers). glm4_moe_lite reads mlp_layer_types (default:
    layer 0 dense), as transformers does; a first_k_dense_replace that says otherwise is refused."""
    if model_type == "axk1" and cfg.get("mlp_layer_types") is None:  # (AXK1Config derives it so)
        return int(_key(cfg, model_type, "first_k_dense_replace") or 0), ()
    if model_type == "axk2" and cfg.get("mlp_layer_types") is None:  # (AXK2Config: from both legacy keys)
        first, freq = int(cfg.get("first_k_dense_replace", 1)), int(cfg.get("moe_layer_freq", 1))
        return 0, tuple(i for i in range(num_layers) if i < first or i % freq)
    if model_type in ("deepseek_v32", "glm_moe_dsa") and cfg.get("mlp_layer_types") is None:
        first = min(int(_key(cfg, model_type, "first_k_dense_replace") or 0), num_layers)
        return 0, tuple(range(first))  # DeepseekV32Config's mlp_layer_types: that many dense, then sparse
    if model_type not in ("glm4_moe_lite", "deepseek_v32", "glm_moe_dsa", "axk1", "axk2"):
        return int(_key(cfg, model_type, "first_k_dense_replace") or 0), ()
    types = cfg.get("mlp_layer_types")
    if types is None:
        types = ["dense"] + ["sparse"] * (num_layers - 1)
        first = cfg.get("first_k_dense_replace")
        if first not in (None, 1):  # transformers' default pattern ignores it: ambiguous
            raise _refuse("first_k_dense_replace", first, " for glm4_moe_lite without mlp_layer_types")
    if len(types) != num_layers or set(types) - {"dense", "sparse"}:
        raise _refuse("mlp_layer_types", types, f" (one of 'dense' / 'sparse' for each of {num_layers} layers)")
    return 0, tuple(i for i, kind in enumerate(types) if kind == "dense")


def routed_experts(model_type: str, cfg: dict[str, Any], num_layers: int) -> DeepSeekMoEConfig | None:
    """DeepSeek's routed + shared experts as config.json describes them (V2, V3, and the GLM-4.5 /
    4.7-Flash families, whose router is V3's); None when every layer is dense."""
    get = lambda key: _key(cfg, model_type, key)
    experts = int(get("n_routed_experts") or 0)
    first_dense, dense = _dense_layers(model_type, cfg, num_layers)
    if experts == 0 or first_dense >= num_layers or len(dense) == num_layers:
        return None  # every layer a dense MLP
    freq = cfg.get("moe_layer_freq", 1)
    if (
        freq not in (None, 1) and model_type != "axk2"
    ):  # (A.X-K2's: read into its dense layers)  # transformers makes every layer from first_k_dense_replace on sparse
        raise _refuse("moe_layer_freq", freq, " (transformers makes every layer past first_k_dense_replace sparse)")
    top_k = get("num_experts_per_tok")
    if top_k is None or not 1 <= int(top_k) <= experts:
        raise _refuse("num_experts_per_tok", top_k, f" (must be between 1 and the {experts} experts)")
    scoring = cfg.get("scoring_func") or _SCORING[model_type]
    if scoring != _SCORING[model_type]:
        raise _refuse("scoring_func", scoring, f" for {model_type} (its router is a {_SCORING[model_type]})")
    method = get("topk_method") or _TOPK_METHODS[model_type][0]
    if method not in _TOPK_METHODS[model_type]:
        raise _refuse("topk_method", method, f"; {model_type} supports {', '.join(_TOPK_METHODS[model_type])}")
    n_group, topk_group = 1, 1
    ungrouped = model_type == "axk2" and get("n_group") is None and get("topk_group") is None  # (A.X-K2-Light)
    if method != "greedy" and not ungrouped:
        n_group, topk_group = get("n_group"), get("topk_group")
        if n_group is None or topk_group is None or experts % n_group or not 1 <= topk_group <= n_group:
            raise _refuse("n_group", n_group, f" with topk_group={topk_group} and {experts} experts")
    per_group = experts // n_group
    if method == "noaux_tc" and per_group < 2:  # groups are ranked by their two best scores
        raise _refuse("n_group", n_group, f" ({experts} experts: {model_type} needs at least 2 per group)")
    if int(top_k) > topk_group * per_group and model_type != "axk2":  # (A.X-K2's unchosen experts score 0: routable)
        raise _refuse("num_experts_per_tok", top_k, f" (more than the {topk_group * per_group} experts routable)")
    norm = bool(get("norm_topk_prob"))
    if model_type == "deepseek_v2" and norm:
        # transformers' V2 router ignores it, DeepSeek's own code renormalises: ambiguous maths.
        raise _refuse("norm_topk_prob", True, " for deepseek_v2")
    inner = _int(cfg, model_type, "moe_intermediate_size")
    return DeepSeekMoEConfig(
        num_experts=experts,
        top_k=int(top_k),
        intermediate_size=inner,
        norm_topk_prob=norm,
        router_weights_fp32=True,  # expert outputs are scaled by float32 weights
        scoring=scoring,
        topk_method=method,
        n_group=int(n_group),
        topk_group=int(topk_group),
        routed_scaling_factor=float(get("routed_scaling_factor") or 1.0),
        first_dense=first_dense,
        dense_layers=dense,
        correction_bias=scoring == "sigmoid",
        router_fp32=model_type != "mistral4",
        shared_size=int(get("n_shared_experts") or 0) * inner,
        post_norm=model_type == "axk1",
        group_fill=0.0 if model_type == "axk2" else float("-inf"),
    )


def _lite_defaults(cfg: dict[str, Any]) -> dict[str, Any]:
    """Glm4MoeLiteConfig's defaults for keys ModelConfig.from_hf defaults otherwise."""
    return {
        "rms_norm_eps": float(cfg.get("rms_norm_eps", 1e-5)),
        "max_position_embeddings": int(cfg.get("max_position_embeddings", 202752)),
    }


def mistral4_rope(cfg: dict[str, Any], mla: MLAConfig) -> dict[str, Any]:
    """Mistral 4's rope and query temperature, as Mistral4Config states them: rope_parameters (default:
    YaRN x128 from 8192 with mscale 1 / mscale_all_dim 1 and llama_4_scaling_beta 0.1) whose
    partial_rotary_factor only says that the rope covers qk_rope_head_dim of each query head (the width
    the MLA tables have anyway), plus max_position_embeddings there (read by no initialiser)."""
    from lantern.app.models.family_ministral import temperature_of
    from lantern.app.models.rope_config import rope_scaling

    max_pos = int(cfg.get("max_position_embeddings", 1048576))
    stated = cfg.get("rope_parameters") or cfg.get("rope_scaling")
    rope = dict(stated) if stated else dict(_MISTRAL4_ROPE)
    partial = rope.pop("partial_rotary_factor", None)
    rope_share = mla.qk_rope_head_dim / mla.qk_head_dim
    if partial is not None and abs(float(partial) - rope_share) > 1e-9:
        raise _refuse("rope_parameters.partial_rotary_factor", partial, f" (the rope covers {rope_share:g} of a head)")
    theta = float(rope.pop("rope_theta", None) or cfg.get("rope_theta") or 10000.0)
    beta = rope.pop("llama_4_scaling_beta", None)
    rope.pop("max_position_embeddings", None)
    if rope.get("rope_type", rope.get("type")) in ("yarn", "llama3", "longrope"):  # transformers' fill-in
        rope.setdefault("original_max_position_embeddings", max_pos)
    return {
        "attn_scale": softmax_scale({"rope_parameters": rope}, mla.qk_head_dim),  # the default YaRN's mscale too
        "rope_theta": theta,
        "rope_scaling": rope_scaling({"model_type": "mistral4", "rope_scaling": rope}, {}, max_pos),
        "attn_temperature": temperature_of(beta, rope.get("original_max_position_embeddings")),
        "max_position_embeddings": max_pos,
    }


_MISTRAL4_ROPE = {
    "type": "yarn", "rope_theta": 10000.0, "factor": 128.0, "original_max_position_embeddings": 8192,
    "beta_fast": 32.0, "beta_slow": 1.0, "mscale_all_dim": 1.0, "mscale": 1.0, "llama_4_scaling_beta": 0.1,
}  # fmt: skip


def configure(model_type: str, cfg: dict[str, Any], fields: dict[str, Any]) -> dict[str, Any]:
    """ModelConfig field overrides for a DeepSeek V2/V3 (or GLM-4.7-Flash, Mistral 4) config.json (`mla`,
    `moe`, the latent's KV shape, the softmax scale); refuses, in one line naming the key, what Lantern
    does not compute."""
    if model_type not in DEEPSEEK_TYPES:
        raise UnsupportedModelError(f"{model_type!r} is not a DeepSeek family Lantern knows")
    act = cfg.get("hidden_act", "silu")
    if act not in ("silu", "swish"):
        raise _refuse("hidden_act", act, "; DeepSeek's MLPs are SiLU-gated here")
    for key in ("mlp_bias", "attention_bias"):
        if cfg.get(key):
            raise _refuse(key, cfg[key], f" for {model_type}")
    heads = int(cfg["num_attention_heads"])
    if cfg.get("num_key_value_heads") not in (None, heads):  # transformers' MLA expands to every head
        raise _refuse("num_key_value_heads", cfg["num_key_value_heads"], f" (MLA needs num_attention_heads={heads})")
    interleave = True if model_type == "deepseek_v2" else _key(cfg, model_type, "rope_interleave")
    dsa = model_type in ("deepseek_v32", "glm_moe_dsa", "axk2")
    if interleave not in (True, False) or (dsa and not interleave):
        raise _refuse("rope_interleave", interleave, f" ({model_type}'s latent rope always turns pairs)")
    q_lora = _key(cfg, model_type, "q_lora_rank")
    if model_type in ("axk1", "axk2") and q_lora is None:  # (their attention always compresses q)
        raise _refuse("q_lora_rank", None, f" for {model_type} (its attention always has a q LoRA)")
    mla = MLAConfig(
        kv_lora_rank=_int(cfg, model_type, "kv_lora_rank"),
        q_lora_rank=None if q_lora is None else int(q_lora),
        qk_nope_head_dim=_int(cfg, model_type, "qk_nope_head_dim"),
        qk_rope_head_dim=_int(cfg, model_type, "qk_rope_head_dim"),
        v_head_dim=_int(cfg, model_type, "v_head_dim"),
        rope_interleave=bool(interleave),
        indexer=indexer_config(model_type, cfg, q_lora) if dsa else None,
        norm_eps=float(cfg.get("latent_norm_eps") or 1e-6),
        q_gate=model_type == "axk2",
    )
    if mla.qk_rope_head_dim % 2:
        raise _refuse("qk_rope_head_dim", mla.qk_rope_head_dim, " (rope needs an even size)")
    num_layers = fields.get("num_layers", cfg.get("num_hidden_layers", 0))
    return {
        # The pool's one latent "head"; head_dim is the rope's width (the runners' rope tables).
        "num_kv_heads": 1,
        "head_dim": mla.qk_rope_head_dim,
        "attn_scale": softmax_scale(cfg, mla.qk_head_dim),
        "hidden_act": "silu",
        "attention_bias": False,
        "mla": mla,
        "moe": routed_experts(model_type, cfg, num_layers),
        "mtp_layers": mtp_layers(model_type, cfg),
        **(_lite_defaults(cfg) if model_type == "glm4_moe_lite" else {}),
        **({"gated_norm_rank": int(cfg.get("gated_norm_rank", 16))} if model_type == "axk2" else {}),
        **(mistral4_rope(cfg, mla) if model_type == "mistral4" else {}),
    }


# ---- MLX-format folders ---------------------------------------------------------------------------------
_HALVES = re.compile(r"^(.*\.self_attn(?:\.\d+)?)\.(embed_q|unembed_out)\.weight$")  # (LongCat: self_attn.<i>)


def join_mla_heads(source: Iterator[tuple[str, Any]], mla: MLAConfig, num_heads: int) -> Iterator[tuple[str, Any]]:
    """mlx_lm's DeepSeek-V3 family (and Kimi) conversions store kv_b_proj as two per-head matrices:
    `embed_q` [H, kv_lora_rank, nope] (each head's key rows, transposed) and `unembed_out` [H, v_head,
    kv_lora_rank] (its value rows), each quantized along its own last axis. Joined back into the
    checkpoints' kv_b_proj [H * (nope + v_head), kv_lora_rank] in float32 (the key halves' groups run
    across kv_b_proj's rows, which no row-wise layout holds; both backends use kv_b_proj dequantized)."""
    pending: dict[str, dict[str, Any]] = {}
    for name, value in source:
        m = _HALVES.match(name)
        if m is None:
            yield name, value
            continue
        halves = pending.setdefault(m.group(1), {})
        halves[m.group(2)] = _per_head_floats(value)
        if len(halves) == 2:
            keys, values = halves.pop("embed_q"), halves.pop("unembed_out")
            del pending[m.group(1)]
            yield f"{m.group(1)}.kv_b_proj.weight", _kv_b(keys, values, mla, num_heads, m.group(1))
    if pending:
        raise ValueError(f"{', '.join(sorted(pending))}: embed_q without unembed_out (or the reverse)")


def _per_head_floats(value: Any) -> np.ndarray:
    """float32 [H, rows, cols] from a float tensor (numpy, MLX or torch) or a sequence of quantized heads."""
    if isinstance(value, StackedWeights):
        return np.stack([head.dequantize(np.float32) for head in value])
    return float32_array(value)


def _kv_b(keys: np.ndarray, values: np.ndarray, mla: MLAConfig, num_heads: int, where: str) -> np.ndarray:
    want_k = (num_heads, mla.kv_lora_rank, mla.qk_nope_head_dim)
    want_v = (num_heads, mla.v_head_dim, mla.kv_lora_rank)
    if keys.shape != want_k or values.shape != want_v:
        raise ValueError(
            f"{where}: embed_q {keys.shape} / unembed_out {values.shape}; the config implies {want_k} / {want_v}"
        )
    joined = np.concatenate([keys.transpose(0, 2, 1), values], axis=1)  # [H, nope + v_head, kv_lora_rank]
    return np.ascontiguousarray(joined.reshape(-1, mla.kv_lora_rank))
