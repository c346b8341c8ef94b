"""Vision-language folders whose language model Lantern serves (app/models/family_vl_wrappers.py): LLaVA 1.5 / NeXT /
OneVision, Aya Vision, Idefics3, SmolVLM, InternVL and the GENERIC ones, each built by transformers' own class (a
tiny vision tower, the language model's weights a tiny random text model's) and saved by it; Lantern serves the
folder's language model on both backends with logits within 1e-4 of the wrapper's own text-only forward through the
paged cache."""

from __future__ import annotations

import json

import pytest

from lantern.app.engine import LLM
from lantern.app.models.spec import ModelConfig, UnsupportedModelError
from tests.conformance.test_parity import PROMPT
from tests.fixtures.teacher_forcing import assert_matches_reference
from tests.fixtures.tiny_models import build_model

_VISION = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2}
_SQUARE = {**_VISION, "image_size": 32, "patch_size": 16}
# wrapper -> (text variant, its vision config, other wrapper keys)
CASES = {
    "llava": ("llama2", {"model_type": "clip_vision_model", **_SQUARE}, {}),
    "llava_next": ("mistral", {"model_type": "clip_vision_model", **_SQUARE}, {"image_grid_pinpoints": [[32, 32]]}),
    "llava_onevision": (
        "qwen2",
        {"model_type": "siglip_vision_model", **_SQUARE},
        {"image_grid_pinpoints": [[32, 32]]},
    ),
    "aya_vision": ("cohere2", {"model_type": "siglip_vision_model", **_SQUARE}, {}),  # (tied by default)
    "idefics3": ("llama2", {"model_type": "idefics3_vision", **_SQUARE}, {}),
    "smolvlm": ("llama2", {"model_type": "smolvlm_vision", **_SQUARE}, {}),
    "internvl": (
        "qwen2",
        {"model_type": "internvl_vision", **_VISION, "image_size": [32, 32], "patch_size": [16, 16]},
        {},
    ),
    "internvl_untied": (
        "qwen2",
        {"model_type": "internvl_vision", **_VISION, "image_size": [32, 32], "patch_size": [16, 16]},
        {"tie_word_embeddings": False},
    ),
}


# Wrappers built with each sub-config (vision, audio, projector) of their class cut down to these sizes
GENERIC = {
    "cohere2_vision": "cohere2",  # (its head never applies Command R's logit_scale)
    "exaone4_5": "exaone4",
    "minicpmv4_6": "qwen3_5",
    "hyperclovax_vision_v2": "hyperclovax",
    "ovis2": "qwen2",
    "video_llama_3": "qwen2",
    "idefics2": "mistral",
    "deepseek_vl": "llama2",
    "vipllava": "llama2",
    "video_llava": "llama2",
    "llava_next_video": "llama2",
    "gemma4_unified": "gemma4_unified",
}
_TINY = {
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "image_size": 32,
    "patch_size": 16,
    "depth": 1,
    "embed_dim": 32,
    "num_heads": 2,
    "out_hidden_size": 64,
}


def _tiny_sub_configs(wrapper: str) -> dict:
    from transformers import CONFIG_MAPPING

    base, out = CONFIG_MAPPING[wrapper](), {}
    for name in getattr(base, "sub_configs", {}):
        sub = getattr(base, name) if name != "text_config" else None
        if sub is not None:
            d = sub.to_dict()
            out[name] = {**d, **{k: v for k, v in _TINY.items() if k in d}}
    return out


def _wrapper_folder(case: str, root):
    """(folder, the transformers model that saved it)."""
    import torch
    from safetensors.torch import load_file
    from transformers import CONFIG_MAPPING, AutoModelForImageTextToText

    if case in GENERIC:
        variant, subs, extra = GENERIC[case], _tiny_sub_configs(case), {}
    else:
        variant, vision, extra = CASES[case]
        subs = {"vision_config": vision}
    src = build_model(variant, root / f"{case}-text")
    text = {k: v for k, v in json.loads((src / "config.json").read_text()).items() if k != "architectures"}
    wrapper = case.removesuffix("_untied")
    config = CONFIG_MAPPING[wrapper](text_config=text, **subs, **extra)
    torch.manual_seed(0)
    model = AutoModelForImageTextToText.from_config(config).eval()
    weights = load_file(src / "model.safetensors")
    with torch.no_grad():
        model.get_decoder().load_state_dict(
            {k.removeprefix("model."): v for k, v in weights.items() if k != "lm_head.weight"}
        )
        if not model.config.tie_word_embeddings:
            model.lm_head.weight.copy_(weights.get("lm_head.weight", weights["model.embed_tokens.weight"]))
    folder = root / case
    model.save_pretrained(folder)
    for f in src.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens", "vocab", "merges")):
            (folder / f.name).write_bytes(f.read_bytes())
    return folder, model


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("vl_wrappers")
    return {case: _wrapper_folder(case, root) for case in [*CASES, *GENERIC]}


