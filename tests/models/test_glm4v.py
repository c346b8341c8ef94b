"""GLM-4.1V / GLM-4.6V-Flash (glm4v, and glm46v: transformers 5's own type for GLM-4.6V-Flash) and GLM-4.5V /
GLM-4.6V (glm4v_moe) folders serve their language model.

Tiny random Glm4vForConditionalGeneration / Glm4vMoeForConditionalGeneration models (vision tower included) are
saved by transformers; the reference is transformers' own vision-language model run on text: Lantern's logits
through the paged cache must equal its logits at the prompt's end and at 8 teacher-forced greedy tokens, on both
backends. The text config classes' defaults (which differ from GLM-4's and GLM-4.5's) are what a config.json
that omits them means.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from lantern.app.engine import LLM
from lantern.app.models.spec import ModelConfig
from tests.fixtures.teacher_forcing import assert_matches_reference
from tests.fixtures.tiny_models import build_tokenizer, tiny_text_config

PROMPT = "Paged attention stores keys and values in blocks, while continuous batching"
VISION = dict(depth=1, hidden_size=32, intermediate_size=32, num_heads=2, out_hidden_size=64)
MROPE = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 1, 1], "partial_rotary_factor": 0.5}


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("LANTERN_CACHE", str(tmp_path / "cache"))


def _classes(moe: bool, kind: str = "glm4v"):
    import transformers

    if moe:
        return transformers.Glm4vMoeConfig, transformers.Glm4vMoeForConditionalGeneration
    if kind == "glm46v":  # GLM-4.6V-Flash's own wrapper type (transformers 5)
        return transformers.Glm46VConfig, transformers.Glm46VForConditionalGeneration
    return transformers.Glm4vConfig, transformers.Glm4vForConditionalGeneration


@pytest.fixture(scope="module", params=["glm4v", "glm46v", "glm4v_moe"])
def folder(request, tmp_path_factory) -> Path:
    return _build(tmp_path_factory.mktemp(request.param), moe=request.param == "glm4v_moe", kind=request.param)


def _build_glm4v(root: Path) -> Path:
    root.mkdir(parents=True)
    return _build(root, moe=False)


def _build(root: Path, moe: bool, kind: str = "glm4v") -> Path:
    text = {**tiny_text_config(build_tokenizer(root)), "intermediate_size": 96, "head_dim": 16}
    text["rope_parameters"] = MROPE
    text.pop("tie_word_embeddings")  # (the wrapper's key decides)
    if moe:  # layer 0 dense, layer 1 the routed experts beside a shared one
        text.update(n_routed_experts=6, num_experts_per_tok=2, moe_intermediate_size=32, first_k_dense_replace=1)
    config_cls, model_cls = _classes(moe, kind)
    torch.manual_seed(0)
    model = model_cls(config_cls(text_config=text, vision_config=VISION))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "language_model" in name and "norm" in name:
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            elif "language_model" in name and name.endswith(".bias"):
                p.copy_(0.2 * torch.randn_like(p))  # q/k/v biases (zeros at init)
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_(0.5 * torch.randn_like(b))
    model.save_pretrained(str(root))
    return root


def test_logits_match_transformers_vision_language_model(folder, backend):
    from transformers import AutoModelForImageTextToText

    ref = AutoModelForImageTextToText.from_pretrained(str(folder), dtype=torch.float32).eval()
    llm = LLM(str(folder), backend=backend, dtype="float32", block_size=4, prefill_chunk_size=8, num_kv_blocks=64)
    try:
        config = llm.engine.model_config
        assert config.architecture == ("glm4_moe" if "moe" in folder.name else "glm4") and config.attention_bias
        assert config.rope_scaling["partial_rotary_factor"] == 0.5
        assert_matches_reference(llm, ref, PROMPT, steps=8, atol=1e-4)
    finally:
        llm.engine.shutdown()


@pytest.mark.parametrize("moe", [False, True])
def test_omitted_keys_take_the_text_config_classes_defaults(moe):
    """A config.json stating only the shape: head_dim, the rotated width, eps, biases and context are what
    transformers builds (not GLM-4's / GLM-4.5's defaults)."""
    config_cls, model_cls = _classes(moe)
    text = {"hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2}
    text |= {"vocab_size": 300, "intermediate_size": 96}
    if moe:
        text |= {"n_routed_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32}
    ref = config_cls(text_config=text, vision_config=VISION)
    model = model_cls(ref).model.language_model
    cfg = ModelConfig.from_hf({"model_type": "glm4v_moe" if moe else "glm4v", "text_config": text})
    attn = model.layers[0].self_attn
    assert cfg.head_dim == attn.head_dim and cfg.attention_bias == (attn.q_proj.bias is not None)
    rotated = 2 * model.rotary_emb.inv_freq.numel()
    assert int(cfg.head_dim * (cfg.rope_scaling or {}).get("partial_rotary_factor", 1.0)) == rotated
    assert cfg.rms_norm_eps == ref.text_config.rms_norm_eps
    assert cfg.max_position_embeddings == ref.text_config.max_position_embeddings


def test_glm4v_gguf_as_llama_cpp_writes_it(tmp_path, backend):
    """llama.cpp's Glm4Model writes GLM-4.1V as arch glm4 with rope.dimension_sections, its q/k rows (and
    biases) reordered per head for M-RoPE: the rotated dims' even ones first, then the odd ones
    (conversion/glm.py normal_to_neox). Read back, the file computes what transformers' model computes."""
    import json
    import shutil

    from safetensors.torch import load_file, save_file
    from transformers import AutoModelForImageTextToText

    from tests.fixtures.gguf_families import convert_to_gguf

    src = _build_glm4v(tmp_path / "glm4v")
    cfg = json.loads((src / "config.json").read_text())
    text = shutil.copytree(src, tmp_path / "text", ignore=shutil.ignore_patterns("*.safetensors", "config.json"))
    (text / "config.json").write_text(
        json.dumps({**cfg["text_config"], "model_type": "glm4", "tie_word_embeddings": False})
    )
    heads, kv, head_dim = cfg["text_config"]["num_attention_heads"], cfg["text_config"]["num_key_value_heads"], 16
    rotary = int(head_dim * MROPE["partial_rotary_factor"])
    tensors = {}
    for name, t in load_file(src / "model.safetensors").items():
        if name.startswith("model.visual."):
            continue
        name = name.replace("model.language_model.", "model.")
        for proj, n in (("q_proj", heads), ("k_proj", kv)):
            if f".self_attn.{proj}." in name:  # the converter's reordering, per head
                rows = t.reshape(n, head_dim, -1)
                rot = rows[:, :rotary]
                t = torch.cat([rot[:, ::2], rot[:, 1::2], rows[:, rotary:]], dim=1).reshape(t.shape)
        tensors[name] = t.contiguous()
    save_file(tensors, text / "model.safetensors", metadata={"format": "pt"})
    path, _ = convert_to_gguf(text, tmp_path / "gguf")
    ref = AutoModelForImageTextToText.from_pretrained(str(src), dtype=torch.float32).eval()
    llm = LLM(str(path), backend=backend, dtype="float32", block_size=4, prefill_chunk_size=8, num_kv_blocks=64)
    try:
        assert llm.engine.model_config.architecture == "glm4"
        assert_matches_reference(llm, ref, PROMPT, steps=8, atol=1e-4)
    finally:
        llm.engine.shutdown()


def test_text_config_tying_and_keys_transformers_ignores():
    """A text_config that ties while the wrapper's key is off ties (Glm4vConfig forwards it); GLM-4.5V's
    text config has no use_qk_norm (its attention never norms q/k), so the key is ignored."""
    text = {"hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2}
    text |= {"vocab_size": 300, "intermediate_size": 96, "tie_word_embeddings": True}
    for kind, config_cls in (("glm4v", _classes(False)[0]), ("glm4v_moe", _classes(True)[0])):
        extra = {"n_routed_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32} if "moe" in kind else {}
        ref = config_cls(text_config={**text, **extra}, vision_config=VISION)
        cfg = ModelConfig.from_hf({"model_type": kind, "text_config": {**text, **extra, "use_qk_norm": True}})
        assert cfg.tie_word_embeddings is ref.tie_word_embeddings is True and not cfg.qk_norm
