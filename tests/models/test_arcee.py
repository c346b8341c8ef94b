"""Arcee AFM ("arcee") and Jais 2 ("jais2", the same MLP with biases under LayerNorms): config.json read as
transformers' config classes read it, refusals naming the key, an `arcee` GGUF written as llama.cpp's ArceeModel
(a LlamaModel: q/k permuted, its YaRN keys, ffn_up / ffn_down only) and a `jais2` GGUF written as its Jais2Model
(a plain TextModel: q/k as stored, the LayerNorms' eps as layer_norm_epsilon, every bias) answering as
transformers on both backends. The folder's logits and greedy tokens run in
tests/conformance (arcee), two ranks in test_tensor_parallel.py."""

from __future__ import annotations

import json

import pytest

from lantern.app.engine import LLM
from lantern.app.models.loader import resolve_model
from lantern.app.models.spec import ModelConfig, UnsupportedModelError
from tests.conformance.test_parity import PROMPT, hf_model
from tests.fixtures.teacher_forcing import assert_matches_reference
from tests.fixtures.tiny_models import build_model

BASE = {"model_type": "arcee", "vocab_size": 400, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2}
YARN = {"rope_type": "yarn", "factor": 20.0, "original_max_position_embeddings": 4096, "rope_theta": 10000.0}


@pytest.mark.parametrize("extra", [{}, {"num_attention_heads": 4, "num_key_value_heads": 2, "rope_parameters": YARN}])
def test_config_matches_transformers(extra):
    from transformers import ArceeConfig

    cfg, ref = ModelConfig.from_hf({**BASE, **extra}), ArceeConfig(**{**BASE, **extra})
    assert cfg.hidden_act == "relu2" and cfg.family == "arcee"
    assert (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.rms_norm_eps, cfg.max_position_embeddings) == (
        ref.num_attention_heads,
        ref.num_key_value_heads,
        ref.hidden_size // ref.num_attention_heads,
        ref.rms_norm_eps,
        ref.max_position_embeddings,
    )
    assert (cfg.rope_scaling or {}).get("rope_type", "default") == ref.rope_parameters["rope_type"]


@pytest.mark.parametrize(
    ("extra", "key"),
    [
        ({"hidden_act": "silu"}, "hidden_act"),
        ({"attention_bias": True}, "attention_bias"),
        ({"mlp_bias": True}, "mlp_bias"),
    ],
)
def test_unimplemented_keys_are_refused_by_name(extra, key):
    with pytest.raises(UnsupportedModelError, match=key):
        ModelConfig.from_hf({**BASE, **extra})


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return build_model("arcee", tmp_path_factory.mktemp("arcee"))


@pytest.fixture(scope="module")
def gguf_file(folder, tmp_path_factory):
    """`folder` as an F32 GGUF the way convert_hf_to_gguf.py's ArceeModel writes it."""
    import gguf
    from transformers import AutoTokenizer

    from tests.fixtures.gguf_writer import write_llama_hparams, write_llama_tensors, write_tokenizer

    cfg = json.loads((folder / "config.json").read_text())
    heads, kv, rope = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["rope_parameters"]
    path = tmp_path_factory.mktemp("arcee-gguf") / "tiny-arcee.gguf"
    w = gguf.GGUFWriter(path, "arcee")
    write_llama_hparams(w, cfg, rope["rope_theta"])
    w.add_vocab_size(cfg["vocab_size"])
    w.add_rope_dimension_count(cfg["hidden_size"] // heads)
    w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
    w.add_rope_scaling_factor(rope["factor"])
    w.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])
    write_tokenizer(w, AutoTokenizer.from_pretrained(str(folder)))
    write_llama_tensors(w, folder, gguf.MODEL_ARCH.ARCEE, heads, kv)
    return path


def test_gguf_config_is_the_checkpoints(folder, gguf_file, tmp_path, monkeypatch):
    monkeypatch.setenv("LANTERN_CACHE", str(tmp_path / "cache"))
    assert resolve_model(str(gguf_file)).spec.config == resolve_model(str(folder)).spec.config


