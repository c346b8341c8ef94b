"""LFM2: config.json read as transformers' Lfm2Config reads it (layer kinds from layer_types or
full_attn_idxs, the MLP width block_auto_adjust_ff_dim computes, tie_embedding), refusals naming the
key; its GGUF as llama.cpp writes it (tests/fixtures/gguf_lfm2.py) and an mlx_lm-made folder compute
what transformers computes, on both backends. Logits, greedy tokens and the short-conv state through
batching and preemption run in tests/conformance (the lfm2 variant)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from lantern.app.engine import LLM
from lantern.app.models.loader import resolve_model
from lantern.app.models.spec import ModelConfig, UnsupportedModelError
from tests.fixtures.teacher_forcing import assert_matches_reference

SMALL = {"vocab_size": 400, "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2}
PROMPT = "Paged attention stores keys and values in blocks, while continuous batching"


def hf(**extra):
    from transformers import AutoConfig

    return AutoConfig.for_model("lfm2", **SMALL, **extra)


@pytest.mark.parametrize(
    "extra",
    [
        {"num_hidden_layers": 6, "full_attn_idxs": [2, 5]},
        {"num_hidden_layers": 4, "layer_types": ["conv", "full_attention", "conv", "full_attention"]},
        {"num_hidden_layers": 4, "full_attn_idxs": [3], "block_ff_dim": 1000, "block_ffn_dim_multiplier": 1.5},
        {"num_hidden_layers": 4, "full_attn_idxs": [1], "block_auto_adjust_ff_dim": False, "intermediate_size": 96},
        {"num_hidden_layers": 4, "full_attn_idxs": [1], "block_multiple_of": 64, "conv_L_cache": 4},
    ],
)
def test_config_matches_transformers(extra):
    from transformers.models.lfm2.modeling_lfm2 import Lfm2MLP

    ref = hf(**extra)
    cfg = ModelConfig.from_hf(ref.to_dict())
    assert [t == "conv" for t in ref.layer_types] == list(cfg.short_conv.conv_layers)
    assert cfg.intermediate_size == Lfm2MLP(ref).w1.out_features
    assert (cfg.short_conv.kernel, cfg.short_conv.bias, cfg.rms_norm_eps) == (
        ref.conv_L_cache,
        ref.conv_bias,
        ref.norm_eps,
    )
    assert cfg.tie_word_embeddings == ref.tie_word_embeddings
    assert cfg.num_kv_layers == ref.layer_types.count("full_attention")


@pytest.mark.parametrize(
    "extra,key",
    [
        ({"layer_types": ["conv", "mamba", "conv", "full_attention"]}, "layer_types"),
        ({"layer_types": ["conv"] * 4}, "layer_types"),
        ({"conv_L_cache": 1}, "conv_L_cache"),
    ],
)
def test_unimplemented_keys_are_refused_by_name(extra, key):
    cfg = {"model_type": "lfm2", "num_hidden_layers": 4, **SMALL}
    with pytest.raises(UnsupportedModelError, match=key):
        ModelConfig.from_hf({**cfg, **extra})


@pytest.fixture(scope="module")
def float_folder(tmp_path_factory) -> Path:
    from tests.fixtures.tiny_models import build_model

    return build_model("lfm2", tmp_path_factory.mktemp("lfm2"), conv_bias=False)  # (llama.cpp has no conv bias)


def test_gguf_as_llama_cpp_writes_it(float_folder, tmp_path, monkeypatch, backend):
    from transformers import AutoModelForCausalLM

    from tests.fixtures.gguf_lfm2 import convert_lfm2

    monkeypatch.setenv("LANTERN_CACHE", str(tmp_path / "cache"))
    path = convert_lfm2(float_folder, tmp_path)
    # the metadata alone gives the checkpoint's config (the MLP width stated already adjusted)
    assert resolve_model(str(path)).spec.config == ModelConfig.from_hf(
        json.loads((float_folder / "config.json").read_text())
    )
    llm = LLM(str(path), backend=backend, dtype="float32", block_size=4, prefill_chunk_size=8, num_kv_blocks=64)
    ref = AutoModelForCausalLM.from_pretrained(float_folder, dtype=torch.float32).eval()
    assert_matches_reference(llm, ref, PROMPT, steps=12)


@pytest.mark.parametrize(
    "key,write",
    [
        ("attention.sliding_window", lambda w: w.add_sliding_window(64)),  # LFM2.5's audio tokenizer
        ("attention.causal", lambda w: w.add_causal_attention(False)),  # the bidirectional embedding models
    ],
)
def test_lfm2_gguf_keys_not_computed_are_refused_by_name(float_folder, tmp_path, monkeypatch, key, write):
    from tests.fixtures.gguf_lfm2 import convert_lfm2

    monkeypatch.setenv("LANTERN_CACHE", str(tmp_path / "cache"))
    with pytest.raises(UnsupportedModelError, match=f"lfm2.{key}"):
        resolve_model(str(convert_lfm2(float_folder, tmp_path, extra=write)))


def test_all_attention_config_is_a_plain_decoder():
    """No conv layer (neither layer_types nor full_attn_idxs: transformers makes every layer attend):
    no state, so prefix caching and the compiled decode paths stay on."""
    cfg = ModelConfig.from_hf({"model_type": "lfm2", "num_hidden_layers": 2, **SMALL})
    assert (
        cfg.short_conv is None
        and not cfg.recurrent
        and cfg.rope_theta == hf(num_hidden_layers=2).rope_parameters["rope_theta"]
    )


def test_mlx_lm_folder_equals_the_original_model(tmp_path, backend):
    """mlx_lm stores the convolution as MLX's [C, K, 1]; read back, the model is the original."""
    pytest.importorskip("mlx_lm")
    from transformers import AutoModelForCausalLM

    from tests.fixtures.mlx_lm_folders import convert

    # (LFM2 configs state block_dim, and tie: mlx_lm needs the one and has no lm_head)
    folder, _ = convert("lfm2", tmp_path, mode=None, block_dim=128, tie_word_embeddings=True)
    llm = LLM(str(folder), backend=backend, dtype="float32", block_size=4, prefill_chunk_size=8, num_kv_blocks=64)
    ref = AutoModelForCausalLM.from_pretrained(folder.parent / "lfm2-float", dtype=torch.float32).eval()
    assert_matches_reference(llm, ref, PROMPT, steps=8)


