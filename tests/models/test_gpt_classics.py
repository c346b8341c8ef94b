"""GPT-2, GPT-BigCode (StarCoder), OPT, GPT-NeoX (Pythia), Falcon, GPT-J, CodeGen, BLOOM, MPT, OLMo (1) and Helium:
their released config.json files read as transformers reads them, what Lantern does not compute refused by name,
checkpoint names of older and quantized files mapped (buffers skipped), and the layouts other tools save (mlx_lm-
quantized GPT-2 and GPT-NeoX folders) computing what that tool computes. (Logits and greedy tokens of every tiny
variant against transformers: tests/conformance, variants gpt2, gpt_bigcode, gpt_bigcode_mha, opt, gpt_neox,
gpt_neox_seq, falcon, falcon_40b, gptj, codegen, bloom, bloom6, mpt, mpt6, olmo1, helium.)"""

from __future__ import annotations

import numpy as np
import pytest
import torch

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
GPTJ = {
    "model_type": "gptj",
    "activation_function": "gelu_new",
    "n_embd": 4096,
    "n_head": 16,
    "n_layer": 28,
    "n_positions": 2048,
    "rotary_dim": 64,
    "vocab_size": 50400,
    "tie_word_embeddings": False,
}
OLMO_17 = {  # allenai/OLMo-1.7-7B-hf
    "model_type": "olmo",
    "clip_qkv": 8.0,
    "hidden_size": 4096,
    "intermediate_size": 11008,
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "max_position_embeddings": 4096,
    "vocab_size": 50304,
}
CODEGEN = {  # Salesforce/codegen-350M-mono
    "model_type": "codegen",
    "activation_function": "gelu_new",
    "n_ctx": 2048,
    "n_embd": 1024,
    "n_head": 16,
    "n_layer": 20,
    "n_positions": 2048,
    "rotary_dim": 32,
    "vocab_size": 51200,
    "tie_word_embeddings": False,
}
BLOOM_560M = {  # bigscience/bloom-560m
    "model_type": "bloom",
    "hidden_size": 1024,
    "n_head": 16,
    "n_layer": 24,
    "layer_norm_epsilon": 1e-5,
    "apply_residual_connection_post_layernorm": False,
    "vocab_size": 250880,
    "seq_length": 2048,
}
MPT_7B = {  # mosaicml/mpt-7b
    "model_type": "mpt",
    "d_model": 4096,
    "n_heads": 32,
    "n_layers": 32,
    "expansion_ratio": 4,
    "max_seq_len": 2048,
    "vocab_size": 50432,
    "no_bias": True,
    "learned_pos_emb": True,
    "logit_scale": None,
    "attn_config": {
        "alibi": True,
        "alibi_bias_max": 8,
        "attn_type": "multihead_attention",
        "clip_qkv": None,
        "prefix_lm": False,
        "qk_ln": False,
        "softmax_scale": None,
        "attn_uses_sequence_id": False,
    },
}
HELIUM = {"model_type": "helium", "hidden_size": 2560, "num_hidden_layers": 24, "vocab_size": 48000}


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
    gptj = ModelConfig.from_hf(GPTJ)
    assert (gptj.family, gptj.head_dim, gptj.intermediate_size, gptj.rope_interleaved) == ("phi", 256, 16384, True)
    assert gptj.rope_scaling == {"rope_type": "default", "partial_rotary_factor": 0.25} and gptj.lm_head_bias
    assert ModelConfig.from_hf({**GPTJ, "rotary_dim": None}).rope_scaling is None  # (whole heads)
    codegen = ModelConfig.from_hf(CODEGEN)
    assert (codegen.family, codegen.head_dim, codegen.rope_interleaved, codegen.lm_head_bias) == ("phi", 64, True, True)
    assert codegen.rope_scaling == {"rope_type": "default", "partial_rotary_factor": 0.5}
    bloom = ModelConfig.from_hf(BLOOM_560M)
    assert (bloom.family, bloom.num_heads, bloom.intermediate_size, bloom.embed_norm) == ("jais2", 16, 4096, True)
    assert bloom.tie_word_embeddings and bloom.rope_layers == (False,) * 24 and bloom.max_context == 2048
    mpt = ModelConfig.from_hf(MPT_7B)
    assert (mpt.family, mpt.hidden_act, mpt.intermediate_size, mpt.attention_bias, mpt.mlp_bias) == (
        "mpt",
        "gelu",
        16384,
        False,
        False,
    )
    assert mpt.tie_word_embeddings and mpt.clip_qkv is None and mpt.attn_scale is None and len(mpt.alibi_slopes) == 32
    olmo = ModelConfig.from_hf(OLMO_17)
    assert (olmo.family, olmo.clip_qkv, olmo.num_kv_heads, olmo.rms_norm_eps) == ("olmo1", 8.0, 32, 1e-5)
    assert ModelConfig.from_hf({**OLMO_17, "clip_qkv": None}).clip_qkv is None
    helium = ModelConfig.from_hf(HELIUM)
    assert (helium.rope_theta, helium.head_dim, helium.num_kv_heads, helium.rms_norm_eps) == (1e5, 128, 20, 1e-8)
    assert helium.rope_interleaved and helium.family == "llama"


