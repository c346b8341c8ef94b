"""GLM-4 (and the partial rotary it shares with Phi-3 / Phi-4-mini): config.json read as
transformers' Glm4Config reads it (defaults included), refusals naming the key, the rope of both
backends against transformers' own apply_rotary_pos_emb, and end-to-end runs the conformance
variants do not cover (Phi-3 with partial rotary, tied and quantized GLM-4, two torch ranks).

Logits and greedy tokens of the glm4 variant against transformers run in tests/conformance."""

from __future__ import annotations

import copy
import re

import numpy as np
import pytest
import torch

from lantern.app.engine import LLM, SamplingParams
from lantern.app.models.spec import ModelConfig, UnsupportedModelError
from tests.conformance.test_parity import PROMPT, hf_greedy, hf_model
from tests.fixtures.teacher_forcing import teacher_forced_logits
from tests.fixtures.tiny_models import build_model

BASE = {"vocab_size": 400, "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4}


def ours(model_type: str = "glm4", **extra) -> ModelConfig:
    return ModelConfig.from_hf({"model_type": model_type, "num_hidden_layers": 2, **BASE, **extra})


def hf(model_type: str = "glm4", **extra):
    """transformers' config of the same keys, read as from_pretrained reads a config.json."""
    from transformers import AutoConfig

    cls = type(AutoConfig.for_model(model_type, num_hidden_layers=2, **BASE))
    extra = copy.deepcopy(extra)  # transformers fills defaults into the dicts it is given
    return cls.from_dict({"model_type": model_type, "num_hidden_layers": 2, **BASE, **extra})


def partial(config: ModelConfig) -> float:
    return (config.rope_scaling or {}).get("partial_rotary_factor", 1.0)


# ---- config.json -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "keys",
    [
        {},  # Glm4Config's defaults: head_dim 128, 2 KV heads, factor 0.5, eps 1.5625e-7, biases
        {"head_dim": 16, "num_key_value_heads": 4, "partial_rotary_factor": 0.25, "attention_bias": False},
        {"head_dim": 32, "partial_rotary_factor": 1.0, "rms_norm_eps": 1e-5, "max_position_embeddings": 512},
        # rope_parameters' factor wins over the top-level key, as in transformers
        {
            "head_dim": 16,
            "partial_rotary_factor": 0.75,
            "rope_parameters": {"rope_theta": 500.0, "partial_rotary_factor": 0.25},
        },
        {"head_dim": 16, "rope_scaling": {"rope_type": "yarn", "factor": 4.0}},
        {"head_dim": 16, "eos_token_id": 7, "tie_word_embeddings": True},
    ],
    ids=["defaults", "explicit", "full-rotary", "precedence", "yarn", "eos-tied"],
)
def test_config_matches_transformers(keys):
    config, ref = ours(**keys), hf(**keys)
    assert config.family == "glm4"
    assert config.head_dim == ref.head_dim
    assert config.num_kv_heads == ref.num_key_value_heads
    assert config.rms_norm_eps == ref.rms_norm_eps
    assert config.max_position_embeddings == ref.max_position_embeddings
    assert config.attention_bias == ref.attention_bias
    assert config.tie_word_embeddings == ref.tie_word_embeddings
    assert config.rope_theta == ref.rope_parameters["rope_theta"]
    assert partial(config) == ref.rope_parameters["partial_rotary_factor"]
    eos = ref.eos_token_id
    assert config.eos_token_ids == ([eos] if isinstance(eos, int) else eos)
    assert (config.rope_scaling or {}).get("rope_type", "default") == ref.rope_parameters["rope_type"]
    if ref.rope_parameters["rope_type"] == "yarn":
        assert (
            config.rope_scaling["original_max_position_embeddings"]
            == ref.rope_parameters["original_max_position_embeddings"]
        )


def test_phi3_partial_rotary_is_read_and_plain_phi3_unchanged():
    assert partial(ours("phi3", partial_rotary_factor=0.75)) == 0.75  # Phi-4-mini
    assert ours("phi3").rope_scaling is None


