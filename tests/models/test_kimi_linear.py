"""Kimi Linear (kimi_linear): Kimi Delta Attention layers (a decay per key channel) between rope-less latent-attention
layers, DeepSeek-V3's mixture. Tiny random models built and saved by transformers' KimiLinearForCausalLM (its
block_sparse_moe / w1-w3 names and split convolutions as it saves them); Lantern's logits equal transformers'
through the paged cache and the recurrent-state slots (prefill in chunks, then decode; one prompt longer than the
64-token chunk of the delta rule) on both backends, for transformers' config and the released remote-code config;
the KDA rule itself against transformers' reference implementation."""

from __future__ import annotations

import json

import numpy as np
import pytest

from lantern.app.models.errors import UnsupportedModelError
from lantern.app.models.spec import ModelConfig
from tests.fixtures.gguf_kimi_linear import LAYERS, SHAPE, kimi_linear_folder


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return kimi_linear_folder(tmp_path_factory.mktemp("kimi_linear"))


@pytest.fixture(scope="module")
def one_group_folder(tmp_path_factory):
    """The released models' routing: one expert group (all llama.cpp's kimi-linear graph computes)."""
    return kimi_linear_folder(tmp_path_factory.mktemp("kimi_linear_one_group"), n_group=1)


def _assert_matches(folder, reference, backend, repeat: int = 1, chunk: int = 8) -> None:
    """`repeat`: the test prompt that many times over (in one prefill chunk of `chunk` tokens)."""
    from lantern.app.engine import LLM
    from tests.conformance.test_parity import PROMPT
    from tests.fixtures.teacher_forcing import assert_matches_reference

    llm = LLM(str(folder), backend=backend, dtype="float32", block_size=4, prefill_chunk_size=chunk, num_kv_blocks=96)
    try:
        cfg = llm.engine.model_config
        assert cfg.num_kv_layers == 1 and cfg.mla is not None and not cfg.mla.rope
        prompt = " ".join([PROMPT] * repeat)
        assert repeat == 1 or 128 < len(llm.tokenizer.encode(prompt)) <= chunk
        assert_matches_reference(llm, reference, prompt, steps=8, atol=2e-4)
    finally:
        llm.engine.shutdown()


def test_logits_match_transformers(folder, backend):
    _assert_matches(*folder, backend)


def test_a_prompt_longer_than_the_delta_rules_chunk(folder, backend):
    """Over 128 prompt tokens in one prefill chunk: three of the rule's 64-token chunks, the state carried across."""
    _assert_matches(*folder, backend, repeat=6, chunk=256)


def test_the_released_config_reads_as_transformers_reads_it(folder, tmp_path, backend):
    """moonshotai's config.json: the remote code's names (linear_attn_config with 1-based kda_layers /
    full_attn_layers, num_experts, num_experts_per_token, model_max_length, first_k_dense_replace, ...)."""
    out, model = folder
    _assert_matches(_released(out, tmp_path / "released"), model, backend)


@pytest.fixture(scope="module")
def mlx_lm_folders(folder, tmp_path_factory):
    """mlx_lm's conversions of the released folder (mlx-community's layout: convolutions as MLX's [C, K, 1] under
    q_conv.conv, experts stacked in switch_mlp, the router's bias beside it, kv_b_proj as per-head embed_q /
    unembed_out): float, and 4-bit affine g32."""
    pytest.importorskip("mlx_lm")
    from mlx_lm.utils import load, quantize_model, save

    root = tmp_path_factory.mktemp("kimi_mlx_lm")
    released = _released(folder[0], root / "released")
    made = {}
    for mode in (None, "affine"):
        model, tokenizer, config = load(str(released), return_config=True)
        if mode is not None:
            model, config = quantize_model(model, config, 32, 4, mode=mode)
        made[mode] = root / f"mlx-{mode or 'float'}"
        save(made[mode], str(released), model, tokenizer, config)
    return made


def test_an_mlx_lm_float_folder_equals_the_original_model(mlx_lm_folders, folder, backend):
    _assert_matches(mlx_lm_folders[None], folder[1], backend)


def test_an_mlx_lm_4bit_folder_computes_what_mlx_lm_computes(mlx_lm_folders, backend):
    from lantern.app.engine import LLM
    from tests.fixtures.teacher_forcing import mlx_lm_error

    path = mlx_lm_folders["affine"]
    llm = LLM(str(path), backend=backend, dtype="float32", block_size=4, prefill_chunk_size=8, num_kv_blocks=64)
    try:
        worst, scale = mlx_lm_error(llm, path, "Paged attention stores keys and values in blocks", [5, 17, 42, 99, 7])
    finally:
        llm.engine.shutdown()
    assert worst < (2e-3 if backend == "mlx" else 2e-2) * scale  # torch: activations in bf16 in its int4 kernel