REFUSED = [
    (GPT2, "scale_attn_by_inverse_layer_idx", True),
    (GPT2, "activation_function", "swish"),
    (GPT2, "add_cross_attention", True),
    (OPT, "do_layer_norm_before", False),  # OPT-350m
    (OPT, "word_embed_proj_dim", 512),  # OPT-350m
    (PYTHIA, "hidden_act", "relu"),
    (FALCON_7B, "alibi", True),
    (FALCON_7B, "parallel_attn", False),
    (GPT2, "attention_head_type", "multiquery"),  # bigcode/santacoder's remote code
    (GPTJ, "rotary_dim", 300),
    (GPTJ, "tie_word_embeddings", True),
    (OLMO_17, "attention_bias", True),
    (OLMO_17, "clip_qkv", -1.0),
    (HELIUM, "mlp_bias", True),
    (BLOOM_560M, "apply_residual_connection_post_layernorm", True),
    (MPT_7B, "expansion_ratio", 8),
    (MPT_7B, "no_bias", False),
    (MPT_7B, "logit_scale", 0.5),
    ({**MPT_7B, "attn_config": {"alibi": False}}, "attn_config.alibi", None),
    ({**MPT_7B, "attn_config": {"qk_ln": True}}, "attn_config.qk_ln", None),
    ({**MPT_7B, "attn_config": {"attn_type": "multiquery_attention"}}, "attn_config.attn_type", None),
    (CODEGEN, "auto_map", {"AutoModelForCausalLM": "modeling_codegen.CodeGenForCausalLM"}),  # CodeGen2's
    ({**CODEGEN, "n_embd": 1008}, "n_head", 6),  # six heads of 168 do not split into CodeGen's four shards
]


@pytest.mark.parametrize("cfg,key,value", REFUSED, ids=[f"{c['model_type']}-{k}" for c, k, _ in REFUSED])
def test_what_is_not_computed_is_refused_naming_the_key(cfg, key, value):
    with pytest.raises(UnsupportedModelError, match=key.replace(".", r"\.")):
        ModelConfig.from_hf(cfg if value is None else {**cfg, key: value})  # (None: the key is set in cfg)


def test_grouped_qkv_rows_reorder_to_q_then_k_then_v():
    """Falcon 40B's groups [q q k v] of one head_dim each; a per-head [q k v] (GPT-NeoX); multi-query [q.. k v]."""
    d = 2
    rows = np.arange(2 * 4 * d)  # 2 KV groups of 2 query heads + k + v
    got = reorder_rows(rows, stacked_order(2, 2, d))
    q = [0, 1, 2, 3, 8, 9, 10, 11]
    assert got.tolist() == q + [4, 5, 12, 13] + [6, 7, 14, 15]
    assert reorder_rows(np.arange(6), stacked_order(2, 1, 1)).tolist() == [0, 3, 1, 4, 2, 5]
    assert reorder_rows(np.arange(5), stacked_order(1, 3, 1)).tolist() == [0, 1, 2, 3, 4]


@pytest.mark.parametrize("heads", [1, 4, 6, 32, 40, 48])
def test_mpt_alibi_slopes_are_mpts(heads):
    """MPT's slopes (interleaved where the head count is no power of two: 6, 40 and 48 here)."""
    from transformers.models.mpt.modeling_mpt import build_mpt_alibi_tensor

    from lantern.app.models.family_mpt import mpt_alibi_slopes

    # its bias at key j of 2 keys is slope * (j - 1): the slope is the bias at the last key minus the first
    bias = build_mpt_alibi_tensor(heads, 2, 8)
    want = (bias[:, 0, 1] - bias[:, 0, 0]).tolist()
    np.testing.assert_allclose(mpt_alibi_slopes(heads), want, rtol=1e-6)