@pytest.mark.parametrize(
    "model_type, extra, key",
    [
        ("glm4", {"hidden_act": "gelu"}, 'hidden_act="gelu"'),
        ("glm4", {"head_dim": 12, "partial_rotary_factor": 0.25}, "partial_rotary_factor=0.25"),  # 3 dims: odd
        ("glm4", {"head_dim": 16, "rope_scaling": {"rope_type": "longrope", "factor": 2.0}}, "rope_scaling.rope_type"),
        (
            "glm4",
            {"head_dim": 16, "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "attention_factor": -0.5}},
            "rope_scaling.attention_factor=-0.5",
        ),
        ("glm4", {"num_key_value_heads": 3}, "num_key_value_heads=3"),
        # The other families' attention rotates the whole head in transformers: still refused.
        ("llama", {"partial_rotary_factor": 0.5}, "partial_rotary_factor=0.5"),
        ("qwen2", {"partial_rotary_factor": 0.5}, "partial_rotary_factor=0.5"),
    ],
)
def test_refusals_name_the_key(model_type, extra, key):
    with pytest.raises(UnsupportedModelError, match=re.escape(key)):
        ours(model_type, **extra)


# ---- partial rotary vs transformers' apply_rotary_pos_emb -----------------------------------------
ROPES = {
    "default": {"rope_theta": 10000.0},
    "linear": {"rope_type": "linear", "factor": 4.0, "rope_theta": 10000.0},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64, "rope_theta": 10000.0},
    "llama3": {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 32,
        "rope_theta": 500000.0,
    },
}


def hf_rotary(model_type: str, keys: dict, q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor):
    """transformers' rotary embedding module and apply_rotary_pos_emb of the family; q, k [T, H, D]."""
    import importlib

    module = importlib.import_module(f"transformers.models.{model_type}.modeling_{model_type}")
    prefix = {"glm4": "Glm4", "phi3": "Phi3"}[model_type]
    emb = getattr(module, f"{prefix}RotaryEmbedding")(hf(model_type, **keys))
    cos, sin = emb(q, positions[None])
    # transformers' layout: [batch, heads, T, D]
    q_ref, k_ref = module.apply_rotary_pos_emb(q.transpose(0, 1)[None], k.transpose(0, 1)[None], cos, sin)
    return q_ref[0].transpose(0, 1), k_ref[0].transpose(0, 1)


CASES = [("glm4", 0.5, r) for r in ROPES] + [("glm4", 0.25, "default"), ("phi3", 0.75, "default")]


@pytest.mark.parametrize("model_type, factor, rope", CASES, ids=[f"{m}-{f}-{r}" for m, f, r in CASES])
def test_partial_rotary_matches_transformers_on_both_backends(model_type, factor, rope):
    import mlx.core as mx

    from lantern.backends.mlx.layers import Attention as MlxAttention
    from lantern.backends.torch.layers import apply_rotary, rope_tables, rotary_dim

    keys = {"head_dim": 16, "num_key_value_heads": 2, "partial_rotary_factor": factor, "rope_parameters": ROPES[rope]}
    if model_type == "phi3":
        keys.pop("head_dim")  # Phi-3 has head_dim = hidden_size // heads = 16
    config = ours(model_type, **keys)
    assert rotary_dim(config) == int(16 * factor)
    interleaved = model_type == "glm4"
    torch.manual_seed(0)
    positions = torch.tensor([0, 1, 2, 7, 40, 41, 100, 250])  # tokens of different sequences, any order
    q, k = torch.randn(8, 4, 16), torch.randn(8, 2, 16)
    q_ref, k_ref = hf_rotary(model_type, keys, q, k, positions)
    assert not torch.allclose(q_ref[..., : rotary_dim(config)], q[..., : rotary_dim(config)])  # it rotates

    cos, sin = rope_tables(config, 256, torch.device("cpu"))
    for x, ref in ((q, q_ref), (k, k_ref)):
        got = apply_rotary(x, cos[positions], sin[positions], interleaved)
        torch.testing.assert_close(got, ref, atol=1e-5, rtol=0)
        # and the layout matters: the other one is wrong (the dims past rotary_dim pass through)
        assert not torch.allclose(apply_rotary(x, cos[positions], sin[positions], not interleaved), ref, atol=1e-3)

    def mlx_rope(x: torch.Tensor, layout: bool) -> np.ndarray:
        rope = MlxAttention(config, 0, rope_interleaved=layout).rope
        return np.array(rope(mx.array(x.numpy())[:, :, None, :], offset=mx.array(positions.numpy()))[:, :, 0, :])

    for x, ref in ((q, q_ref), (k, k_ref)):
        # mx.fast.rope forms its angles its own way: at position 250 float32 holds them to ~1.5e-5 rad.
        np.testing.assert_allclose(mlx_rope(x, interleaved), ref.numpy(), atol=1e-4, rtol=0)
        assert np.abs(mlx_rope(x, not interleaved) - ref.numpy()).max() > 1e-2


