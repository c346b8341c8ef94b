"""Llama 4 ("llama4_text", and the language model of a `llama4` folder): config.json read as transformers'
Llama4TextConfig reads it (Scout's and Maverick's keys: NoPE layers, MoE layers, q/k norms, the query
temperature, chunked attention), the context served within one attention chunk and more refused naming the key,
and a vision-language folder answering as its text model. Logits and greedy tokens of the tiny variant (llama4:
NoPE layers whose temperature steps within the prompt, alternating dense / MoE layers) against transformers run
in tests/conformance."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest

from lantern.app.models.spec import ModelConfig, UnsupportedModelError, check_servable

SCOUT = {  # Llama-4-Scout-17B-16E's text_config keys, its sizes scaled down
    "model_type": "llama4_text",
    "vocab_size": 400,
    "hidden_size": 64,
    "intermediate_size": 48,
    "intermediate_size_mlp": 96,
    "num_hidden_layers": 8,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "num_local_experts": 16,
    "num_experts_per_tok": 1,
    "interleave_moe_layer_step": 1,
    "no_rope_layers": [],
    "use_qk_norm": True,
    "attn_temperature_tuning": 4,  # (as the original release states it: a truthy number; transformers 5 wants a bool)
    "floor_scale": 8192,
    "attn_scale": 0.1,
    "attention_chunk_size": 8192,
    "max_position_embeddings": 10485760,
    "rope_scaling": {
        "rope_type": "llama3",
        "factor": 16.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 1.0,
        "original_max_position_embeddings": 8192,
    },
    "rope_theta": 500000.0,
}
MAVERICK = {**SCOUT, "interleave_moe_layer_step": 2, "use_qk_norm": False, "rope_scaling": None}


@pytest.mark.parametrize("raw", [SCOUT, MAVERICK], ids=["scout", "maverick"])
def test_config_reads_as_transformers_does(raw):
    from transformers import Llama4TextConfig

    cfg = ModelConfig.from_hf(json.loads(json.dumps(raw)))
    ref = Llama4TextConfig(**{**{k: v for k, v in raw.items() if k != "model_type"}, "attn_temperature_tuning": True})
    assert cfg.rope_layers == tuple(bool(v) for v in ref.no_rope_layers)  # every 4th layer without rope
    assert [i for i in range(8) if cfg.moe.is_sparse(i)] == ref.moe_layers
    assert (cfg.intermediate_size, cfg.moe.intermediate_size) == (ref.intermediate_size_mlp, ref.intermediate_size)
    assert (cfg.moe.num_experts, cfg.moe.top_k) == (ref.num_local_experts, 1)
    assert cfg.qk_norm == ref.use_qk_norm and cfg.qk_norm_after_rope
    t = cfg.attn_temperature
    assert (t.beta, t.length, t.offset) == (ref.attn_scale, ref.floor_scale, 1)
    chunked = [i for i, kind in enumerate(ref.layer_types) if kind == "chunked_attention"]
    assert chunked == [i for i in range(8) if cfg.rope_layers[i]] and cfg.attention_chunk == ref.attention_chunk_size
    assert cfg.servable_context == 8192 and cfg.rope_theta == 500000.0
    assert (cfg.rope_scaling or {}).get("rope_type", "default") == ref.rope_parameters["rope_type"]


def test_the_context_is_served_within_one_chunk():
    cfg = ModelConfig.from_hf(SCOUT)
    check_servable(cfg, 8192)
    with pytest.raises(ValueError, match=r"attention_chunk_size=8192.*--max-model-len 8192"):
        check_servable(cfg, 8193)
    unchunked = ModelConfig.from_hf({**SCOUT, "attention_chunk_size": None})  # every layer full attention
    assert unchunked.attention_chunk is None and unchunked.servable_context == unchunked.max_context


def test_moe_layers_stated_empty_is_a_dense_model():
    """transformers takes its default MoE layers only when moe_layers is absent: [] (its conversion of dense
    Llama 4 checkpoints, with interleave_moe_layer_step 0 and no experts) is every layer dense."""
    from transformers import Llama4TextConfig

    dense = {**SCOUT, "moe_layers": [], "interleave_moe_layer_step": 0, "num_local_experts": 0}
    assert ModelConfig.from_hf(dense).moe is None and ModelConfig.from_hf({**SCOUT, "moe_layers": []}).moe is None
    assert (
        Llama4TextConfig(
            **{**{k: v for k, v in dense.items() if k != "model_type"}, "attn_temperature_tuning": True}
        ).moe_layers
        == []
    )
    assert [i for i in range(8) if ModelConfig.from_hf({**SCOUT, "moe_layers": [3, 7]}).moe.is_sparse(i)] == [3, 7]
    with pytest.raises(UnsupportedModelError, match="moe_layers"):
        ModelConfig.from_hf({**SCOUT, "moe_layers": [9]})


def test_rope_tables_cover_the_served_context_not_the_rope_length(tiny_model_dir, tmp_path):
    """Scout's rope reaches 10M positions; its chunked attention is served within 8192: the torch runner's cos /
    sin tables (float32, [positions, head_dim] each) are sized by the latter."""
    from lantern.app.engine import LLM

    src = Path(tiny_model_dir("llama4"))
    folder = tmp_path / "long"
    shutil.copytree(src, folder)
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg, "max_position_embeddings": 10485760}))
    llm = LLM(str(folder), backend="torch", dtype="float32", block_size=4, num_kv_blocks=64)
    try:
        assert llm.engine.backend.cos.shape[0] == 128 == llm.engine.model_config.servable_context
    finally:
        llm.engine.shutdown()


@pytest.mark.parametrize(
    ("change", "key"),
    [
        ({"num_experts_per_tok": 2}, "num_experts_per_tok"),
        ({"attention_bias": True}, "attention_bias"),
        ({"no_rope_layers": [1, 0]}, "no_rope_layers"),
        ({"layer_types": ["sliding_attention"] * 8}, "layer_types"),
        ({"hidden_act": "gelu"}, "hidden_act"),
    ],
)
def test_what_is_not_computed_is_refused_naming_the_key(change, key):
    with pytest.raises(UnsupportedModelError, match=key):
        ModelConfig.from_hf({**SCOUT, **change})


def test_vision_language_folder_serves_its_text_model(tiny_model_dir, tmp_path, backend):
    """A `llama4` folder (Llama4ForConditionalGeneration: language_model.* beside the vision tower and projector)
    gives its language model's greedy tokens."""
    import numpy as np
    import torch

    from tests.fixtures.teacher_forcing import assert_same_greedy
    from tests.fixtures.tiny_models import vision_language_folder

    text = Path(tiny_model_dir("llama4"))
    extra = {
        "vision_model.patch_embedding.linear.weight": torch.from_numpy(np.ones((8, 12), np.float32)),
        "multi_modal_projector.linear_1.weight": torch.from_numpy(np.ones((64, 8), np.float32)),
    }
    wrapper = {"model_type": "llama4", "architectures": ["Llama4ForConditionalGeneration"], "vision_config": {}}
    folder = vision_language_folder(text, tmp_path / "vl", wrapper, extra)
    assert ModelConfig.from_hf(json.loads((folder / "config.json").read_text())).multimodal_wrapper == "llama4"
    assert_same_greedy(str(text), str(folder), backend)


