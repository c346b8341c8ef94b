"""DeepSeek-MoE (deepseek-moe-16b: model_type deepseek, remote code, no transformers class): Llama's layer over a
softmax mixture with always-on shared experts past the first dense layers. Tiny random folders in the released
layout, checked against a reference nobody here wrote -- mlx_lm's own deepseek model, teacher-forced through the
paged cache on both backends: the float folder, a 4-bit folder mlx_lm's code quantized (mlx-community's form), and
the float folder as llama.cpp's DeepseekModel converter writes it to GGUF (q/k permuted, experts stacked)."""

from __future__ import annotations

import json

import pytest

from lantern.app.models.errors import UnsupportedModelError
from lantern.app.models.spec import ModelConfig

PROMPT = "Paged attention stores keys and values in blocks"
SHAPE = {  # deepseek-moe-16b's keys, its sizes scaled down
    "hidden_size": 64,
    "intermediate_size": 96,
    "moe_intermediate_size": 32,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "n_routed_experts": 8,
    "n_shared_experts": 2,
    "num_experts_per_tok": 3,
    "first_k_dense_replace": 1,
    "moe_layer_freq": 1,
    "norm_topk_prob": False,
    "scoring_func": "softmax",
    "aux_loss_alpha": 0.001,
    "seq_aux": True,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "max_position_embeddings": 256,
    "attention_bias": False,
    "tie_word_embeddings": False,
}


def deepseek_folder(out):
    from tests.fixtures.remote_code_folders import save_folder, start_folder

    cfg, w = start_folder(out, {"model_type": "deepseek", "architectures": ["DeepseekForCausalLM"], **SHAPE})
    v, d = cfg["vocab_size"], SHAPE["hidden_size"]

    tensors = {"model.embed_tokens.weight": w(v, d, scale=0.5), "model.norm.weight": 1 + w(d)}
    tensors["lm_head.weight"] = w(v, d, scale=0.5)
    inner = SHAPE["moe_intermediate_size"]
    for i in range(SHAPE["num_hidden_layers"]):
        p = f"model.layers.{i}"
        tensors |= {f"{p}.self_attn.{n}_proj.weight": w(d, d) for n in "qkvo"}
        tensors |= {f"{p}.input_layernorm.weight": 1 + w(d), f"{p}.post_attention_layernorm.weight": 1 + w(d)}
        if i < SHAPE["first_k_dense_replace"]:
            tensors |= w.mlp(f"{p}.mlp", SHAPE["intermediate_size"], d)
            continue
        tensors |= w.moe(f"{p}.mlp", SHAPE["n_routed_experts"], inner, SHAPE["n_shared_experts"] * inner, d)
    return save_folder(out, tensors)


