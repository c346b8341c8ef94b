"""Qwen3-Next / Qwen3.5: config.json read as transformers' config classes read it, a Qwen3.5
vision-language folder served as its language model, refusals naming the key, and the gated delta
rule's chunked form against its token-by-token recurrence on both backends. Logits and greedy tokens
run in tests/conformance (qwen3_next, qwen3_5 variants), the engine's state handling in
tests/conformance/test_recurrent_state.py."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from lantern.app.models.spec import ModelConfig, UnsupportedModelError

SMALL = {"vocab_size": 400, "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2}


def hf(model_type: str, **extra):
    from transformers import AutoConfig

    return AutoConfig.for_model(model_type, **SMALL, **extra)


@pytest.mark.parametrize(
    "model_type,extra",
    [
        ("qwen3_next", {"num_hidden_layers": 8}),
        ("qwen3_next", {"num_hidden_layers": 6, "full_attention_interval": 3, "mlp_only_layers": [0, 1]}),
        ("qwen3_next", {"num_hidden_layers": 4, "decoder_sparse_step": 2, "num_experts": 16}),
        ("qwen3_5_text", {"num_hidden_layers": 8}),
        ("qwen3_5_moe_text", {"num_hidden_layers": 4, "layer_types": ["linear_attention", "full_attention"] * 2}),
    ],
)
def test_config_matches_transformers(model_type, extra):
    ref = hf(model_type, **extra)
    cfg = ModelConfig.from_hf(ref.to_dict())
    la = cfg.linear_attn
    assert [t == "linear_attention" for t in ref.layer_types] == list(la.linear_layers)
    assert (cfg.head_dim, la.num_k_heads, la.num_v_heads, la.k_dim, la.v_dim, la.conv_kernel) == (
        ref.head_dim,
        ref.linear_num_key_heads,
        ref.linear_num_value_heads,
        ref.linear_key_head_dim,
        ref.linear_value_head_dim,
        ref.linear_conv_kernel_dim,
    )
    assert cfg.rope_scaling["partial_rotary_factor"] == ref.rope_parameters["partial_rotary_factor"] == 0.25
    assert cfg.rope_theta == ref.rope_parameters["rope_theta"]
    assert cfg.num_kv_layers == ref.layer_types.count("full_attention")
    if model_type == "qwen3_5_text":
        assert cfg.moe is None
        return
    # transformers' decoder-layer rule for which MLPs are sparse
    sparse = [
        i not in (getattr(ref, "mlp_only_layers", None) or []) and (i + 1) % getattr(ref, "decoder_sparse_step", 1) == 0
        for i in range(ref.num_hidden_layers)
    ]
    assert [cfg.moe.is_sparse(i) for i in range(ref.num_hidden_layers)] == sparse
    assert (cfg.moe.num_experts, cfg.moe.top_k, cfg.moe.shared_expert_size) == (
        ref.num_experts,
        ref.num_experts_per_tok,
        ref.shared_expert_intermediate_size,
    )


def test_yarn_beside_mrope_keys_reads_as_transformers(tmp_path):
    """Qwen's long-context recipe: YaRN in rope_parameters next to Qwen3.5's mrope keys, on 25% of each head."""
    rope = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 262144, "rope_theta": 1e7}
    rope.update(partial_rotary_factor=0.25, mrope_section=[11, 11, 10], mrope_interleaved=True)
    cfg = ModelConfig.from_hf({**hf("qwen3_5_text", num_hidden_layers=4).to_dict(), "rope_parameters": rope})
    assert cfg.rope_scaling == {
        "rope_type": "yarn",
        "factor": 4.0,
        "original_max_position_embeddings": 262144,
        "partial_rotary_factor": 0.25,
    }


def test_tensor_parallelism_is_refused_before_any_rank_starts():
    from lantern.backends.torch.parallel import local_config

    cfg = ModelConfig.from_hf(hf("qwen3_5_text", num_hidden_layers=4).to_dict())
    with pytest.raises(ValueError, match="linear-attention"):
        local_config(cfg, 2)


@pytest.mark.parametrize(
    "extra,key",
    [
        ({"hidden_act": "gelu"}, "hidden_act"),
        ({"attention_bias": True}, "attention_bias"),
        ({"linear_num_value_heads": 24}, "linear_num_value_heads"),
        ({"layer_types": ["linear_attention"] * 3}, "layer_types"),
        ({"linear_conv_kernel_dim": 1}, "linear_conv_kernel_dim"),
        ({"attn_output_gate": False}, "attn_output_gate"),
        ({"layer_types": ["linear_attention"] * 4}, "layer_types"),
        ({"rope_parameters": {"rope_type": "default", "rope_theta": 1e6, "partial_rotary_factor": 0.1}}, "partial"),
    ],
)
def test_unimplemented_keys_are_refused_by_name(extra, key):
    cfg = {"model_type": "qwen3_next", "num_hidden_layers": 4, "intermediate_size": 128, "head_dim": 16, **SMALL}
    with pytest.raises(UnsupportedModelError, match=key):
        ModelConfig.from_hf({**cfg, **extra})


def test_qwen35_vision_language_folder_serves_its_language_model(tiny_model_dir, tmp_path, backend):
    """A Qwen3_5ForConditionalGeneration folder (text_config, model.language_model.* names, a vision
    tower and MTP weights beside) gives the text model's tokens."""
    from tests.fixtures.teacher_forcing import assert_same_greedy
    from tests.fixtures.tiny_models import vision_language_folder

    src = Path(tiny_model_dir("qwen3_5"))
    wrapper = {
        "model_type": "qwen3_5",
        "architectures": ["Qwen3_5ForConditionalGeneration"],
        # the text model is tied; text_config saying otherwise is overruled by the wrapper's key, as transformers does
        "text_config": {"tie_word_embeddings": False},
        "vision_config": {"depth": 1},
        "tie_word_embeddings": True,
    }
    extra = {"model.visual.blocks.0.attn.qkv.weight": torch.ones(3, 3), "mtp.fc.weight": torch.ones(4, 4)}
    assert_same_greedy(vision_language_folder(src, tmp_path, wrapper, extra), src, backend)


