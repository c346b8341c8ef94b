"""LFM3: config.json read as transformers' Lfm3Config / Lfm3ForCausalLM read it (the default layer pattern and ropes,
legacy layer names, each type's rope -- the full layers' proportional one over the whole head --, windows, the
gate, the sandwich norms, the width LFM2's keys no longer change), refusals naming the key; logits of variants the
conformance one (the "lfm3" variant in tests/conformance: logits, greedy tokens, cross-backend) leaves out."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from lantern.app.engine import LLM
from lantern.app.models.spec import ModelConfig, UnsupportedModelError
from tests.fixtures.teacher_forcing import assert_matches_reference

SMALL = {"vocab_size": 400, "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16}
SMALL |= {"intermediate_size": 96, "pad_token_id": 0}
PROMPT = "Paged attention stores keys and values in blocks, while continuous batching"
_ROPES = {
    "full_attention": {"rope_type": "proportional", "rope_theta": 5e4, "partial_rotary_factor": 0.25, "factor": 2.0},
    "sliding_attention": {"rope_type": "default", "rope_theta": 100.0, "partial_rotary_factor": 0.5},  # (ignored)
}


@pytest.mark.parametrize(
    "extra",
    [
        {"num_hidden_layers": 9},  # Lfm3Config's layer pattern and ropes
        {"num_hidden_layers": 4, "layer_types": ["conv", "attention", "sliding_attention", "full_attention"]},
        {"num_hidden_layers": 5, "rope_parameters": _ROPES, "sliding_window": 3, "conv_L_cache": 4, "conv_bias": True},
        {  # bases from a top-level rope_theta (default_theta without it), the factor from a top-level one
            "num_hidden_layers": 5,
            "rope_theta": 5e5,
            "partial_rotary_factor": 0.75,
            "rope_parameters": {"full_attention": {"rope_type": "proportional"}, "sliding_attention": {}},
        },
        {  # a plain full-layer rope ignores partial_rotary_factor; only the present types' ropes are read
            "num_hidden_layers": 3,
            "layer_types": ["conv", "full_attention", "conv"],
            "rope_parameters": {"full_attention": {"rope_theta": 1e4, "partial_rotary_factor": 0.5}},
        },
        {"num_hidden_layers": 5, "use_attention_gate": False, "use_sandwich_norm": False, "attention_bias": True},
        {"num_hidden_layers": 5, "tie_word_embeddings": False, "rms_norm_eps": 1e-3, "norm_eps": 1e-4},
        # LFM2's width keys and full_attn_idxs, which Lfm3Config does not read
        {"num_hidden_layers": 5, "block_ff_dim": 1000, "block_auto_adjust_ff_dim": True, "full_attn_idxs": [0]},
    ],
)
def test_config_matches_transformers(extra):
    from transformers import AutoConfig, Lfm3ForCausalLM

    from lantern.app.models.family_lfm3 import full_inv_freq
    from lantern.backends.torch.layers import rope_tables
    from lantern.backends.torch.models.lfm2 import CausalLM

    ref = AutoConfig.for_model("lfm3", **SMALL, **extra)
    cfg = ModelConfig.from_hf({"model_type": "lfm3", **SMALL, **extra})
    model = Lfm3ForCausalLM(ref).eval()
    layers = model.model.layers
    assert [t == "conv" for t in ref.layer_types] == list(cfg.short_conv.conv_layers)
    assert (cfg.short_conv.kernel, cfg.short_conv.bias) == (ref.conv_L_cache, ref.conv_bias)
    attn = [layer.self_attn for layer in layers if layer.is_attention_layer]
    assert cfg.num_kv_layers == len(attn)
    windows = [layer.self_attn.sliding_window if layer.is_attention_layer else None for layer in layers]
    assert (cfg.layer_windows or [None] * len(layers)) == windows
    assert cfg.attn_output_gate == ("sigmoid_head" if attn[0].g_proj is not None else None)
    assert cfg.attention_bias == (attn[0].o_proj.bias is not None) == (attn[0].q_proj.bias is not None)
    assert cfg.sandwich_norms == (not isinstance(layers[0].post_ffn_norm, torch.nn.Identity))
    assert cfg.intermediate_size == layers[0].feed_forward.w1.out_features
    assert cfg.rms_norm_eps == ref.norm_eps == attn[0].q_norm.variance_epsilon
    assert cfg.tie_word_embeddings == ref.tie_word_embeddings and cfg.qk_norm
    # each type's cos / sin at positions 0..63: the torch runner's table (full), the torch model's (sliding)
    rotary, positions = model.model.rotary_emb, torch.arange(64)
    x = torch.zeros(1, 64, ref.hidden_size)
    if "full_attention" in ref.layer_types:
        cos, sin = rotary(x, positions[None], layer_type="full_attention")
        ours = rope_tables(cfg, 64, torch.device("cpu"))
        torch.testing.assert_close(ours, (cos[0], sin[0]), rtol=0, atol=1e-6)
        inv = full_inv_freq(cfg)  # (the MLX model file's)
        if inv is not None:
            np.testing.assert_allclose(inv, rotary.full_attention_inv_freq.numpy(), rtol=1e-6)
    if "sliding_attention" in ref.layer_types:
        cos, sin = rotary(x, positions[None], layer_type="sliding_attention")
        step = SimpleNamespace(cos=torch.zeros(1), sin=torch.zeros(1), positions=positions)
        torch.testing.assert_close(CausalLM(cfg)._local_rope(step), (cos[0], sin[0]), rtol=0, atol=0)
    else:
        assert cfg.local_rope_theta is None


@pytest.mark.parametrize(
    "extra,key",
    [
        ({"layer_types": ["conv", "linear_attention", "conv", "full_attention"]}, "layer_types"),
        ({"layer_types": ["conv", "full_attention"]}, "layer_types"),  # not one per layer
        ({"layer_types": ["conv"] * 4}, "layer_types"),  # no attention layer
        ({"conv_L_cache": 1}, "conv_L_cache"),
        ({"layer_types": ["conv", "sliding_attention"] * 2, "sliding_window": None}, "sliding_window"),
        ({"rope_parameters": {"rope_type": "default", "rope_theta": 1e4}}, "rope_parameters.rope_t"),  # flat
        ({"rope_parameters": {"sliding_attention": {"rope_type": "default"}}}, "rope_parameters.full_attention"),
        (
            {
                "layer_types": ["conv", "sliding_attention", "conv", "full_attention"],
                "rope_parameters": {**_ROPES, "sliding_attention": {"rope_type": "linear", "factor": 2.0}},
            },
            "rope_parameters.sliding_attention.rope_type",
        ),
        (
            {"rope_parameters": {**_ROPES, "full_attention": {"rope_type": "yarn", "factor": 2.0}}},
            "rope_parameters.full_attention.rope_type",
        ),
        (
            {"rope_parameters": {**_ROPES, "full_attention": {"rope_type": "proportional", "factor": 0}}},
            "rope_parameters.full_attention.factor",
        ),
    ],
)
def test_unimplemented_keys_are_refused_by_name(extra, key):
    cfg = {"model_type": "lfm3", **SMALL, "num_hidden_layers": 4, **extra}
    with pytest.raises(UnsupportedModelError, match=key):
        ModelConfig.from_hf(cfg)


def test_a_config_of_only_its_keys_is_lfm3_1_7b():
    """Lfm3Config's defaults where config.json omits a key (LFM3-1.7B's shape)."""
    cfg = ModelConfig.from_hf({"model_type": "lfm3"})
    assert (cfg.hidden_size, cfg.num_layers, cfg.head_dim, cfg.intermediate_size, cfg.vocab_size) == (
        2048,
        24,
        128,
        7680,
        128_000,
    )
    assert cfg.layer_windows.count(256) == 5 and cfg.num_kv_layers == 11 and cfg.short_conv.kernel == 7
    assert (cfg.rope_theta, cfg.local_rope_theta, cfg.rope_scaling["partial_rotary_factor"]) == (1e6, 1e4, 0.5)
    assert cfg.tie_word_embeddings and cfg.eos_token_ids == [124_900] and cfg.max_position_embeddings == 128_000


@pytest.mark.parametrize(
    "extra",
    [
        # no gate, no sandwich norms, biases on q/k/v/o and the convolution, each type's rope of its own shape
        {
            "num_hidden_layers": 4,
            "layer_types": ["sliding_attention", "conv", "full_attention", "conv"],
            "use_attention_gate": False,
            "use_sandwich_norm": False,
            "attention_bias": True,
            "conv_bias": True,
            "rope_parameters": _ROPES,
            "sliding_window": 5,
        },
        # no conv layer: a plain decoder (no state), sliding and full layers
        {
            "num_hidden_layers": 3,
            "layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
            "sliding_window": 6,
        },
    ],
    ids=["ungated", "no_conv"],
)
def test_other_variants_match_transformers(extra, tmp_path, backend):
    from transformers import AutoModelForCausalLM

    from tests.fixtures.tiny_models import build_model

    folder = build_model("lfm3", tmp_path / "lfm3", **extra)
    llm = LLM(str(folder), backend=backend, dtype="float32", block_size=4, prefill_chunk_size=8, num_kv_blocks=64)
    try:
        assert llm.engine.model_config.recurrent == ("conv" in extra["layer_types"])
        ref = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
        assert_matches_reference(llm, ref, PROMPT, steps=16)
    finally:
        llm.engine.shutdown()


def test_batched_chunked_and_preempted_runs_equal_each_sequence_alone(tiny_model_dir, backend, caplog):
    """The conformance variant through tests/conformance's recurrent-state check (which lists its variants): the
    conv states and the sliding layers' K/V through batching, 5-token chunks, preemption and slot reuse."""
    from tests.conformance import test_recurrent_state

    test_recurrent_state.test_batched_chunked_and_preempted_runs_equal_each_sequence_alone(
        tiny_model_dir, "lfm3", backend, caplog
    )


