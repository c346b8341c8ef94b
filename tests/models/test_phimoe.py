"""PhiMoE (Phi-3.5-MoE: "phimoe"): SparseMixer's routing on both backends against transformers' own function,
the released config read as PhimoeConfig reads it (LongRoPE with its mscale), refusals naming the key, and a
LongRoPE model's logits against transformers. The tiny variant's logits and greedy tokens (LayerNorms with biases,
biased attention and head) run in tests/conformance (phimoe)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lantern.app.engine import LLM
from lantern.app.models.spec import ModelConfig, UnsupportedModelError
from tests.conformance.test_parity import PROMPT, hf_model
from tests.fixtures.teacher_forcing import assert_matches_reference
from tests.fixtures.tiny_models import build_model


@pytest.mark.parametrize("eps", [0.01, 0.3, 2.0])
def test_sparsemixer_routes_as_transformers(eps):
    import mlx.core as mx
    from transformers.models.phimoe.modeling_phimoe import sparsemixer as reference

    from lantern.backends.mlx.moe import sparsemixer as mlx_sparsemixer
    from lantern.backends.torch.moe import sparsemixer as torch_sparsemixer

    logits = torch.randn(64, 8, generator=torch.Generator().manual_seed(0)) * 2
    logits[:8] = -logits[:8].abs()  # all negative rows too: the margin's denominator is |logit| there
    want_weights, want_ids = reference(logits, jitter_eps=eps, training=False, top_k=2)
    ids, weights = torch_sparsemixer(logits, eps)
    assert torch.equal(ids, want_ids)
    torch.testing.assert_close(weights, want_weights)
    ids, weights = mlx_sparsemixer(mx.array(logits.numpy()), eps)
    np.testing.assert_array_equal(np.array(ids), want_ids.numpy())
    np.testing.assert_allclose(np.array(weights), want_weights.numpy(), rtol=1e-5, atol=1e-6)
    if eps > 0.1:  # (not vacuous: several logits inside the margin, weights below one)
        assert (want_weights < 0.99).any()


LONGROPE = {
    "rope_type": "longrope",
    "short_factor": [1.0, 1.1, 1.3, 1.6, 2.0, 2.5, 3.0, 3.5],
    "long_factor": [1.0, 1.5, 2.5, 4.0, 6.0, 9.0, 12.0, 16.0],
    "short_mscale": 1.2,
    "long_mscale": 1.2,
    "original_max_position_embeddings": 4096,
    "rope_theta": 10000.0,
}
RELEASED = {  # Phi-3.5-MoE-instruct's keys, its sizes scaled down
    "model_type": "phimoe",
    "vocab_size": 400,
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "num_local_experts": 16,
    "num_experts_per_tok": 2,
    "router_jitter_noise": 0.01,
    "attention_bias": True,
    "lm_head_bias": True,
    "sliding_window": 131072,
    "max_position_embeddings": 131072,
    "original_max_position_embeddings": 4096,
    "rope_scaling": {k: v for k, v in LONGROPE.items() if k != "rope_type"} | {"type": "longrope"},
    "rope_theta": 10000.0,
}


def test_released_config_reads_as_transformers_does():
    from transformers import PhimoeConfig

    cfg = ModelConfig.from_hf(RELEASED)
    ref = PhimoeConfig(**{k: v for k, v in RELEASED.items() if k != "model_type"})
    assert (cfg.moe.num_experts, cfg.moe.top_k, cfg.moe.sparsemixer_eps) == (16, 2, ref.router_jitter_noise)
    assert cfg.attention_bias and cfg.lm_head_bias and cfg.moe.intermediate_size == ref.intermediate_size
    assert cfg.rope_scaling["rope_type"] == "longrope" and cfg.rope_scaling["attention_factor"] == 1.2
    assert cfg.rope_scaling["original_max_position_embeddings"] == 4096
    assert cfg.layer_windows == [131072, 131072] and cfg.rms_norm_eps == ref.rms_norm_eps


@pytest.mark.parametrize(
    ("change", "key"),
    [
        ({"num_experts_per_tok": 1}, "num_experts_per_tok"),
        ({"rope_scaling": {**RELEASED["rope_scaling"], "long_mscale": 1.5}}, "long_mscale"),
        ({"hidden_act": "gelu"}, "hidden_act"),
        ({"router_jitter_noise": -1}, "router_jitter_noise"),
    ],
)
def test_what_is_not_computed_is_refused_naming_the_key(change, key):
    with pytest.raises(UnsupportedModelError, match=key):
        ModelConfig.from_hf({**RELEASED, **change})


def test_longrope_model_matches_transformers(tmp_path, backend):
    """Within the original length (the short factors, as transformers takes them there), cos / sin scaled by the
    mscale: the logits equal transformers'."""
    rope = {**LONGROPE, "original_max_position_embeddings": 256}
    path = build_model("phimoe", tmp_path / "longrope", rope_parameters=rope, head_dim=16)
    llm = LLM(str(path), backend=backend, dtype="float32", block_size=4, prefill_chunk_size=8, num_kv_blocks=64)
    try:
        assert llm.engine.model_config.rope_scaling["attention_factor"] == 1.2
        assert_matches_reference(llm, hf_model(str(path)), PROMPT)
    finally:
        llm.engine.shutdown()


@pytest.mark.parametrize("longrope", [False, True])
def test_llama_cpp_gguf_computes_what_transformers_computes(tmp_path, backend, longrope):
    """llama.cpp's PhiMoeModel file (F32) of a folder whose router jitter is the released 0.01 and whose LongRoPE
    mscale is the converter's own factor (what the file can hold): Lantern on it computes what transformers computes
    on the folder -- LayerNorms and SparseMixer, not llama.cpp's RMS-norm / renormalised-softmax shortcut."""
    from tests.fixtures.gguf_phimoe import convert_phimoe, converter_attn_factor
    from tests.fixtures.teacher_forcing import assert_file_matches_folder

    over: dict = {"router_jitter_noise": 0.01}
    options = {"max_model_len": 256} if longrope else {}  # (the short factors, as transformers' phimoe takes them)
    if longrope:
        factor = converter_attn_factor(1024, 256)
        rope = {**LONGROPE, "original_max_position_embeddings": 256, "short_mscale": factor, "long_mscale": factor}
        over |= {"rope_parameters": rope, "head_dim": 16, "max_position_embeddings": 1024}
    src = build_model("phimoe", tmp_path / "hf", **over)
    path = convert_phimoe(src, tmp_path / "tiny-phimoe.gguf")
    assert_file_matches_folder(path, src, backend, "phimoe", **options)
