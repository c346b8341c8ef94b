"""Talkie folders (model_type talkie, the HF layout of talkie-1930-13b: remote code, no transformers class) and
llama.cpp's talkie GGUFs. mlx_lm's talkie model is the reference for the folders (float, and a 4-bit folder its code
made); the GGUF, written as llama.cpp's converter writes it (the reversed rope folded into q / k, the gains as
`.scale` tensors and logit_scale), answers as the folder it came from on both backends (llama-server computes the
same tokens on it: scripts/check_gguf_vs_llamacpp.py --only talkie)."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from lantern.app.models.spec import ModelConfig, UnsupportedModelError
from tests.fixtures.remote_code_folders import save_folder, start_folder
from tests.fixtures.teacher_forcing import (
    assert_close_to_mlx_lm,
    assert_files_agree,
    assert_float_folder_matches_mlx_lm,
    quantized_by_mlx_lm,
)

HIDDEN, HEADS, HEAD_DIM, LAYERS, WIDTH = 64, 4, 16, 2, 128
PROMPT = "Paged attention stores keys and values in blocks of a fixed size"
FORCED = [5, 17, 42, 99, 7, 3, 250, 11, 60, 2, 33, 18]


def talkie_folder(out):
    """Random weights under the checkpoint's names (its bare lm_head, the gains away from 1)."""
    cfg = {"model_type": "talkie", "architectures": ["TalkieForCausalLM"], "hidden_size": HIDDEN}
    cfg |= {"num_hidden_layers": LAYERS, "num_attention_heads": HEADS, "head_dim": HEAD_DIM, "intermediate_size": WIDTH}
    cfg |= {"rope_theta": 10000.0, "max_position_embeddings": 256}
    cfg, w = start_folder(out, cfg)
    d, inner, vocab = HIDDEN, HEADS * HEAD_DIM, cfg["vocab_size"]
    t = {"model.embed.weight": w(vocab, d, scale=1.0), "lm_head": w(vocab, d, scale=0.3)}
    t["lm_head_gain.w_g"] = np.array([1.7], np.float32)
    for i in range(LAYERS):
        p = f"model.blocks.{i}"
        for proj in ("attn_query", "attn_key", "attn_value"):
            t[f"{p}.attn.{proj}.weight"] = w(inner, d, scale=0.3)
        t[f"{p}.attn.attn_resid.weight"] = w(d, inner, scale=0.3)
        t[f"{p}.attn.head_gain.head_g"] = 1 + w(HEADS, scale=0.5)
        for gain, value in (("attn_gain", 0.8), ("mlp_gain", 0.6), ("embed_skip", 0.3)):
            t[f"{p}.{gain}.a_g"] = np.array([value + 0.1 * i], np.float32)
        t[f"{p}.mlp.mlp_gate.weight"], t[f"{p}.mlp.mlp_linear.weight"] = w(WIDTH, d), w(WIDTH, d)
        t[f"{p}.mlp.mlp_resid.weight"] = w(d, WIDTH)
    return save_folder(out, t)


def convert_talkie(folder, path):
    """The float32 GGUF llama.cpp's TalkieModel writes of a Talkie folder."""
    import gguf
    from safetensors.numpy import load_file
    from transformers import PreTrainedTokenizerFast

    from tests.fixtures.gguf_writer import write_tokenizer

    cfg = json.loads((folder / "config.json").read_text())
    tensors = load_file(str(folder / "model.safetensors"))
    w = gguf.GGUFWriter(path, "talkie")
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_key_length(cfg["head_dim"])
    w.add_value_length(cfg["head_dim"])
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_rope_freq_base(cfg["rope_theta"])
    w.add_layer_norm_rms_eps(float(np.finfo(np.float32).eps))
    w.add_logit_scale(float(tensors["lm_head_gain.w_g"][0]))
    write_tokenizer(w, PreTrainedTokenizerFast.from_pretrained(str(folder)), pre="talkie")
    signs = np.ones((1, HEAD_DIM, 1), np.float32)
    signs[:, HEAD_DIM // 2 :] = -1  # (the converter's "absorb inverse rope")
    out = {"token_embd.weight": tensors["model.embed.weight"], "output.weight": tensors["lm_head"]}
    names = {"attn.attn_value.weight": "attn_v.weight", "attn.attn_resid.weight": "attn_output.weight"}
    names |= {"mlp.mlp_gate.weight": "ffn_gate.weight", "mlp.mlp_linear.weight": "ffn_up.weight"}
    names |= {"mlp.mlp_resid.weight": "ffn_down.weight", "attn_gain.a_g": "attn_output.scale"}
    names |= {"mlp_gain.a_g": "ffn_down.scale", "embed_skip.a_g": "layer_output_scale.weight"}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.blocks.{i}."
        for src, dst in (("attn.attn_query.weight", "attn_q.weight"), ("attn.attn_key.weight", "attn_k.weight")):
            value = tensors[p + src]
            out[f"blk.{i}.{dst}"] = (value.reshape(-1, HEAD_DIM, value.shape[-1]) * signs).reshape(value.shape)
        for src, dst in names.items():
            out[f"blk.{i}.{dst}"] = tensors[p + src]
        out[f"blk.{i}.attn_q_norm.weight"] = tensors[p + "attn.head_gain.head_g"][:, None]
    for name, value in out.items():
        w.add_tensor(name, np.ascontiguousarray(value, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return talkie_folder(tmp_path_factory.mktemp("talkie"))


def test_float_folder_matches_mlx_lm(folder, backend, by_file_tokenizer):
    assert_float_folder_matches_mlx_lm(folder, backend, PROMPT, FORCED)


def test_mlx_lm_made_folder_matches_mlx_lm(folder, tmp_path, backend, by_file_tokenizer):
    assert_close_to_mlx_lm(quantized_by_mlx_lm(folder, tmp_path / "q4"), backend, "talkie")


def test_gguf_answers_as_its_folder(folder, tmp_path, backend):
    assert_files_agree((folder, convert_talkie(folder, tmp_path / "tiny-talkie.gguf")), backend, PROMPT, FORCED)


def test_config():
    cfg = ModelConfig.from_hf({"model_type": "talkie"})  # (mlx_lm's defaults: talkie-1930-13b)
    assert (cfg.num_layers, cfg.hidden_size, cfg.num_kv_heads, cfg.vocab_size) == (40, 5120, 40, 65540)
    assert cfg.rope_reversed and cfg.qk_norm_after_rope and cfg.rms_norm_eps == float(np.finfo(np.float32).eps)
    for key, value in (("num_key_value_heads", 8), ("tie_word_embeddings", True), ("hidden_act", "gelu")):
        with pytest.raises(UnsupportedModelError, match=f"^{re.escape(key)}="):
            ModelConfig.from_hf({"model_type": "talkie", key: value})
