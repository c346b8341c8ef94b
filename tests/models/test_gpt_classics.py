"""GPT-2, GPT-BigCode (StarCoder), OPT, GPT-NeoX (Pythia) and Falcon: their released config.json files read as
transformers reads them, what Lantern does not compute refused by name, and the layouts other tools save (an
mlx_lm-quantized GPT-2 folder) computing what that tool computes. (Logits and greedy tokens of every tiny variant
against transformers: tests/conformance, variants gpt2, gpt_bigcode, gpt_bigcode_mha, opt, gpt_neox,
gpt_neox_seq, falcon, falcon_40b.)"""

from __future__ import annotations

import numpy as np
import pytest

from lantern.app.engine import LLM
from lantern.app.models.errors import UnsupportedModelError
from lantern.app.models.grouped_qkv import reorder_rows, stacked_order
from lantern.app.models.spec import ModelConfig

# The released config.json files' keys (openai-community/gpt2, bigcode/starcoderbase-1b, facebook/opt-125m,
# EleutherAI/pythia-70m, tiiuae/falcon-7b, tiiuae/falcon-40b), trimmed to what the readers look at.
GPT2 = {
    "model_type": "gpt2",
    "activation_function": "gelu_new",
    "n_ctx": 1024,
    "n_embd": 768,
    "n_head": 12,
    "n_layer": 12,
    "n_positions": 1024,
    "vocab_size": 50257,
    "layer_norm_epsilon": 1e-05,
    "bos_token_id": 50256,
    "eos_token_id": 50256,
}
STARCODER = {
    "model_type": "gpt_bigcode",
    "activation_function": "gelu_pytorch_tanh",
    "multi_query": True,
    "n_embd": 2048,
    "n_head": 16,
    "n_inner": 8192,
    "n_layer": 24,
    "n_positions": 8192,
    "vocab_size": 49152,
}
OPT = {
    "model_type": "opt",
    "activation_function": "relu",
    "do_layer_norm_before": True,
    "ffn_dim": 3072,
    "hidden_size": 768,
    "max_position_embeddings": 2048,
    "num_attention_heads": 12,
    "num_hidden_layers": 12,
    "vocab_size": 50272,
    "word_embed_proj_dim": 768,
}
PYTHIA = {
    "model_type": "gpt_neox",
    "hidden_act": "gelu",
    "hidden_size": 512,
    "intermediate_size": 2048,
    "max_position_embeddings": 2048,
    "num_attention_heads": 8,
    "num_hidden_layers": 6,
    "rotary_emb_base": 10000,
    "rotary_pct": 0.25,
    "tie_word_embeddings": False,
    "use_parallel_residual": True,
    "vocab_size": 50304,
}
FALCON_7B = {
    "model_type": "falcon",
    "alibi": False,
    "bias": False,
    "hidden_size": 4544,
    "multi_query": True,
    "new_decoder_architecture": False,
    "num_attention_heads": 71,
    "num_hidden_layers": 32,
    "parallel_attn": True,
    "vocab_size": 65024,
}
FALCON_40B = {**FALCON_7B, "hidden_size": 8192, "num_attention_heads": 128, "num_hidden_layers": 60}
FALCON_40B.update(new_decoder_architecture=True, num_kv_heads=8)


def test_released_configs_read_as_transformers_reads_them():
    gpt2 = ModelConfig.from_hf(GPT2)
    assert (gpt2.family, gpt2.hidden_size, gpt2.intermediate_size, gpt2.num_heads, gpt2.num_kv_heads) == (
        "jais2",
        768,
        3072,  # 4 x n_embd (no n_inner)
        12,
        12,
    )
    assert gpt2.tie_word_embeddings and gpt2.learned_positions and gpt2.max_context == 1024
    assert gpt2.rope_layers == (False,) * 12 and gpt2.hidden_act == "gelu_tanh" and gpt2.attn_scale is None
    star = ModelConfig.from_hf(STARCODER)
    assert (star.num_kv_heads, star.intermediate_size, star.max_context) == (1, 8192, 8192)
    opt = ModelConfig.from_hf(OPT)
    assert (opt.hidden_act, opt.intermediate_size, opt.max_context) == ("relu", 3072, 2048)
    assert opt.tie_word_embeddings and opt.learned_positions
    pythia = ModelConfig.from_hf(PYTHIA)
    assert (pythia.family, pythia.mlp_norm, pythia.hidden_act, pythia.attention_bias) == ("phi", True, "gelu", True)
    assert pythia.rope_scaling == {"rope_type": "default", "partial_rotary_factor": 0.25}
    assert ModelConfig.from_hf({**PYTHIA, "use_parallel_residual": False}).family == "jais2"
    falcon = ModelConfig.from_hf(FALCON_7B)
    assert (falcon.family, falcon.num_kv_heads, falcon.intermediate_size, falcon.mlp_norm) == ("phi", 1, 18176, False)
    assert falcon.tie_word_embeddings and not falcon.attention_bias and falcon.rope_scaling is None
    big = ModelConfig.from_hf(FALCON_40B)
    assert (big.num_kv_heads, big.mlp_norm) == (8, True)
    assert not ModelConfig.from_hf({**FALCON_40B, "num_ln_in_parallel_attn": 1}).mlp_norm  # (Falcon2-11B)


