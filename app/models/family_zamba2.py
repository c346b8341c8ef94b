"""Zamba2 (Zyphra's Zamba2-1.2B / 2.7B / 7B and their instruct models; model_type "zamba2"), as transformers'
Zamba2Config reads its config.json, turned into ModelConfig fields, and its checkpoint's tensors under the model
files' names.

The maths (transformers' modeling_zamba2): every layer is a Mamba-2 mixer block, residual + mixer(RMSNorm(x)) with
the mixer of family_mamba2 (its grouped gated norm at eps 1e-5, dt clamped below at time_step_min). A "hybrid" layer
first runs one of num_mem_blocks shared transformer blocks -- blocks taken in turn, hybrid layer i using block
i % num_mem_blocks -- on the concatenation [x, e] of the layer's input and the token embedding e (width 2 x hidden):

    a = attention(RMSNorm_2h([x, e]));  t = MLP(RMSNorm_h(a));  x' = x + mixer(RMSNorm_h(x + linear_i(t)))

(no residual inside the block; its output only joins the mixer's input). Attention has head_dim = 2 hidden / heads,
scores scaled by (head_dim / 2) ** -0.5, a rope over the whole head only with use_mem_rope; the MLP is gated, its
activation hidden_act (GELU), gate and up fused in gate_up_proj. Each hybrid layer owns its linear_i and LoRA-style
adapters (rank adapter_rank) added to the shared projections: on gate_up always, on q / k / v with
use_shared_attention_adapter. Each hybrid layer keeps its own K/V (ModelConfig.kv_layers: one pool layer per hybrid
layer, Attention's kv_layer); every layer keeps a Mamba state.

Checkpoints: transformers' layout (model.layers.{L}.shared_transformer.* -- stored once per block or repeated in every
hybrid layer, the first hybrid layer of each block is read; the adapters of hybrid layer i inside its block's
adapter lists at index i; a hybrid layer's mixer under mamba_decoder) and Zyphra's original "blocks" layout
(model.blocks.{b}, model.mamba_layers.{L}, model.linear_layers.{i}, the MLP as linear_fc1 / linear_fc2 with
linear_fc1_lora_A_list / _B_list), read as mlx_lm reads them; a folder holding both reads transformers' tensors only.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from lantern.app.models.errors import refuse
from lantern.app.models.spec import UnsupportedModelError

# Zamba2Config's defaults for the keys ModelConfig.from_hf reads (spec.ARCHITECTURES "defaults").
DEFAULTS: dict[str, Any] = {
    "vocab_size": 32000,
    "hidden_size": 2560,
    "num_hidden_layers": 54,
    "num_attention_heads": 32,
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": True,
    "rope_theta": 10000.0,
    "hidden_act": "gelu",
}
_MAMBA = ("mamba", "linear_attention")  # the released configs' name / transformers 5's saved one


@dataclass(frozen=True)
class Zamba2Blocks:
    """Where the shared transformer blocks run and what each hybrid layer adds to them."""

    hybrid_layers: tuple[int, ...]  # the layers that run a shared block before their mixer, in order
    num_blocks: int  # num_mem_blocks: hybrid layer i runs block i % num_blocks
    adapter_rank: int
    attention_adapters: bool  # use_shared_attention_adapter: q / k / v adapters beside gate_up's
    mlp_bias: bool  # add_bias_linear: the shared MLP's projections have biases

    def block_of(self, layer: int) -> int:
        return self.hybrid_layers.index(layer) % self.num_blocks

    def first_layer(self, block: int) -> int:
        """The hybrid layer whose shared_transformer tensors a checkpoint's block is read from."""
        return self.hybrid_layers[block]


