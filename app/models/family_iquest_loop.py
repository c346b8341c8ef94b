"""IQuest-Coder-V1 Loop (IQuestLab/IQuest-Coder-V1-40B-Loop-Instruct; model_type "iquestloopcoder", remote code, no
transformers class), its config.json turned into ModelConfig fields. mlx_lm's iquestloopcoder model is the reference
the tests hold it to.

The maths: Llama's layers (attention_bias: biases on q, k, v and o) run twice over the same tokens with shared
weights. The first pass is Llama's, each layer's K/V kept in pool layer i. In the second pass a layer's query (after
the rope) attends twice: to the first pass's K/V of that layer (causal, the whole context) and, within a sliding
window of loop_window_size tokens, to the second pass's own K/V (pool layer num_layers + i); a per-head gate
sigmoid(q . w_h + b_h) (model.gate_projections.<i>: a [heads, head_dim] weight and a [heads] bias, per token and
head) mixes them, gate * first-pass + (1 - gate) * window, before o_proj. The final norm comes once, after the
second pass. Two passes only (mlx_lm's and the released models' loop_num).
"""

from __future__ import annotations

import re
from typing import Any

from lantern.app.models.errors import check_silu, refuse
from lantern.app.models.spec import UnsupportedModelError

# mlx_lm's ModelArgs defaults for the keys a released config may leave out
DEFAULTS: dict[str, Any] = {"max_position_embeddings": 131072, "rope_theta": 500000.0}


def configure(model_type: str, cfg: dict[str, Any], fields: dict[str, Any]) -> dict[str, Any]:
    """ModelConfig field overrides for an iquestloopcoder config.json; refuses, naming the key, what it does not
    compute."""
    if model_type != "iquestloopcoder":
        raise UnsupportedModelError(f"family_iquest_loop does not configure model_type {model_type!r}")
    check_silu(cfg, "IQuest-Coder")
    if cfg.get("mlp_bias"):
        raise refuse("mlp_bias", cfg["mlp_bias"], " (biases on the MLP projections)")
    loops = cfg.get("loop_num", 2)
    if loops != 2:
        raise refuse("loop_num", loops, " (IQuest-Coder Loop's two passes only, as mlx_lm)")
    window = cfg.get("loop_window_size", 64)
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise refuse("loop_window_size", window, " (a positive number of tokens)")
    return {"loop_window": window, "kv_layers": 2 * fields["num_layers"], "layer_windows": None}


_GATE = re.compile(r"^model\.gate_projections\.(\d+)\.")


def checkpoint_name(name: str) -> str:
    """model.gate_projections.<i>.* as layer i's attention's loop_gate (the model files keep it there)."""
    return _GATE.sub(r"model.layers.\1.self_attn.loop_gate.", name)