# ---- end to end: what the conformance variants do not cover ---------------------------------------
def _parity(path: str, backend: str, steps: int = 33, **options) -> None:
    """Logits within 1e-4 of transformers through a paged cache (block size 4, chunked prefill),
    then 64 greedy tokens identical to its generate()."""
    llm = LLM(path, backend=backend, dtype="float32", block_size=4, prefill_chunk_size=8, num_kv_blocks=64, **options)
    try:
        prompt_ids = llm.tokenizer.encode(PROMPT)
        ref_model = hf_model(path)
        ref_tokens = hf_greedy(ref_model, prompt_ids, 64)
        with torch.no_grad():
            ref_logits = ref_model(torch.tensor([prompt_ids + ref_tokens[:steps]])).logits[0].numpy()
        compared = 0
        for pos, row in teacher_forced_logits(llm.engine, prompt_ids, ref_tokens[:steps]):
            np.testing.assert_allclose(row, ref_logits[pos], atol=1e-4, rtol=0)
            compared += 1
        assert compared == steps
        out = llm.generate([prompt_ids], SamplingParams(temperature=0, max_tokens=64, ignore_eos=True))
        assert out[0].outputs[0].token_ids == ref_tokens
        assert len(set(ref_tokens)) > 8, "degenerate reference"
    finally:
        llm.engine.shutdown()


@pytest.fixture(scope="module")
def phi3_partial(tmp_path_factory) -> str:
    # Phi-4-mini's rotary (rotate_half on the first 3/4 of each head) on the tiny phi3 variant.
    return str(build_model("phi3", tmp_path_factory.mktemp("phi3_partial"), partial_rotary_factor=0.75))


@pytest.fixture(scope="module")
def glm4_tied(tmp_path_factory) -> str:
    return str(build_model("glm4", tmp_path_factory.mktemp("glm4_tied"), tie_word_embeddings=True))


@pytest.mark.parametrize("backend", ["mlx", "torch"])
def test_phi3_partial_rotary_matches_transformers(phi3_partial, backend):
    _parity(phi3_partial, backend)


@pytest.mark.parametrize("backend", ["mlx", "torch"])
def test_glm4_tied_embeddings_match_transformers(glm4_tied, backend):
    _parity(glm4_tied, backend, steps=9)


def test_glm4_two_torch_ranks_match_transformers(tiny_model_dir):
    """Half the heads (biases, partial rope) and half the MLP per rank, post-sublayer norms replicated."""
    _parity(tiny_model_dir("glm4"), "torch", steps=9, tensor_parallel_size=2)


def test_glm4_isq_q8_on_mlx_matches_the_dequantized_reference(glm4_tied, tmp_path):
    """The quantized (tied) embedding and the split gate/up of a fused checkpoint stay quantized."""
    from pathlib import Path

    from lantern.app.models.quant.affine import quantize_affine
    from tests.models.quant_logits import logits_error, reference_folder, tolerance

    def quantized(name, w):
        return w if w.ndim != 2 else quantize_affine(w.astype("float32"), 8, 32).dequantize()

    ref = reference_folder(Path(glm4_tied), tmp_path / "ref", quantized)
    err = logits_error(glm4_tied, str(ref), "mlx", quantization="q8")
    assert err <= tolerance("mlx", str(ref)), err
    assert logits_error(glm4_tied, str(ref), "mlx") > err  # the quantization is real


_TRITON_CHECK = """
import torch
from unittest import mock
from transformers.models.glm4.modeling_glm4 import apply_rotary_pos_emb
from lantern.backends.torch.layers import apply_rotary

torch.manual_seed(0)
freqs = torch.outer(torch.tensor([0.0, 3.0, 41.0]), 1.0 / 10000 ** (torch.arange(0, 8, 2) / 8))
cos, sin = torch.cat([freqs, freqs], -1).cos(), torch.cat([freqs, freqs], -1).sin()
q = torch.randn(3, 4, 16)
ref = apply_rotary_pos_emb(q.transpose(0, 1)[None], q.transpose(0, 1)[None], cos[None], sin[None])[0][0].transpose(0, 1)
with mock.patch("lantern.backends.torch.kernels.ops.use_triton", lambda t: True):
    got = apply_rotary(q, cos, sin, interleaved=True)
torch.testing.assert_close(got, ref, atol=1e-5, rtol=0)
print("ok")
"""


def test_partial_interleaved_rotary_through_the_triton_kernel():
    """CUDA's path: the Triton rope kernel on the first rotary_dim dims (a strided slice), run in
    Triton's interpreter in a fresh process (TRITON_INTERPRET must be set before triton loads)."""
    import os
    import subprocess
    import sys

    pytest.importorskip("triton")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    out = subprocess.run([sys.executable, "-c", _TRITON_CHECK], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-2000:]
