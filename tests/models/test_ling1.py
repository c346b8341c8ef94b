"""Ling 1.x / Ring-lite (bailing_moe with BailingMoe's first keys: remote code, no transformers class): DeepSeek-MoE's
maths under Bailing's names -- fused query_key_value with biases, a softmax router renormalised beside shared experts,
a head whose columns are L2-normalised. Tiny random folders in the released layout against a reference nobody here
wrote: mlx_lm's own bailing_moe, teacher-forced through the paged cache on both backends; the folder as llama.cpp's
BailingMoeModel converts it (q/k split and permuted, the normalised head stored) against mlx_lm on the folder."""

from __future__ import annotations

import json

import numpy as np
import pytest

from lantern.app.models.spec import ModelConfig, UnsupportedModelError

PROMPT = "Paged attention stores keys and values in blocks"
CONFIG = {  # Ling-lite's keys, its sizes scaled down
    "model_type": "bailing_moe",
    "architectures": ["BailingMoeForCausalLM"],
    "hidden_size": 64,
    "intermediate_size": 96,
    "moe_intermediate_size": 32,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "num_experts": 8,
    "num_shared_experts": 2,
    "num_experts_per_tok": 3,
    "norm_topk_prob": True,
    "first_k_dense_replace": 1,
    "norm_head": True,
    "use_qkv_bias": True,
    "use_bias": False,
    "rotary_dim": 8,
    "rms_norm_eps": 1e-6,
    "rope_theta": 600000.0,
    "max_position_embeddings": 256,
    "tie_word_embeddings": False,
}


def ling1_folder(out, **extra):
    from tests.fixtures.remote_code_folders import save_folder, start_folder

    cfg, w = start_folder(out, {**CONFIG, **extra})
    d, v, hd = cfg["hidden_size"], cfg["vocab_size"], cfg["hidden_size"] // cfg["num_attention_heads"]
    qkv = (cfg["num_attention_heads"] + 2 * cfg["num_key_value_heads"]) * hd

    tensors = {"model.word_embeddings.weight": w(v, d, scale=0.5), "model.norm.weight": 1 + w(d)}
    tensors["lm_head.weight"] = w(v, d, scale=0.5)
    inner = cfg["moe_intermediate_size"]
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}"
        tensors |= {f"{p}.attention.query_key_value.weight": w(qkv, d), f"{p}.attention.dense.weight": w(d, d)}
        if cfg["use_qkv_bias"]:
            tensors[f"{p}.attention.query_key_value.bias"] = w(qkv, scale=0.3)
        tensors |= {f"{p}.input_layernorm.weight": 1 + w(d), f"{p}.post_attention_layernorm.weight": 1 + w(d)}
        if i < cfg["first_k_dense_replace"]:
            tensors |= w.mlp(f"{p}.mlp", cfg["intermediate_size"], d)
            continue
        tensors |= w.moe(f"{p}.mlp", cfg["num_experts"], inner, cfg["num_shared_experts"] * inner, d)
    return save_folder(out, tensors)


def convert_ling1(src, path):
    """As llama.cpp's BailingMoeModel writes it (F32): TextModel's keys, the rope's width, the experts' keys (weights
    norm from norm_topk_prob, scale 1); query_key_value split into q / k / v (q, k permuted), the experts stacked, the
    head's columns normalised (norm_head)."""
    import gguf
    from safetensors.numpy import load_file
    from transformers import PreTrainedTokenizerFast

    from tests.fixtures.gguf_writer import (
        permute_qk,
        stack_experts,
        write_llama_hparams,
        write_named_tensors,
        write_tokenizer,
    )

    cfg = json.loads((src / "config.json").read_text())
    heads, kv, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["hidden_size"] // 4
    w = gguf.GGUFWriter(path, "bailingmoe")
    w.add_name("tiny-ling1")
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    write_llama_hparams(w, cfg, cfg["rope_theta"])
    w.add_expert_count(cfg["num_experts"])
    w.add_expert_used_count(cfg["num_experts_per_tok"])
    w.add_rope_dimension_count(cfg["hidden_size"] // heads)
    w.add_leading_dense_block_count(cfg["first_k_dense_replace"])
    w.add_vocab_size(cfg["vocab_size"])
    w.add_expert_feed_forward_length(cfg["moe_intermediate_size"])
    w.add_expert_weights_scale(1.0)
    w.add_expert_shared_count(cfg["num_shared_experts"])
    w.add_expert_weights_norm(cfg["norm_topk_prob"])
    write_tokenizer(w, PreTrainedTokenizerFast.from_pretrained(str(src)))
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.BAILINGMOE, cfg["num_hidden_layers"])
    tensors = load_file(str(src / "model.safetensors"))
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}"
        for kind in ("weight", "bias"):
            fused = tensors.pop(f"{p}.attention.query_key_value.{kind}", None)
            if fused is not None:
                q, k, v = np.split(fused, [heads * hd, (heads + kv) * hd])
                tensors[f"{p}.attention.q.{kind}"] = permute_qk(q, heads)
                tensors[f"{p}.attention.k.{kind}"] = permute_qk(k, kv)
                tensors[f"{p}.attention.v.{kind}"] = v
        stack_experts(tensors, f"{p}.mlp.experts", cfg["num_experts"])
    head = tensors["lm_head.weight"]
    tensors["lm_head.weight"] = head / (np.linalg.norm(head, axis=0, keepdims=True) + 1e-7)
    ours = {"attention.q": "attn_q", "attention.k": "attn_k", "attention.v": "attn_v", "attention.dense": "attn_output"}

    def gguf_name(name: str) -> str | None:
        stem, kind = name.rsplit(".", 1)
        layer, part = (stem.split(".", 3)[2], stem.split(".", 3)[3]) if stem.startswith("model.layers.") else (0, "")
        return f"blk.{layer}.{ours[part]}.{kind}" if part in ours else names.get_name(name, (".weight", ".bias"))

    write_named_tensors(w, tensors, gguf_name)
    return path