@pytest.mark.parametrize("heads", [1, 4, 6, 16, 71, 112])
def test_alibi_slopes_are_blooms(heads):
    """BLOOM's slopes for powers of two and not (bloom-176b: 112 heads)."""
    from transformers.models.bloom.modeling_bloom import _get_alibi_slopes

    from lantern.app.models.family_bloom import alibi_slopes

    want = _get_alibi_slopes(heads, torch.device("cpu")).tolist()
    np.testing.assert_allclose(alibi_slopes(heads), want, rtol=1e-6)


def test_tensor_parallelism_is_refused_for_alibi_naming_it():
    """Each rank would hold all the slopes for a share of the heads: refused before any rank starts."""
    from lantern.backends.torch.parallel import local_config

    with pytest.raises(ValueError, match="ALiBi"):
        local_config(ModelConfig.from_hf(BLOOM_560M), 2)


def test_alibi_decodes_on_the_reference_path_when_decode_would_compile(tiny_model_dir, caplog):
    """A compiled decode (--compile) of an ALiBi model is declined, saying why: its attention takes the reference
    path; the answers are eager's."""
    import logging

    from lantern.app.engine import SamplingParams

    path = tiny_model_dir("bloom")
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    eager = LLM(path, backend="torch", dtype="float32", num_kv_blocks=64).generate(["def add(a, b):"], params)
    with caplog.at_level(logging.INFO):
        llm = LLM(path, backend="torch", dtype="float32", num_kv_blocks=64, compile_decode=True)
    assert "ALiBi attention takes the reference attention path" in caplog.text
    assert llm.generate(["def add(a, b):"], params)[0].outputs[0].token_ids == eager[0].outputs[0].token_ids


def test_checkpoint_names_of_older_and_quantized_files():
    """Buffers older transformers saved (attention masks, the rope's inv_freq) are skipped; a quantized module's
    tensors (GPTQ's qweight / qzeros / scales / g_idx) and mlx_lm's names map like its weights; an unknown name is
    kept, for the model files to refuse by name."""
    from lantern.app.models.family_gpt2 import checkpoint_name as gpt2_name
    from lantern.app.models.family_gptj import checkpoint_name as gptj_name
    from lantern.app.models.family_gptneox import checkpoint_name as neox_name

    for buffer in ("h.3.attn.bias", "h.3.attn.masked_bias", "transformer.h.3.attn.masked_bias"):
        assert gpt2_name(buffer) is None
    assert gpt2_name("h.3.attn.c_attn.weight") == "model.layers.3.self_attn.qkv_proj.weight"
    assert gpt2_name("model.h.3.mlp.c_fc.scales") == "model.layers.3.mlp.up_proj.scales"  # mlx_lm's
    assert gpt2_name("decoder.layers.1.fc2.bias") == "model.layers.1.mlp.down_proj.bias"  # OPT without model.
    assert gpt2_name("h.3.attn.q_attn.weight") == "h.3.attn.q_attn.weight"  # (SantaCoder's: refused by name)
    for buffer in ("attention.bias", "attention.masked_bias", "attention.rotary_emb.inv_freq"):
        assert neox_name(f"gpt_neox.layers.2.{buffer}") is None
    for part in ("qweight", "qzeros", "scales", "g_idx"):
        want = f"model.layers.2.self_attn.qkv_proj.{part}"
        assert neox_name(f"gpt_neox.layers.2.attention.query_key_value.{part}") == want
    assert neox_name("model.h.2.attention.dense.biases") == "model.layers.2.self_attn.o_proj.biases"  # mlx_lm's
    assert neox_name("model.embed_out.weight") == "lm_head.weight"
    assert neox_name("transformer.h.0.self_attention.rotary_emb.inv_freq") is None
    assert neox_name("transformer.h.0.ln_mlp.weight") == "model.layers.0.post_attention_layernorm.weight"
    assert gptj_name("transformer.h.0.attn.masked_bias") is None
    assert gptj_name("transformer.h.0.mlp.fc_in.qweight") == "model.layers.0.mlp.up_proj.qweight"
    from lantern.app.models.family_bloom import checkpoint_name as bloom_name

    # bigscience's early files name BLOOM's tensors without "transformer."
    assert bloom_name("h.2.self_attention.query_key_value.bias") == "model.layers.2.self_attn.qkv_proj.bias"
    assert bloom_name("word_embeddings_layernorm.weight") == "model.embed_norm.weight"
    assert bloom_name("transformer.ln_f.bias") == "model.norm.bias"