def _inputs(length: int, case: str, heads: int = 2, dk: int = 128, dv: int = 64, seed: int = 0):
    """random: independent keys, decays down to -2 per token. repeated: one key over and over with a
    near-1 decay and beta (a run of repeated tokens through the convolution), where a power-series
    inverse of the chunk's triangular system loses everything to cancellation."""
    gen = torch.Generator().manual_seed(seed)
    unit = lambda t: torch.nn.functional.normalize(t, dim=-1)
    q = unit(torch.randn(length, heads, dk, generator=gen)) * dk**-0.5
    v = torch.randn(length, heads, dv, generator=gen)
    if case == "repeated":
        k = unit(torch.ones(length, heads, dk) + 0.05 * torch.randn(length, heads, dk, generator=gen))
        g, beta = torch.full((length, heads), -1e-3), torch.full((length, heads), 0.999)
    else:
        k = unit(torch.randn(length, heads, dk, generator=gen))
        g, beta = -torch.rand(length, heads, generator=gen) * 2, torch.rand(length, heads, generator=gen)
    return q, k, v, g, beta, 0.3 * torch.randn(heads, dk, dv, generator=gen)


def _recurrence64(q, k, v, g, beta, state):
    """The token-by-token rule in float64: the reference both chunked forms are held to."""
    q, k, v, g, beta, s = (t.double() for t in (q, k, v, g, beta, state))
    outs = []
    for t in range(q.shape[0]):
        s = s * g[t].exp()[:, None, None]
        delta = (v[t] - torch.einsum("hkv,hk->hv", s, k[t])) * beta[t][:, None]
        s = s + k[t][:, :, None] * delta[:, None, :]
        outs.append(torch.einsum("hkv,hk->hv", s, q[t]))
    return torch.stack(outs).numpy(), s.numpy()


@pytest.mark.parametrize(
    "length,case", [(1, "random"), (63, "random"), (65, "random"), (200, "random"), (256, "repeated")]
)
def test_chunked_delta_rule_equals_the_recurrence(length, case, backend):
    """The chunked (WY) form with block-doubled triangular inverses vs the float64 token loop, from a
    non-zero state; the torch token step too."""
    from lantern.backends.torch import gated_delta as reference

    q, k, v, g, beta, state = _inputs(length, case)
    want_out, want_state = _recurrence64(q, k, v, g, beta, state)
    if backend == "mlx":
        import mlx.core as mx

        from lantern.backends.mlx import gated_delta

        got = gated_delta.chunked(*(mx.array(t.numpy()) for t in (q, k, v, g, beta, state)))
        got_out, got_state = (np.array(a) for a in got)
    else:
        got_out, got_state = (t.numpy() for t in reference.chunked(q, k, v, g, beta, state))
        s, outs = state[None], []
        for t in range(length):
            o, s = reference.recurrent_step(q[t : t + 1], k[t : t + 1], v[t : t + 1], g[t : t + 1], beta[t : t + 1], s)
            outs.append(o)
        np.testing.assert_allclose(torch.cat(outs).numpy(), want_out, atol=2e-5, rtol=0)
    np.testing.assert_allclose(got_out, want_out, atol=2e-5, rtol=0)
    np.testing.assert_allclose(got_state, want_state, atol=2e-5, rtol=0)
