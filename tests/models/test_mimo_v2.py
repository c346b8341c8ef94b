"""MiMo-V2-Flash (model_type mimo_v2_flash): config.json read as transformers' MiMoV2FlashConfig reads it (layer
types, the sliding layers' doubled K/V heads and window, each type's partial rope, narrower scaled values, the
router), what Lantern does not compute refused by name, and the released layout (sinks as attention_sink_bias, the
prediction module under model.mtp) loading and answering as transformers does. (The tiny folder's logits and greedy
tokens against transformers: tests/conformance, variant mimo_v2_flash.)"""

from __future__ import annotations

import pytest

from lantern.app.models.errors import UnsupportedModelError
from lantern.app.models.spec import ModelConfig

BASE = {"model_type": "mimo_v2_flash", "hidden_size": 64, "num_hidden_layers": 8, "num_attention_heads": 8}


UNSTATED_FACTORS = {"full_attention": {"rope_theta": 1e6}, "sliding_attention": {"rope_theta": 1e4}}


@pytest.mark.parametrize(
    "extra",
    [
        {},
        {"sliding_window_size": 127, "v_head_dim": 192, "attention_value_scale": None},
        {"rope_parameters": UNSTATED_FACTORS},  # (each type's partial_rotary_factor then 0.334, as transformers')
    ],
)
def test_config_matches_transformers(extra):
    from transformers import MiMoV2FlashConfig

    cfg, ref = ModelConfig.from_hf({**BASE, **extra}), MiMoV2FlashConfig(**{**BASE, **extra})
    assert cfg.layer_windows == [ref.sliding_window if t == "sliding_attention" else None for t in ref.layer_types]
    kv = [ref.num_key_value_heads * (2 if t == "sliding_attention" else 1) for t in ref.layer_types]
    assert [shape for shape in cfg.kv_shapes] == [(k, ref.head_dim) for k in kv]
    assert (cfg.v_head_dim or cfg.head_dim) == ref.v_head_dim and cfg.head_dim == ref.head_dim
    assert cfg.attn_value_scale == (ref.attention_value_scale if ref.attention_value_scale is not None else 1.0)
    full, local = ref.rope_parameters["full_attention"], ref.rope_parameters["sliding_attention"]
    assert (cfg.rope_theta, cfg.local_rope_theta) == (full["rope_theta"], local["rope_theta"])
    assert cfg.local_rope_dim == int(ref.head_dim * local.get("partial_rotary_factor", 0.334))
    assert cfg.rope_scaling["partial_rotary_factor"] == full.get("partial_rotary_factor", 0.334)
    moe = cfg.moe
    assert (moe.num_experts, moe.top_k, moe.intermediate_size) == (
        ref.n_routed_experts,
        ref.num_experts_per_tok,
        ref.moe_intermediate_size,
    )
    assert [moe.is_sparse(i) for i in range(8)] == [m == "sparse" for m in ref.mlp_layer_types]


@pytest.mark.parametrize(
    ("extra", "key"),
    [
        ({"v_head_dim": 256}, "v_head_dim"),
        ({"num_key_value_heads": 3}, "num_key_value_heads"),
        ({"n_shared_experts": 1}, "n_shared_experts"),
        ({"layer_types": ["full_attention"] * 3}, "layer_types"),
        ({"swa_head_dim": 128}, "swa_head_dim"),
    ],
)
def test_unimplemented_keys_are_refused_by_name(extra, key):
    with pytest.raises(UnsupportedModelError, match=key):
        ModelConfig.from_hf({**BASE, **extra})


def test_released_layout_loads(tmp_path, backend):
    """The tiny folder as released: its sinks under attention_sink_bias (what transformers saves) and a prediction
    module under model.mtp, which is skipped; answers as transformers on the folder."""
    import numpy as np
    from safetensors.numpy import load_file, save_file

    from lantern.app.engine import LLM
    from tests.conformance.test_parity import PROMPT, hf_model
    from tests.fixtures.teacher_forcing import assert_matches_reference
    from tests.fixtures.tiny_models import build_model

    folder = build_model("mimo_v2_flash", tmp_path / "mimo")
    ref = hf_model(str(folder))
    tensors = load_file(str(folder / "model.safetensors"))
    assert any(name.endswith("attention_sink_bias") for name in tensors)
    mtp = {"model.mtp.layers.0.enorm.weight": np.ones(64, np.float32)}
    save_file({**tensors, **mtp}, str(folder / "model.safetensors"), metadata={"format": "pt"})
    llm = LLM(str(folder), backend=backend, dtype="float32", block_size=4, prefill_chunk_size=8, num_kv_blocks=64)
    try:
        assert_matches_reference(llm, ref, PROMPT, steps=4)
    finally:
        llm.engine.shutdown()


def test_released_keys_state_the_layer_pattern_and_heads():
    """The released config's own keys (hybrid_layer_pattern, swa_num_key_value_heads, sliding_window_size) give the
    same layers as transformers' fixed rules where they agree."""
    from transformers import MiMoV2FlashConfig

    pattern = [0, 1, 1, 1, 1, 0, 1, 1]
    released = {**BASE, "hybrid_layer_pattern": pattern, "swa_num_key_value_heads": 8, "sliding_window_size": 128}
    cfg, ref = ModelConfig.from_hf(released), MiMoV2FlashConfig(**released)
    assert cfg.layer_windows == [ref.sliding_window if t == "sliding_attention" else None for t in ref.layer_types]
    assert cfg.layer_windows == [129 if p else None for p in pattern]
    assert [k for k, _ in cfg.kv_shapes] == [8 if p else 4 for p in pattern]


def test_gguf_computes_what_transformers_computes(tmp_path, backend):
    """llama.cpp's mimo2 GGUF of the tiny folder: transformers on that folder."""
    from tests.fixtures.gguf_mimo2 import convert_mimo2
    from tests.fixtures.teacher_forcing import assert_file_matches_folder
    from tests.fixtures.tiny_models import build_model

    src = build_model("mimo_v2_flash", tmp_path / "hf")
    path = convert_mimo2(src, tmp_path / "tiny-mimo2.gguf")
    assert_file_matches_folder(path, src, backend, "mimo2")
