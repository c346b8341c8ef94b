"""Gemma 3n (text): configs read as transformers' Gemma3nTextConfig reads them (K/V sharing, widths, windows,
rope bases, the sparse gate's cutoffs), refusals by key, the multimodal folder, the KV pool and --isq.
Logit parity through the paged cache on both backends is in tests/conformance (variant gemma3n)."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest

from lantern.app.engine import LLM
from lantern.app.models.spec import ModelConfig, UnsupportedModelError
from tests.fixtures.teacher_forcing import assert_same_greedy

# The released E2B config's keys (30 layers, 4 sliding to 1 full, the last 10 sharing K/V, the first 10
# sparse, rope bases by the older keys), with small widths.
E2B_LIKE = {
    "model_type": "gemma3n_text",
    "hidden_size": 64,
    "intermediate_size": [96] * 30,
    "num_hidden_layers": 30,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "head_dim": 256,
    "num_kv_shared_layers": 10,
    "sliding_window": 512,
    "layer_types": (["sliding_attention"] * 4 + ["full_attention"]) * 6,
    "activation_sparsity_pattern": [0.95] * 10 + [0.0] * 20,
    "hidden_size_per_layer_input": 16,
    "vocab_size": 1000,
    "vocab_size_per_layer_input": 900,
    "rope_theta": 1_000_000.0,
    "rope_local_base_freq": 10_000.0,
    "rope_scaling": None,
    "query_pre_attn_scalar": 256,
    "altup_num_inputs": 4,
    "laurel_rank": 8,
}


def _transformers_view(cfg: dict) -> dict:
    import torch
    from transformers import Gemma3nTextConfig

    tc = Gemma3nTextConfig(**{k: v for k, v in cfg.items() if k != "model_type"})
    modes = tc.kv_sharing_modes
    sources = [
        i if modes[i] != "reuse" else max(j for j in range(i) if modes[j] == "store" and tc.layer_types[j] == t)
        for i, t in enumerate(tc.layer_types)
    ]
    normal = torch.distributions.normal.Normal(0, 1)
    cutoffs = [
        float(normal.icdf(torch.tensor(p, dtype=torch.float32))) if p > 0 else None
        for p in tc.activation_sparsity_pattern
    ]
    return {
        "sources": sources,
        "widths": list(tc.intermediate_size),
        "windows": [tc.sliding_window if t == "sliding_attention" else None for t in tc.layer_types],
        "cutoffs": cutoffs,
        "thetas": (
            tc.rope_parameters["sliding_attention"]["rope_theta"],
            tc.rope_parameters["full_attention"]["rope_theta"],
        ),
    }


@pytest.mark.parametrize(
    "cfg",
    [E2B_LIKE, {k: v for k, v in E2B_LIKE.items() if k not in ("layer_types", "activation_sparsity_pattern")}],
    ids=["released", "defaults"],
)
def test_config_matches_transformers(cfg):
    ours = ModelConfig.from_hf(cfg)
    ref = _transformers_view(cfg)
    g4, g3n = ours.gemma4, ours.gemma3n
    assert list(g4.kv_sources) == ref["sources"]
    assert ours.num_kv_layers == 20 and len(set(ours.kv_shapes)) == 1
    assert list(g4.mlp_widths) == ref["widths"]
    assert ours.layer_windows == ref["windows"]
    # transformers' Phi^-1 in float32 (torch's erfinv: within an ulp of the exact value rounded, which Lantern takes)
    assert [c is None for c in g3n.sparsity_cutoffs] == [c is None for c in ref["cutoffs"]]
    np.testing.assert_allclose([c or 0 for c in g3n.sparsity_cutoffs], [c or 0 for c in ref["cutoffs"]], rtol=2e-7)
    assert (ours.rope_theta, g4.global_rope_theta) == ref["thetas"]
    assert (g3n.altup_inputs, g3n.laurel_rank, g4.ple_dim, g4.ple_vocab) == (4, 8, 16, 900)
    assert ours.attn_scale == 1.0 and ours.final_softcap == 30.0 and ours.tie_word_embeddings


@pytest.mark.parametrize(
    "extra,key",
    [
        ({"hidden_activation": "gelu"}, "hidden_activation"),
        ({"attention_bias": True}, "attention_bias"),
        ({"rope_scaling": {"rope_type": "linear", "factor": 2.0}}, "rope_scaling"),
        ({"rope_parameters": {"full_attention": {"rope_type": "yarn", "factor": 2.0}}}, "rope_type"),
        ({"activation_sparsity_pattern": [0.95] * 3}, "activation_sparsity_pattern"),
        ({"layer_types": ["sliding_attention"] * 3}, "layer_types"),
        ({"num_kv_shared_layers": 30}, "num_kv_shared_layers"),
        ({"hidden_size_per_layer_input": 0}, "hidden_size_per_layer_input"),
        ({"altup_active_idx": 4}, "altup_active_idx"),
    ],
)
def test_unimplemented_keys_are_refused_by_name(extra, key):
    with pytest.raises(UnsupportedModelError, match=key):
        ModelConfig.from_hf({**E2B_LIKE, **extra})


def test_multimodal_folder_serves_its_language_model(tiny_model_dir, tmp_path, backend):
    """A Gemma3nForConditionalGeneration folder (text_config, model.language_model.* names, vision and audio
    towers beside, and the K/V projections of the sharing layers as released checkpoints carry them) gives
    the text model's tokens."""
    import torch

    from tests.fixtures.tiny_models import vision_language_folder

    src = Path(tiny_model_dir("gemma3n"))
    wrapper = {
        "model_type": "gemma3n",
        "architectures": ["Gemma3nForConditionalGeneration"],
        "vision_config": {"hidden_size": 8},
        "audio_config": {"hidden_size": 8},
    }
    extra = {
        "model.vision_tower.timm_model.conv_stem.conv.weight": torch.ones(3, 3),
        "model.embed_vision.embedding_projection.weight": torch.ones(4, 4),
        "model.audio_tower.conformer.0.attention.attn.q_proj.weight": torch.ones(2, 2),
        "model.embed_audio.embedding.weight": torch.ones(2, 2),
    }
    for layer in (4, 5):  # sharing layers: transformers ignores their K/V projections
        extra[f"model.language_model.layers.{layer}.self_attn.k_proj.weight"] = torch.full((32, 64), 9.0)
        extra[f"model.language_model.layers.{layer}.self_attn.v_norm.weight"] = torch.full((16,), 9.0)
    assert_same_greedy(vision_language_folder(src, tmp_path, wrapper, extra), src, backend)


