"""Kwai Klear (model_type "Klear", remote code: no transformers class): Qwen3's attention over a biased sigmoid router
beside shared experts, the two outputs mixed by a learned softmax (mlp.coefficient). Tiny random folders in the
released layout against a reference nobody here wrote: mlx_lm's own Klear model, teacher-forced through the paged cache
on both backends; the float folder and a 4-bit folder mlx_lm's code quantized."""

from __future__ import annotations

import pytest

from lantern.app.models.spec import ModelConfig, UnsupportedModelError

PROMPT = "Paged attention stores keys and values in blocks"
CONFIG = {  # Klear-46B-A2.5B's keys, its sizes scaled down
    "model_type": "Klear",
    "architectures": ["KlearForCausalLM"],
    "hidden_size": 64,
    "intermediate_size": 96,
    "moe_intermediate_size": 32,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "num_experts": 8,
    "num_experts_per_tok": 2,
    "n_shared_experts": 1,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [0],
    "norm_topk_prob": True,
    "attention_bias": False,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0,
    "max_position_embeddings": 256,
    "tie_word_embeddings": False,
}


def klear_folder(out):
    from tests.fixtures.remote_code_folders import save_folder, start_folder

    cfg, w = start_folder(out, CONFIG)
    d, v, hd = cfg["hidden_size"], cfg["vocab_size"], cfg["hidden_size"] // cfg["num_attention_heads"]
    kv = cfg["num_key_value_heads"] * hd
    tensors = {"model.embed_tokens.weight": w(v, d, scale=0.5), "model.norm.weight": 1 + w(d)}
    tensors["lm_head.weight"] = w(v, d, scale=0.5)
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}"
        tensors |= {f"{p}.self_attn.q_proj.weight": w(d, d), f"{p}.self_attn.o_proj.weight": w(d, d)}
        tensors |= {f"{p}.self_attn.{n}_proj.weight": w(kv, d) for n in "kv"}
        tensors |= {f"{p}.self_attn.{n}_norm.weight": 1 + w(hd, scale=0.3) for n in "qk"}
        tensors |= {f"{p}.input_layernorm.weight": 1 + w(d), f"{p}.post_attention_layernorm.weight": 1 + w(d)}
        if i in cfg["mlp_only_layers"]:
            tensors |= w.mlp(f"{p}.mlp", cfg["intermediate_size"], d)
            continue
        inner = cfg["moe_intermediate_size"]
        tensors |= w.moe(f"{p}.mlp", cfg["num_experts"], inner, cfg["n_shared_experts"] * inner, d)
        tensors |= {f"{p}.mlp.expert_bias": w(8), f"{p}.mlp.coefficient.bias": w(2)}
        tensors[f"{p}.mlp.coefficient.weight"] = w(2, d, scale=0.5)
    return save_folder(out, tensors)


def test_folder_matches_mlx_lm(tmp_path, backend, by_file_tokenizer):
    from lantern.app.engine import LLM
    from tests.fixtures.teacher_forcing import mlx_lm_error

    folder = klear_folder(tmp_path / "klear")
    llm = LLM(str(folder), backend=backend, dtype="float32", block_size=4, prefill_chunk_size=8, num_kv_blocks=64)
    try:
        moe = llm.engine.model_config.moe
        assert moe.shared_mix and moe.dense_layers == (0,) and moe.shared_size == 32
        worst, scale = mlx_lm_error(llm, folder, PROMPT, [5, 17, 42, 99, 7, 250])
        assert worst < 1e-4 * scale, (worst, scale)
    finally:
        llm.engine.shutdown()


def test_an_mlx_lm_quantized_folder_matches_mlx_lm(tmp_path, backend, by_file_tokenizer):
    from tests.fixtures.teacher_forcing import assert_close_to_mlx_lm, quantized_by_mlx_lm

    folder = quantized_by_mlx_lm(klear_folder(tmp_path / "klear"), tmp_path / "q4")
    assert_close_to_mlx_lm(folder, backend, "Klear")


@pytest.mark.parametrize(
    "extra, key",
    [
        ({"attention_bias": True}, "attention_bias"),
        ({"rope_scaling": {"type": "linear", "factor": 2.0}}, "rope_scaling"),
        ({"n_shared_experts": 0}, "n_shared_experts"),
        ({"num_experts_per_tok": 9}, "num_experts_per_tok"),
    ],
)
def test_what_it_cannot_compute_is_refused_by_name(extra, key):
    with pytest.raises(UnsupportedModelError, match=key):
        ModelConfig.from_hf({**CONFIG, "vocab_size": 300, **extra})