@pytest.fixture(scope="module")
def llama_cpp_shaped(tmp_path_factory):
    """(float folder, its GGUF): the tiny model with the values llama.cpp's graph fixes (every 4th layer rope-less)."""
    from tests.fixtures.gguf_llama4 import LLAMA_CPP_FIXED, convert_llama4
    from tests.fixtures.tiny_models import build_model

    root = tmp_path_factory.mktemp("llama4-gguf")
    src = build_model("llama4", root / "hf", **LLAMA_CPP_FIXED)
    return src, convert_llama4(src, root / "tiny-llama4.gguf")


def test_gguf_config_is_the_checkpoints(llama_cpp_shaped, tmp_path, monkeypatch):
    from lantern.app.models.loader import resolve_model

    monkeypatch.setenv("LANTERN_CACHE", str(tmp_path / "cache"))
    src, path = llama_cpp_shaped
    got, want = resolve_model(str(path)).spec.config, resolve_model(str(src)).spec.config
    # (the llama3 rope comes back from rope_freqs as an equivalent set of keys: the logits below check it)
    assert dataclasses.replace(got, rope_scaling=None) == dataclasses.replace(want, rope_scaling=None)
    assert got.rope_layers == (True, True, True, False) and got.rope_scaling["factor"] == want.rope_scaling["factor"]


def test_gguf_logits_match_transformers(llama_cpp_shaped, backend, tmp_path, monkeypatch):
    from lantern.app.engine import LLM
    from tests.conformance.test_parity import PROMPT, hf_model
    from tests.fixtures.teacher_forcing import assert_matches_reference

    monkeypatch.setenv("LANTERN_CACHE", str(tmp_path / "cache"))
    src, path = llama_cpp_shaped
    llm = LLM(str(path), backend=backend, dtype="float32", block_size=4, prefill_chunk_size=8, num_kv_blocks=64)
    try:
        assert_matches_reference(llm, hf_model(str(src)), PROMPT)
    finally:
        llm.engine.shutdown()
