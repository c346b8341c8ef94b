"""GPT-Neo (EleutherAI/gpt-neo-*: model_type gpt_neo): its released config.json read as transformers' GPTNeoConfig
reads it, what Lantern does not compute refused by name, the checkpoint's names (and its stored mask buffers)
mapped, and a tiny model with local layers narrower than the prompt answering as transformers does on both
backends (logits at 1e-4 through the paged cache, teacher-forced)."""

from __future__ import annotations

import pytest

from lantern.app.engine import LLM
from lantern.app.models.errors import UnsupportedModelError
from lantern.app.models.family_gpt2 import checkpoint_name
from lantern.app.models.spec import ModelConfig
from tests.conformance.test_parity import PROMPT, hf_model
from tests.fixtures.teacher_forcing import assert_matches_reference

# EleutherAI/gpt-neo-125m's config.json, trimmed to what the readers look at
NEO_125M = {
    "model_type": "gpt_neo",
    "activation_function": "gelu_new",
    "attention_types": [[["global", "local"], 6]],
    "hidden_size": 768,
    "intermediate_size": None,
    "layer_norm_epsilon": 1e-05,
    "max_position_embeddings": 2048,
    "num_heads": 12,
    "num_layers": 12,
    "vocab_size": 50257,
    "window_size": 256,
    "bos_token_id": 50256,
    "eos_token_id": 50256,
}


def test_released_config_reads_as_transformers_reads_it():
    from transformers import GPTNeoConfig

    cfg, ref = ModelConfig.from_hf(dict(NEO_125M)), GPTNeoConfig(**NEO_125M)
    assert (cfg.num_layers, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim) == (
        ref.num_layers,
        ref.num_heads,
        ref.num_heads,
        ref.hidden_size // ref.num_heads,
    )
    assert cfg.intermediate_size == 4 * ref.hidden_size and cfg.max_position_embeddings == 2048
    assert cfg.layer_windows == [256 if kind == "local" else None for kind in ref.attention_layers]
    assert cfg.attn_scale == 1.0 and cfg.hidden_act == "gelu_tanh" and cfg.tie_word_embeddings
    assert not cfg.attention_bias and cfg.attn_out_bias and cfg.learned_positions and not any(cfg.rope_layers)


@pytest.mark.parametrize(
    ("extra", "key"),
    [
        ({"attention_types": [[["global", "sparse"], 6]]}, "attention_types"),
        ({"attention_types": [[["global", "local"], 5]]}, "attention_types"),  # 10 types for 12 layers
        ({"activation_function": "swish"}, "activation_function"),
    ],
)
def test_unimplemented_keys_are_refused_by_name(extra, key):
    with pytest.raises(UnsupportedModelError, match=key):
        ModelConfig.from_hf({**NEO_125M, **extra})


def test_checkpoint_names_map_and_mask_buffers_are_skipped():
    assert checkpoint_name("transformer.h.3.attn.attention.q_proj.weight") == "model.layers.3.self_attn.q_proj.weight"
    assert checkpoint_name("transformer.h.3.attn.attention.out_proj.bias") == "model.layers.3.self_attn.o_proj.bias"
    assert checkpoint_name("transformer.h.0.mlp.c_fc.weight") == "model.layers.0.mlp.up_proj.weight"
    assert checkpoint_name("transformer.wpe.weight") == "model.embed_positions.weight"
    assert checkpoint_name("transformer.h.0.attn.attention.bias") is None  # (older files store the masks)
    assert checkpoint_name("transformer.h.0.attn.attention.masked_bias") is None


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """A tiny GPT-Neo whose local layers see 6 keys: the prompt and the tokens after it slide past them."""
    import torch
    from transformers import GPTNeoConfig, GPTNeoForCausalLM

    from tests.fixtures.tiny_models import build_tokenizer

    out = tmp_path_factory.mktemp("gpt-neo")
    tokenizer = build_tokenizer(out)
    config = GPTNeoConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        num_layers=4,
        num_heads=4,
        attention_types=[[["global", "local"], 2]],
        window_size=6,
        max_position_embeddings=256,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(0)
    model = GPTNeoForCausalLM(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.startswith("transformer.ln") or ".ln_" in name:
                p.copy_((1.0 if name.endswith("weight") else 0.0) + 0.1 * torch.randn_like(p))
            elif name.endswith(".bias"):
                p.copy_(0.2 * torch.randn_like(p))
            else:  # (scores are not scaled: the default init's 0.02 would leave every row near uniform)
                p.copy_(0.15 * torch.randn_like(p))
    model.save_pretrained(str(out), safe_serialization=True)
    return out


def test_logits_match_transformers_through_the_paged_cache(folder, backend):
    llm = LLM(str(folder), backend=backend, dtype="float32", block_size=4, prefill_chunk_size=8, num_kv_blocks=64)
    try:
        assert len(llm.tokenizer.encode(PROMPT)) > 6  # the local layers' window slides within the prompt
        assert_matches_reference(llm, hf_model(str(folder)), PROMPT, steps=12)
    finally:
        llm.engine.shutdown()
