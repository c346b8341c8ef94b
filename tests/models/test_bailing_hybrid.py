"""Ling 3.0 (bailing_hybrid): Kimi Delta Attention with full-rank, bounded gates between latent-attention layers that
rotate their rope part and gate each head's output, DeepSeek-V3's grouped mixture. Tiny random models built and saved
by transformers' BailingHybridForCausalLM (which writes inclusionAI's released names); Lantern's logits equal
transformers' through the paged cache on both backends -- with the bounded gate and with Kimi's, from the released
layout and from transformers' own, multi-token-prediction layers skipped -- and batched sequences answer as each alone;
the config reads as BailingHybridConfig reads it, what Lantern cannot compute refused by name."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from lantern.app.models.errors import UnsupportedModelError
from lantern.app.models.spec import ModelConfig
from tests.models.quant_logits import relaid_folder

SHAPE = {"hidden_size": 64, "intermediate_size": 96, "moe_intermediate_size": 32, "num_hidden_layers": 4}
SHAPE |= {"num_attention_heads": 4, "num_key_value_heads": 4, "head_dim": 16, "kv_lora_rank": 32, "q_lora_rank": None}
SHAPE |= {"qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 16, "num_local_experts": 8}
SHAPE |= {"num_experts_per_tok": 2, "n_group": 2, "topk_group": 1, "n_shared_experts": 1, "first_k_dense_replace": 1}
SHAPE |= {"layer_group_size": 2, "rope_theta": 10000.0, "max_position_embeddings": 256, "routed_scaling_factor": 2.5}
VARIANTS = {"bounded_gate": {}, "kimi_gate_q_lora": {"kda_safe_gate": False, "q_lora_rank": 24}}


def _build(out, **variant):
    import torch
    from transformers import BailingHybridConfig, BailingHybridForCausalLM

    from tests.fixtures.tiny_models import build_tokenizer

    tokenizer = build_tokenizer(out)
    ids = {"bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id, "pad_token_id": 0}
    config = BailingHybridConfig(vocab_size=len(tokenizer), tie_word_embeddings=False, **{**SHAPE, **variant}, **ids)
    torch.manual_seed(0)
    model = BailingHybridForCausalLM(config).eval()
    with torch.no_grad():  # (norms start at one, the router's bias at zero: made to differ, so each is read right)
        for name, p in model.named_parameters():
            if p.dim() == 1 and not name.endswith(("A_log", "dt_bias")):
                p.mul_(1.0 + 0.3 * torch.rand_like(p))
            if name.endswith("e_score_correction_bias"):
                p.normal_(0.0, 0.5)
            if name.endswith("embed_tokens.weight"):  # (the padding id's row starts at zero)
                p[0].normal_(0.0, 0.02)
    model.save_pretrained(str(out), safe_serialization=True)
    return out, model


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def folder(request, tmp_path_factory):
    return _build(tmp_path_factory.mktemp(f"ling3_{request.param}"), **VARIANTS[request.param])


def _assert_matches(path, reference, backend) -> None:
    from tests.fixtures.teacher_forcing import assert_serves_like

    def check(cfg):  # KDA in layers 0 and 2, latent attention (the pool's layers) in 1 and 3
        assert cfg.linear_attn.linear_layers == (True, False, True, False) and cfg.linear_attn.full_rank
        assert cfg.mla.head_gate and cfg.mla.rope and cfg.mla.rope_interleave and cfg.moe.dense_layers == (0,)

    assert_serves_like(path, reference, backend, check)


def test_logits_match_transformers(folder, backend):
    _assert_matches(*folder, backend)


def test_transformers_own_layout_and_mtp_layers(folder, tmp_path, backend):
    """transformers' internal names (forget_gate.*, one conv1d, self_attn / o_proj, the router's
    e_score_correction_bias, fused experts left per expert) read as the released ones; a multi-token-prediction
    layer stored after the last (layers.4.*) is skipped."""
    out, model = folder
    convs: dict[str, dict[str, np.ndarray]] = {}

    def internal(name, value):
        name = name.replace("model.word_embeddings.", "model.embed_tokens.").replace(".attention.", ".self_attn.")
        name = name.replace(".self_attn.dense.", ".self_attn.o_proj.").replace(
            ".gate.expert_bias", ".gate.e_score_correction_bias"
        )
        name = re.sub(r"\.self_attn\.(f_proj\.weight|A_log|dt_bias)$", r".self_attn.forget_gate.\1", name)
        conv = re.fullmatch(r"(.*\.self_attn\.)([qkv])_conv1d\.weight", name)
        if conv is not None:
            parts = convs.setdefault(conv.group(1), {})
            parts[conv.group(2)] = value
            return (
                {} if len(parts) < 3 else {f"{conv.group(1)}conv1d.weight": np.concatenate([parts[c] for c in "qkv"])}
            )
        extra = {}
        if name.startswith("model.layers.3."):  # an MTP layer's copy, off the end (values that would change logits)
            extra = {name.replace("model.layers.3.", "model.layers.4.", 1): value + 1}
        return {name: value, **extra}

    relaid_folder(out, tmp_path / "internal", internal)
    _assert_matches(tmp_path / "internal", model, backend)


def test_batched_sequences_answer_as_each_alone(folder, backend):
    from tests.fixtures.teacher_forcing import assert_batch_answers_as_each_alone

    prompts = ["Paged attention stores keys", "blocks", "continuous batching of many requests at once, and"]
    assert_batch_answers_as_each_alone(folder[0], backend, prompts)


def _base(**extra) -> dict:
    return {"model_type": "bailing_hybrid", "vocab_size": 300, **SHAPE, **extra}


def test_the_config_reads_as_bailing_hybrid_config_reads_it():
    from transformers import BailingHybridConfig

    ref = BailingHybridConfig()  # Ling-3.0-Flash's shape: its released key names, defaults and layer schedules
    released = {"model_type": "bailing_hybrid", "num_experts": 64, "num_experts_per_token": 4, "num_shared_experts": 2}
    cfg = ModelConfig.from_hf({**released, "moe_renormalize": False, "model_max_length": 8192})
    assert (cfg.moe.num_experts, cfg.moe.top_k, cfg.moe.shared_size) == (64, 4, 2 * ref.moe_intermediate_size)
    assert not cfg.moe.norm_topk_prob and cfg.max_position_embeddings == 8192
    assert cfg.linear_attn.linear_layers == tuple(t == "linear_attention" for t in ref.layer_types)
    assert cfg.moe.dense_layers == tuple(i for i, t in enumerate(ref.mlp_layer_types) if t == "dense")
    assert cfg.linear_attn.gate_bound == ref.kda_lower_bound and cfg.rope_theta == ref.rope_theta
    assert cfg.attn_scale == pytest.approx((ref.qk_nope_head_dim + ref.qk_rope_head_dim) ** -0.5)
    assert ModelConfig.from_hf(_base(kda_safe_gate=False)).linear_attn.gate_bound is None
    saved = json.loads(BailingHybridConfig(**SHAPE).to_json_string())  # (what save_pretrained writes)
    assert ModelConfig.from_hf(saved).moe.num_experts == SHAPE["num_local_experts"]


@pytest.mark.parametrize(
    "extra, key",
    [
        ({"rope_parameters": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e4}}, "rope_parameters"),
        ({"kda_lower_bound": 1.0}, "kda_lower_bound"),
        ({"layer_types": ["linear_attention"] * 4}, "layer_types"),
        ({"num_key_value_heads": 2}, "num_key_value_heads"),
        ({"hidden_act": "gelu"}, "hidden_act"),
        ({"group_norm_size": 8}, "group_norm_size"),  # Ling 2.5's config under the same model type
    ],
)
def test_what_it_cannot_compute_is_refused_by_name(extra, key):
    with pytest.raises(UnsupportedModelError, match=key):
        ModelConfig.from_hf(_base(**extra))


def test_a_transformers_without_its_config_class_is_named(monkeypatch):
    """The released keys are read through transformers' BailingHybridConfig: an older transformers gets one clear
    line, not an ImportError's traceback."""
    import sys
    import types

    monkeypatch.setitem(sys.modules, "transformers", types.ModuleType("transformers"))
    with pytest.raises(UnsupportedModelError, match="BailingHybridConfig"):
        ModelConfig.from_hf(_base())
