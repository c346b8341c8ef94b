"""Cohere Compass (cohere_compass_text: the language model of CohereLabs/North-*-Vision; cohere_compass: the
vision-language folder, its vision tower skipped): Command A's parallel block with the rope on the halves of each
head, per layer type (NoPE where the type's rope is null), against transformers' own classes on both backends."""

from __future__ import annotations

import pytest

from lantern.app.models.spec import ModelConfig, UnsupportedModelError
from tests.conformance.test_parity import PROMPT

TYPES = ["sliding_attention", "sliding_attention", "sliding_attention", "full_attention"]
TEXT = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "layer_types": TYPES,
    "sliding_window": 8,
    "logit_scale": 0.25,
    "max_position_embeddings": 256,
    "initializer_range": 0.2,
}
NOPE_FULL = {"sliding_attention": {"rope_type": "default", "rope_theta": 50000.0}, "full_attention": None}


def compass_folder(out, wrapped: bool = False, rope: dict | None = None):
    """transformers' CohereCompassForCausalLM (or the vision-language CohereCompassForConditionalGeneration, a tiny
    vision tower beside it) as save_pretrained writes it, its LayerNorm weights made non-trivial."""
    import torch
    from transformers import (
        CohereCompassConfig,
        CohereCompassForCausalLM,
        CohereCompassForConditionalGeneration,
        CohereCompassTextConfig,
    )

    from tests.fixtures.tiny_models import build_tokenizer

    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(out)
    text = {**TEXT, "vocab_size": len(tokenizer), "rope_parameters": rope or NOPE_FULL}
    text |= {"bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id, "pad_token_id": 0}
    torch.manual_seed(0)
    if wrapped:
        vision = {"depth": 1, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2, "out_hidden_size": 64}
        config = CohereCompassConfig(text_config=text, vision_config=vision | {"deepstack_visual_indexes": []})
        model = CohereCompassForConditionalGeneration(config)
    else:
        model = CohereCompassForCausalLM(CohereCompassTextConfig(**text))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name and "visual" not in name:
                p.copy_(1 + torch.randn_like(p) * 0.3)
    model.save_pretrained(out)
    return out, model.eval()


@pytest.mark.parametrize(
    "wrapped, rope",
    [
        (False, NOPE_FULL),
        (False, {k: {"rope_type": "default", "rope_theta": 50000.0} for k in ("sliding_attention", "full_attention")}),
        (True, NOPE_FULL),
    ],
)
def test_logits_match_transformers(tmp_path, backend, wrapped, rope):
    from lantern.app.engine import LLM
    from tests.fixtures.teacher_forcing import assert_matches_reference

    folder, ref = compass_folder(tmp_path / "compass", wrapped, rope)
    llm = LLM(str(folder), backend=backend, dtype="float32", block_size=4, prefill_chunk_size=8, num_kv_blocks=64)
    try:
        cfg = llm.engine.model_config
        assert not cfg.rope_interleaved and cfg.logits_divisor == 4.0 and cfg.layer_windows == [8, 8, 8, None]
        assert cfg.rope_layers == (None if rope["full_attention"] else (True, True, True, False))
        assert_matches_reference(llm, ref, PROMPT, steps=12)
    finally:
        llm.engine.shutdown()


@pytest.mark.parametrize(
    "change, key",
    [
        ({"rope_parameters": {"sliding_attention": {"rope_theta": 5e4}}}, "rope_parameters"),
        ({"rope_parameters": {**NOPE_FULL, "full_attention": {"rope_theta": 1e6}}}, "rope_parameters"),
        ({"rope_parameters": {**NOPE_FULL, "full_attention": {"rope_type": "yarn", "factor": 2.0}}}, "rope_type"),
        ({"attention_bias": True}, "attention_bias"),
    ],
)
def test_what_it_cannot_compute_is_refused_by_name(change, key):
    cfg = {"model_type": "cohere_compass_text", "vocab_size": 300, **TEXT, "rope_parameters": NOPE_FULL, **change}
    with pytest.raises(UnsupportedModelError, match=key):
        ModelConfig.from_hf(cfg)
