"""Zamba (Zyphra's Zamba-7B-v1 and its instruct model; model_type "zamba"), as transformers' ZambaConfig reads its
config.json, turned into ModelConfig fields, and its checkpoint's tensors under the model files' names.

The maths (transformers' modeling_zamba): Zamba2's layout (family_zamba2) with Mamba-1 mixers and one shared block.
Every layer is x + mixer(RMSNorm(x)); a "hybrid" layer first runs the shared transformer block on the concatenation
[x, e] of its input and the token embedding and adds linear_i(block output) to the mixer's input only:

    t = MLP(RMSNorm_h(attention(RMSNorm_2h([x, e]))));  x' = x + mixer(RMSNorm_h(x + linear_i(t)))

Attention has no rope, head_dim = 2 hidden / heads (attention_head_dim) and scores scaled by (head_dim / 2) ** -0.5;
the MLP is gated (gate_proj, up_proj; hidden_act GELU). The mixer is Mamba-1 (family_mamba) with its d_inner split
into n_mamba_heads heads, each with its own x_proj (dt, B, C from the head's channels) and dt_proj: B and C differ
per head (Mamba1Config.heads). Its in_proj interleaves x and the gate channel by channel (x_c, z_c at rows 2c,
2c + 1), put in Mamba's [x | z] order while loading. Each hybrid layer keeps its own K/V (kv_layers: one pool
layer per hybrid layer); every layer keeps a Mamba state.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from typing import Any

from lantern.app.models.errors import refuse
from lantern.app.models.spec import UnsupportedModelError

# ZambaConfig's defaults for the keys ModelConfig.from_hf reads (spec.ARCHITECTURES "defaults").
DEFAULTS: dict[str, Any] = {
    "vocab_size": 32000,
    "hidden_size": 3712,
    "intermediate_size": 14848,
    "num_hidden_layers": 76,
    "num_attention_heads": 16,
    "num_key_value_heads": 16,
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": True,
    "hidden_act": "gelu",
}
_MAMBA = ("mamba", "linear_attention")  # the released configs' name / transformers 5's saved one


def layer_types(cfg: dict[str, Any], layers: int) -> list[str]:
    """layers_block_type as stated, else ZambaConfig's schedule: two mixer layers, a hybrid one, then hybrid where
    i % attn_layer_period == attn_layer_offset among the rest."""
    types = cfg.get("layers_block_type") or cfg.get("layer_types")
    if types:
        return list(types)
    period, offset = int(cfg.get("attn_layer_period", 6)), int(cfg.get("attn_layer_offset", 4))
    rest = ["hybrid" if i % period == offset else "mamba" for i in range(layers - 3)]
    return ["mamba", "mamba", "hybrid", *rest]


def prepare(cfg: dict[str, Any]) -> dict[str, Any]:
    """The keys spec.ModelConfig.from_hf reads, as ZambaConfig derives them: head_dim (attention_head_dim) 2 x hidden
    / heads unless stated (its attention reads [x, e]); no rope (rope_layers all False in configure)."""
    hidden, heads = int(cfg.get("hidden_size", DEFAULTS["hidden_size"])), int(cfg["num_attention_heads"])
    head_dim = cfg.get("attention_head_dim") or 2 * hidden // heads
    return {**cfg, "head_dim": int(head_dim)}


def configure(model_type: str, cfg: dict[str, Any], fields: dict[str, Any]) -> dict[str, Any]:
    """ModelConfig field overrides for a zamba config.json; refuses, naming the key, what it does not compute."""
    from lantern.app.models.family_mamba import Mamba1Config
    from lantern.app.models.family_zamba2 import Zamba2Blocks

    if model_type != "zamba":
        raise UnsupportedModelError(f"family_zamba does not configure model_type {model_type!r}")
    layers, hidden = fields["num_layers"], fields["hidden_size"]
    types = layer_types(cfg, layers)
    if len(types) != layers or any(t not in (*_MAMBA, "hybrid") for t in types):
        raise refuse("layers_block_type", types, f" (mamba or hybrid for each of the {layers} layers)")
    hybrid = tuple(i for i, t in enumerate(types) if t == "hybrid")
    if not hybrid:
        raise refuse("layers_block_type", types, " (no hybrid layer: no attention at all)")
    width = cfg.get("attention_hidden_size")
    if width not in (None, 2 * hidden):  # (the block's input is [x, e]: 2 x hidden wide, whatever this says)
        raise refuse("attention_hidden_size", width, f" (must be 2 x hidden_size = {2 * hidden})")
    act = cfg.get("hidden_act", "gelu")
    if act not in ("gelu", "silu", "gelu_pytorch_tanh"):
        raise refuse("hidden_act", act, " (gelu, silu or gelu_pytorch_tanh for the shared MLP)")
    if cfg.get("hidden_mamba_act", "silu") != "silu":
        raise refuse("hidden_mamba_act", cfg["hidden_mamba_act"], " (the mixer's convolution takes SiLU)")
    inner = int(cfg.get("mamba_expand", 2)) * hidden
    heads = int(cfg.get("n_mamba_heads", 2))
    if heads < 1 or inner % heads:
        raise refuse("n_mamba_heads", heads, f" (must divide the mixer's {inner} channels)")
    rank = cfg.get("mamba_dt_rank", "auto")
    conv = int(cfg.get("mamba_d_conv", 4))
    if conv < 2:
        raise refuse("mamba_d_conv", conv, " (must be at least 2)")
    mamba1 = Mamba1Config(
        mamba_layers=(True,) * layers,  # (every layer keeps a state; the hybrid ones add attention before it)
        inner=inner,
        state_size=int(cfg.get("mamba_d_state", 16)),
        conv_kernel=conv,
        dt_rank=math.ceil(hidden / 16) if rank == "auto" else int(rank),
        conv_bias=bool(cfg.get("mamba_conv_bias", True)),
        proj_bias=bool(cfg.get("mamba_proj_bias", False)),
        heads=heads,
    )
    act = {"gelu_pytorch_tanh": "gelu_tanh"}.get(act, act)
    return {
        "mamba1": mamba1,
        "zamba2": Zamba2Blocks(hybrid, 1, 0, False, False),  # one shared block, no adapters, no MLP biases
        "kv_layers": len(hybrid),
        "hidden_act": act,
        "attn_scale": (fields["head_dim"] / 2) ** -0.5,
        "rope_layers": (False,) * layers,
        "layer_windows": None,
    }


_SHARED = re.compile(r"model\.layers\.(\d+)\.shared_transf\.(.+)")


def name_map(spec: Any) -> Any:
    """checkpoint_name with the folder's hybrid layers and head tying."""
    blocks, tied = spec.config.zamba2, spec.config.tie_word_embeddings
    return lambda name: checkpoint_name(name, blocks.hybrid_layers, tied)


