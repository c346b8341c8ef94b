"""IQuest-Coder-V1 Loop folders (model_type iquestloopcoder: remote code, no transformers class): mlx_lm's
iquestloopcoder model is the reference. A tiny folder (a transformers Llama's weights plus random per-head loop gates,
a window of 8 tokens, shorter than the prompts) is served on both backends through 4-token blocks and 8-token
prefill chunks (the later chunks read the first pass's K/V from the pool) and compared, teacher-forced, with
mlx_lm's forward on the float folder and on a 4-bit folder its code made."""

from __future__ import annotations

import json
import re

import pytest
import torch
from safetensors.torch import load_file, save_file

from lantern.app.engine import LLM
from lantern.app.models.spec import ModelConfig, UnsupportedModelError
from tests.fixtures.teacher_forcing import (
    assert_batch_answers_as_each_alone,
    assert_close_to_mlx_lm,
    assert_float_folder_matches_mlx_lm,
    mlx_lm_error,
    quantized_by_mlx_lm,
)
from tests.fixtures.tiny_models import build_model

WINDOW = 8


def loop_folder(root, window: int = WINDOW):
    """A Llama folder's weights under IQuest-Coder Loop's config, with its gate projections drawn."""
    src = build_model("llama2", root, num_key_value_heads=2)
    cfg = json.loads((src / "config.json").read_text())
    tensors = load_file(str(src / "model.safetensors"))
    g = torch.Generator().manual_seed(3)
    for i in range(cfg["num_hidden_layers"]):  # (gates well away from 0 and 1: both attentions count)
        tensors[f"model.gate_projections.{i}.weight"] = 0.3 * torch.randn(4, cfg["head_dim"], generator=g)
        tensors[f"model.gate_projections.{i}.bias"] = 0.5 * torch.randn(4, generator=g)
    save_file(tensors, str(src / "model.safetensors"))
    keep = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")
    keep += ("num_key_value_heads", "head_dim", "max_position_embeddings", "rms_norm_eps", "bos_token_id")
    keep += ("eos_token_id", "tie_word_embeddings")
    loop = {k: cfg[k] for k in keep} | {
        "model_type": "iquestloopcoder",
        "architectures": ["IQuestLoopCoderForCausalLM"],
    }
    loop |= {"loop_num": 2, "loop_window_size": window, "rope_theta": 10000.0, "hidden_act": "silu"}
    (src / "config.json").write_text(json.dumps(loop | {"torch_dtype": "float32"}))
    return src


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return loop_folder(tmp_path_factory.mktemp("iquest_loop"))


def test_float_folder_matches_mlx_lm(folder, backend, by_file_tokenizer):
    prompt = "Paged attention stores keys and values in blocks of a fixed size"
    assert_float_folder_matches_mlx_lm(folder, backend, prompt, [5, 17, 42, 99, 7, 3, 250, 11, 60, 2, 33, 18])


def test_mlx_lm_made_folder_matches_mlx_lm(folder, tmp_path, backend, by_file_tokenizer):
    assert_close_to_mlx_lm(quantized_by_mlx_lm(folder, tmp_path / "q4"), backend, "iquest loop")


def test_both_attentions_and_the_gate_count(folder, tmp_path, by_file_tokenizer):
    """Another window gives other logits (the local attention is computed within it), as mlx_lm's does."""
    other = loop_folder(tmp_path / "wide", window=64)
    llm = LLM(str(other), backend="torch", dtype="float32", block_size=4, num_kv_blocks=64)
    try:
        prompt = "Paged attention stores keys and values in blocks of a fixed size"
        worst, scale = mlx_lm_error(llm, folder, prompt, [5, 17, 42, 99])  # (against the 8-token window's)
        assert worst > 1e-3 * scale
        assert mlx_lm_error(llm, other, prompt, [5, 17, 42, 99])[0] < 1e-4 * scale
    finally:
        llm.engine.shutdown()


def test_config(folder):
    cfg = ModelConfig.from_hf(json.loads((folder / "config.json").read_text()))
    assert (cfg.family, cfg.loop_window, cfg.num_kv_layers) == ("iquest_loop", WINDOW, 2 * cfg.num_layers)
    base = {"model_type": "iquestloopcoder", "vocab_size": 400, "hidden_size": 64, "intermediate_size": 96}
    base |= {"num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16}
    assert ModelConfig.from_hf(base).rope_theta == 500000.0  # (mlx_lm's default)
    for key, value in (("loop_num", 3), ("loop_window_size", 0), ("mlp_bias", True), ("hidden_act", "gelu")):
        with pytest.raises(UnsupportedModelError, match=f"^{re.escape(key)}="):
            ModelConfig.from_hf({**base, key: value})


def test_a_batch_answers_as_each_prompt_alone(folder, backend):
    """Sequences decoding beside others' prefill chunks read only their own two pool layers."""
    prompts = ["Continuous batching lets new requests join", "Blocks", "A sliding window of eight tokens, then more"]
    assert_batch_answers_as_each_alone(folder, backend, prompts)
