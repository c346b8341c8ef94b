"""Lara Mini (lara_mini): Qwen3.5's gated delta net layers beside Qwen3 attention layers (sliding ones with the rope,
full ones without), a softmax mixture with an ungated shared expert in every layer. Tiny random models built and
saved by transformers' LaraMiniForCausalLM (the delta net's fused in_proj and out_norm, fused experts, as it saves
them); Lantern's logits equal transformers' through the paged cache and the state slots on both backends, also for a
prompt past the window and the delta rule's 64-token chunk; what it cannot compute is refused by name."""

from __future__ import annotations

import pytest

from lantern.app.models.errors import UnsupportedModelError
from lantern.app.models.spec import ModelConfig

SHAPE = {"hidden_size": 64, "num_hidden_layers": 5, "num_attention_heads": 4, "num_key_value_heads": 2}
SHAPE |= {"head_dim": 16, "linear_key_head_dim": 16, "linear_value_head_dim": 16, "linear_num_key_heads": 2}
SHAPE |= {"linear_num_value_heads": 4, "moe_intermediate_size": 32, "shared_expert_intermediate_size": 48}
SHAPE |= {"num_experts": 8, "num_experts_per_tok": 2, "sliding_window": 6}


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    import torch
    from transformers import LaraMiniConfig, LaraMiniForCausalLM

    from tests.fixtures.tiny_models import build_tokenizer

    out = tmp_path_factory.mktemp("lara_mini")
    tokenizer = build_tokenizer(out)
    ids = {"bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id, "pad_token_id": 0}
    config = LaraMiniConfig(vocab_size=len(tokenizer), initializer_range=0.2, **SHAPE, **ids)
    torch.manual_seed(0)
    model = LaraMiniForCausalLM(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
    model.save_pretrained(str(out), safe_serialization=True)
    return out, model


@pytest.mark.parametrize("repeat", [1, 6])
def test_logits_match_transformers(folder, backend, repeat):
    from lantern.app.engine import LLM
    from tests.conformance.test_parity import PROMPT
    from tests.fixtures.teacher_forcing import assert_matches_reference

    path, reference = folder
    chunk = 8 if repeat == 1 else 256
    llm = LLM(str(path), backend=backend, dtype="float32", block_size=4, prefill_chunk_size=chunk, num_kv_blocks=96)
    try:
        cfg = llm.engine.model_config
        assert cfg.num_kv_layers == 3 and cfg.rope_layers == (False, True, False, False, True)
        prompt = " ".join([PROMPT] * repeat)  # (6 times: past the window and the delta rule's 64-token chunk)
        assert repeat == 1 or 128 < len(llm.tokenizer.encode(prompt)) <= chunk
        assert_matches_reference(llm, reference, prompt, steps=8, atol=2e-4)
    finally:
        llm.engine.shutdown()


def _base(**extra) -> dict:
    return {"model_type": "lara_mini", "vocab_size": 300, **SHAPE, **extra}


def test_defaults_follow_transformers_config_class():
    from transformers import LaraMiniConfig

    ref = LaraMiniConfig(num_hidden_layers=5)
    cfg = ModelConfig.from_hf({"model_type": "lara_mini", "num_hidden_layers": 5})
    assert [w is not None for w in cfg.layer_windows] == [t == "sliding_attention" for t in ref.layer_types]
    assert cfg.tie_word_embeddings == ref.tie_word_embeddings and cfg.moe.top_k == ref.num_experts_per_tok
    assert cfg.moe.shared_size == ref.shared_expert_intermediate_size and cfg.rms_norm_eps == ref.rms_norm_eps


@pytest.mark.parametrize(
    "extra, key",
    [
        ({"attention_bias": True}, "attention_bias"),
        ({"hidden_act": "gelu"}, "hidden_act"),
        ({"layer_types": ["full_attention"] * 5}, "layer_types"),
        ({"num_experts_per_tok": 9}, "num_experts_per_tok"),
    ],
)
def test_what_it_cannot_compute_is_refused_by_name(extra, key):
    with pytest.raises(UnsupportedModelError, match=key):
        ModelConfig.from_hf(_base(**extra))