def checkpoint_name(name: str, hybrid: tuple[int, ...] = (), tied: bool = True) -> str | None:
    """A Zamba checkpoint's tensor under the model files' name (None: not read -- the shared block as repeated in
    hybrid layers after the first, a tied head); unknown names kept for the loader to refuse."""
    if name == "model.final_layernorm.weight":
        return "model.norm.weight"
    if name == "lm_head.weight" and tied:
        return None
    m = _SHARED.fullmatch(name)
    if m is not None:
        layer = int(m.group(1))
        if layer not in hybrid:
            return name
        return f"model.shared_transformers.0.{m.group(2)}" if layer == hybrid[0] else None
    return name.replace(".mamba_decoder.", ".", 1) if ".mamba_decoder." in name else name


def checkpoint_tensors(source: Iterator[tuple[str, Any]], spec: Any) -> Iterator[tuple[str, Any]]:
    """The stream with each mixer's in_proj rows from [x_0, z_0, x_1, z_1, ...] to [x | z] (its bias too, a quantized
    weight in its own format), and A_log [heads, head width, N] / D [heads, head width] as the channels' [d_inner, N]
    / [d_inner]."""
    import numpy as np

    from lantern.app.models.grouped_qkv import reorder_rows

    inner = spec.config.mamba1.inner
    order = np.concatenate([np.arange(0, 2 * inner, 2), np.arange(1, 2 * inner, 2)])
    for name, value in source:
        if ".mamba.in_proj." in name:
            value = reorder_rows(value, order)
        elif name.endswith(".mamba.A_log"):
            value = value.reshape(inner, -1)
        elif name.endswith(".mamba.D"):
            value = value.reshape(inner)
        yield name, value
