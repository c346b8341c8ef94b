"""Apple's OpenELM (openelm, remote code: no transformers class): each layer its own query / K/V heads and MLP width,
q/k RMSNorms, fused qkv_proj and proj_1. Tiny random folders in the released layout, checked against a reference
nobody here wrote: mlx_lm's own openelm model, teacher-forced through the paged cache on both backends -- float
folders with the head shared or not, a 4-bit folder mlx_lm's code quantized (mlx-community's form), and the float
folder as llama.cpp's converter writes it to GGUF (per-layer head / width arrays, fused attn_qkv)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from lantern.app.models.errors import UnsupportedModelError
from lantern.app.models.spec import ModelConfig

SHAPE = {"num_transformer_layers": 3, "model_dim": 64, "head_dim": 16, "ffn_dim_divisor": 32}
# (no one K/V count divides every layer's query heads, as in OpenELM-270M)
SHAPE |= {"num_query_heads": [3, 4, 5], "num_kv_heads": [3, 2, 5], "ffn_multipliers": [0.5, 1.0, 1.6]}


def openelm_folder(out, shared: bool = True):
    from safetensors.numpy import save_file

    from lantern.app.models.family_openelm import make_divisible
    from tests.fixtures.tiny_models import build_tokenizer

    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(out)
    cfg = {"model_type": "openelm", "vocab_size": len(tokenizer), "share_input_output_layers": shared, **SHAPE}
    cfg |= {"bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id, "max_context_length": 256}
    (out / "config.json").write_text(json.dumps(cfg))
    rng = np.random.default_rng(0)
    d, hd, v = SHAPE["model_dim"], SHAPE["head_dim"], len(tokenizer)

    def w(*shape, scale=0.08):
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    tensors = {"transformer.token_embeddings.weight": w(v, d, scale=0.5), "transformer.norm.weight": 1 + w(d)}
    for i, (q, kv, m) in enumerate(zip(SHAPE["num_query_heads"], SHAPE["num_kv_heads"], SHAPE["ffn_multipliers"])):
        width, p = make_divisible(m * d, SHAPE["ffn_dim_divisor"]), f"transformer.layers.{i}"
        tensors |= {
            f"{p}.attn.qkv_proj.weight": w((q + 2 * kv) * hd, d),
            f"{p}.attn.out_proj.weight": w(d, q * hd),
            f"{p}.attn.q_norm.weight": 1 + w(hd, scale=0.3),
            f"{p}.attn.k_norm.weight": 1 + w(hd, scale=0.3),
            f"{p}.ffn.proj_1.weight": w(2 * width, d),
            f"{p}.ffn.proj_2.weight": w(d, width),
            f"{p}.attn_norm.weight": 1 + w(d, scale=0.3),
            f"{p}.ffn_norm.weight": 1 + w(d, scale=0.3),
        }
    if not shared:
        tensors["lm_head.weight"] = w(v, d, scale=0.5)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


@pytest.mark.parametrize("shared", [True, False])
def test_logits_match_mlx_lm(tmp_path, backend, shared, by_file_tokenizer):
    from lantern.app.engine import LLM
    from tests.fixtures.teacher_forcing import mlx_lm_error

    folder = openelm_folder(tmp_path / "openelm", shared)
    llm = LLM(str(folder), backend=backend, dtype="float32", block_size=4, prefill_chunk_size=8, num_kv_blocks=64)
    try:
        cfg = llm.engine.model_config
        assert cfg.kv_shapes == ((3, 16), (2, 16), (5, 16)) and cfg.openelm.mlp_widths == (32, 64, 96)
        worst, scale = mlx_lm_error(llm, folder, "Paged attention stores keys and values in blocks", [5, 17, 42, 99])
        assert worst < 1e-4 * scale, (worst, scale)
    finally:
        llm.engine.shutdown()


def test_an_mlx_lm_quantized_folder_matches_mlx_lm(tmp_path, backend, by_file_tokenizer):
    from tests.fixtures.teacher_forcing import assert_close_to_mlx_lm, quantized_by_mlx_lm

    folder = quantized_by_mlx_lm(openelm_folder(tmp_path / "openelm"), tmp_path / "q4")
    assert_close_to_mlx_lm(folder, backend, "openelm")


@pytest.mark.parametrize("shared", [True, False])
def test_llama_cpp_gguf_matches_mlx_lm_on_the_folder(tmp_path, backend, shared, by_file_tokenizer):
    """The GGUF holds the folder's values (F32): Lantern on it computes what mlx_lm computes on the folder."""
    from lantern.app.engine import LLM
    from tests.fixtures.gguf_openelm import convert_openelm
    from tests.fixtures.teacher_forcing import mlx_lm_error

    folder = openelm_folder(tmp_path / "openelm", shared)
    path = convert_openelm(folder, tmp_path / "tiny-openelm.gguf")
    llm = LLM(str(path), backend=backend, dtype="float32", block_size=4, prefill_chunk_size=8, num_kv_blocks=64)
    try:
        cfg = llm.engine.model_config
        assert cfg.layer_heads == (3, 4, 5) and cfg.kv_shapes == ((3, 16), (2, 16), (5, 16))
        assert cfg.openelm.mlp_widths == (32, 64, 96) and cfg.tie_word_embeddings == shared
        worst, scale = mlx_lm_error(llm, folder, "Paged attention stores keys and values in blocks", [5, 17, 42, 99])
        assert worst < 1e-4 * scale, (worst, scale)
    finally:
        llm.engine.shutdown()


def _base(**extra) -> dict:
    return {"model_type": "openelm", "vocab_size": 300, **SHAPE, **extra}


def test_openelm_270m_s_head_counts_read():
    """OpenELM-270M's layers: 12 / 16 / 20 query heads over 3 / 4 / 5 K/V heads (no one K/V count divides all)."""
    q, kv = [12] * 5 + [16] * 7 + [20] * 4, [3] * 5 + [4] * 7 + [5] * 4
    shape = {"num_transformer_layers": 16, "num_query_heads": q, "num_kv_heads": kv, "ffn_multipliers": [1.0] * 16}
    cfg = ModelConfig.from_hf(_base(**shape, model_dim=1280, head_dim=64))
    assert cfg.layer_heads == tuple(q) and cfg.kv_shapes == tuple((k, 64) for k in kv) and cfg.num_heads == 20


@pytest.mark.parametrize(
    "extra, key",
    [
        ({"num_kv_heads": [1, 2]}, "num_kv_heads"),
        ({"num_query_heads": [2, 3, 4]}, "num_query_heads"),  # (3 over 2 K/V heads)
        ({"ffn_multipliers": 2.0}, "ffn_multipliers"),
        ({"ffn_with_glu": False}, "ffn_with_glu"),
        ({"activation_fn_name": "gelu"}, "activation_fn_name"),
    ],
)
def test_what_it_cannot_compute_is_refused_by_name(extra, key):
    with pytest.raises(UnsupportedModelError, match=key):
        ModelConfig.from_hf(_base(**extra))
