"""Apertus (Swiss AI's Apertus-8B / 70B: model_type apertus), as transformers 5's ApertusConfig reads its
config.json, turned into ModelConfig fields.

The maths (transformers' modeling_apertus): Llama's decoder layer with per-head q/k RMSNorms before the rope,
its two norms named attention_layernorm / feedforward_layernorm, and an ungated MLP, down(xIELU(up(x))), whose
xIELU activation has two trained scalars per layer (act_fn.alpha_p, act_fn.alpha_n):
    xIELU(x) = a_p x^2 + beta x                         for x > 0
             = (expm1(min(x, eps)) - x) a_n + beta x    otherwise,
with a_p = softplus(alpha_p), a_n = beta + softplus(alpha_n), beta = 0.5 and eps = -1e-6 (the activation's
constants, which checkpoints store too). The rope defaults to llama3 scaling of base 12e6.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from lantern.app.models.errors import refuse as _refuse
from lantern.app.models.rope_config import rope_scaling
from lantern.app.models.spec import UnsupportedModelError

XIELU_BETA, XIELU_EPS = 0.5, -1e-6
# ApertusConfig's rope when config.json states none
_ROPE = {
    "rope_type": "llama3",
    "rope_theta": 12000000.0,
    "factor": 8.0,
    "original_max_position_embeddings": 8192,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
}
DEFAULTS: dict[str, Any] = {"max_position_embeddings": 65536, "rms_norm_eps": 1e-5}


def configure(model_type: str, cfg: dict[str, Any], fields: dict[str, Any]) -> dict[str, Any]:
    if model_type != "apertus":
        raise UnsupportedModelError(f"family_apertus does not configure model_type {model_type!r}")
    if cfg.get("hidden_act", "xielu") != "xielu":
        raise _refuse("hidden_act", cfg["hidden_act"], " for Apertus (its MLP is xIELU's)")
    for key, computed in (("post_norm", False), ("qk_norm", True)):  # released configs' keys: variants nobody computes
        if key in cfg and cfg[key] != computed:
            raise _refuse(key, cfg[key], f" (Apertus computes {key}={str(computed).lower()})")
    for key, why in (("attention_bias", " (biases on q/k/v and o_proj)"), ("mlp_bias", " (MLP biases)")):
        if cfg.get(key):
            raise _refuse(key, cfg[key], why)
    rope = dict(cfg.get("rope_parameters") or cfg.get("rope_scaling") or _ROPE)
    theta = float(rope.get("rope_theta") or cfg.get("rope_theta") or _ROPE["rope_theta"])
    return {
        "qk_norm": True,
        "hidden_act": "xielu",
        "rope_theta": theta,
        "rope_scaling": rope_scaling({**cfg, "rope_scaling": None}, rope, fields["max_position_embeddings"]),
    }


def checkpoint_name(name: str) -> str:
    """Apertus's norms under the model files' (Llama's) names."""
    return name.replace(".attention_layernorm.", ".input_layernorm.").replace(
        ".feedforward_layernorm.", ".post_attention_layernorm."
    )


def checkpoint_tensors(source: Iterator[tuple[str, Any]]) -> Iterator[tuple[str, Any]]:
    """xIELU's stored constants checked (the model files compute with Apertus's) and dropped; its trained
    scalars as one-element vectors (mlx_lm stores them squeezed)."""
    for name, value in source:
        if name.endswith((".act_fn.beta", ".act_fn.eps")):
            want = XIELU_BETA if name.endswith("beta") else XIELU_EPS
            got = float(value.reshape(-1)[0].item())  # (torch / MLX bfloat16 too: stored in the model's dtype)
            if abs(got - want) > 0.05 * abs(want):  # bfloat16's -1e-6 is 0.16% off, float16's 1.3%
                raise UnsupportedModelError(f"{name}={got}: an xIELU constant other than Apertus's ({want})")
            continue
        if name.endswith((".act_fn.alpha_p", ".act_fn.alpha_n")):
            value = value.reshape(1)
        yield name, value


def gguf_tensors(source: Iterator[tuple[str, Any]], metadata: dict[str, Any], layers: int) -> Iterator[tuple[str, Any]]:
    """An `apertus` GGUF's stream (llama.cpp's ApertusModel keeps xIELU's scalars as per-layer metadata arrays,
    xielu.alpha_p / alpha_n / beta / eps, the trained ones as stored): the file's tensors, then each layer's two
    trained scalars as the checkpoint's one-element tensors; the constants checked as checkpoint_tensors does."""
    import numpy as np

    yield from source
    values: dict[str, list[float]] = {}
    for key in ("alpha_p", "alpha_n", "beta", "eps"):
        stated = metadata.get(f"xielu.{key}")  # (gguf's Keys.xIELU: no architecture prefix)
        stated = [stated] * layers if isinstance(stated, (int, float)) else list(stated or [])
        if len(stated) != layers:
            raise UnsupportedModelError(f"xielu.{key} holds {len(stated)} values for {layers} layers")
        values[key] = [float(v) for v in stated]
    for key, want in (("beta", XIELU_BETA), ("eps", XIELU_EPS)):
        for got in values[key]:
            if abs(got - want) > 0.05 * abs(want):
                raise UnsupportedModelError(
                    f"apertus.xielu.{key}={got}: an xIELU constant other than Apertus's ({want})"
                )
    for layer in range(layers):
        for key in ("alpha_p", "alpha_n"):
            yield f"model.layers.{layer}.mlp.act_fn.{key}", np.asarray([values[key][layer]], dtype=np.float32)
