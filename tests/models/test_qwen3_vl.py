"""Qwen3-VL (dense and MoE) folders and GGUFs serve their language model, on both backends.

Tiny random Qwen3VLForConditionalGeneration / Qwen3VLMoeForConditionalGeneration models (vision tower
included) are saved by transformers itself; the MoE one also as Qwen ships its checkpoints, with the
fused experts transposed ([E, hidden, 2 * inner], [E, inner, hidden]), and as an older config (rope_theta
beside a rope_scaling that holds mrope_section). The reference is transformers' own vision-language model
run on text: Lantern's logits through the paged cache must equal its logits at the prompt's end and at 8
teacher-forced greedy tokens. The GGUFs are written as llama.cpp's converter writes them (arches qwen3vl /
qwen3vlmoe: Qwen3's tensors and keys plus n_deepstack_layers and rope.dimension_sections).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from lantern.app.engine import LLM
from lantern.app.models.spec import ModelConfig, UnsupportedModelError
from tests.fixtures.teacher_forcing import assert_matches_reference
from tests.fixtures.tiny_models import build_tokenizer

PROMPT = "Paged attention stores keys and values in blocks, while continuous batching"
MROPE = {"rope_type": "default", "rope_theta": 5000000.0, "mrope_section": [2, 3, 3], "mrope_interleaved": True}


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("LANTERN_CACHE", str(tmp_path / "cache"))


def _text_config(vocab: int, moe: bool) -> dict:
    cfg = dict(
        vocab_size=vocab,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=256,
        rms_norm_eps=1e-5,
        initializer_range=0.2,
        rope_parameters=MROPE,
    )
    if moe:  # every layer a mixture (llama.cpp's qwen3vlmoe has no dense layer); 2 * inner (80) != hidden (64)
        cfg.update(num_experts=6, num_experts_per_tok=2, moe_intermediate_size=40)
    return cfg


def _build(root: Path, moe: bool) -> Path:
    """A tiny Qwen3-VL folder as transformers saves it (its layout of the fused experts)."""
    from transformers import (
        Qwen3VLConfig,
        Qwen3VLForConditionalGeneration,
        Qwen3VLMoeConfig,
        Qwen3VLMoeForConditionalGeneration,
    )

    tokenizer = build_tokenizer(root)
    vision = dict(depth=1, hidden_size=32, intermediate_size=32, num_heads=2, out_hidden_size=64)
    config_cls, model_cls = (Qwen3VLConfig, Qwen3VLForConditionalGeneration)
    if moe:
        config_cls, model_cls = (Qwen3VLMoeConfig, Qwen3VLMoeForConditionalGeneration)
    text = {**_text_config(len(tokenizer), moe), "eos_token_id": tokenizer.eos_token_id}
    config = config_cls(text_config=text, vision_config=vision, tie_word_embeddings=False)
    torch.manual_seed(1 if moe else 0)
    model = model_cls(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "language_model" in name and "norm" in name:
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            elif name.endswith(("experts.gate_up_proj", "experts.down_proj", "mlp.gate.weight")):
                p.copy_(0.2 * torch.randn_like(p))  # fused experts and routers: not drawn from initializer_range
    model.save_pretrained(str(root))
    return root


def _as_qwen_ships(src: Path, out: Path, old_rope: bool = False) -> Path:
    """src with its fused experts transposed to Qwen's stored layout; old_rope: the rope as the first
    configs state it (rope_theta beside rope_scaling with the multimodal keys)."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(src, out)
    tensors = load_file(src / "model.safetensors")
    for name in list(tensors):
        if name.endswith(("experts.gate_up_proj", "experts.down_proj")):
            tensors[name] = tensors[name].transpose(1, 2).contiguous()
    save_file(tensors, out / "model.safetensors", metadata={"format": "pt"})
    if old_rope:
        cfg = json.loads((src / "config.json").read_text())
        rope = cfg["text_config"].pop("rope_parameters")
        cfg["text_config"]["rope_theta"] = rope.pop("rope_theta")
        cfg["text_config"]["rope_scaling"] = rope
        (out / "config.json").write_text(json.dumps(cfg))
    return out


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("qwen3-vl")
    dense = _build(root / "dense", moe=False)
    moe = _build(root / "moe", moe=True)
    return {
        "dense": dense,
        "moe": moe,
        "moe-shipped": _as_qwen_ships(moe, root / "moe-shipped"),
        "moe-old-rope": _as_qwen_ships(moe, root / "moe-old-rope", old_rope=True),
    }