def test_reorder_keeps_quantized_weights_quantized():
    """A GPTQ-style affine weight and an MLX-packed one are reordered as rows, staying quantized; the identity
    order (Falcon 7B's multi-query layout) returns the weight untouched, FP8 included."""
    from lantern.app.models.quant.affine import Fp8Weight, quantize_affine

    rng = np.random.default_rng(0)
    w = rng.standard_normal((12, 64)).astype(np.float32)
    order = stacked_order(2, 1, 2)  # GPT-NeoX's per-head [q, k, v] of 2 heads of 2 dims
    q = quantize_affine(w, 4, 32)
    moved = reorder_rows(q, order)
    np.testing.assert_array_equal(moved.dequantize(), q.dequantize()[order])
    identity = stacked_order(1, 2, 4)
    fp8 = Fp8Weight(np.zeros((16, 64), np.uint8), np.ones((16, 1), np.float32), None, "FP8")
    assert reorder_rows(fp8, identity) is fp8


@pytest.fixture(scope="module")
def mlx_lm_gpt2(tmp_path_factory):
    """A tiny GPT-2 quantized by mlx_lm (4-bit g32): its nn.Linear matrices under "model.h.*" names. The float
    folder it starts from names its tensors as openai-community/gpt2's file does (h.*, wte, no "transformer.")."""
    pytest.importorskip("mlx_lm")
    from safetensors.torch import load_file, save_file

    from tests.fixtures.teacher_forcing import quantized_by_mlx_lm
    from tests.fixtures.tiny_models import build_model

    out = tmp_path_factory.mktemp("gpt2-mlx-lm")
    # (mlx_lm reads n_ctx, as released configs hold, and makes the MLP 4 x n_embd wide whatever n_inner says)
    src = build_model("gpt2", out / "float", n_inner=256, n_ctx=256)
    stored = load_file(src / "model.safetensors")
    bare = {n.removeprefix("transformer."): t for n, t in stored.items() if n != "lm_head.weight"}
    save_file(bare, src / "model.safetensors", metadata={"format": "pt"})
    return quantized_by_mlx_lm(src, out / "mlx")


def test_4bit_mlx_lm_gpt2_computes_what_mlx_lm_computes(mlx_lm_gpt2, backend):
    """mlx_lm's saved GPT-2 (already transposed, quantized) is not transposed again: its logits are mlx_lm's."""
    from tests.fixtures.teacher_forcing import assert_close_to_mlx_lm

    assert_close_to_mlx_lm(mlx_lm_gpt2, backend, "gpt2")


@pytest.fixture(scope="module")
def mlx_lm_neox(tmp_path_factory):
    """A tiny GPT-NeoX quantized by mlx_lm (4-bit g32): "model.h.*" names, the per-head q/k/v rows as Hugging
    Face's. (mlx_lm computes GPT-NeoX's MLP with the tanh GELU whatever hidden_act says: the folder says so too.)"""
    pytest.importorskip("mlx_lm")
    import json

    from tests.fixtures.teacher_forcing import quantized_by_mlx_lm
    from tests.fixtures.tiny_models import build_model

    out = tmp_path_factory.mktemp("neox-mlx-lm")
    src = build_model("gpt_neox", out / "float", hidden_act="gelu_new", intermediate_size=256)  # (mlx_lm: 4 x hidden)
    cfg = json.loads((src / "config.json").read_text())
    cfg.update(rotary_pct=0.25, rotary_emb_base=10000)  # (the keys mlx_lm reads, as released configs hold them)
    (src / "config.json").write_text(json.dumps(cfg))
    return quantized_by_mlx_lm(src, out / "mlx")


def test_4bit_mlx_lm_gpt_neox_computes_what_mlx_lm_computes(mlx_lm_neox, backend):
    from tests.fixtures.teacher_forcing import assert_close_to_mlx_lm

    assert_close_to_mlx_lm(mlx_lm_neox, backend, "gpt_neox")
