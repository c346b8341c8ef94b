"""Qwen3-VL (dense and MoE): the language model of a Qwen3VLForConditionalGeneration /
Qwen3VLMoeForConditionalGeneration folder, served for text (the vision tower is not loaded).

What differs from Qwen3 / Qwen3-MoE (transformers 5's Qwen3VLTextModel / Qwen3VLMoeTextModel):
- Multimodal rope (`mrope_section`, interleaved): each rotary frequency reads the time, height or width
  position id. For text all three are the token's position, so it is Qwen3's rope; the keys are dropped.
- Deepstack: visual features added to the first layers' hidden states, for image tokens only; text has none.
- The MoE router always renormalises the top-k probabilities (no norm_topk_prob key), and the experts
  are stored fused: Qwen's checkpoints as `mlp.experts.gate_up_proj` [E, hidden, 2 * inner] and
  `mlp.experts.down_proj` [E, inner, hidden] (x @ W), which transformers transposes while loading
  (when the shape says so) to its own [E, 2 * inner, hidden] / [E, hidden, inner], the layout it then
  saves. `checkpoint_tensors` does the same, so weight_stream.split_switch_mlp reads either.
- GGUF (llama.cpp's Qwen3VLTextModel / Qwen3VLMoeTextModel: arches qwen3vl / qwen3vlmoe): Qwen3's
  tensors and keys plus `n_deepstack_layers` and `rope.dimension_sections`; gguf_builders reads them.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from lantern.app.models.errors import UnsupportedModelError
from lantern.app.models.errors import refuse as _refuse
from lantern.app.models.rope_config import rope_scaling

_WRAPPED = {"qwen3_vl": "qwen3_vl_text", "qwen3_vl_moe": "qwen3_vl_moe_text"}  # vision-language folders


def text_config_of(cfg: dict[str, Any]) -> dict[str, Any]:
    """The language model's config inside a Qwen3-VL config.json; the wrapper's tying decides
    (Qwen3VLConfig's and Qwen3VLMoeConfig's default: untied)."""
    from lantern.app.models.spec import wrapped_text_config

    return wrapped_text_config(cfg, _WRAPPED[cfg["model_type"]], cfg.get("tie_word_embeddings", False))


def configure(model_type: str, cfg: dict[str, Any], fields: dict[str, Any]) -> dict[str, Any]:
    """ModelConfig field overrides: Qwen3's q/k norms, the rope without its multimodal keys, and for the
    MoE Qwen3-MoE's experts with the top-k always renormalised."""
    from lantern.app.models import family_moe

    if cfg.get("attention_bias"):
        raise _refuse("attention_bias", cfg["attention_bias"], " (biases on the attention projections)")
    # rope_parameters (transformers 5), or rope_scaling beside rope_theta (the configs Qwen released first)
    plain = {**cfg, "rope_scaling": _without_mrope(cfg.get("rope_scaling")) or None}
    rope = _without_mrope(cfg.get("rope_parameters"))
    max_pos = fields["max_position_embeddings"]
    out: dict[str, Any] = {"qk_norm": True, "rope_scaling": rope_scaling(plain, rope, max_pos)}
    if model_type == "qwen3_vl_moe_text":  # (its router renormalises whatever a norm_topk_prob key says)
        out.update(family_moe.configure("qwen3_moe", {**cfg, "norm_topk_prob": True}, fields))
    return out


def _without_mrope(rope: dict[str, Any] | None) -> dict[str, Any]:
    return {k: v for k, v in (rope or {}).items() if not k.startswith("mrope_")}


def checkpoint_tensors(source: Iterator[tuple[str, Any]], hidden_size: int) -> Iterator[tuple[str, Any]]:
    """Qwen's stored layout of the fused experts ([E, hidden, 2 * inner] and [E, inner, hidden]) as
    transformers' ([E, 2 * inner, hidden] and [E, hidden, inner]); tensors already in transformers'
    layout (a folder it saved) pass as they are. Where both readings fit (hidden == 2 * inner), the
    tensor is taken as transformers' layout, as transformers itself does."""
    for name, value in source:
        if name.endswith((".mlp.experts.gate_up_proj", ".mlp.experts.down_proj")) and getattr(value, "ndim", 0) == 3:
            gate_up = name.endswith("gate_up_proj")
            ours = value.shape[2] == hidden_size if gate_up else value.shape[1] == hidden_size
            if not ours:
                if not hasattr(value, "swapaxes"):
                    raise UnsupportedModelError(
                        f"{name}: quantized fused experts stored [E, in, out] are not implemented"
                    )
                value = value.swapaxes(1, 2)
        yield name, value