def test_lfm2_vl_folder_serves_its_language_model(float_folder, tmp_path, backend):
    """An Lfm2VlForConditionalGeneration folder (text_config, model.language_model.* names, a vision
    tower and projector beside, tied by the wrapper) gives the text model's tokens."""
    from lantern.app.engine import SamplingParams
    from tests.fixtures.tiny_models import vision_language_folder

    text = json.loads((float_folder / "config.json").read_text())
    wrapper = {
        "model_type": "lfm2_vl",
        "architectures": ["Lfm2VlForConditionalGeneration"],
        "text_config": {"tie_word_embeddings": True},
        "tie_word_embeddings": text["tie_word_embeddings"],  # the wrapper's key decides
    }
    extra = {
        "model.vision_tower.embeddings.patch_embedding.weight": torch.ones(3, 3),
        "model.multi_modal_projector.linear_1.weight": torch.ones(4, 4),
    }
    vision_language_folder(float_folder, tmp_path, wrapper, extra)
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    ours = LLM(str(tmp_path), backend=backend, dtype="float32", num_kv_blocks=64).generate([PROMPT], params)
    plain = LLM(str(float_folder), backend=backend, dtype="float32", num_kv_blocks=64).generate([PROMPT], params)
    assert ours[0].outputs[0].token_ids == plain[0].outputs[0].token_ids


