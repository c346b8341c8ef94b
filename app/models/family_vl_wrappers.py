"""Vision-language folders whose language model is a family Lantern serves, read as transformers' own config classes
read them (spec.VL_WRAPPERS): LLaVA 1.5 / 1.6 (llava_next) / OneVision / NeXT-Video, Video-LLaVA, ViP-LLaVA and the
Pixtral-12B folder (llava over Mistral), Aya Vision and Command A Vision (Command R7B's layers), Idefics2 / Idefics3
/ SmolVLM, InternVL 3 / 3.5 in transformers' layout, Kimi K2.5 (DeepSeek-V3; its text config's `kimi_k2` read as
deepseek_v3 as transformers does), EXAONE 4.5 (EXAONE 4), MiniCPM-V 4.6 / 4.7 (Qwen3.5), HyperCLOVA X SEED Vision,
Ovis2, VideoLLaMA3, DeepSeek-VL (hybrid too), Llama 3.2 Vision (mllama: family_mllama) and Kimi-VL (remote code:
kimi_vl_text_config). The vision tower and projector are not loaded (an image in a request is refused, as for every
text model).

transformers builds the wrapper's text config from its text_config (the text class's defaults for what it leaves
out: LLaVA 1.5's folders state six keys of Vicuna's config) and ties the head by the wrapper's tie_word_embeddings
(each class its own default: Aya Vision, InternVL and Kimi K2.5 tie unless told not to; LLaVA also ties where its
text config says so); the wrapper's token ids and quantization apply where the text config lacks them. Aya Vision's
and Command A Vision's logits are their language model's before Command R's logit_scale: transformers' wrappers
never apply it.
"""

from __future__ import annotations

from typing import Any

from lantern.app.models.spec import VL_WRAPPERS, UnsupportedModelError, wrapped_text_config


def text_config_of(cfg: dict[str, Any]) -> dict[str, Any]:
    """The language model's config.json inside a vision-language one, as its transformers config class makes it."""
    from transformers import CONFIG_MAPPING

    wrapper = cfg.get("model_type")
    if wrapper not in VL_WRAPPERS:
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
    tie = getattr(built, "tie_word_embeddings", False)  # (MllamaConfig has none: its model never ties the head)
    out = wrapped_text_config(cfg, text.model_type, tie, defaults={**filled, **raw})
    if wrapper in ("aya_vision", "cohere2_vision"):  # (their heads never multiply by it; vLLM's do)
        out["logit_scale"] = 1.0
    return out


def kimi_vl_text_config(cfg: dict[str, Any]) -> dict[str, Any]:
    """Kimi-VL's language model (moonshotai/Kimi-VL-A3B-Instruct / -Thinking: remote code, which transformers has no
    class for): its text_config is DeepSeek-V3's config (Moonlight's 16B-A3B), read as transformers' DeepseekV3Config
    reads it; untied unless it says so (the remote DeepseekV3Config's default)."""
    text = cfg.get("text_config") or {}
    kind = text.get("model_type", "deepseek_v3")
    if kind != "deepseek_v3":
        raise UnsupportedModelError(f"kimi_vl text_config.model_type={kind!r} is not implemented (deepseek_v3)")
    return wrapped_text_config(cfg, "deepseek_v3", bool(text.get("tie_word_embeddings", False)))
