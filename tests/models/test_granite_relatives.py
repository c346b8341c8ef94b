"""Granite's relatives: Granite Swash (granite_swa / granitemoe_swa: sliding layers, a sink logit per head, a rope
base per layer), GraniteMoeShared (a dense SwiGLU beside the experts), HyperCLOVA X SEED (Granite's scalars with the
logits multiplied, norms on the sublayers' outputs) and Ministral-8B (`ministral`: Mistral's layer, sliding where
layer_types says). Configs read as transformers' classes read them, refusals naming the key; the tiny folders' logits
and greedy tokens run in tests/conformance (granite_swa, granitemoe_swa, granitemoe_swa_shared, granitemoeshared,
hyperclovax, ministral)."""

from __future__ import annotations

import pytest

from lantern.app.engine import LLM
from lantern.app.models.spec import ModelConfig, UnsupportedModelError
from tests.conformance.test_parity import PROMPT, hf_model
from tests.fixtures.teacher_forcing import assert_matches_reference
from tests.fixtures.tiny_models import build_model

BASE = {"vocab_size": 400, "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4}


def _windows(ref) -> list[int | None]:
    return [ref.sliding_window if t == "sliding_attention" else None for t in ref.layer_types]


@pytest.mark.parametrize("model_type", ["granite_swa", "granitemoe_swa"])
@pytest.mark.parametrize("layers", [4, 9])
def test_swash_config_matches_transformers(model_type, layers):
    from transformers import AutoConfig

    raw = {"model_type": model_type, "num_hidden_layers": layers, **BASE}
    cfg, ref = ModelConfig.from_hf(raw), AutoConfig.for_model(**raw)
    assert cfg.layer_windows == _windows(ref)  # every 4th layer from 0 full, window 128
    assert cfg.attn_sinks and cfg.rope_layers is None and cfg.rope_theta == ref.layer_rope_theta[0]
    assert (cfg.embed_multiplier, cfg.residual_multiplier, cfg.logits_divisor, cfg.attn_scale) == (
        ref.embedding_multiplier,
        ref.residual_multiplier,
        ref.logits_scaling,
        ref.attention_multiplier,
    )
    assert (cfg.moe is not None) == (model_type == "granitemoe_swa")
    assert cfg.family == "llama"  # (granitemoe_swa: shared_intermediate_size 0 by default, no dense MLP)


def test_swash_nope_layers_and_one_rope_base():
    raw = {"model_type": "granite_swa", "num_hidden_layers": 4, **BASE}
    cfg = ModelConfig.from_hf({**raw, "layer_rope_theta": [0, 5e5, 5e5, 0]})
    assert cfg.rope_layers == (False, True, True, False) and cfg.rope_theta == 5e5
    with pytest.raises(UnsupportedModelError, match="layer_rope_theta"):  # two bases: not one rope table
        ModelConfig.from_hf({**raw, "layer_rope_theta": [1e4, 5e5, 5e5, 5e5]})
    with pytest.raises(UnsupportedModelError, match="layer_types"):
        ModelConfig.from_hf({**raw, "layer_types": ["full_attention", "chunked_attention"] * 2})
    with pytest.raises(UnsupportedModelError, match="no_rope_layers"):  # llama.cpp reads it, transformers does not
        ModelConfig.from_hf({**raw, "no_rope_layers": [0, 1, 1, 1]})
    assert ModelConfig.from_hf({**raw, "no_rope_layers": [1, 1, 1, 1]}).rope_layers is None


def test_moe_shared_config_matches_transformers():
    from transformers import GraniteMoeSharedConfig

    raw = {"model_type": "granitemoeshared", "num_hidden_layers": 2, "num_local_experts": 4, **BASE}
    assert ModelConfig.from_hf(raw).family == "llama"  # shared_intermediate_size 0 by default: GraniteMoE's layer
    raw["shared_intermediate_size"] = 96
    cfg, ref = ModelConfig.from_hf(raw), GraniteMoeSharedConfig(**raw)
    assert cfg.family == "granite_hybrid" and cfg.mamba is None  # Granite 4.0's attention-only layer
    assert (cfg.intermediate_size, cfg.moe.intermediate_size) == (ref.shared_intermediate_size, ref.intermediate_size)
    assert cfg.layer_windows is None and not cfg.attn_sinks


@pytest.mark.parametrize("extra", [{}, {"attention_multiplier": 0.3, "logits_scaling": 4.0, "use_post_norm": False}])
def test_hyperclovax_config_matches_transformers(extra):
    from transformers import HyperCLOVAXConfig

    raw = {"model_type": "hyperclovax", "num_hidden_layers": 2, **BASE, **extra}
    cfg, ref = ModelConfig.from_hf(raw), HyperCLOVAXConfig(**raw)
    assert cfg.attn_scale == pytest.approx(ref.attention_multiplier)  # head_dim ** -0.5 unless stated
    assert cfg.logits_divisor == pytest.approx(1 / ref.logits_scaling)  # multiplied, not divided
    assert cfg.post_norms == ref.use_post_norm


@pytest.mark.parametrize("backend", ["torch", "mlx"])
def test_hyperclovax_without_post_norms(tmp_path, backend):
    """use_post_norm false: Granite's layer with HyperCLOVA X's scalars, and no post_norm tensors to read."""
    folder = build_model("hyperclovax", tmp_path / "m", use_post_norm=False)
    llm = LLM(str(folder), backend=backend, dtype="float32", block_size=4, prefill_chunk_size=8, num_kv_blocks=64)
    assert_matches_reference(llm, hf_model(folder), PROMPT)


@pytest.mark.parametrize("window", [None, 4096, 32])
def test_ministral_windows_match_transformers(window):
    from transformers import MinistralConfig

    raw = {"model_type": "ministral", "num_hidden_layers": 4, "num_key_value_heads": 2, **BASE}
    if window != 4096:  # (absent: MistralConfig's 4096)
        raw["sliding_window"] = window
    cfg, ref = ModelConfig.from_hf(raw), MinistralConfig(**raw)
    assert cfg.layer_windows == (None if window is None else _windows(ref))
    typed = {**raw, "sliding_window": 32, "layer_types": ["sliding_attention"] * 3 + ["full_attention"]}
    assert ModelConfig.from_hf(typed).layer_windows == [32, 32, 32, None]
    assert not ModelConfig.from_hf({**raw, "attention_bias": True}).attention_bias  # (MinistralAttention has none)
    with pytest.raises(UnsupportedModelError, match="layer_types"):
        ModelConfig.from_hf({**typed, "layer_types": ["sliding_attention"] * 3})


@pytest.mark.parametrize("backend", ["torch", "mlx"])
def test_moe_shared_without_shared_mlp(tmp_path, backend):
    """shared_intermediate_size 0 (GraniteMoeSharedConfig's default): GraniteMoE's layer, its experts' names read."""
    folder = build_model("granitemoeshared", tmp_path / "m", shared_intermediate_size=0)
    llm = LLM(str(folder), backend=backend, dtype="float32", block_size=4, prefill_chunk_size=8, num_kv_blocks=64)
    assert_matches_reference(llm, hf_model(folder), PROMPT)


@pytest.mark.parametrize("variant", ["granite_swa", "granitemoe_swa_shared", "granitemoeshared"])
@pytest.mark.parametrize("backend", ["torch", "mlx"])
def test_gguf_answers_as_transformers(tmp_path, monkeypatch, variant, backend):
    """A GGUF as llama.cpp's converters write these (GraniteSWAModel / GraniteMoeSWAModel: granite_swa with the window
    pattern, rope_pattern, attn_sinks, the experts' and shared MLP's gate and up rows fused; GraniteMoeModel: granitemoe
    with expert_shared_feed_forward_length and ffn_*_shexp) computes what transformers computes on its checkpoint."""
    from tests.fixtures.gguf_granite import convert_granite

    monkeypatch.setenv("LANTERN_CACHE", str(tmp_path / "cache"))
    path, ref = convert_granite(build_model(variant, tmp_path / "hf"), tmp_path, "f32")
    llm = LLM(str(path), backend=backend, dtype="float32", block_size=4, prefill_chunk_size=8, num_kv_blocks=64)
    cfg = llm.engine.model_config
    assert cfg.architecture == {"granite_swa": "granite_swa", "granitemoeshared": "granitemoeshared"}.get(
        variant, "granitemoe_swa"
    )
    assert cfg.attn_sinks == (variant != "granitemoeshared")
    assert_matches_reference(llm, hf_model(ref), PROMPT)
