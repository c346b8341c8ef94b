"""Qwen2-VL and Qwen2.5-VL folders and GGUFs serve their language model, on both backends.

Tiny random Qwen2VLForConditionalGeneration / Qwen2_5_VLForConditionalGeneration models (vision tower included)
are saved by transformers 5 (a nested text_config; tensors named model.layers.* beside visual.*, as Qwen released
them) and, for Qwen2.5-VL, also as Qwen released the config (flat, its rope_scaling of type "mrope") and as
transformers 4.52 to 4.57 saved the tensors (model.language_model.* beside model.visual.*). The GGUF is written
as llama.cpp's Qwen2VLModel converts it (arch qwen2vl: Qwen2's tensors and keys plus rope.dimension_sections).
The reference is transformers' own vision-language model run on text: Lantern's logits through the paged cache
must equal its logits at the prompt's end and at 8 teacher-forced greedy tokens.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from lantern.app.engine import LLM
from lantern.app.models.spec import ModelConfig
from tests.fixtures.teacher_forcing import assert_matches_reference
from tests.fixtures.tiny_models import build_tokenizer, tiny_text_config

PROMPT = "Paged attention stores keys and values in blocks, while continuous batching"
MROPE = {"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": [2, 3, 3]}


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("LANTERN_CACHE", str(tmp_path / "cache"))


def _build(root: Path, kind: str) -> Path:
    from transformers import (
        Qwen2_5_VLConfig,
        Qwen2_5_VLForConditionalGeneration,
        Qwen2VLConfig,
        Qwen2VLForConditionalGeneration,
    )

    text = {**tiny_text_config(build_tokenizer(root)), "intermediate_size": 96, "rope_parameters": MROPE}
    text.pop("tie_word_embeddings")  # (the wrapper's key decides)
    if kind == "qwen2_5_vl":
        vision = dict(depth=1, hidden_size=32, intermediate_size=32, num_heads=2, out_hidden_size=64)
        vision["fullatt_block_indexes"] = [0]
        config = Qwen2_5_VLConfig(text_config=text, vision_config=vision, tie_word_embeddings=False)
        model_cls = Qwen2_5_VLForConditionalGeneration
    else:
        vision = dict(depth=1, embed_dim=32, hidden_size=64, num_heads=2)
        config = Qwen2VLConfig(text_config=text, vision_config=vision, tie_word_embeddings=False)
        model_cls = Qwen2VLForConditionalGeneration
    torch.manual_seed(0)
    model = model_cls(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "language_model" in name and "norm" in name:
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            elif "language_model" in name and name.endswith(".bias"):
                p.copy_(0.2 * torch.randn_like(p))  # the q/k/v biases (zeros at init)
    model.save_pretrained(str(root))
    return root


def _nested_names(src: Path, out: Path) -> Path:
    """src with its tensors named as transformers 4.52 to 4.57 saved them: model.language_model.*, model.visual.*."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(src, out)
    tensors = {}
    for name, t in load_file(src / "model.safetensors").items():
        if name.startswith("model."):
            name = name.replace("model.", "model.language_model.", 1)
        elif name.startswith("visual."):
            name = "model." + name
        tensors[name] = t
    save_file(tensors, out / "model.safetensors", metadata={"format": "pt"})
    return out


def _as_released(src: Path, out: Path) -> Path:
    """src with the config as Qwen released Qwen2.5-VL's: flat, rope_scaling of type "mrope" beside rope_theta."""
    shutil.copytree(src, out)
    cfg = json.loads((src / "config.json").read_text())
    text = cfg.pop("text_config")
    rope = dict(text.pop("rope_parameters"))
    flat = {**text, **cfg, "model_type": "qwen2_5_vl", "rope_theta": rope.pop("rope_theta")}
    flat["rope_scaling"] = {"type": "mrope", "mrope_section": rope["mrope_section"]}
    (out / "config.json").write_text(json.dumps(flat))
    return out


def _gguf(folder: Path, out_dir: Path) -> Path:
    """The folder's language model as an F32 GGUF the way llama.cpp's Qwen2VLModel converts it."""
    from safetensors.torch import load_file, save_file

    from tests.fixtures.gguf_families import convert_to_gguf

    cfg = json.loads((folder / "config.json").read_text())
    text = shutil.copytree(folder, out_dir / "text", ignore=shutil.ignore_patterns("*.safetensors", "config.json"))
    flat = {**cfg["text_config"], "model_type": "qwen2_vl_text", "tie_word_embeddings": False}
    (text / "config.json").write_text(json.dumps(flat))
    tensors = {n: t for n, t in load_file(folder / "model.safetensors").items() if not n.startswith("visual.")}
    save_file(tensors, text / "model.safetensors", metadata={"format": "pt"})
    path, _ = convert_to_gguf(text, out_dir)
    return path


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    root = tmp_path_factory.mktemp("qwen2-vl")
    v25, v2 = _build(root / "qwen2_5_vl", "qwen2_5_vl"), _build(root / "qwen2_vl", "qwen2_vl")
    return {
        "qwen2_5_vl": (v25, v25),
        "qwen2_5_vl-released": (_as_released(v25, root / "released"), v25),
        "qwen2_5_vl-4.5x": (_nested_names(v25, root / "nested"), v25),
        "qwen2_vl": (v2, v2),
        "gguf": (_gguf(v25, root / "gguf"), v25),
    }


@pytest.mark.parametrize("source", ["qwen2_5_vl", "qwen2_5_vl-released", "qwen2_5_vl-4.5x", "qwen2_vl", "gguf"])
def test_logits_match_transformers_vision_language_model(source, backend, sources):
    from transformers import AutoModelForImageTextToText

    path, ref_path = sources[source]
    ref = AutoModelForImageTextToText.from_pretrained(str(ref_path), dtype=torch.float32).eval()
    llm = LLM(str(path), backend=backend, dtype="float32", block_size=4, prefill_chunk_size=8, num_kv_blocks=64)
    try:
        config = llm.engine.model_config
        assert config.architecture == "qwen2" and config.attention_bias and config.rope_scaling is None
        assert config.rope_theta == 1000000.0 and config.layer_windows is None
        assert_matches_reference(llm, ref, PROMPT, steps=8, atol=1e-4)
    finally:
        llm.engine.shutdown()


def test_the_released_flat_config_reads_as_the_nested_one(sources):
    """The flat layout's config (text keys at the top, rope_scaling of type mrope) is the nested one's."""
    nested = ModelConfig.from_hf(json.loads((sources["qwen2_5_vl"][0] / "config.json").read_text()))
    flat = ModelConfig.from_hf(json.loads((sources["qwen2_5_vl-released"][0] / "config.json").read_text()))
    assert flat == nested and nested.multimodal_wrapper == "qwen2_5_vl"
    tied = json.loads((sources["qwen2_5_vl-released"][0] / "config.json").read_text())
    assert ModelConfig.from_hf({**tied, "tie_word_embeddings": True}).tie_word_embeddings  # Qwen2.5-VL-3B
