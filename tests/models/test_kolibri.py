"""Aleph Alpha's Kolibri-1 (`kolibri1`): config.json read as Kolibri1Config reads it, refusals naming the key, its
released tensor names (GLM-4's sandwich norms, the router's expert_bias) reaching AFMoE's layer, and the default
unnormalised router weights answering as transformers on both backends. The tiny folder's logits and greedy tokens
(norm_topk_prob on) run in tests/conformance (kolibri1)."""

from __future__ import annotations

import pytest

from lantern.app.engine import LLM
from lantern.app.models.family_kolibri import checkpoint_name
from lantern.app.models.spec import ModelConfig, UnsupportedModelError
from tests.conformance.test_parity import PROMPT, hf_model
from tests.fixtures.teacher_forcing import assert_matches_reference
from tests.fixtures.tiny_models import build_model

BASE = {"model_type": "kolibri1", "vocab_size": 400, "hidden_size": 64, "num_attention_heads": 4, "head_dim": 16}


NO_WINDOW = {"num_hidden_layers": 3, "sliding_window": None, "layer_types": ["full_attention"] * 3}


@pytest.mark.parametrize("extra", [{"num_hidden_layers": 10}, NO_WINDOW])
def test_config_matches_transformers(extra):
    from transformers import Kolibri1Config

    raw = {**BASE, **extra}
    cfg, ref = ModelConfig.from_hf(raw), Kolibri1Config(**raw)
    sliding = [t == "sliding_attention" for t in ref.layer_types]
    if ref.sliding_window is None:  # no window: every layer full and rotating (EXAONE 4's rule)
        assert cfg.layer_windows is None and cfg.rope_layers is None
    else:
        assert cfg.layer_windows == [ref.sliding_window if s else None for s in sliding]
        assert cfg.rope_layers == tuple(sliding)
    moe = cfg.moe
    assert (moe.num_experts, moe.top_k, moe.intermediate_size, moe.shared_size, moe.norm_topk_prob) == (
        ref.num_experts,
        ref.num_experts_per_tok,
        ref.moe_intermediate_size,
        ref.shared_expert_intermediate_size,
        ref.norm_topk_prob,
    )
    assert moe.choose_on_logits and moe.correction_bias and moe.routed_scaling_factor == 1.0
    assert all(moe.is_sparse(i) for i in range(cfg.num_layers)) and cfg.qk_norm and cfg.attn_output_gate is None


@pytest.mark.parametrize(
    ("extra", "key"),
    [
        ({"hidden_act": "gelu"}, "hidden_act"),
        ({"layer_types": ["full_attention"]}, "layer_types"),
        ({"num_experts_per_tok": 500}, "num_experts_per_tok"),
        ({"sliding_window": 0}, "sliding_window"),
        ({"sliding_window": None}, "sliding_window"),  # (sliding layers without one: Kolibri1Config refuses it too)
    ],
)
def test_unimplemented_keys_are_refused_by_name(extra, key):
    with pytest.raises(UnsupportedModelError, match=key):
        ModelConfig.from_hf({**BASE, "num_hidden_layers": 5, **extra})


def test_released_names_swap_into_afmoes():
    """post_attention_layernorm is the pre-MLP norm in GLM-4's layer: renamed in the same pass that names the
    post-attention norm post_attention_layernorm."""
    layer = "model.layers.2."
    assert checkpoint_name(layer + "post_attention_layernorm.weight") == layer + "pre_feedforward_layernorm.weight"
    assert checkpoint_name(layer + "post_attn_norm.weight") == layer + "post_attention_layernorm.weight"
    assert checkpoint_name(layer + "post_ffn_norm.weight") == layer + "post_feedforward_layernorm.weight"
    assert checkpoint_name(layer + "moe.router.expert_bias") == layer + "mlp.gate.e_score_correction_bias"


@pytest.mark.parametrize("backend", ["torch", "mlx"])
def test_unnormalised_router_weights(tmp_path, backend):
    """norm_topk_prob off (Kolibri1Config's default): the chosen experts weighted by their plain sigmoids."""
    folder = build_model("kolibri1", tmp_path / "m", norm_topk_prob=False)
    llm = LLM(str(folder), backend=backend, dtype="float32", block_size=4, prefill_chunk_size=8, num_kv_blocks=64)
    assert not llm.engine.model_config.moe.norm_topk_prob
    assert_matches_reference(llm, hf_model(folder), PROMPT)


def test_attention_bias_is_ignored_as_transformers_does():
    """Kolibri1Attention builds its projections without biases whatever attention_bias says."""
    assert not ModelConfig.from_hf({**BASE, "num_hidden_layers": 5, "attention_bias": True}).attention_bias
