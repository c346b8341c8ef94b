"""Nanbeige 4.2 (Nanbeige/Nanbeige4.2-3B; model_type "nanbeige": remote code, no transformers class), its
config.json turned into ModelConfig fields. mlx_lm's nanbeige model and llama.cpp's graph are the references the tests
hold it to.

The maths: Llama's layers (attention_bias puts biases on q, k, v and o) run num_loops times over the same tokens
with shared weights; each loop's pass of a layer keeps its own K/V (ModelConfig.kv_layers: loops x layers, pool layer
loop x layers + i), and each loop but the last ends with the final norm unless skip_loop_final_norm (the last
loop's norm is the model's final norm either way). The reference code's depth attention, double loop split and
per-loop shared K/V are refused by name.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from lantern.app.models.errors import check_silu, refuse
from lantern.app.models.spec import UnsupportedModelError


@dataclass(frozen=True)
class LayerLoops:
    loops: int
    norm_between: bool  # the final norm after each loop but the last (not skip_loop_final_norm)


def configure(model_type: str, cfg: dict[str, Any], fields: dict[str, Any]) -> dict[str, Any]:
    """ModelConfig field overrides for a nanbeige config.json; refuses, naming the key, what it does not compute."""
    if model_type != "nanbeige":
        raise UnsupportedModelError(f"family_nanbeige does not configure model_type {model_type!r}")
    check_silu(cfg, "Nanbeige")
    for key in ("enable_double_loop_split", "loop_share_kv", "enable_depth_attention", "mlp_bias"):
        if cfg.get(key):
            raise refuse(key, cfg[key], " (not in Nanbeige's released models)")
    loops = cfg.get("num_loops", 1) or 1
    if not isinstance(loops, int) or loops < 1:
        raise refuse("num_loops", loops, " (a positive count)")
    weights = cfg.get("loop_loss_weights")
    if weights and len(weights) + 1 != loops:  # (mlx_lm counts loops from these, llama.cpp from num_loops)
        raise refuse("loop_loss_weights", weights, f" ({loops} num_loops would have {loops - 1} of them)")
    return {
        "loops": LayerLoops(loops, not cfg.get("skip_loop_final_norm", False)),
        "kv_layers": loops * fields["num_layers"],
        "layer_windows": None,
    }
