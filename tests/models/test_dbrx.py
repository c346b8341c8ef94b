"""DBRX (model_type "dbrx"): its released config.json read as DBRX's own code reads it (the rope base from
attn_config, which transformers' DbrxConfig drops), what Lantern does not compute refused by name, the checkpoint's
fused experts and mlx_lm's per-expert layout mapped, and llama.cpp's `dbrx` GGUF computing what transformers computes
on the folder it was written from, on both backends. (The tiny folder's logits and greedy tokens against transformers:
tests/conformance, variant dbrx.)"""

from __future__ import annotations

import pytest

from lantern.app.models.errors import UnsupportedModelError
from lantern.app.models.family_dbrx import checkpoint_name
from lantern.app.models.spec import ModelConfig
from tests.fixtures.teacher_forcing import assert_file_matches_folder
from tests.fixtures.tiny_models import build_model

# databricks/dbrx-instruct's config.json, trimmed to what the readers look at
DBRX_INSTRUCT = {
    "model_type": "dbrx",
    "d_model": 6144,
    "n_heads": 48,
    "n_layers": 40,
    "max_seq_len": 32768,
    "vocab_size": 100352,
    "attn_config": {"clip_qkv": 8, "kv_n_heads": 8, "rope_theta": 500000},
    "ffn_config": {
        "ffn_act_fn": {"name": "silu"},
        "ffn_hidden_size": 10752,
        "moe_jitter_eps": 0.01,
        "moe_normalize_expert_weights": 1,
        "moe_num_experts": 16,
        "moe_top_k": 4,
    },
    "tie_word_embeddings": False,
}


def test_released_config_reads_as_dbrx_reads_it():
    from transformers import DbrxConfig

    # (the release writes moe_normalize_expert_weights as the integer 1, which DbrxConfig's strict fields refuse)
    ffn = {**DBRX_INSTRUCT["ffn_config"], "moe_normalize_expert_weights": 1.0}
    cfg, ref = ModelConfig.from_hf(dict(DBRX_INSTRUCT)), DbrxConfig(**{**DBRX_INSTRUCT, "ffn_config": ffn})
    assert (cfg.hidden_size, cfg.num_layers, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim) == (
        ref.d_model,
        ref.n_layers,
        ref.n_heads,
        ref.attn_config.kv_n_heads,
        ref.d_model // ref.n_heads,
    )
    assert cfg.max_position_embeddings == ref.max_seq_len and cfg.clip_qkv == 8.0 and cfg.family == "dbrx"
    moe = cfg.moe
    assert (moe.num_experts, moe.top_k, moe.intermediate_size, moe.norm_topk_prob) == (16, 4, 10752, True)
    # the model's own base (DBRX's code and llama.cpp read attn_config.rope_theta; transformers' config drops it)
    assert cfg.rope_theta == 500000.0 != ref.rope_parameters["rope_theta"]


@pytest.mark.parametrize(
    ("change", "key"),
    [
        (
            {"ffn_config": {**DBRX_INSTRUCT["ffn_config"], "moe_normalize_expert_weights": 2}},
            "moe_normalize_expert_weights",
        ),
        ({"ffn_config": {**DBRX_INSTRUCT["ffn_config"], "ffn_act_fn": {"name": "gelu"}}}, "ffn_act_fn"),
        ({"tie_word_embeddings": True}, "tie_word_embeddings"),
    ],
)
def test_unimplemented_keys_are_refused_by_name(change, key):
    with pytest.raises(UnsupportedModelError, match=key):
        ModelConfig.from_hf({**DBRX_INSTRUCT, **change})


def test_checkpoint_names_map():
    b = "transformer.blocks.3."
    assert checkpoint_name(b + "norm_attn_norm.attn.Wqkv.weight") == "model.layers.3.self_attn.qkv_proj.weight"
    assert checkpoint_name(b + "norm_attn_norm.norm_2.weight") == "model.layers.3.post_attention_layernorm.weight"
    assert checkpoint_name(b + "ffn.router.layer.weight") == "model.layers.3.mlp.gate.weight"
    assert checkpoint_name(b + "ffn.experts.mlp.w2") == "model.layers.3.mlp.experts.w2"  # (split while loading)
    # mlx_lm's per-expert layout, quantized
    assert checkpoint_name(b + "ffn.experts.5.v1.scales") == "model.layers.3.mlp.experts.5.up_proj.scales"
    assert checkpoint_name("transformer.norm_f.weight") == "model.norm.weight"


def test_mlx_lm_folder_computes_what_mlx_lm_computes(tmp_path):
    """mlx_lm's own conversion (experts split per expert, 4-bit) of the tiny folder: Lantern's logits equal
    mlx_lm's on it."""
    import mlx.core as mx
    import numpy as np
    from mlx_lm import convert, load

    from lantern.app.engine import LLM
    from tests.conformance.test_parity import PROMPT
    from tests.fixtures.teacher_forcing import teacher_forced_logits

    src = build_model("dbrx", tmp_path / "hf")
    out = tmp_path / "mlx"
    convert(str(src), str(out), quantize=True, q_bits=4, q_group_size=32)
    model, tokenizer = load(str(out))
    ids = tokenizer.encode(PROMPT)
    want = np.array(model(mx.array([ids]))[0].astype(mx.float32))
    llm = LLM(str(out), backend="mlx", dtype="float32", block_size=4, prefill_chunk_size=8, num_kv_blocks=64)
    try:
        rows = list(teacher_forced_logits(llm.engine, ids[:-4], ids[-4:]))
        assert len(rows) == 4
        for pos, logits in rows:
            np.testing.assert_allclose(logits, want[pos], atol=1e-4, rtol=0, err_msg=f"position {pos}")
    finally:
        llm.engine.shutdown()


def test_gguf_computes_what_transformers_computes(tmp_path, backend):
    from tests.fixtures.gguf_dbrx import convert_dbrx

    src = build_model("dbrx", tmp_path / "hf")
    path = convert_dbrx(src, tmp_path / "tiny-dbrx.gguf")
    assert_file_matches_folder(path, src, backend, "dbrx")