def _gguf(folder: Path, out_dir: Path) -> Path:
    """The folder's language model as an F32 GGUF the way llama.cpp's Qwen3VLTextModel /
    Qwen3VLMoeTextModel convert it (via a per-expert text folder for the fixture's converter)."""
    from safetensors.torch import load_file, save_file

    from tests.fixtures.gguf_families import convert_to_gguf

    cfg = json.loads((folder / "config.json").read_text())
    text = out_dir / "text"
    text.mkdir(parents=True)
    for f in folder.iterdir():
        if f.suffix != ".safetensors" and f.name != "config.json":
            shutil.copy(f, text / f.name)
    flat = {**cfg["text_config"], "tie_word_embeddings": cfg["tie_word_embeddings"]}
    flat["deepstack_layers"] = len(cfg["vision_config"]["deepstack_visual_indexes"])
    (text / "config.json").write_text(json.dumps(flat))
    tensors = {}
    for name, t in load_file(folder / "model.safetensors").items():
        if not name.startswith(("model.language_model.", "lm_head.")):
            continue  # the vision tower goes to the mmproj file
        name = name.replace("model.language_model.", "model.")
        if name.endswith("experts.gate_up_proj"):  # [E, 2I, H]
            inner = t.shape[1] // 2
            for e in range(t.shape[0]):
                tensors[name.replace("gate_up_proj", f"{e}.gate_proj.weight")] = t[e, :inner]
                tensors[name.replace("gate_up_proj", f"{e}.up_proj.weight")] = t[e, inner:]
        elif name.endswith("experts.down_proj"):  # [E, H, I]
            for e in range(t.shape[0]):
                tensors[name.replace("down_proj", f"{e}.down_proj.weight")] = t[e]
        else:
            tensors[name] = t
    save_file({k: v.contiguous() for k, v in tensors.items()}, text / "model.safetensors")
    path, _ = convert_to_gguf(text, out_dir)
    return path


@pytest.fixture(scope="module")
def ggufs(folders, tmp_path_factory):
    root = tmp_path_factory.mktemp("qwen3-vl-gguf")
    return {kind: _gguf(folders[kind], root / kind) for kind in ("dense", "moe")}


def _reference(folder: Path):
    from transformers import AutoModelForImageTextToText

    return AutoModelForImageTextToText.from_pretrained(str(folder), dtype=torch.float32).eval()


@pytest.mark.parametrize("source", ["dense", "moe", "moe-shipped", "moe-old-rope", "gguf-dense", "gguf-moe"])
def test_logits_match_transformers_vision_language_model(source, backend, folders, ggufs):
    kind = source.removeprefix("gguf-")
    path = ggufs[kind] if source.startswith("gguf") else folders[source]
    ref = _reference(folders["moe" if kind.startswith("moe") else "dense"])
    llm = LLM(str(path), backend=backend, dtype="float32", block_size=4, prefill_chunk_size=8, num_kv_blocks=64)
    try:
        config = llm.engine.model_config
        assert config.qk_norm and config.rope_scaling is None and config.rope_theta == 5000000.0
        assert (config.moe is not None) == kind.startswith("moe")
        if config.moe is not None:
            assert config.moe.norm_topk_prob and config.moe.num_experts == 6 and config.moe.top_k == 2
        assert_matches_reference(llm, ref, PROMPT, steps=8, atol=1e-4)
    finally:
        llm.engine.shutdown()


def test_the_experts_layout_matters(folders):
    """Not vacuous: the stored layout read untransposed would be other weights (shapes differ here)."""
    from safetensors.torch import load_file

    saved = load_file(folders["moe"] / "model.safetensors")["model.language_model.layers.1.mlp.experts.gate_up_proj"]
    shipped = load_file(folders["moe-shipped"] / "model.safetensors")[
        "model.language_model.layers.1.mlp.experts.gate_up_proj"
    ]
    assert saved.shape == (6, 80, 64) and shipped.shape == (6, 64, 80)
    assert torch.equal(shipped.transpose(1, 2), saved)