def assert_gguf_answers_as_folder(gguf_path, folder, backend: str) -> None:
    """The GGUF through the paged cache answers as transformers runs the folder (logits, greedy tokens)."""
    llm = LLM(str(gguf_path), backend=backend, dtype="float32", block_size=4, prefill_chunk_size=8, num_kv_blocks=64)
    try:
        assert_matches_reference(llm, hf_model(str(folder)), PROMPT)
    finally:
        llm.engine.shutdown()


def test_gguf_logits_match_transformers(folder, gguf_file, backend, tmp_path, monkeypatch):
    monkeypatch.setenv("LANTERN_CACHE", str(tmp_path / "cache"))
    assert_gguf_answers_as_folder(gguf_file, folder, backend)


def test_jais2_config_reads_as_transformers_does():
    """Jais2Config's defaults: biases on attention and MLP, its LayerNorms' eps under layer_norm_eps."""
    from transformers import Jais2Config

    raw = {**{k: v for k, v in BASE.items() if k != "model_type"}, "num_attention_heads": 4}
    cfg, ref = ModelConfig.from_hf({"model_type": "jais2", **raw, "layer_norm_eps": 1e-6}), Jais2Config(**raw)
    assert cfg.attention_bias == ref.attention_bias and cfg.mlp_bias == ref.mlp_bias and cfg.hidden_act == "relu2"
    assert cfg.rms_norm_eps == 1e-6 and cfg.max_position_embeddings == ref.max_position_embeddings
    with pytest.raises(UnsupportedModelError, match="hidden_act"):
        ModelConfig.from_hf({"model_type": "jais2", **raw, "hidden_act": "silu"})


@pytest.fixture(scope="module")
def jais2_folder(tmp_path_factory):
    return build_model("jais2", tmp_path_factory.mktemp("jais2"))


@pytest.fixture(scope="module")
def jais2_gguf(jais2_folder, tmp_path_factory):
    """`jais2_folder` as an F32 GGUF the way convert_hf_to_gguf.py's Jais2Model writes it: TextModel's keys
    (layer_norm_eps as attention.layer_norm_epsilon, no RMS eps), the rope's dimension count, tensors as stored."""
    import gguf
    from transformers import AutoTokenizer

    from tests.fixtures.gguf_writer import write_llama_tensors, write_tokenizer

    cfg = json.loads((jais2_folder / "config.json").read_text())
    heads, kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    path = tmp_path_factory.mktemp("jais2-gguf") / "tiny-jais2.gguf"
    w = gguf.GGUFWriter(path, "jais2")
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(heads)
    w.add_head_count_kv(kv)
    w.add_rope_freq_base(cfg["rope_parameters"]["rope_theta"])
    w.add_layer_norm_eps(cfg["layer_norm_eps"])
    w.add_vocab_size(cfg["vocab_size"])
    w.add_rope_dimension_count(cfg["hidden_size"] // heads)
    write_tokenizer(w, AutoTokenizer.from_pretrained(str(jais2_folder)))
    write_llama_tensors(w, jais2_folder, gguf.MODEL_ARCH.JAIS2, heads, kv, permute=False)
    return path


def test_jais2_gguf_config_is_the_checkpoints(jais2_folder, jais2_gguf, tmp_path, monkeypatch):
    monkeypatch.setenv("LANTERN_CACHE", str(tmp_path / "cache"))
    got = resolve_model(str(jais2_gguf)).spec.config
    assert got == resolve_model(str(jais2_folder)).spec.config
    assert got.attention_bias and got.mlp_bias and got.hidden_act == "relu2"


def test_jais2_gguf_logits_match_transformers(jais2_folder, jais2_gguf, backend, tmp_path, monkeypatch):
    monkeypatch.setenv("LANTERN_CACHE", str(tmp_path / "cache"))
    assert_gguf_answers_as_folder(jais2_gguf, jais2_folder, backend)