def test_the_kda_rule_matches_transformers_reference():
    """Lantern's chunked KDA (torch and MLX) against transformers' token-by-token reference, state carried in."""
    import mlx.core as mx
    import torch
    from transformers.models.kimi_linear.modeling_kimi_linear import recurrent_kimi_delta_attention

    from lantern.backends.mlx import kimi_delta as mlx_kda
    from lantern.backends.torch import gated_delta, kimi_delta

    torch.manual_seed(0)
    length, heads, dim = 150, 3, 16
    q, k, v = (torch.randn(length, heads, dim) for _ in range(3))
    g, beta, s0 = -4 * torch.rand(length, heads, dim), torch.rand(length, heads), torch.randn(heads, dim, dim)
    ref, ref_state = recurrent_kimi_delta_attention(
        q[None], k[None], v[None], g[None], beta[None], s0[None], True, use_qk_l2norm_in_kernel=True
    )
    qn, kn = gated_delta.l2norm(q) * dim**-0.5, gated_delta.l2norm(k)
    out, state = kimi_delta.chunked(qn, kn, v, g, beta, s0)
    np.testing.assert_allclose(out.numpy(), ref[0].numpy(), atol=1e-5)
    np.testing.assert_allclose(state.numpy(), ref_state[0].numpy(), atol=1e-5)
    a = lambda t: mx.array(t.numpy())
    mlx_out, mlx_state = mlx_kda.chunked(a(qn), a(kn), a(v), a(g), a(beta), a(s0))
    np.testing.assert_allclose(np.array(mlx_out), ref[0].numpy(), atol=1e-5)
    np.testing.assert_allclose(np.array(mlx_state), ref_state[0].numpy(), atol=1e-5)


def _base(**extra) -> dict:
    return {"model_type": "kimi_linear", "vocab_size": 300, "layer_types": LAYERS, **SHAPE, **extra}


@pytest.mark.parametrize(
    "extra, key",
    [
        ({"mla_use_nope": False}, "mla_use_nope"),
        ({"moe_router_activation_func": "softmax"}, "moe_router_activation_func"),
        ({"hidden_act": "gelu"}, "hidden_act"),
        ({"num_key_value_heads": 2}, "num_key_value_heads"),
        ({"layer_types": ["linear_attention"] * 4}, "layer_types"),
        ({"num_experts_per_tok": 9}, "num_experts_per_token"),
    ],
)
def test_what_it_cannot_compute_is_refused_by_name(extra, key):
    with pytest.raises(UnsupportedModelError, match=key):
        ModelConfig.from_hf(_base(**extra))


def test_tensor_parallelism_is_refused():
    from lantern.backends.torch.parallel import local_config

    with pytest.raises(ValueError, match="tensor parallelism"):
        local_config(ModelConfig.from_hf(_base()), 2)


@pytest.mark.parametrize("scheme", ["q4", "q8"])
def test_isq_matches_the_dequantized_reference(folder, tmp_path, backend, scheme, caplog):
    """--isq: KDA's projections, the latent attention's and the experts quantized (routers and kv_b_proj exact, the
    narrow ones kept in float), every matrix counted by the progress bar."""
    from tests.models.quant_logits import assert_isq_matches_reference

    assert_isq_matches_reference(folder[0], tmp_path / "ref", backend, scheme, caplog)


def test_llama_cpp_gguf_matches_transformers(one_group_folder, tmp_path, backend):
    """The folder as llama.cpp's KimiLinearModel converts it: the same logits, its latents normed with the model's
    eps as llama.cpp norms them (the reference's kv_a_layernorm eps set to match)."""
    import copy

    from tests.fixtures.gguf_kimi_linear import convert_kimi_linear

    out, model = one_group_folder
    reference = copy.deepcopy(model)
    for layer in reference.model.layers:
        norm = getattr(layer.self_attn, "kv_a_layernorm", None)
        if norm is not None:
            norm.variance_epsilon = reference.config.rms_norm_eps
    _assert_matches(convert_kimi_linear(out, tmp_path / "tiny-kimi-linear.gguf"), reference, backend)


def _released(folder, out):
    """The folder as moonshotai publishes it: the remote code's config (linear_attn_config, first_k_dense_replace,
    ...) and the dense layer's MLP under `mlp` (transformers saves it under block_sparse_moe)."""
    from safetensors.numpy import load_file, save_file

    out.mkdir()
    for f in folder.iterdir():
        if f.name != "model.safetensors":
            (out / f.name).write_bytes(f.read_bytes())
    cfg = json.loads((folder / "config.json").read_text())
    for key in ("layer_types", "mlp_layer_types", "linear_head_dim", "linear_num_heads", "linear_conv_kernel_dim"):
        cfg.pop(key)
    cfg["linear_attn_config"] = {
        "head_dim": SHAPE["linear_head_dim"],
        "num_heads": SHAPE["linear_num_heads"],
        "short_conv_kernel_size": 4,
        "kda_layers": [i + 1 for i, t in enumerate(LAYERS) if t == "linear_attention"],
        "full_attn_layers": [i + 1 for i, t in enumerate(LAYERS) if t == "full_attention"],
    }
    cfg |= {"first_k_dense_replace": 1, "mla_use_nope": True, "moe_router_activation_func": "sigmoid"}
    cfg |= {"moe_layer_freq": 1, "use_grouped_topk": True, "rope_theta": 10000.0}
    (out / "config.json").write_text(json.dumps(cfg))
    weights = load_file(str(folder / "model.safetensors"))
    dense = {k.replace(".layers.0.block_sparse_moe.", ".layers.0.mlp."): v for k, v in weights.items()}
    save_file(dense, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


def test_sequences_batched_together_decode_as_each_alone(folder, backend):
    """Three prompts of different lengths in one batch (their KDA states in separate slots, decode rows stepped
    together): each one's greedy tokens are those it gets alone."""
    from tests.fixtures.teacher_forcing import assert_batch_answers_as_each_alone

    prompts = ["Paged attention stores keys", "Continuous batching keeps the GPU busy while", "A"]
    assert_batch_answers_as_each_alone(folder[0], backend, prompts)