def convert_deepseek(src, path):
    """As llama.cpp's DeepseekModel writes it (F32): TextModel's keys, its expert / shared-expert keys and a weights
    scale of 1, rope scaling none; q/k permuted, each layer's experts stacked into one tensor per projection."""
    import gguf
    from safetensors.numpy import load_file
    from transformers import PreTrainedTokenizerFast

    from tests.fixtures.gguf_writer import stack_experts, write_llama_hparams, write_llama_tensors, write_tokenizer

    cfg = json.loads((src / "config.json").read_text())
    w = gguf.GGUFWriter(path, "deepseek")
    w.add_name("tiny-deepseek-moe")
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    write_llama_hparams(w, cfg, cfg["rope_theta"])
    w.add_expert_count(cfg["n_routed_experts"])
    w.add_expert_used_count(cfg["num_experts_per_tok"])
    w.add_rope_dimension_count(cfg["hidden_size"] // cfg["num_attention_heads"])
    w.add_rope_scaling_type(gguf.RopeScalingType.NONE)
    w.add_leading_dense_block_count(cfg["first_k_dense_replace"])
    w.add_vocab_size(cfg["vocab_size"])
    w.add_expert_feed_forward_length(cfg["moe_intermediate_size"])
    w.add_expert_weights_scale(1.0)
    w.add_expert_shared_count(cfg["n_shared_experts"])
    write_tokenizer(w, PreTrainedTokenizerFast.from_pretrained(str(src)))
    tensors = load_file(str(src / "model.safetensors"))
    for i in range(cfg["num_hidden_layers"]):
        stack_experts(tensors, f"model.layers.{i}.mlp.experts", cfg["n_routed_experts"])
    heads = cfg["num_attention_heads"]
    write_llama_tensors(w, src, gguf.MODEL_ARCH.DEEPSEEK, heads, cfg["num_key_value_heads"], tensors=tensors)
    return path


def _assert_matches_mlx_lm(model_path, folder, backend) -> None:
    from lantern.app.engine import LLM
    from tests.fixtures.teacher_forcing import mlx_lm_error

    llm = LLM(str(model_path), backend=backend, dtype="float32", block_size=4, prefill_chunk_size=8, num_kv_blocks=64)
    try:
        moe = llm.engine.model_config.moe
        assert (moe.num_experts, moe.top_k, moe.first_dense, moe.shared_size) == (8, 3, 1, 64)
        assert not moe.norm_topk_prob and moe.scoring == "softmax"
        worst, scale = mlx_lm_error(llm, folder, PROMPT, [5, 17, 42, 99, 7, 250])
        assert worst < 1e-4 * scale, (worst, scale)
    finally:
        llm.engine.shutdown()


def test_folder_matches_mlx_lm(tmp_path, backend, by_file_tokenizer):
    folder = deepseek_folder(tmp_path / "deepseek")
    _assert_matches_mlx_lm(folder, folder, backend)


def test_llama_cpp_gguf_matches_mlx_lm_on_the_folder(tmp_path, backend, by_file_tokenizer):
    """The GGUF holds the folder's values (F32): Lantern on it computes what mlx_lm computes on the folder."""
    folder = deepseek_folder(tmp_path / "deepseek")
    _assert_matches_mlx_lm(convert_deepseek(folder, tmp_path / "tiny-deepseek.gguf"), folder, backend)


def test_an_mlx_lm_quantized_folder_matches_mlx_lm(tmp_path, backend, by_file_tokenizer):
    from tests.fixtures.teacher_forcing import assert_close_to_mlx_lm, quantized_by_mlx_lm

    folder = quantized_by_mlx_lm(deepseek_folder(tmp_path / "deepseek"), tmp_path / "q4")
    assert_close_to_mlx_lm(folder, backend, "deepseek")


def test_renormalised_weights_follow_norm_topk_prob():
    """Its MoEGate renormalises the top-k weights only with norm_topk_prob and more than one expert."""
    base = {"model_type": "deepseek", "vocab_size": 300, **SHAPE}
    assert ModelConfig.from_hf({**base, "norm_topk_prob": True}).moe.norm_topk_prob
    assert not ModelConfig.from_hf({**base, "norm_topk_prob": True, "num_experts_per_tok": 1}).moe.norm_topk_prob
    assert ModelConfig.from_hf({**base, "n_routed_experts": None}).moe is None  # (a dense model)


@pytest.mark.parametrize(
    "extra, key",
    [
        ({"scoring_func": "sigmoid"}, "scoring_func"),
        ({"moe_layer_freq": 2}, "moe_layer_freq"),
        ({"attention_bias": True}, "attention_bias"),
        ({"num_experts_per_tok": 9}, "num_experts_per_tok"),
        ({"hidden_act": "gelu"}, "hidden_act"),
    ],
)
def test_what_it_cannot_compute_is_refused_by_name(extra, key):
    with pytest.raises(UnsupportedModelError, match=key):
        ModelConfig.from_hf({"model_type": "deepseek", "vocab_size": 300, **SHAPE, **extra})
