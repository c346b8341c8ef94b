"""Nemotron-NAS / DeciLM (model_type "nemotron-nas", DeciLMForCausalLM: NVIDIA's Llama-3.1-Nemotron-51B,
Llama-3.3-Nemotron-Super-49B v1 / v1.5, Llama-3.1-Nemotron-Ultra-253B, as their remote code reads config.json):
Llama 3.1 cut down by neural architecture search, each layer its own shape (`block_configs`, one per layer):

- attention: Llama's with num_attention_heads / n_heads_in_group KV heads; `replace_with_linear`, one bias-less
  hidden x hidden matrix of the normed input instead (self_attn.linear_attn, the 51B's); `no_op`, none (nor its
  norm);
- ffn: Llama's SiLU-gated MLP find_multiple(int(2 * ffn_mult * hidden / 3), 256) wide (ffn_mult rounded to six
  places first, as the remote code's FFNConfig does); `no_op`, none.

Everything else is Llama 3.1's (RMSNorms, the llama3 rope, no biases). The KV pool holds the attention layers
only, each in its own shape (ModelConfig.kv_shapes); the model files build each layer from `NASBlocks`.
llama.cpp's `deci` GGUFs state the same per layer (gguf_llama_builders).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from lantern.app.models.errors import check_silu, refuse
from lantern.app.models.spec import UnsupportedModelError

# The remote code's subblock fields; the values it computes nothing else for (its sink / window attention, its
# sparsity masks, Puzzle's Mamba and Llama 4 subblocks are not in the released models)
_ATTENTION = {
    "no_op": False,
    "replace_with_linear": False,
    "n_heads_in_group": None,
    "sparsify": None,
    "window_length": None,
    "num_sink_tokens": None,
    "use_prefill_window_in_sink_attention": False,
    "unshifted_sink": False,
}
# (intermediate_size: a width stated outright, as vLLM reads Puzzle's newer blocks and the GGUF reader writes them)
_FFN = {"no_op": False, "replace_with_linear": False, "ffn_mult": None, "intermediate_size": None, "sparsify": None}
_COMPUTED = {"no_op", "replace_with_linear", "n_heads_in_group", "ffn_mult", "intermediate_size"}


@dataclass(frozen=True)
class NASBlocks:
    """Per layer: its attention ("attention", "linear" or "none"), its KV heads (0 without attention) and its MLP's
    width (0: none)."""

    attention: tuple[str, ...]
    kv_heads: tuple[int, ...]
    mlp_widths: tuple[int, ...]

    def pool_index(self, layer: int) -> int:
        """The layer's place in the KV pool, which holds the attention layers only."""
        return sum(kind == "attention" for kind in self.attention[:layer])


def ffn_width(ffn_mult: float, hidden: int) -> int:
    """The remote code's _ffn_mult_to_intermediate_size: two thirds of ffn_mult x hidden, up to a multiple of 256."""
    width = int(2 * round(float(ffn_mult), 6) * hidden / 3)
    return width if width % 256 == 0 else width + 256 - width % 256


def _blocks(cfg: dict[str, Any]) -> NASBlocks:
    configs, layers = cfg.get("block_configs"), cfg.get("num_hidden_layers")
    if not isinstance(configs, list) or len(configs) != layers:
        raise refuse(
            "block_configs", None if configs is None else f"{len(configs)} blocks", f" (one per layer: {layers})"
        )
    heads, hidden = cfg["num_attention_heads"], cfg["hidden_size"]
    kinds, kv, widths = [], [], []
    for i, block in enumerate(configs):
        attn, ffn = block.get("attention") or {}, block.get("ffn") or {}
        for name, sub, known in (("attention", attn, _ATTENTION), ("ffn", ffn, _FFN)):
            for key, value in sub.items():
                if key not in known or (key not in _COMPUTED and value != known[key]):
                    raise refuse(f"block_configs[{i}].{name}.{key}", value, " (Nemotron-NAS)")
        if attn.get("no_op"):
            kinds.append("none")
            kv.append(0)
        elif attn.get("replace_with_linear"):
            kinds.append("linear")
            kv.append(0)
        else:
            group = attn.get("n_heads_in_group")
            if not isinstance(group, int) or group < 1 or heads % group:
                raise refuse(f"block_configs[{i}].attention.n_heads_in_group", group, f" (divides the {heads} heads)")
            kinds.append("attention")
            kv.append(heads // group)
        if ffn.get("replace_with_linear"):
            raise refuse(f"block_configs[{i}].ffn.replace_with_linear", True, " (no released model has one)")
        if ffn.get("no_op"):
            widths.append(0)
        elif ffn.get("ffn_mult") is None and ffn.get("intermediate_size") is not None:
            width = ffn["intermediate_size"]
            if isinstance(width, bool) or not isinstance(width, int) or width < 1:
                raise refuse(f"block_configs[{i}].ffn.intermediate_size", width, " (a positive whole number)")
            widths.append(width)
        else:
            mult = ffn.get("ffn_mult")
            if isinstance(mult, bool) or not isinstance(mult, (int, float)) or mult <= 0:
                raise refuse(f"block_configs[{i}].ffn.ffn_mult", mult, " (a positive number)")
            widths.append(ffn_width(mult, hidden))
    if "attention" not in kinds:
        raise refuse("block_configs", "no attention layer", " (Lantern's engine needs one to hold the context)")
    return NASBlocks(tuple(kinds), tuple(kv), tuple(widths))


def prepare(cfg: dict[str, Any]) -> dict[str, Any]:
    """The Llama keys the generic reader needs, from the blocks: the widest MLP, the most KV heads."""
    blocks = _blocks(cfg)
    return {
        **cfg,
        "intermediate_size": max(blocks.mlp_widths) or cfg.get("intermediate_size") or 0,
        "num_key_value_heads": max(blocks.kv_heads),
    }


def configure(model_type: str, cfg: dict[str, Any], fields: dict[str, Any]) -> dict[str, Any]:
    """ModelConfig field overrides for a Nemotron-NAS config; refuses, naming the key, what it does not compute."""
    if model_type != "nemotron-nas":
        raise UnsupportedModelError(f"family_deci does not configure model_type {model_type!r}")
    check_silu(cfg, "Nemotron-NAS")
    for key in ("attention_bias", "mlp_bias"):
        if cfg.get(key):
            raise refuse(key, cfg[key], " for nemotron-nas")
    if cfg.get("head_dim") not in (None, fields["hidden_size"] // fields["num_heads"]):
        raise refuse("head_dim", cfg["head_dim"], " (DeciLM's heads are hidden_size / num_attention_heads wide)")
    blocks = _blocks(cfg)
    head_dim = fields["head_dim"]
    return {
        "nas": blocks,
        "kv_shapes": tuple(
            (kv, head_dim) for kind, kv in zip(blocks.attention, blocks.kv_heads) if kind == "attention"
        ),
    }


def checkpoint_name(name: str) -> str:
    """mlx_lm's name for the 51B's linear layer (self_attn.linear) as the remote code's (self_attn.linear_attn)."""
    return name.replace(".self_attn.linear.", ".self_attn.linear_attn.")


def gguf_tensors(source: Iterator[tuple[str, Any]], nas: NASBlocks) -> Iterator[tuple[str, Any]]:
    """llama.cpp's deci files store a linear layer's matrix as attn_output (read as o_proj): its own name again."""
    for name, value in source:
        if ".self_attn.o_proj." in name and nas.attention[int(name.split(".", 3)[2])] == "linear":
            name = name.replace(".self_attn.o_proj.", ".self_attn.linear_attn.")
        yield name, value
