"""NVIDIA Nemotron-Labs Dory (model_type "dory": nvidia/NVIDIA-Nemotron-Labs-Dory1.0-4B), as transformers' DoryConfig
reads its config.json (the released layout, one "mlp" entry after each attention entry of layer_types and every
count doubled, folded back to one entry per layer), turned into ModelConfig fields; its checkpoint's names.

The maths (transformers' modeling_dory): nGPT on the unit sphere, looped. Every norm is an L2 norm without a weight
(x / sqrt(sum x^2 + 1e-6), float32). A layer: h = norm(x); a = norm(attention(h)); h += |lambda_1 s| (a - h);
h = norm(h); m = norm(mlp(h)); h += |lambda_2 s| (m - h), with s = ngpt_alpha_init / initializer_range. Attention:
q and k L2-normed per head, then the rope (sliding layers their own base, a window of sliding_window keys), q times
(sqk sqk_scale)^2 per channel, scores by head_dim^-0.5, the output times sigmoid(gate_proj(h) (s_gate s_gate_scale)^2)
per channel, L2-normed before o_proj. MLP: down(norm(silu(gate(h) suv_gate suv_scale) up(h) suv_up suv_scale)). The
layers run as n_input_layers once; then n_recurrent_loops passes through the recurrent layers, each pass from
norm(h) + norm(the input layers' output); then n_output_layers once; the head reads norm(h) and scales each logit by
logit_scale / initializer_range. recurrent_kv_cache_mode "per_loop": each pass keeps its own K/V (ModelConfig.kv_layers
counts them); "last_loop" (earlier passes read the last pass's K/V without writing) is refused.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from lantern.app.models.errors import check_silu, refuse
from lantern.app.models.rope_config import rope_scaling
from lantern.app.models.spec import UnsupportedModelError

# The keys ModelConfig.from_hf reads, as prepare() states them from DoryConfig.
_READ = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "max_position_embeddings",
    "tie_word_embeddings",
    "bos_token_id",
    "eos_token_id",
    "pad_token_id",
    "hidden_act",
    "attention_bias",
    "mlp_bias",
    "initializer_range",
    "ngpt_alpha_init",
    "layer_types",
    "sliding_window",
    "rope_parameters",
    "n_input_layers",
    "n_recurrent_layers",
    "n_output_layers",
    "n_recurrent_loops",
    "recurrent_kv_cache_mode",
)


@dataclass(frozen=True)
class DoryLoops:
    """The layers' sections and loops, and nGPT's fixed scales."""

    n_input: int
    n_recurrent: int
    n_output: int
    loops: int
    lambda_scale: float  # ngpt_alpha_init / initializer_range
    sqk_scale: float  # head_dim ** 0.5 / initializer_range
    s_gate_scale: float  # hidden_size ** 0.25 / initializer_range
    suv_scale: float  # hidden_size ** 0.5
    logit_factor: float  # 1 / initializer_range

    @property
    def kv_layers(self) -> int:
        return self.n_input + self.loops * self.n_recurrent + self.n_output

    def recurrent_kv(self, loop: int, j: int) -> int:
        """The pool layer of recurrent layer j in pass `loop`."""
        return self.n_input + loop * self.n_recurrent + j

    def output_kv(self, k: int) -> int:
        return self.n_input + self.loops * self.n_recurrent + k


def prepare(cfg: dict[str, Any]) -> dict[str, Any]:
    """The config as DoryConfig reads it: one layer_types entry per layer, the counts halved where released configs
    double them, its defaults (two rope bases, every 4th layer full)."""
    from transformers import DoryConfig

    skip = ("model_type", "transformers_version", "architectures", "auto_map")
    try:
        built = DoryConfig(**{k: v for k, v in cfg.items() if k not in skip})
    except (TypeError, ValueError) as exc:
        raise UnsupportedModelError(f"dory config.json: transformers cannot read it ({exc})") from None
    return {"model_type": "dory", **{k: getattr(built, k) for k in _READ}, "rms_norm_eps": 1e-6}


def configure(model_type: str, cfg: dict[str, Any], fields: dict[str, Any]) -> dict[str, Any]:
    """ModelConfig field overrides for a (prepared) dory config; refuses, naming the key, what it does not compute."""
    if model_type != "dory":
        raise UnsupportedModelError(f"family_dory does not configure model_type {model_type!r}")
    check_silu(cfg, "Dory")
    for key in ("attention_bias", "mlp_bias", "tie_word_embeddings"):
        if cfg.get(key):
            raise refuse(key, cfg[key], " for dory")
    if cfg["recurrent_kv_cache_mode"] != "per_loop":
        why = " (earlier loops reading the last loop's K/V unwritten; per_loop is)"
        raise refuse("recurrent_kv_cache_mode", cfg["recurrent_kv_cache_mode"], why)
    types, layers = cfg["layer_types"], int(cfg["num_hidden_layers"])
    if len(types) != layers or set(types) - {"sliding_attention", "full_attention"}:
        raise refuse("layer_types", types, f" (sliding_attention / full_attention for each of {layers} layers)")
    rope = cfg["rope_parameters"]
    for kind in set(types):  # (DoryRotaryEmbedding reads one entry per layer type)
        if not isinstance(rope, dict) or not isinstance(rope.get(kind), dict) or "rope_theta" not in rope[kind]:
            raise refuse("rope_parameters", rope, f" (an entry with rope_theta for each layer type: {kind})")
    full, local = rope.get("full_attention", {}), rope.get("sliding_attention", {})
    if local.get("rope_type", "default") != "default" or set(local) - {"rope_type", "rope_theta"}:
        raise refuse("rope_parameters.sliding_attention", local, " (the sliding layers' rope is plain)")
    init, hidden, head_dim = float(cfg["initializer_range"]), int(cfg["hidden_size"]), int(cfg["head_dim"])
    loops = DoryLoops(
        n_input=int(cfg["n_input_layers"]),
        n_recurrent=int(cfg["n_recurrent_layers"]),
        n_output=int(cfg["n_output_layers"]),
        loops=int(cfg["n_recurrent_loops"]),
        lambda_scale=float(cfg["ngpt_alpha_init"]) / init,
        sqk_scale=head_dim**0.5 / init,
        s_gate_scale=hidden**0.25 / init,
        suv_scale=hidden**0.5,
        logit_factor=1.0 / init,
    )
    window = int(cfg["sliding_window"])
    theta = float(full.get("rope_theta", 10_000_000.0))
    return {
        "dory": loops,
        "kv_layers": loops.kv_layers,
        "head_dim": head_dim,
        "rope_theta": theta,
        "rope_scaling": rope_scaling({}, {**full, "rope_theta": theta}, fields["max_position_embeddings"]),
        "local_rope_theta": float(local.get("rope_theta", 10_000.0)) if "sliding_attention" in types else None,
        "layer_windows": [window if t == "sliding_attention" else None for t in types],
    }


_PAIR = re.compile(r"layers\.(\d+)\.(mixer|attn_alpha|mlp_alpha)(?=\.|$)")


def checkpoint_name(name: str) -> str | None:
    """A Dory checkpoint's tensor under the model files' name: backbone.* as model.*, the released layout's attention
    block layers.{2i} and MLP block layers.{2i+1} (mixer, attn_alpha, mlp_alpha) folded into layer i as
    transformers' LayerPairCollapse does, g_proj as gate_proj, the head's logit_scale as model.logit_scale."""
    if name == "lm_head.logit_scale":
        return "model.logit_scale"
    if name.startswith("backbone."):
        name = "model." + name.removeprefix("backbone.")
    name = name.replace(".embeddings.", ".embed_tokens.").replace(".self_attn.g_proj.", ".self_attn.gate_proj.")
    m = _PAIR.search(name)
    if m is None:
        return name
    index, part = int(m.group(1)), m.group(2)
    sub = {"attn_alpha": "lambda_1", "mlp_alpha": "lambda_2"}.get(part, ("self_attn", "mlp")[index % 2])
    name = f"{name[: m.start()]}layers.{index // 2}.{sub}{name[m.end() :]}"
    return name.replace(".self_attn.g_proj.", ".self_attn.gate_proj.")