# ---- LFM2-MoE (LFM2-8B-A1B): its logits and state through batching run in tests/conformance (lfm2_moe) -----
def test_moe_config_matches_transformers():
    from transformers import AutoConfig, Lfm2MoeForCausalLM

    ref = AutoConfig.for_model(
        "lfm2_moe", **SMALL, num_hidden_layers=4, layer_types=["conv", "full_attention"] * 2, intermediate_size=96,
        moe_intermediate_size=32, num_dense_layers=2, num_experts=6, num_experts_per_tok=3, use_expert_bias=False,
    )  # fmt: skip
    cfg = ModelConfig.from_hf(ref.to_dict())
    model = Lfm2MoeForCausalLM(ref)
    sparse = [hasattr(layer.feed_forward, "experts") for layer in model.model.layers]
    assert [cfg.moe.is_sparse(i) for i in range(4)] == sparse == [False, False, True, True]
    assert cfg.intermediate_size == model.model.layers[0].feed_forward.w1.out_features  # not adjusted
    assert cfg.moe.intermediate_size == model.model.layers[2].feed_forward.experts.down_proj.shape[-1]
    assert (cfg.moe.num_experts, cfg.moe.top_k, cfg.moe.correction_bias, cfg.moe.scoring) == (6, 3, False, "sigmoid")
    assert cfg.moe.norm_topk_prob and cfg.moe.norm_eps == 1e-6 and cfg.tie_word_embeddings
    with pytest.raises(UnsupportedModelError, match="num_experts_per_tok"):
        ModelConfig.from_hf({**ref.to_dict(), "num_experts_per_tok": 7})


def test_moe_gguf_as_llama_cpp_writes_it(tiny_model_dir, tmp_path, monkeypatch, backend):
    """LFM2MoeModel's keys and merged experts, the router's bias as exp_probs_b; the metadata gives the config."""
    from transformers import AutoModelForCausalLM

    from tests.fixtures.gguf_lfm2 import convert_lfm2

    monkeypatch.setenv("LANTERN_CACHE", str(tmp_path / "cache"))
    src = Path(tiny_model_dir("lfm2_moe"))
    path = convert_lfm2(src, tmp_path)
    assert resolve_model(str(path)).spec.config == ModelConfig.from_hf(json.loads((src / "config.json").read_text()))
    llm = LLM(str(path), backend=backend, dtype="float32", block_size=4, prefill_chunk_size=8, num_kv_blocks=64)
    try:
        ref = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32).eval()
        assert_matches_reference(llm, ref, PROMPT, steps=12)
    finally:
        llm.engine.shutdown()


def test_moe_mlx_lm_folder_equals_the_original_model(tmp_path, backend):
    """mlx_lm's LFM2-MoE folder (mlx-community's LFM2-8B-A1B kind): experts stacked as switch_mlp, w1/w3/w2 as
    gate/up/down_proj; read back in float, the model is the original."""
    pytest.importorskip("mlx_lm")
    from transformers import AutoModelForCausalLM

    from tests.fixtures.mlx_lm_folders import convert
    from tests.fixtures.tiny_hybrid_variants import HYBRID_VARIANTS

    folder, _ = convert("lfm2_moe", tmp_path, mode=None, **HYBRID_VARIANTS["lfm2_moe"][1])
    llm = LLM(str(folder), backend=backend, dtype="float32", block_size=4, prefill_chunk_size=8, num_kv_blocks=64)
    try:
        ref = AutoModelForCausalLM.from_pretrained(folder.parent / "lfm2_moe-float", dtype=torch.float32).eval()
        assert_matches_reference(llm, ref, PROMPT, steps=8)
    finally:
        llm.engine.shutdown()


def test_an_lfm2_vl_folder_around_lfm2_moe_reads_its_experts():
    text = {"model_type": "lfm2_moe", **SMALL, "num_hidden_layers": 4, "layer_types": ["conv", "full_attention"] * 2}
    text |= {"intermediate_size": 96, "moe_intermediate_size": 32, "num_dense_layers": 1, "num_experts": 4}
    cfg = ModelConfig.from_hf({"model_type": "lfm2_vl", "text_config": text})
    assert cfg.architecture == "lfm2_moe" and cfg.moe is not None and cfg.multimodal_wrapper == "lfm2_vl"
