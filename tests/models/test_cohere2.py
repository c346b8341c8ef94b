"""Command R7B / Command A (cohere2): config.json read as transformers' Cohere2Config reads it (layer kinds,
window, logit scale, tied embeddings), refusals naming the key, and the LayerNorm against transformers'
own on both backends. Logits and greedy tokens run in tests/conformance (cohere2), a GGUF file in
test_gguf_families.py, an mlx_lm-made folder in test_mlx_moe_folders.py."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lantern.app.models.spec import ModelConfig, UnsupportedModelError

BASE = {"vocab_size": 400, "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4}


def ours(**extra) -> ModelConfig:
    return ModelConfig.from_hf({"model_type": "cohere2", "num_hidden_layers": 8, **BASE, **extra})


def hf(**extra):
    from transformers import Cohere2Config

    return Cohere2Config.from_dict({"model_type": "cohere2", "num_hidden_layers": 8, **BASE, **extra})


@pytest.mark.parametrize(
    "extra",
    [
        {},
        {"sliding_window_pattern": 2, "logit_scale": 0.125, "num_key_value_heads": 2, "layer_norm_eps": 1e-6},
        # both bases stated: rope_parameters' wins (transformers fills it from rope_theta only when absent)
        {"rope_theta": 1e4, "rope_parameters": {"rope_type": "default", "rope_theta": 5e4}},
    ],
)
def test_config_matches_transformers(extra):
    cfg, ref = ours(**extra), hf(**extra)
    windows = [ref.sliding_window if t == "sliding_attention" else None for t in ref.layer_types]
    assert cfg.layer_windows == windows
    assert list(cfg.rope_layers) == [t == "sliding_attention" for t in ref.layer_types]  # global layers: NoPE
    assert cfg.logits_divisor * ref.logit_scale == pytest.approx(1.0)
    assert cfg.rope_theta == ref.rope_parameters["rope_theta"]
    assert (cfg.tie_word_embeddings, cfg.rms_norm_eps, cfg.num_kv_heads) == (
        ref.tie_word_embeddings,
        ref.layer_norm_eps,
        ref.num_key_value_heads,
    )


@pytest.mark.parametrize(
    "extra,key",
    [
        ({"attention_bias": True}, "attention_bias"),
        ({"rotary_pct": 0.5}, "rotary_pct"),
        ({"logit_scale": 0}, "logit_scale"),
        ({"layer_types": ["sliding_attention"] * 3}, "layer_types"),
        ({"hidden_act": "gelu"}, "hidden_act"),
    ],
)
def test_unimplemented_keys_are_refused_by_name(extra, key):
    with pytest.raises(UnsupportedModelError, match=key):
        ours(**extra)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_layer_norm_matches_transformers(dtype):
    import mlx.core as mx
    from transformers.models.cohere2.modeling_cohere2 import Cohere2LayerNorm

    from lantern.backends.mlx.models.cohere import CohereLayerNorm as MlxNorm
    from lantern.backends.torch.models.cohere import CohereLayerNorm as TorchNorm

    torch.manual_seed(0)
    ref = Cohere2LayerNorm(64, eps=1e-5)
    with torch.no_grad():
        ref.weight.copy_(1 + 0.3 * torch.randn(64))
    x = (3 * torch.randn(5, 64) + 1).to(dtype)
    with torch.no_grad():
        want = ref.to(dtype)(x).float().numpy()
    ours_t = TorchNorm(64, 1e-5).to(dtype)
    ours_t.weight.data = ref.weight.detach().clone()
    with torch.no_grad():
        got_torch = ours_t(x)[0].float().numpy()
    ours_m = MlxNorm(64, 1e-5)
    ours_m.weight = mx.array(ref.weight.detach().float().numpy())
    mx_dtype = mx.float32 if dtype == torch.float32 else mx.bfloat16
    got_mlx = np.array(ours_m(mx.array(x.float().numpy()).astype(mx_dtype)).astype(mx.float32))
    tol = 1e-5 if dtype == torch.float32 else 1e-2  # bf16: one rounding of the same float32 result
    np.testing.assert_allclose(got_torch, want, atol=tol, rtol=tol)
    np.testing.assert_allclose(got_mlx, want, atol=tol, rtol=tol)


MOE = {"model_type": "cohere2_moe", "num_hidden_layers": 8, **BASE, "num_experts": 4, "num_experts_per_tok": 2}


@pytest.mark.parametrize(
    "extra",
    [
        {},
        {"first_k_dense_replace": 3, "prefix_dense_intermediate_size": 96, "num_shared_experts": 1},
        {"first_k_dense_replace": 2, "prefix_dense_sliding_window_pattern": 2, "expert_selection_fn": "sigmoid"},
        {"first_k_dense_replace": 1, "shared_expert_combination_strategy": "sum", "num_shared_experts": 2},
    ],
)
def test_moe_config_matches_transformers(extra):
    """Cohere2-MoE's layer kinds, dense prefix, the rope its dense global layers force, and its mixture."""
    from transformers import Cohere2MoeConfig

    cfg, ref = ModelConfig.from_hf({**MOE, **extra}), Cohere2MoeConfig(**{**MOE, **extra})
    assert cfg.layer_windows == [ref.sliding_window if t == "sliding_attention" else None for t in ref.layer_types]
    force = ref.prefix_dense_sliding_window_pattern == 1
    rotates = [
        t == "sliding_attention" or (force and m == "dense") for t, m in zip(ref.layer_types, ref.mlp_layer_types)
    ]
    assert list(cfg.rope_layers or [True] * 8) == rotates
    moe = cfg.moe
    assert [moe.is_sparse(i) for i in range(8)] == [m == "sparse" for m in ref.mlp_layer_types]
    assert cfg.intermediate_size == (ref.prefix_dense_intermediate_size or ref.intermediate_size)
    assert moe.intermediate_size == ref.intermediate_size and moe.scoring == ref.expert_selection_fn
    assert moe.shared_size == ref.num_shared_experts * ref.intermediate_size
    assert moe.shared_average == (ref.num_shared_experts > 0 and ref.shared_expert_combination_strategy == "average")