REFUSED = [
    (GPT2, "scale_attn_by_inverse_layer_idx", True),
    (GPT2, "activation_function", "swish"),
    (GPT2, "add_cross_attention", True),
    (OPT, "do_layer_norm_before", False),  # OPT-350m
    (OPT, "word_embed_proj_dim", 512),  # OPT-350m
    (PYTHIA, "hidden_act", "relu"),
    (FALCON_7B, "alibi", True),
    (FALCON_7B, "parallel_attn", False),
]


@pytest.mark.parametrize("cfg,key,value", REFUSED, ids=[f"{c['model_type']}-{k}" for c, k, _ in REFUSED])
def test_what_is_not_computed_is_refused_naming_the_key(cfg, key, value):
    with pytest.raises(UnsupportedModelError, match=key):
        ModelConfig.from_hf({**cfg, key: value})


def test_grouped_qkv_rows_reorder_to_q_then_k_then_v():
    """Falcon 40B's groups [q q k v] of one head_dim each; a per-head [q k v] (GPT-NeoX); multi-query [q.. k v]."""
    d = 2
    rows = np.arange(2 * 4 * d)  # 2 KV groups of 2 query heads + k + v
    got = reorder_rows(rows, stacked_order(2, 2, d))
    q = [0, 1, 2, 3, 8, 9, 10, 11]
    assert got.tolist() == q + [4, 5, 12, 13] + [6, 7, 14, 15]
    assert reorder_rows(np.arange(6), stacked_order(2, 1, 1)).tolist() == [0, 3, 1, 4, 2, 5]
    assert reorder_rows(np.arange(5), stacked_order(1, 3, 1)).tolist() == [0, 1, 2, 3, 4]


@pytest.fixture(scope="module")
def mlx_lm_gpt2(tmp_path_factory):
    """A tiny GPT-2 quantized by mlx_lm (4-bit g32): its nn.Linear matrices under "model.h.*" names. The float
    folder it starts from names its tensors as openai-community/gpt2's file does (h.*, wte, no "transformer.")."""
    pytest.importorskip("mlx_lm")
    from mlx_lm.utils import load, quantize_model, save
    from safetensors.torch import load_file, save_file

    from tests.fixtures.tiny_models import build_model

    out = tmp_path_factory.mktemp("gpt2-mlx-lm")
    # (mlx_lm reads n_ctx, as released configs hold, and makes the MLP 4 x n_embd wide whatever n_inner says)
    src = build_model("gpt2", out / "float", n_inner=256, n_ctx=256)
    stored = load_file(src / "model.safetensors")
    bare = {n.removeprefix("transformer."): t for n, t in stored.items() if n != "lm_head.weight"}
    save_file(bare, src / "model.safetensors", metadata={"format": "pt"})
    model, tokenizer, config = load(str(src), return_config=True, lazy=True)
    model, config = quantize_model(model, config, 32, 4, mode="affine")
    save(out / "mlx", str(src), model, tokenizer, config)
    return out / "mlx"


def test_4bit_mlx_lm_gpt2_computes_what_mlx_lm_computes(mlx_lm_gpt2, backend):
    """mlx_lm's saved GPT-2 (already transposed, quantized) is not transposed again: its logits are mlx_lm's."""
    from tests.fixtures.teacher_forcing import mlx_lm_error

    llm = LLM(str(mlx_lm_gpt2), backend=backend, dtype="float32", block_size=4, prefill_chunk_size=8, num_kv_blocks=64)
    worst, scale = mlx_lm_error(llm, mlx_lm_gpt2, "Paged attention stores keys and values in blocks", [5, 17, 42, 99])
    print(f"gpt2 {backend}: worst |diff| {worst:.2e} of logits up to {scale:.1f}")
    assert worst < (1e-3 if backend == "mlx" else 4e-2) * scale, (worst, scale)
