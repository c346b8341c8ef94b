"""Vision-language folders whose language model is a family Lantern serves, read as transformers' own config classes
read them: LLaVA 1.5 / 1.6 (llava_next) / OneVision and the Pixtral-12B folder (llava over Mistral), Aya Vision
(Command R7B's layers), Idefics3 / SmolVLM (Llama) and InternVL 3 / 3.5 in transformers' layout (internvl: Qwen2 /
Qwen3 / Llama) and Kimi K2.5 (kimi_k25: DeepSeek-V3, its text config's `kimi_k2` read as deepseek_v3 as transformers
does). The vision tower and projector are not loaded (an image in a request is refused, as for every text model).

transformers builds the wrapper's text config from its text_config (the text class's defaults for what it leaves
out: LLaVA 1.5's folders state six keys of Vicuna's config) and ties the head by the wrapper's tie_word_embeddings
(each class its own default: Aya Vision, InternVL and Kimi K2.5 tie unless told not to; LLaVA also ties where its
text config says so); the wrapper's token ids and quantization apply where the text config lacks them. Aya Vision's
logits are its language model's before Command R's logit_scale: transformers' wrapper never applies it.
"""

from __future__ import annotations

from typing import Any

from lantern.app.models.spec import UnsupportedModelError, wrapped_text_config

WRAPPERS = ("llava", "llava_next", "llava_onevision", "aya_vision", "idefics3", "smolvlm", "internvl", "kimi_k25")


def text_config_of(cfg: dict[str, Any]) -> dict[str, Any]:
    """The language model's config.json inside a vision-language one, as its transformers config class makes it."""
    from transformers import CONFIG_MAPPING

    wrapper = cfg.get("model_type")
    if wrapper not in WRAPPERS:
        raise UnsupportedModelError(f"family_vl_wrappers does not read model_type {wrapper!r}")
    raw = dict(cfg.get("text_config") or {})
    try:
        built = CONFIG_MAPPING[wrapper](
            **{k: v for k, v in cfg.items() if k not in ("model_type", "transformers_version")}
        )
    except (TypeError, ValueError, KeyError) as exc:
        raise UnsupportedModelError(f"{wrapper} config.json: transformers cannot read it ({exc})") from None
    text = built.get_text_config()
    filled = {k: v for k, v in text.to_dict().items() if k not in ("architectures", "transformers_version")}
    if wrapper == "aya_vision":  # (AyaVisionForConditionalGeneration's head never multiplies by it; vLLM's does)
        raw["logit_scale"] = 1.0
    out = wrapped_text_config(cfg, text.model_type, built.tie_word_embeddings, defaults={**filled, **raw})
    return {**out, **({"logit_scale": 1.0} if wrapper == "aya_vision" else {})}