@pytest.mark.parametrize(
    ("extra", "key"),
    [
        ({"expert_selection_fn": "sparsemixer"}, "expert_selection_fn"),
        ({"shared_expert_combination_strategy": "gated"}, "shared_expert_combination_strategy"),
        ({"mlp_layer_types": ["dense"] * 3}, "mlp_layer_types"),
    ],
)
def test_moe_unimplemented_keys_are_refused_by_name(extra, key):
    with pytest.raises(UnsupportedModelError, match=key):
        ModelConfig.from_hf({**MOE, **extra})


def test_moe_rms_norms_and_prediction_layers(tmp_path, backend):
    """North-Mini-Code's layout: RMSNorms (rms_norm_eps), and num_nextn_predict_layers' layers stored after the
    stack, which are skipped: the folder with a copy of its last layer past the stack answers as transformers."""
    import json

    from safetensors.numpy import load_file, save_file

    from lantern.app.engine import LLM
    from tests.conformance.test_parity import PROMPT, hf_model
    from tests.fixtures.teacher_forcing import assert_matches_reference
    from tests.fixtures.tiny_models import build_model

    folder = build_model("cohere2_moe_rms", tmp_path / "north")
    ref = hf_model(str(folder))
    cfg = json.loads((folder / "config.json").read_text())
    assert ModelConfig.from_hf(cfg).rms_norm
    (folder / "config.json").write_text(json.dumps({**cfg, "num_nextn_predict_layers": 1}))
    tensors = load_file(str(folder / "model.safetensors"))
    last = cfg["num_hidden_layers"] - 1
    extra = {
        k.replace(f"layers.{last}.", f"layers.{last + 1}."): v for k, v in tensors.items() if f"layers.{last}." in k
    }
    save_file({**tensors, **extra}, str(folder / "model.safetensors"), metadata={"format": "pt"})
    llm = LLM(str(folder), backend=backend, dtype="float32", block_size=4, prefill_chunk_size=8, num_kv_blocks=64)
    try:
        assert_matches_reference(llm, ref, PROMPT, steps=4)
    finally:
        llm.engine.shutdown()


def test_moe_gguf_computes_what_transformers_computes(tmp_path, backend):
    """llama.cpp's cohere2moe GGUF of the North-Mini-Code-shaped folder: transformers on that folder."""
    from tests.fixtures.gguf_cohere2moe import convert_cohere2moe
    from tests.fixtures.teacher_forcing import assert_file_matches_folder
    from tests.fixtures.tiny_models import build_model

    src = build_model("cohere2_moe_rms", tmp_path / "hf")
    path = convert_cohere2moe(src, tmp_path / "tiny-cohere2moe.gguf")
    assert_file_matches_folder(path, src, backend, "cohere2moe")