def test_configs_are_qwen3s():
    """The wrapper's config is Qwen3's (or Qwen3-MoE's, always renormalised) with the multimodal keys dropped."""
    wrapper = {"model_type": "qwen3_vl", "text_config": {"model_type": "qwen3_vl_text", **_text_config(300, False)}}
    cfg = ModelConfig.from_hf(wrapper)
    assert (cfg.architecture, cfg.multimodal_wrapper, cfg.family) == ("qwen3_vl_text", "qwen3_vl", "llama")
    assert cfg.qk_norm and cfg.rope_scaling is None and not cfg.tie_word_embeddings
    bare = {k: v for k, v in _text_config(300, False).items() if k != "rope_parameters"}
    default = ModelConfig.from_hf({"model_type": "qwen3_vl", "text_config": bare})
    assert default.rope_theta == 500000.0  # Qwen3VLTextConfig's default_theta
    moe = ModelConfig.from_hf({"model_type": "qwen3_vl_moe", "text_config": _text_config(300, True)})
    assert moe.architecture == "qwen3_vl_moe_text" and moe.moe.norm_topk_prob and moe.moe.num_experts == 6


@pytest.mark.parametrize(
    "extra, key",
    [
        ({"attention_bias": True}, "attention_bias"),
        ({"rope_parameters": {**MROPE, "rope_type": "longrope"}}, "rope_type"),
    ],
)
def test_unimplemented_keys_are_refused_by_name(extra, key):
    moe = "num_experts" in extra
    text = {**_text_config(300, False), **extra}
    with pytest.raises(UnsupportedModelError, match=key):
        ModelConfig.from_hf({"model_type": "qwen3_vl_moe" if moe else "qwen3_vl", "text_config": text})


def test_a_template_kept_for_the_processor_is_the_models(folders, tmp_path):
    """Qwen3-VL folders may keep the chat template only in the processor's chat_template.json, which
    tokenizers do not read: the model's template is that one."""
    folder = shutil.copytree(folders["dense"], tmp_path / "processor-template")
    template = (folder / "chat_template.jinja").read_text()
    (folder / "chat_template.jinja").unlink()
    (folder / "chat_template.json").write_text(json.dumps({"chat_template": template}))
    llm = LLM(str(folder), backend="torch", dtype="float32", num_kv_blocks=16)
    try:
        assert llm.engine.chat_template == template
        text = llm.engine.apply_chat_template([{"role": "user", "content": "hi"}])
        assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    finally:
        llm.engine.shutdown()


@pytest.mark.parametrize("kind", ["dense", "moe-shipped"])
def test_mlx_lm_4bit_folder_computes_what_mlx_lm_computes(kind, backend, folders, tmp_path):
    """mlx_lm's own conversion of a Qwen3-VL folder (mlx-community's *-4bit kind: language_model.model.* names,
    the MoE's experts split from Qwen's stored layout into switch_mlp): Lantern computes what mlx_lm computes."""
    pytest.importorskip("mlx_lm")
    from mlx_lm.utils import load, quantize_model, save

    from tests.fixtures.teacher_forcing import mlx_lm_error

    src = shutil.copytree(folders[kind], tmp_path / "released")
    cfg = json.loads((src / "config.json").read_text())
    text = cfg["text_config"]  # the keys Qwen's released configs state, which mlx_lm reads
    rope = text.pop("rope_parameters")
    text.update(rope_theta=rope.pop("rope_theta"), rope_scaling=rope, tie_word_embeddings=False)
    if "num_local_experts" in text:
        text.update(num_experts=text["num_local_experts"], norm_topk_prob=True)
    (src / "config.json").write_text(json.dumps(cfg))
    model, tokenizer, config = load(str(src), return_config=True, lazy=True)
    model, config = quantize_model(model, config, 32, 4, mode="affine")
    out = tmp_path / "mlx-4bit"
    save(out, str(src), model, tokenizer, config)
    llm = LLM(str(out), backend=backend, dtype="float32", block_size=4, prefill_chunk_size=8, num_kv_blocks=64)
    try:
        assert llm.engine.model_config.multimodal_wrapper is not None
        worst, scale = mlx_lm_error(llm, out, PROMPT, [5, 17, 42, 99, 7, 3])
    finally:
        llm.engine.shutdown()
    assert worst < (2e-3 if backend == "mlx" else 2e-2) * scale  # torch: activations in bf16 in its int4 kernel
