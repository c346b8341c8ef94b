"""Gemma 4 (text): configs read as transformers' Gemma4TextConfig reads them (layer shapes, K/V sharing,
MLP widths, windows), refusals by key, the vision-language folder, mlx_lm's folders, and a KV pool whose
layers differ in shape sized by what it allocates. Logit parity through the paged cache is in
tests/conformance (variants gemma4, gemma4_moe)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from lantern.app.engine import LLM
from lantern.app.models.spec import ModelConfig, UnsupportedModelError
from tests.fixtures.teacher_forcing import assert_matches_reference, assert_same_greedy, mlx_lm_error

PROMPT = "Paged attention stores keys and values in blocks, while continuous batching"

# Shapes as the released configs state them (global_head_dim / num_global_key_value_heads, layer
# patterns), with small widths: the structure is what is compared.
E2B_LIKE = {
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 35,
    "num_attention_heads": 8,
    "num_key_value_heads": 1,
    "head_dim": 256,
    "global_head_dim": 512,
    "num_kv_shared_layers": 20,
    "sliding_window": 512,
    "layer_types": (["sliding_attention"] * 4 + ["full_attention"]) * 7,
    "use_double_wide_mlp": True,
    "hidden_size_per_layer_input": 16,
    "vocab_size": 1000,
    "vocab_size_per_layer_input": 1000,
}
A4B_LIKE = {
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 12,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 256,
    "global_head_dim": 512,
    "attention_k_eq_v": True,
    "num_global_key_value_heads": 2,
    "enable_moe_block": True,
    "num_experts": 128,
    "top_k_experts": 8,
    "moe_intermediate_size": 32,
    "hidden_size_per_layer_input": 0,
    "sliding_window": 1024,
    "vocab_size": 1000,
}


def _transformers_view(cfg: dict) -> dict:
    """What Gemma4TextConfig and its modules make of cfg: per layer (kv heads, head dim), the layer each
    KV-sharing layer reads, MLP widths and windows."""
    from transformers import Gemma4TextConfig
    from transformers.models.gemma4.modeling_gemma4 import Gemma4TextMLP

    tc = Gemma4TextConfig(**{k: v for k, v in cfg.items() if k != "model_type"})
    modes = tc.kv_sharing_modes
    shapes, sources = [], []
    for i, t in enumerate(tc.layer_types):
        layer = tc.per_layer_config[i]
        if modes[i] != "reuse":
            shapes.append((layer.num_key_value_heads, layer.head_dim))
            sources.append(i)
        else:  # transformers: the last earlier layer of the type that stores its K/V ("store")
            sources.append(max(j for j in range(i) if modes[j] == "store" and tc.layer_types[j] == t))
    widths = [Gemma4TextMLP(tc, i).intermediate_size for i in range(tc.num_hidden_layers)]
    windows = [tc.sliding_window if t == "sliding_attention" else None for t in tc.layer_types]
    return {"shapes": shapes, "sources": sources, "widths": widths, "windows": windows}


@pytest.mark.parametrize("cfg", [E2B_LIKE, A4B_LIKE], ids=["e2b_like", "a4b_like"])
def test_config_matches_transformers(cfg):
    ours = ModelConfig.from_hf({"model_type": "gemma4_text", **cfg})
    ref = _transformers_view(cfg)
    g4 = ours.gemma4
    assert list(ours.kv_shapes) == ref["shapes"]
    assert list(g4.kv_sources) == ref["sources"]
    assert list(g4.mlp_widths) == ref["widths"]
    assert (ours.layer_windows or [None] * ours.num_layers) == ref["windows"]
    assert ours.num_kv_layers == len(ref["shapes"])
    assert (ours.moe is not None) == bool(cfg.get("enable_moe_block"))


def test_saved_per_layer_config_reads_as_the_released_keys(tiny_model_dir):
    """transformers 5 saves per_layer_config instead of global_head_dim: both forms give one model."""
    saved = json.loads((Path(tiny_model_dir("gemma4")) / "config.json").read_text())
    assert "per_layer_config" in saved and "global_head_dim" not in saved
    released = {k: v for k, v in saved.items() if k != "per_layer_config"}
    released["global_head_dim"] = next(iter(saved["per_layer_config"].values()))["head_dim"]
    a, b = ModelConfig.from_hf(saved), ModelConfig.from_hf(released)
    assert a.kv_shapes == b.kv_shapes and a.gemma4 == b.gemma4
    assert len(set(a.kv_shapes)) == 2  # two layer shapes in the pool
    assert list(a.kv_shapes) == _transformers_view(saved)["shapes"]


def test_proportional_rope_turns_the_leading_pairs_only():
    import torch
    from transformers import Gemma4TextConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    cfg = {**A4B_LIKE, "rope_parameters": None}
    ours = ModelConfig.from_hf({"model_type": "gemma4_text", **cfg}).gemma4.global_inv_freq()
    tc = Gemma4TextConfig(**cfg)
    ref, _ = ROPE_INIT_FUNCTIONS["proportional"](tc, torch.device("cpu"), layer_type="full_attention")
    np.testing.assert_allclose(ours, ref.numpy(), rtol=1e-6, atol=0)  # float32 powers: an ulp apart at most
    assert (ours[64:] == 0).all() and (ours[:64] > 0).all()  # 0.25 of 256 pairs turn


@pytest.mark.parametrize(
    "extra,key",
    [
        ({"use_bidirectional_attention": "all"}, "use_bidirectional_attention"),
        ({"hidden_activation": "gelu"}, "hidden_activation"),
        ({"attention_bias": True}, "attention_bias"),
        ({"rope_parameters": {"full_attention": {"rope_type": "yarn", "factor": 2.0}}}, "rope_type"),
        ({"rope_parameters": {"rope_theta": 1e6}}, "rope_parameters.rope_theta"),
        ({"per_layer_config": {"1": {"sliding_window": 4}}}, "per_layer_config"),
        ({"num_kv_shared_layers": 3}, "num_kv_shared_layers"),
        ({"enable_moe_block": True, "num_experts": 4, "top_k_experts": 8, "moe_intermediate_size": 8}, "top_k"),
    ],
)
def test_unimplemented_keys_are_refused_by_name(extra, key):
    cfg = {"model_type": "gemma4_text", **A4B_LIKE, "num_hidden_layers": 3, "enable_moe_block": False}
    cfg["layer_types"] = ["sliding_attention", "sliding_attention", "full_attention"]
    with pytest.raises(UnsupportedModelError, match=key):
        ModelConfig.from_hf({**cfg, **extra})


def test_vision_language_folder_serves_its_language_model(tiny_model_dir, tmp_path, backend):
    """A Gemma4ForConditionalGeneration folder (text_config, model.language_model.* names, vision and audio
    towers beside, and K/V projections of the sharing layers as released checkpoints carry them) gives the
    text model's tokens."""
    import torch

    from tests.fixtures.tiny_models import vision_language_folder

    src = Path(tiny_model_dir("gemma4"))
    wrapper = {
        "model_type": "gemma4",
        "architectures": ["Gemma4ForConditionalGeneration"],
        "vision_config": {"hidden_size": 8},
        "tie_word_embeddings": True,
    }
    extra = {
        "model.vision_tower.encoder.layers.0.mlp.weight": torch.ones(3, 3),
        "model.embed_vision.embedding_projection.weight": torch.ones(4, 4),
        "model.audio_tower.conv.weight": torch.ones(2, 2),
    }
    for layer in (4, 5):  # sharing layers: transformers ignores their K/V projections
        extra[f"model.language_model.layers.{layer}.self_attn.k_proj.weight"] = torch.full((32, 64), 9.0)
        extra[f"model.language_model.layers.{layer}.self_attn.k_norm.weight"] = torch.full((32,), 9.0)
    assert_same_greedy(vision_language_folder(src, tmp_path, wrapper, extra), src, backend)


