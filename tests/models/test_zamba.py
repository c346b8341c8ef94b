"""Zyphra's Zamba (v1, model_type zamba): multi-head Mamba-1 mixers in every layer, some layers running the one shared
transformer block on [x, embedding] first. The parity suite's `zamba` variant holds the logits and greedy tokens to
transformers' ZambaForCausalLM on both backends; here: grouped KV heads and four mixer heads, a folder repeating the
shared block in every hybrid layer, batched sequences answering as each alone, --isq, the config as ZambaConfig
reads it, and what Lantern cannot compute refused by name."""

from __future__ import annotations

import json
import re

import pytest

from lantern.app.models.errors import UnsupportedModelError
from lantern.app.models.spec import ModelConfig
from tests.models.quant_logits import relaid_folder

SHAPE = {"hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 6, "num_attention_heads": 4}
SHAPE |= {"num_key_value_heads": 2, "n_mamba_heads": 4, "mamba_d_state": 8, "mamba_dt_rank": 6}
TYPES = ["mamba", "hybrid", "mamba", "mamba", "hybrid", "mamba"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    import torch
    from transformers import ZambaConfig, ZambaForCausalLM

    from tests.fixtures.tiny_models import build_tokenizer

    out = tmp_path_factory.mktemp("zamba")
    tokenizer = build_tokenizer(out)
    ids = {"bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id, "pad_token_id": 0}
    config = ZambaConfig(vocab_size=len(tokenizer), layers_block_type=TYPES, tie_word_embeddings=False, **SHAPE, **ids)
    torch.manual_seed(0)
    model = ZambaForCausalLM(config).eval()
    with torch.no_grad():  # (norms, D and the biases start as constants: made to differ per channel)
        for name, p in model.named_parameters():
            if p.dim() == 1 or name.endswith((".D", "dt_proj_bias")):
                p.mul_(1.0 + 0.3 * torch.rand_like(p)).add_(0.05 * torch.randn_like(p))
            elif name.endswith("embed_tokens.weight"):  # (the padding id's row starts at zero: a token like others)
                p[0].normal_(0.0, 0.02)
            elif name.endswith(("x_proj_weight", "dt_proj_weight")):  # (per head: each head's must be its own)
                p.normal_(0.0, 0.3)
    model.save_pretrained(str(out), safe_serialization=True)
    return out, model


def _assert_matches(path, reference, backend) -> None:
    from tests.fixtures.teacher_forcing import assert_serves_like

    def check(cfg):  # one pool layer per hybrid layer; four mixer heads of 16 channels
        assert (cfg.num_layers, cfg.num_kv_layers, cfg.head_dim, cfg.num_kv_heads) == (6, 2, 16, 2)
        assert (cfg.mamba1.heads, cfg.mamba1.inner, cfg.mamba1.dt_rank) == (4, 64, 6)

    assert_serves_like(path, reference, backend, check)


def test_logits_match_transformers(folder, backend):
    _assert_matches(*folder, backend)


def test_a_shared_block_repeated_in_every_hybrid_layer_is_read_once(folder, tmp_path, backend):
    """A folder may store the shared block under every hybrid layer: the first is read, the copies skipped -- here
    made different, so reading one would change the logits."""
    out, model = folder

    def repeat(name, value):
        m = re.fullmatch(r"model\.layers\.1\.shared_transf\.(.+)", name)
        return {name: value} if m is None else {name: value, f"model.layers.4.shared_transf.{m.group(1)}": value + 7}

    relaid_folder(out, tmp_path / "repeated", repeat)
    _assert_matches(tmp_path / "repeated", model, backend)


def test_batched_sequences_answer_as_each_alone(folder, backend):
    from tests.fixtures.teacher_forcing import assert_batch_answers_as_each_alone

    prompts = ["Paged attention stores keys", "blocks", "continuous batching of many requests at once, and"]
    assert_batch_answers_as_each_alone(folder[0], backend, prompts)


def test_isq_keeps_the_head_wise_projections_float_and_serves(folder):
    """--isq q8 quantizes the 2-D matrices (in_proj, out_proj, the shared block, the linears); each head's x_proj
    and dt_proj stay as stored; greedy tokens as the float model's for a few steps."""
    from torch import nn

    from lantern.app.engine import LLM, SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    prompt = "Paged attention stores keys and values in blocks"
    outs = []
    for quantization in (None, "q8"):
        llm = LLM(str(folder[0]), backend="torch", dtype="float32", quantization=quantization)
        try:
            outs.append(llm.generate([prompt], params)[0].outputs[0].token_ids)
            mixer = llm.engine.backend.model.model.layers[0].mamba
            assert isinstance(mixer.in_proj, nn.Linear) == (quantization is None)  # (quantized: another layer)
            assert isinstance(mixer.x_proj_weight, nn.Parameter) and mixer.x_proj_weight.dim() == 3
        finally:
            llm.engine.shutdown()
    assert outs[0] == outs[1]


def test_a_quantized_in_proj_is_deinterleaved_in_its_own_format():
    """A pre-quantized in_proj (a GPTQ / AWQ / FP8 folder's, read as AffineWeight) gets the float weight's row order:
    [x rows | gate rows] out of the checkpoint's interleaved [x_0, z_0, x_1, z_1, ...]."""
    from types import SimpleNamespace

    import numpy as np

    from lantern.app.models.family_zamba import checkpoint_tensors
    from lantern.app.models.quant.affine import quantize_affine

    inner = 4
    spec = SimpleNamespace(config=SimpleNamespace(mamba1=SimpleNamespace(inner=inner)))
    rows = np.arange(2 * inner, dtype=np.float32)[:, None] * np.ones((1, 32), dtype=np.float32)
    name = "model.layers.0.mamba.in_proj.weight"
    (_, plain), (_, quantized) = (
        next(checkpoint_tensors(iter([(name, value)]), spec)) for value in (rows, quantize_affine(rows, 8, 32))
    )
    assert plain[:, 0].tolist() == [0, 2, 4, 6, 1, 3, 5, 7]
    np.testing.assert_allclose(quantized.dequantize(), plain, atol=0.05)


def _base(**extra) -> dict:
    return {"model_type": "zamba", "vocab_size": 300, **SHAPE, "layers_block_type": TYPES, **extra}


def test_the_config_reads_as_zamba_config_reads_it():
    from transformers import ZambaConfig

    ref = ZambaConfig(**{k: v for k, v in _base().items() if k != "model_type"})
    cfg = ModelConfig.from_hf(json.loads(ref.to_json_string()))  # (transformers' saved names: linear_attention)
    hybrid = tuple(i for i, t in enumerate(ref.layers_block_type) if t == "hybrid")
    assert cfg.head_dim == ref.attention_head_dim and cfg.num_kv_heads == ref.num_key_value_heads
    assert cfg.zamba2.hybrid_layers == hybrid and cfg.kv_layers == 2
    assert cfg.attn_scale == pytest.approx((ref.attention_head_dim / 2) ** -0.5)
    assert cfg.rope_layers == (False,) * 6 and cfg.tie_word_embeddings
    # the defaults: Zamba-7B's shape and ZambaConfig's own hybrid-layer schedule
    released = ZambaConfig()
    cfg = ModelConfig.from_hf({"model_type": "zamba"})
    assert (cfg.hidden_size, cfg.num_layers, cfg.head_dim) == (3712, 76, released.attention_head_dim)
    assert cfg.mamba1.dt_rank == released.mamba_dt_rank and cfg.mamba1.heads == released.n_mamba_heads
    assert cfg.zamba2.hybrid_layers == tuple(i for i, t in enumerate(released.layers_block_type) if t == "hybrid")
    assert cfg.intermediate_size == released.intermediate_size and cfg.hidden_act == "gelu"


@pytest.mark.parametrize(
    "extra, key",
    [
        ({"attention_hidden_size": 48}, "attention_hidden_size"),
        ({"n_mamba_heads": 3}, "n_mamba_heads"),
        ({"layers_block_type": ["mamba"] * 6}, "layers_block_type"),
        ({"layers_block_type": ["mamba", "attention"] * 3}, "layers_block_type"),
        ({"hidden_mamba_act": "gelu"}, "hidden_mamba_act"),
        ({"hidden_act": "relu"}, "hidden_act"),
    ],
)
def test_what_it_cannot_compute_is_refused_by_name(extra, key):
    with pytest.raises(UnsupportedModelError, match=key):
        ModelConfig.from_hf(_base(**extra))
