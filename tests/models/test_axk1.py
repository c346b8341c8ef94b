"""A.X-K1 (model_type axk1): config.json read as transformers' AXK1Config reads it (DeepSeek-V3's latent attention
and router, 192 experts past one dense layer, an RMSNorm on the mixture's output), refusals naming the key, and its
checkpoint's decoder-level post_mlp_layernorm: a sparse layer's held under the mixture, a dense layer's unused as in
transformers. (The tiny folder's logits and greedy tokens against transformers: tests/conformance, variant axk1.)"""

from __future__ import annotations

import pytest

from lantern.app.models.errors import UnsupportedModelError
from lantern.app.models.spec import ModelConfig

BASE = {"model_type": "axk1", "vocab_size": 400, "hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4}


@pytest.mark.parametrize("extra", [{}, {"first_k_dense_replace": 2}, {"mlp_layer_types": ["dense", "sparse"] * 2}])
def test_config_matches_transformers(extra):
    from transformers import AXK1Config

    cfg, ref = ModelConfig.from_hf({**BASE, **extra}), AXK1Config(**{**BASE, **extra})
    moe = cfg.moe
    assert [moe.is_sparse(i) for i in range(4)] == [kind == "sparse" for kind in ref.mlp_layer_types]
    assert (moe.num_experts, moe.top_k, moe.n_group, moe.topk_group) == (
        ref.n_routed_experts,
        ref.num_experts_per_tok,
        ref.n_group,
        ref.topk_group,
    )
    assert moe.post_norm and moe.routed_scaling_factor == ref.routed_scaling_factor
    assert cfg.mla.q_lora_rank == ref.q_lora_rank and cfg.mla.kv_lora_rank == ref.kv_lora_rank


def test_attention_without_q_lora_is_refused_by_name():
    with pytest.raises(UnsupportedModelError, match="q_lora_rank"):
        ModelConfig.from_hf({**BASE, "q_lora_rank": None})


def test_a_dense_layers_stored_norm_is_unused(tmp_path, backend):
    """A post_mlp_layernorm stored on the dense layer too (transformers ignores it): the folder still answers as
    transformers on it."""
    import numpy as np
    from safetensors.numpy import load_file, save_file

    from lantern.app.engine import LLM
    from tests.conformance.test_parity import PROMPT, hf_model
    from tests.fixtures.teacher_forcing import assert_matches_reference
    from tests.fixtures.tiny_models import build_model

    folder = build_model("axk1", tmp_path / "axk1")
    ref = hf_model(str(folder))
    tensors = load_file(str(folder / "model.safetensors"))
    extra = {"model.layers.0.post_mlp_layernorm.weight": np.full(64, 3.0, np.float32)}
    save_file({**tensors, **extra}, str(folder / "model.safetensors"), metadata={"format": "pt"})
    llm = LLM(str(folder), backend=backend, dtype="float32", block_size=4, prefill_chunk_size=8, num_kv_blocks=64)
    try:
        assert_matches_reference(llm, ref, PROMPT, steps=4)
    finally:
        llm.engine.shutdown()