def test_kv_pool_holds_each_layer_in_its_shape(tiny_model_dir, backend):
    """The bytes the engine sizes the pool by are the bytes the pool allocates per block, layer by layer
    in two shapes; the sharing layers take none."""
    llm = LLM(tiny_model_dir("gemma4"), backend=backend, dtype="float32", block_size=4, num_kv_blocks=16)
    runner = llm.engine.backend
    pool = runner.pool
    shapes = [tuple(k.shape[1:]) for k in pool.k]
    assert shapes == [(2, 16), (2, 32), (2, 16), (2, 32)]  # layers 4 and 5 read layers 2 and 3
    assert [tuple(v.shape[1:]) for v in pool.v] == shapes
    per_block = sum(2 * h * d for h, d in shapes) * 4 * 4  # K and V, 4 slots a block, float32
    assert runner.kv_bytes_per_block(4) == per_block


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    from tests.fixtures.mlx_lm_folders import convert

    made: dict[tuple[str, str | None], tuple[Path, Path]] = {}

    def get(variant: str, mode: str | None) -> tuple[Path, Path]:
        if (variant, mode) not in made:
            made[variant, mode] = convert(variant, tmp_path_factory.mktemp(f"{variant}-{mode}"), mode=mode)
        return made[variant, mode]

    return get


