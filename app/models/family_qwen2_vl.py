"""Qwen2-VL and Qwen2.5-VL: the language model of a Qwen2VLForConditionalGeneration /
Qwen2_5_VLForConditionalGeneration folder, served for text (the vision tower is not loaded).

Its language model is Qwen2's (q/k/v biases, Qwen2's sliding-window keys) under a multimodal rope
(`mrope_section`): each rotary frequency reads the time, height or width position id, which for text are
all the token's position, so it is Qwen2's rope. The folders come in several layouts:
- the config as Qwen released it: flat (the text keys at the top, `rope_scaling` of type "mrope"), or nested
  under `text_config` as transformers saves it;
- the tensors as Qwen released them, `model.layers.*` / `lm_head.*` beside `visual.*` (transformers 5 saves
  these names again), or as transformers 4.52 to 4.57 saved them, `model.language_model.*` beside
  `model.visual.*`.
GGUF: llama.cpp's Qwen2VLModel writes both as arch qwen2vl (Qwen2's tensors and keys plus
rope.dimension_sections); gguf_builders reads it.
"""

from __future__ import annotations

from typing import Any

# Keys of a flat config.json that are the wrapper's, not the language model's.
_WRAPPER_ONLY = ("vision_config", "architectures", "image_token_id", "video_token_id", "vision_token_id")
_DEFAULTS = {"rope_theta": 1000000.0, "max_position_embeddings": 32768}  # Qwen2VLTextConfig's


def text_config_of(cfg: dict[str, Any]) -> dict[str, Any]:
    """The qwen2 config of a Qwen2-VL / Qwen2.5-VL folder's language model, its rope without the multimodal
    keys. Tied when the wrapper says so, or (configs saved before transformers 5) its text_config does."""
    from lantern.app.models.spec import wrapped_text_config

    if cfg.get("text_config") is None:  # the released flat layout: the text keys are the top level's
        flat = {k: v for k, v in cfg.items() if k not in _WRAPPER_ONLY and not k.startswith("vision_")}
        cfg = {**cfg, "text_config": flat}
    tie = bool(cfg.get("tie_word_embeddings") or cfg["text_config"].get("tie_word_embeddings"))
    text = wrapped_text_config(cfg, "qwen2", tie, _DEFAULTS)
    for key in ("rope_scaling", "rope_parameters"):
        rope = text.get(key)
        if not isinstance(rope, dict):
            continue
        rope = {k: v for k, v in rope.items() if not k.startswith("mrope_")}
        if rope.get("type") == "mrope" or rope.get("rope_type") == "mrope":  # the released configs' name for it
            rope = {k: v for k, v in rope.items() if k not in ("type", "rope_type")}
        text[key] = rope or None
    return text


def text_weight_name(name: str) -> str | None:
    """The language model's name of a Qwen2-VL folder's tensor, in either layout; None for the vision tower."""
    from lantern.app.models.family_gemma import text_weight_name as wrapped

    mapped = wrapped(name)  # model.language_model.* (transformers 5), lm_head.*
    if mapped is not None:
        return mapped
    return name if name.startswith(("model.layers.", "model.embed_tokens.", "model.norm.")) else None
