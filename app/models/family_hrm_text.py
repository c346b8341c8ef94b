"""HRM-Text (model_type "hrm_text": sapientinc/HRM-Text-1B, danish-foundation-models' DFM-Mimir), as transformers'
HrmTextConfig reads its config.json, turned into ModelConfig fields, and its checkpoint's tensors under the model
files' names.

The maths (transformers' modeling_hrm_text): two stacks of pre-norm layers, L and H, each ended by a norm, run in
cycles over the same tokens. z_H starts as the embedding times embedding_scale, z_L as the learned z_L_init; each of
H_cycles runs z_L = L(z_L + z_H) L_cycles times, then z_H = H(z_H + z_L); the head reads the last z_H. Every norm is
an RMSNorm without a weight (in float32), attention is multi-head with a sigmoid gate of the layer's input on each
output channel (self_attn.gate_proj) and a plain rope, the MLP SiLU-gated. Each stack pass keeps its own K/V: the
pool holds layers_per_stack x H_cycles x (L_cycles + 1) layers (ModelConfig.kv_layers; transformers' cache slots,
llama.cpp's block_count), while the model holds the 2 x layers_per_stack layers the checkpoint has -- the L stack's
first (model.layers.0..), the H stack's after them, as llama.cpp numbers them.

The prefix-LM mask (prefix_lm: prompt tokens marked by token_type_ids attend both ways) is not computed: a request
has no token types, and transformers' forward on input ids alone -- what generate() runs -- is causal, as is
llama.cpp's graph.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from lantern.app.models.errors import check_silu, refuse
from lantern.app.models.spec import UnsupportedModelError

# HrmTextConfig's defaults for the keys ModelConfig.from_hf reads (spec.ARCHITECTURES "defaults").
DEFAULTS: dict[str, Any] = {
    "vocab_size": 151808,
    "hidden_size": 1536,
    "intermediate_size": 4096,
    "num_hidden_layers": 16,
    "num_attention_heads": 12,
    "head_dim": 128,
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
}


@dataclass(frozen=True)
class HrmCycles:
    """The stacks' shape and schedule: layers per stack, H cycles, L cycles per H cycle."""

    layers_per_stack: int
    h_cycles: int
    l_cycles: int

    @property
    def kv_layers(self) -> int:
        """The K/V the passes of one step keep: one per layer of each stack pass."""
        return self.layers_per_stack * self.h_cycles * (self.l_cycles + 1)

    def passes(self) -> Iterator[tuple[str, int]]:
        """Each stack pass of a step in order: ("L" or "H", the pool layer of its first layer)."""
        for h in range(self.h_cycles):
            for slot in range(self.l_cycles + 1):
                stack = "L" if slot < self.l_cycles else "H"
                yield stack, (h * (self.l_cycles + 1) + slot) * self.layers_per_stack


def configure(model_type: str, cfg: dict[str, Any], fields: dict[str, Any]) -> dict[str, Any]:
    """ModelConfig field overrides for an hrm_text config; refuses, naming the key, what it does not compute."""
    if model_type != "hrm_text":
        raise UnsupportedModelError(f"family_hrm_text does not configure model_type {model_type!r}")
    check_silu(cfg, "HRM-Text")
    for key in ("attention_bias", "mlp_bias"):
        if cfg.get(key):
            raise refuse(key, cfg[key], " (biases on HRM-Text's projections)")
    cycles = {}
    for key in ("H_cycles", "L_cycles"):
        value = cfg.get(key, 2 if key == "H_cycles" else 3)  # HrmTextConfig's defaults
        if not isinstance(value, int) or value < 1:
            raise refuse(key, value, " (a positive count of cycles)")
        cycles[key] = value
    h, low = cycles["H_cycles"], cycles["L_cycles"]
    # transformers' saved configs: the per-stack count in num_layers_per_stack, num_hidden_layers the slots; released
    # (training) configs: the per-stack count in num_hidden_layers (HrmTextConfig.__post_init__)
    per_stack = cfg.get("num_layers_per_stack") or cfg["num_hidden_layers"]
    if cfg.get("num_layers_per_stack") is not None and cfg["num_hidden_layers"] != per_stack * h * (low + 1):
        raise refuse(
            "num_hidden_layers", cfg["num_hidden_layers"], " (num_layers_per_stack x H_cycles x (L_cycles + 1))"
        )
    scale = cfg.get("embedding_scale")
    scale = 1.0 / float(cfg.get("initializer_range", 0.02)) if scale is None else float(scale)
    heads = int(fields["num_heads"])
    hrm = HrmCycles(int(per_stack), h, low)
    return {
        "num_layers": 2 * hrm.layers_per_stack,
        "kv_layers": hrm.kv_layers,
        "hrm": hrm,
        "num_kv_heads": heads,  # (multi-head: HrmTextAttention has no KV groups)
        "attn_output_gate": "sigmoid",
        "embed_multiplier": scale,
    }


_STACK = re.compile(r"(?:model\.)?([LH])_module\.layers\.(\d+)\.(.+)")
_SUBLAYER = {"attn.": "self_attn.", "self_attn.": "self_attn.", "mlp.": "mlp."}


def name_map(spec: Any) -> Callable[[str], str | None]:
    """The model files' name of each checkpoint tensor (weight_stream: a family whose names depend on its config)."""
    per_stack = spec.config.hrm.layers_per_stack
    return lambda name: checkpoint_name(name, per_stack)


def checkpoint_name(name: str, layers_per_stack: int) -> str | None:
    """An HRM-Text checkpoint's tensor under the model files' name: stack layers numbered L first, then H; the
    fused gqkv_proj as self_attn.gqkv_proj (split by checkpoint_tensors); unknown names kept for the loader to
    refuse."""
    m = _STACK.fullmatch(name)
    if m is None:  # (a base model's checkpoint: no "model." prefix)
        return f"model.{name}" if name in ("z_L_init", "embed_tokens.weight") else name
    stack, index, rest = m.groups()
    layer = int(index) + (layers_per_stack if stack == "H" else 0)
    for prefix, ours in _SUBLAYER.items():
        if rest.startswith(prefix):
            return f"model.layers.{layer}.{ours}{rest[len(prefix) :]}"
    return f"model.layers.{layer}.{rest}"


def checkpoint_tensors(source: Iterator[tuple[str, Any]], spec: Any) -> Iterator[tuple[str, Any]]:
    """The stream with each layer's fused [gate; q; k; v] as self_attn.gate_proj and q/k/v_proj and its fused
    [gate; up] as mlp.gate_proj / up_proj (row slices: a quantized checkpoint stays quantized)."""
    from lantern.app.models.weight_stream import _row_slice

    cfg = spec.config
    width, inner = cfg.num_heads * cfg.head_dim, cfg.intermediate_size
    fused = {
        "self_attn.gqkv_proj": ("self_attn.gate_proj", "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
        "mlp.gate_up_proj": ("mlp.gate_proj", "mlp.up_proj"),
    }
    for name, value in source:
        stem, _, kind = name.rpartition(".")
        base, _, proj = stem.rpartition(".layers.")
        layer, _, sub = proj.partition(".")
        parts = fused.get(sub)
        if parts is None:
            yield name, value
            continue
        rows = width if sub.startswith("self_attn") else inner
        for i, part in enumerate(parts):
            yield f"{base}.layers.{layer}.{part}.{kind}", _row_slice(value, i * rows, (i + 1) * rows)