def test_float_mlx_lm_folder_equals_the_original_model(converted, backend):
    import torch
    from transformers import AutoModelForCausalLM

    pytest.importorskip("mlx_lm")
    folder, _ = converted("gemma4", None)
    original = folder.parent / "gemma4-float"
    llm = LLM(str(folder), backend=backend, dtype="float32", block_size=4, prefill_chunk_size=8, num_kv_blocks=64)
    ref = AutoModelForCausalLM.from_pretrained(original, dtype=torch.float32).eval()
    assert_matches_reference(llm, ref, PROMPT, steps=8, atol=1e-4)


@pytest.mark.parametrize("variant", ["gemma4", "gemma4_moe"])
def test_4bit_mlx_lm_folder_computes_what_mlx_lm_computes(converted, variant, backend):
    """mlx-community's layout (per-layer embeddings and experts quantized too, experts in switch_glu)."""
    pytest.importorskip("mlx_lm")
    folder, _ = converted(variant, "affine")
    llm = LLM(str(folder), backend=backend, dtype="float32", block_size=4, prefill_chunk_size=8, num_kv_blocks=64)
    worst, scale = mlx_lm_error(llm, folder, PROMPT, [5, 17, 42, 99, 7, 3])
    print(f"{variant} {backend}: worst |diff| {worst:.2e} of logits up to {scale:.1f}")
    assert worst < (1e-3 if backend == "mlx" else 4e-2) * scale  # torch: activations in bf16 in its int4 kernel


@pytest.mark.parametrize("variant", ["gemma4", "gemma4_moe"])
def test_isq_q8_keeps_every_table_quantized_and_close(tiny_model_dir, variant, backend):
    """--isq q8 quantizes the per-layer embedding table too (looked up by id, not multiplied) and the experts;
    the logits stay as near the float model's as this tiny model allows: its logits spread little (soft-capped,
    small weights), so the bound is set by what running it in bfloat16 alone costs (as quant_logits.tolerance)."""
    from tests.models.quant_logits import logits_error

    path = tiny_model_dir(variant)
    err = logits_error(path, path, backend, quantization="q8")
    bf16 = logits_error(path, path, backend, dtype="bfloat16")
    assert err <= max(0.15, 5 * bf16), f"{variant} {backend}: {err:.4f} of the logits' spread (bfloat16: {bf16:.4f})"
    llm = LLM(tiny_model_dir(variant), backend=backend, dtype="float32", num_kv_blocks=16, quantization="q8")
    model = llm.engine.backend.model.model
    tables = [model.embed_tokens] + ([model.embed_tokens_per_layer] if "embed_tokens_per_layer" in dir(model) else [])
    assert all(type(t).__name__ not in ("Embedding",) for t in tables), [type(t).__name__ for t in tables]


def test_turn_end_and_tool_hand_over_stop_generation(tiny_model_dir, tmp_path):
    """Gemma 4's `<turn|>` and `<|tool_response>` end a reply whatever the folder's eos ids say (llama.cpp
    takes them into its end-of-generation set by text too)."""
    import shutil

    from transformers import AutoTokenizer

    from lantern.app.models.loader import resolve_model

    folder = tmp_path / "gemma4"
    shutil.copytree(tiny_model_dir("gemma4"), folder)
    tok = AutoTokenizer.from_pretrained(str(folder))
    tok.add_special_tokens({"additional_special_tokens": ["<turn|>", "<|tool_response>", "<|turn>"]})
    tok.save_pretrained(str(folder))
    loaded = resolve_model(str(folder))
    ends = [tok.convert_tokens_to_ids(t) for t in ("<turn|>", "<|tool_response>")]
    assert set(ends) <= set(loaded.eos_token_ids)
    assert tok.convert_tokens_to_ids("<|turn>") not in loaded.eos_token_ids
    assert tok.eos_token_id in loaded.eos_token_ids