def _assert_matches_mlx_lm(model, folder, backend, first_dense: int = 1) -> None:
    from lantern.app.engine import LLM
    from tests.fixtures.teacher_forcing import mlx_lm_error

    llm = LLM(str(model), backend=backend, dtype="float32", block_size=4, prefill_chunk_size=8, num_kv_blocks=64)
    try:
        cfg = llm.engine.model_config
        assert cfg.architecture == "bailing_moe" and cfg.attention_bias
        assert (cfg.moe.scoring, cfg.moe.norm_topk_prob, cfg.moe.shared_size, cfg.moe.first_dense) == (
            "softmax",
            True,
            64,
            first_dense,
        )
        worst, scale = mlx_lm_error(llm, folder, PROMPT, [5, 17, 42, 99, 7, 250])
        assert worst < 1e-4 * scale, (worst, scale)
    finally:
        llm.engine.shutdown()


def test_released_folder_matches_mlx_lm(tmp_path, backend, by_file_tokenizer):
    folder = ling1_folder(tmp_path / "ling")
    _assert_matches_mlx_lm(folder, folder, backend)


def test_llama_cpp_gguf_matches_mlx_lm_on_the_folder(tmp_path, backend, by_file_tokenizer):
    # (llama.cpp's bailingmoe turns the whole head and has a mixture in every layer, as Ling-lite)
    folder = ling1_folder(tmp_path / "ling", rotary_dim=None, first_k_dense_replace=0)
    _assert_matches_mlx_lm(convert_ling1(folder, tmp_path / "tiny-ling1.gguf"), folder, backend, first_dense=0)


def test_the_normalised_head_matters(tmp_path, by_file_tokenizer):
    """Not vacuous: the same folder read without norm_head gives other logits than mlx_lm with it."""
    from lantern.app.engine import LLM
    from tests.fixtures.teacher_forcing import mlx_lm_error

    folder = ling1_folder(tmp_path / "ling")
    plain = ling1_folder(tmp_path / "plain", norm_head=False)
    llm = LLM(str(plain), backend="torch", dtype="float32", block_size=4, prefill_chunk_size=8, num_kv_blocks=64)
    try:
        worst, scale = mlx_lm_error(llm, folder, PROMPT, [5, 17])
        assert worst > 1e-2 * scale, (worst, scale)
    finally:
        llm.engine.shutdown()


@pytest.mark.parametrize(
    "extra, key",
    [
        ({"use_bias": True}, "use_bias"),
        ({"use_qk_norm": True}, "use_qk_norm"),
        ({"n_group": 2}, "n_group"),
        ({"use_sliding_window": True}, "use_sliding_window"),
    ],
)
def test_what_it_cannot_compute_is_refused_by_name(extra, key):
    with pytest.raises(UnsupportedModelError, match=key):
        ModelConfig.from_hf({**CONFIG, "vocab_size": 300, **extra})


def _dequantized_copy(quantized, out):
    """The mlx_lm-made folder's values as a float folder in its own layout (mx.dequantize of each quantized tensor;
    the head as stored: already normalised, so norm_head off): what the quantized folder means, for mlx_lm."""
    import shutil

    import mlx.core as mx

    out.mkdir(parents=True, exist_ok=True)
    for f in quantized.iterdir():
        if f.suffix != ".safetensors" and f.is_file():
            shutil.copy(f, out / f.name)
    cfg = json.loads((quantized / "config.json").read_text())
    args = cfg.pop("quantization")
    cfg.pop("quantization_config", None)
    (out / "config.json").write_text(json.dumps({**cfg, "norm_head": False}))
    stored = {k: v for f in quantized.glob("*.safetensors") for k, v in mx.load(str(f)).items()}
    floats = {}
    for name, value in stored.items():
        if name.endswith((".scales", ".biases")):
            continue
        module = name.rsplit(".", 1)[0]
        if name.endswith(".weight") and f"{module}.scales" in stored:
            group = args.get(module, args)
            value = mx.dequantize(
                value,
                stored[f"{module}.scales"],
                stored.get(f"{module}.biases"),
                group_size=group["group_size"],
                bits=group["bits"],
            )
        floats[name] = value.astype(mx.float32)
    mx.save_safetensors(str(out / "model.safetensors"), floats, metadata={"format": "mlx"})
    return out


def test_an_mlx_lm_quantized_folder_serves_its_stored_head(tmp_path, backend, by_file_tokenizer):
    """mlx_lm's 4-bit conversion stores the head normalised, then quantized: served as stored (not normalised
    again), it computes what mlx_lm computes on the float values the folder holds."""
    from lantern.app.engine import LLM
    from tests.fixtures.teacher_forcing import mlx_lm_error, quantized_by_mlx_lm

    quantized = quantized_by_mlx_lm(ling1_folder(tmp_path / "ling"), tmp_path / "q4")
    reference = _dequantized_copy(quantized, tmp_path / "ref")
    llm = LLM(str(quantized), backend=backend, dtype="float32", block_size=4, prefill_chunk_size=8, num_kv_blocks=64)
    try:
        assert llm.engine.model_config.norm_head
        worst, scale = mlx_lm_error(llm, reference, PROMPT, [5, 17, 42, 99])
        assert worst < (1e-3 if backend == "mlx" else 4e-2) * scale, (worst, scale)
    finally:
        llm.engine.shutdown()