def test_a_follow_up_turn_starts_from_the_snapshot_and_matches_transformers(tiny_model_dir, backend):
    """The same for tests/conformance's prefix-cache check: a follow-up turn restored from a state snapshot."""
    from tests.conformance import test_recurrent_prefix_cache

    test_recurrent_prefix_cache.test_a_follow_up_turn_starts_from_the_snapshot_and_matches_transformers(
        tiny_model_dir, backend, "lfm3"
    )


def test_lfm3_vl_folder_serves_its_language_model(tiny_model_dir, tmp_path, backend):
    """An Lfm3VlForConditionalGeneration folder (text_config, model.language_model.* names, a vision tower and
    projector beside, tied by the wrapper) gives the text model's greedy tokens."""
    from pathlib import Path

    from lantern.app.engine import SamplingParams
    from tests.fixtures.tiny_models import vision_language_folder

    folder = Path(tiny_model_dir("lfm3"))
    wrapper_cfg = {
        "model_type": "lfm3_vl",
        "architectures": ["Lfm3VlForConditionalGeneration"],
        "text_config": {"tie_word_embeddings": False},  # the wrapper's key decides: tied (Lfm3VlConfig's default)
    }
    extra = {
        "model.vision_tower.embeddings.patch_embedding.weight": torch.ones(3, 3),
        "model.multi_modal_projector.linear_1.weight": torch.ones(4, 4),
    }
    vision_language_folder(folder, tmp_path / "vl", wrapper_cfg, extra)
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    wrapper = LLM(str(tmp_path / "vl"), backend=backend, dtype="float32", num_kv_blocks=64)
    assert wrapper.engine.model_config.multimodal_wrapper == "lfm3_vl"
    ours = wrapper.generate([PROMPT], params)
    plain = LLM(str(folder), backend=backend, dtype="float32", num_kv_blocks=64).generate([PROMPT], params)
    assert ours[0].outputs[0].token_ids == plain[0].outputs[0].token_ids