def prepare(cfg: dict[str, Any]) -> dict[str, Any]:
    """The keys spec.ModelConfig.from_hf reads, as Zamba2Config derives them: head_dim 2 x hidden / heads (its
    attention reads [x, e]), the MLP 4 x hidden unless stated, multi-head attention unless KV heads are stated."""
    hidden, heads = int(cfg["hidden_size"]), int(cfg["num_attention_heads"])
    if (2 * hidden) % heads:
        raise refuse("num_attention_heads", heads, f" (must divide the attention width 2 x {hidden})")
    out = {**cfg, "head_dim": 2 * hidden // heads}
    out["intermediate_size"] = cfg.get("intermediate_size") or 4 * hidden
    out["num_key_value_heads"] = cfg.get("num_key_value_heads") or heads
    return out


def configure(model_type: str, cfg: dict[str, Any], fields: dict[str, Any]) -> dict[str, Any]:
    """ModelConfig field overrides for a zamba2 config.json; refuses, naming the key, what it does not compute."""
    from lantern.app.models.family_mamba2 import Mamba2Config, _json_float

    if model_type != "zamba2":
        raise UnsupportedModelError(f"family_zamba2 does not configure model_type {model_type!r}")
    layers, hidden = fields["num_layers"], fields["hidden_size"]
    types = cfg.get("layers_block_type") or cfg.get("layer_types")
    if not types or len(types) != layers or any(t not in (*_MAMBA, "hybrid") for t in types):
        raise refuse("layers_block_type", types, f" (mamba or hybrid for each of the {layers} layers)")
    hybrid = tuple(i for i, t in enumerate(types) if t == "hybrid")
    if not hybrid:
        raise refuse("layers_block_type", types, " (no hybrid layer: no attention at all)")
    act = cfg.get("hidden_act", "gelu")
    if act not in ("gelu", "silu", "gelu_pytorch_tanh"):
        raise refuse("hidden_act", act, " (gelu, silu or gelu_pytorch_tanh for the shared MLP)")
    rope = bool(cfg.get("use_mem_rope", False))
    if rope and cfg.get("use_long_context"):  # (transformers 4 rescaled the rope base for it, transformers 5 does not)
        raise refuse("use_long_context", True, " with use_mem_rope (its rope base's rescaling differs between sources)")
    heads, kv_heads = fields["num_heads"], fields["num_kv_heads"]
    adapters = bool(cfg.get("use_shared_attention_adapter", False))
    if adapters and kv_heads != heads:  # (the adapters' output is 2 x hidden wide: transformers fails the same way)
        raise refuse("num_key_value_heads", kv_heads, " with use_shared_attention_adapter (must equal the heads)")
    blocks = int(cfg.get("num_mem_blocks", 1))
    if not 1 <= blocks <= len(hybrid):
        raise refuse("num_mem_blocks", blocks, f" (1 to the {len(hybrid)} hybrid layers)")
    mamba_heads = int(cfg.get("n_mamba_heads", 8))
    inner = int(float(cfg.get("mamba_expand", 2)) * hidden)
    groups = int(cfg.get("mamba_ngroups", 1))
    if inner % mamba_heads:
        raise refuse("n_mamba_heads", mamba_heads, f" (must divide the mixer's {inner} channels)")
    if groups < 1 or mamba_heads % groups:
        raise refuse("mamba_ngroups", groups, f" (must divide the {mamba_heads} n_mamba_heads)")
    conv = int(cfg.get("mamba_d_conv", 4))
    if conv < 2:
        raise refuse("mamba_d_conv", conv, " (must be at least 2)")
    bias = bool(cfg.get("add_bias_linear", False))
    mamba = Mamba2Config(
        mamba_layers=(True,) * layers,
        num_heads=mamba_heads,
        head_dim=inner // mamba_heads,
        state_size=int(cfg.get("mamba_d_state", 64)),
        groups=groups,
        conv_kernel=conv,
        conv_bias=True,  # (Zamba2's convolution always has one, whatever use_conv_bias says)
        proj_bias=bias,
        # transformers' chunked form clamps dt below at time_step_min (its one-token step does not): clamped
        # in both here, so a sequence's state does not depend on how its prompt was chunked
        dt_limit=(_json_float(cfg.get("time_step_min", 0.001)), float("inf")),
        norm_eps=1e-5,  # (Zamba2RMSNormGated's, not rms_norm_eps)
    )
    act = {"gelu_pytorch_tanh": "gelu_tanh"}.get(act, act)
    return {
        "mamba": mamba,
        "zamba2": Zamba2Blocks(hybrid, blocks, int(cfg.get("adapter_rank", 128)), adapters, bias),
        "kv_layers": len(hybrid),
        "hidden_act": act,
        "attn_scale": (fields["head_dim"] / 2) ** -0.5,
        "rope_layers": None if rope else (False,) * layers,
        "layer_windows": None,
        "max_position_embeddings": 16384 if cfg.get("use_long_context") else fields["max_position_embeddings"],
    }


_SHARED = re.compile(r"model\.layers\.(\d+)\.shared_transformer\.(.+)")
_ZYPHRA = re.compile(r"model\.(blocks|mamba_layers|linear_layers)\.(\d+)\.(.+)")
_ATTN_ADAPTER = re.compile(r"self_attn\.linear_([qkv])_adapter_list\.(\d+)\.([01])\.weight")
_MLP_ADAPTER = re.compile(r"feed_forward\.gate_up_proj_adapter_list\.(\d+)\.([01])\.weight")
_ZYPHRA_LORA = re.compile(r"feed_forward\.linear_fc1_lora_([AB])_list\.(\d+)\.weight")
_ZYPHRA_MLP = {
    "feed_forward.linear_fc1.": "feed_forward.gate_up_proj.",
    "feed_forward.linear_fc2.": "feed_forward.down_proj.",
}


def name_map(spec: Any) -> Callable[[str], str | None]:
    """The model files' name of each checkpoint tensor (None: not read -- a repeated shared block, the other layout
    of a folder holding both, a tied head); unknown names kept for the loader to refuse."""
    from lantern.app.models.weight_stream import RawSafetensors

    transformers_layout = False
    for path in spec.weight_files:
        raw = RawSafetensors(path)
        transformers_layout |= any(n.startswith("model.layers.") for n in raw.names)
        raw.close()
    blocks, tied = spec.config.zamba2, spec.config.tie_word_embeddings
    return lambda name: checkpoint_name(name, blocks, transformers_layout, tied)


def checkpoint_name(name: str, blocks: Zamba2Blocks, transformers_layout: bool, tied: bool) -> str | None:
    """A Zamba2 checkpoint's tensor under the model files' name (see name_map)."""
    if name == "model.final_layernorm.weight":
        return "model.norm.weight"
    if name == "lm_head.weight" and tied:
        return None
    m = _ZYPHRA.fullmatch(name)
    if m is not None:
        if transformers_layout:
            return None
        kind, index, rest = m.group(1), int(m.group(2)), m.group(3)
        if kind == "mamba_layers":
            return f"model.layers.{index}.{rest}"
        if kind == "linear_layers":
            return (
                f"model.layers.{blocks.hybrid_layers[index]}.linear.{rest}"
                if index < len(blocks.hybrid_layers)
                else name
            )
        lora = _ZYPHRA_LORA.fullmatch(rest)
        if lora is not None:
            return _adapter(blocks, int(lora.group(2)), "mlp", "a" if lora.group(1) == "A" else "b", name)
        for old, new in _ZYPHRA_MLP.items():
            rest = new + rest[len(old) :] if rest.startswith(old) else rest
        return _shared(blocks, index, rest, name)
    m = _SHARED.fullmatch(name)
    if m is not None:
        layer, rest = int(m.group(1)), m.group(2)
        if layer not in blocks.hybrid_layers:
            return name
        block = blocks.block_of(layer)
        return None if layer != blocks.first_layer(block) else _shared(blocks, block, rest, name)
    return name.replace(".mamba_decoder.", ".", 1) if ".mamba_decoder." in name else name


def _shared(blocks: Zamba2Blocks, block: int, rest: str, name: str) -> str:
    """A shared block's tensor: the block's own, or (its adapter lists) the hybrid layer's it belongs to."""
    m = _ATTN_ADAPTER.fullmatch(rest)
    if m is not None:
        return _adapter(blocks, int(m.group(2)), m.group(1), "ab"[int(m.group(3))], name)
    m = _MLP_ADAPTER.fullmatch(rest)
    if m is not None:
        return _adapter(blocks, int(m.group(1)), "mlp", "ab"[int(m.group(2))], name)
    return f"model.shared_transformers.{block}.{rest}"


def _adapter(blocks: Zamba2Blocks, index: int, target: str, half: str, name: str) -> str:
    """Hybrid layer `index`'s adapter on `target` (q, k, v or mlp): its down (a) or up (b) projection."""
    if index >= len(blocks.hybrid_layers):
        return name  # (the loader refuses it by name)
    return f"model.layers.{blocks.hybrid_layers[index]}.adapter.{target}_{half}.weight"