def test_kv_pool_holds_the_writing_layers_only(tiny_model_dir, backend):
    llm = LLM(tiny_model_dir("gemma3n"), backend=backend, dtype="float32", block_size=4, num_kv_blocks=16)
    runner = llm.engine.backend
    shapes = [tuple(k.shape[1:]) for k in runner.pool.k]
    assert shapes == [(2, 16)] * 4  # layers 4 and 5 read layers 2 and 3
    assert runner.kv_bytes_per_block(4) == 4 * 2 * 2 * 16 * 4 * 4  # layers, K and V, heads, dim, slots, float32


def test_isq_q8_quantizes_the_projections_and_keeps_altup_float(tiny_model_dir, backend, caplog):
    """--isq q8 takes the embedding tables, LAuReL and the AltUp projections; AltUp's router and coefficients
    stay float (routers); the logits stay as near the float model's as running it in bfloat16 alone allows."""
    from tests.models.quant_logits import logits_error

    path = tiny_model_dir("gemma3n")
    err = logits_error(path, path, backend, quantization="q8")
    bf16 = logits_error(path, path, backend, dtype="bfloat16")
    assert err <= max(0.15, 5 * bf16), f"{backend}: {err:.4f} of the logits' spread (bfloat16: {bf16:.4f})"
    with caplog.at_level(logging.DEBUG, logger="lantern.app.models.isq"):
        llm = LLM(path, backend=backend, dtype="float32", num_kv_blocks=16, quantization="q8")
    assert "18 router matrices kept in float" in caplog.text  # 3 per layer
    assert "were expected" not in caplog.text  # isq_candidates knows every matrix the stream saw
    model = llm.engine.backend.model.model
    layer = model.layers[0]
    quantized = [model.embed_tokens, model.altup_projections[0], layer.laurel.linear_left, layer.per_layer_input_gate]
    assert all("Linear" != type(m).__name__ != "Embedding" for m in quantized), [type(m).__name__ for m in quantized]
    assert type(layer.altup.modality_router).__name__ == "Linear"


@pytest.fixture(scope="module")
def mlx_lm_folder(tmp_path_factory):
    """A tiny gemma3n folder quantized by mlx_lm (4-bit g32; what mlx-community publishes): the multimodal
    layout mlx_lm reads (text_config with the released rope keys, K/V projections on the sharing layers)."""
    pytest.importorskip("mlx_lm")
    import json

    import torch
    from mlx_lm.utils import load, quantize_model, save

    from tests.fixtures.tiny_models import build_model, vision_language_folder

    out = tmp_path_factory.mktemp("gemma3n-mlx-lm")
    src = build_model("gemma3n", out / "float", hidden_size=128, intermediate_size=[256] * 6)
    rope = json.loads((src / "config.json").read_text())["rope_parameters"]
    text = {
        "rope_theta": rope["full_attention"]["rope_theta"],
        "rope_local_base_freq": rope["sliding_attention"]["rope_theta"],
        "altup_coef_clip": 120.0,
    }
    torch.manual_seed(1)
    extra = {}
    for layer in (4, 5):
        stem = f"model.language_model.layers.{layer}.self_attn"
        extra |= {f"{stem}.{p}_proj.weight": torch.randn(32, 128) for p in ("k", "v")}
        extra[f"{stem}.k_norm.weight"] = torch.randn(16)
    wrapped = vision_language_folder(src, out / "wrapped", {"model_type": "gemma3n", "text_config": text}, extra)
    model, tokenizer, config = load(str(wrapped), return_config=True, lazy=True)
    model, config = quantize_model(model, config, 32, 4, mode="affine")
    save(out / "mlx", str(wrapped), model, tokenizer, config)
    return out / "mlx"


def test_4bit_mlx_lm_folder_computes_what_mlx_lm_computes(mlx_lm_folder, backend):
    """mlx_lm's layout (model.language_model.*, the tables, AltUp's and LAuReL's projections and the router
    quantized) against mlx_lm's own forward."""
    from tests.fixtures.teacher_forcing import mlx_lm_error

    llm = LLM(
        str(mlx_lm_folder), backend=backend, dtype="float32", block_size=4, prefill_chunk_size=8, num_kv_blocks=64
    )
    worst, scale = mlx_lm_error(llm, mlx_lm_folder, "Paged attention stores keys and values in blocks", [5, 17, 42, 99])
    print(f"gemma3n {backend}: worst |diff| {worst:.2e} of logits up to {scale:.1f}")
    assert worst < (1e-3 if backend == "mlx" else 4e-2) * scale, (worst, scale)