@pytest.mark.parametrize("case", [*CASES, *GENERIC])
def test_language_model_matches_the_wrapper(folders, case, backend):
    folder, model = folders[case]
    llm = LLM(str(folder), backend=backend, dtype="float32", block_size=4, prefill_chunk_size=8, num_kv_blocks=64)
    try:
        cfg = llm.engine.model_config
        assert cfg.multimodal_wrapper == case.removesuffix("_untied")
        assert cfg.tie_word_embeddings == model.config.tie_word_embeddings
        assert_matches_reference(llm, model, PROMPT)
    finally:
        llm.engine.shutdown()


def test_llava_1_5_text_config_takes_the_text_class_defaults():
    """llava-hf/llava-1.5-7b-hf states six keys of Vicuna's config; the rest are LlamaConfig's."""
    raw = {
        "model_type": "llava",
        "text_config": {
            "model_type": "llama",
            "max_position_embeddings": 4096,
            "rms_norm_eps": 1e-5,
            "vocab_size": 32064,
        },
        "vision_config": {"model_type": "clip_vision_model"},
    }
    cfg = ModelConfig.from_hf(raw)
    assert (cfg.hidden_size, cfg.num_layers, cfg.num_heads, cfg.intermediate_size) == (4096, 32, 32, 11008)
    assert (cfg.vocab_size, cfg.max_position_embeddings, cfg.tie_word_embeddings) == (32064, 4096, False)


def test_a_text_model_lantern_does_not_serve_is_refused_by_name():
    raw = {"model_type": "llava", "text_config": {"model_type": "mamba2_unknown"}}
    with pytest.raises(UnsupportedModelError):
        ModelConfig.from_hf(raw)


def test_kimi_vl_serves_its_deepseek_v3_language_model(tmp_path, backend):
    """Kimi-VL (remote code, no transformers class): its text_config is DeepSeek-V3's, its language model stored under
    language_model.* beside the vision tower and projector (skipped); the logits are transformers' DeepSeek-V3 on
    the same weights."""
    import numpy as np
    from safetensors.numpy import load_file, save_file

    from tests.conformance.test_parity import hf_model

    src = build_model("deepseek_v3", tmp_path / "text")
    text = {k: v for k, v in json.loads((src / "config.json").read_text()).items() if k != "architectures"}
    folder = tmp_path / "kimi_vl"
    folder.mkdir()
    config = {"model_type": "kimi_vl", "architectures": ["KimiVLForConditionalGeneration"], "text_config": text}
    config |= {"vision_config": {"model_type": "moonvit", "hidden_size": 32}, "media_placeholder_token_id": 7}
    (folder / "config.json").write_text(json.dumps(config))
    weights = {f"language_model.{k}": v for k, v in load_file(str(src / "model.safetensors")).items()}
    weights["vision_tower.encoder.blocks.0.wqkv.weight"] = np.ones((96, 32), np.float32)
    weights["multi_modal_projector.linear_1.weight"] = np.ones((64, 32), np.float32)
    save_file(weights, str(folder / "model.safetensors"), metadata={"format": "pt"})
    for f in src.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens", "vocab", "merges", "generation")):
            (folder / f.name).write_bytes(f.read_bytes())
    llm = LLM(str(folder), backend=backend, dtype="float32", block_size=4, prefill_chunk_size=8, num_kv_blocks=64)
    try:
        cfg = llm.engine.model_config
        assert cfg.multimodal_wrapper == "kimi_vl" and cfg.mla is not None and not cfg.tie_word_embeddings
        assert_matches_reference(llm, hf_model(str(src)), PROMPT)
    finally:
        llm.engine.shutdown()


def test_kimi_vl_with_another_language_model_is_refused_by_name():
    with pytest.raises(UnsupportedModelError, match=r"text_config\.model_type"):
        ModelConfig.from_hf({"model_type": "kimi_vl", "text_config": {"model_type": "qwen2"}})
