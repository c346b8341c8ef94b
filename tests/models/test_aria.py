"""Aria's language model (aria_text) and rhymes-ai's vision-language `aria` folders (their language model served, the
vision tower skipped): against transformers' AriaTextForCausalLM / AriaForConditionalGeneration on both backends.
(The tiny aria_text variant also runs in tests/conformance.)"""

from __future__ import annotations

import re

import pytest

from lantern.app.models.spec import ModelConfig, UnsupportedModelError
from tests.conformance.test_parity import PROMPT

TEXT = {"hidden_size": 64, "intermediate_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4}
TEXT |= {"num_key_value_heads": 2, "moe_num_experts": 6, "moe_topk": 2, "moe_num_shared_experts": 2}


def aria_folder(out):
    """transformers' AriaForConditionalGeneration (a tiny vision tower and projector beside its language model) as
    save_pretrained writes it."""
    import torch
    from transformers import AriaConfig, AriaForConditionalGeneration

    from tests.fixtures.tiny_models import build_tokenizer

    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(out)
    text = {**TEXT, "vocab_size": len(tokenizer), "pad_token_id": 0, "max_position_embeddings": 256}
    vision = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2}
    config = AriaConfig(
        text_config=text,
        vision_config=vision,
        projector_patch_to_query_dict={49: 4},
        image_token_id=len(tokenizer) - 1,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(0)
    model = AriaForConditionalGeneration(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "language_model" in name and "norm" in name:
                p.copy_(1 + torch.randn_like(p) * 0.3)
            elif "language_model" in name or name.startswith("lm_head"):
                p.copy_(torch.randn_like(p) * 0.2)
    model.save_pretrained(out)
    return out, model.eval()


def test_vision_language_folder_serves_its_language_model(tmp_path, backend):
    from lantern.app.engine import LLM
    from tests.fixtures.teacher_forcing import assert_matches_reference

    folder, ref = aria_folder(tmp_path / "aria")
    llm = LLM(str(folder), backend=backend, dtype="float32", block_size=4, prefill_chunk_size=8, num_kv_blocks=64)
    try:
        cfg = llm.engine.model_config
        assert (cfg.architecture, cfg.multimodal_wrapper, cfg.moe.num_experts, cfg.moe.shared_size) == (
            "aria_text",
            "aria",
            6,
            64,
        )
        assert_matches_reference(llm, ref, PROMPT, steps=12)
    finally:
        llm.engine.shutdown()


def test_config_defaults_and_refusals():
    from transformers import AriaTextConfig

    ref, ours = AriaTextConfig(), ModelConfig.from_hf({"model_type": "aria_text"})
    assert (ours.max_position_embeddings, ours.rms_norm_eps) == (ref.max_position_embeddings, ref.rms_norm_eps)
    assert (ours.moe.num_experts, ours.moe.top_k, ours.moe.shared_size) == (8, 2, 2 * ref.intermediate_size)
    for key, value in (("mlp_bias", True), ("moe_topk", 9), ("hidden_act", "gelu")):
        with pytest.raises(UnsupportedModelError, match=f"^{re.escape(key)}="):
            ModelConfig.from_hf({"model_type": "aria_text", key: value})
