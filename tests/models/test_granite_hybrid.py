"""Granite 4.0-H ("granitemoehybrid"): its config.json read as transformers' GraniteMoeHybridConfig and
its modules read it (released form: layer types "mamba" / "attention", time_step_limit with an Infinity;
transformers 5's saved form), refusals in one line naming the key, and the Mamba-2 scan itself: the
chunked form of each backend against the token-by-token recurrence over several chunks, from a state.
Logits and greedy tokens against transformers run in tests/conformance (granite_hybrid, granite_hybrid_moe)
and tests/conformance/test_recurrent_state.py; serving in tests/server/test_hybrid_serving.py."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from lantern.app.models.errors import UnsupportedModelError
from lantern.app.models.spec import ModelConfig

RELEASED = {  # granite-4.0-h-tiny's shape, scaled down
    "model_type": "granitemoehybrid",
    "vocab_size": 300,
    "hidden_size": 64,
    "intermediate_size": 32,
    "shared_intermediate_size": 96,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "layer_types": ["mamba", "mamba", "mamba", "attention"],
    "mamba_n_heads": 8,
    "mamba_n_groups": 1,
    "mamba_d_state": 16,
    "mamba_d_head": "auto",
    "mamba_chunk_size": 256,
    "mamba_expand": 2,
    "num_local_experts": 4,
    "num_experts_per_tok": 2,
    "position_embedding_type": "nope",
    "embedding_multiplier": 12.0,
    "residual_multiplier": 0.22,
    "attention_multiplier": 0.0078125,
    "logits_scaling": 6.0,
    "time_step_limit": [0.0, math.inf],
}


def test_released_config_reads_as_transformers_does():
    from transformers import GraniteMoeHybridConfig
    from transformers.models.granitemoehybrid.modeling_granitemoehybrid import GraniteMoeHybridMambaLayer

    raw = json.loads(json.dumps(RELEASED))  # (json writes the limit as Infinity, as released files hold it)
    cfg = ModelConfig.from_hf(raw)
    hf = GraniteMoeHybridConfig(**{**raw, "layer_types": ["linear_attention"] * 3 + ["full_attention"]})
    mixer = GraniteMoeHybridMambaLayer(hf, 0)
    m = cfg.mamba
    assert m.mamba_layers == (True, True, True, False) and cfg.num_kv_layers == 1 and cfg.recurrent
    assert (m.num_heads, m.head_dim, m.state_size, m.groups) == (8, hf.mamba_d_head, 16, 1)
    assert (m.inner, m.conv_dim, m.conv_kernel) == (mixer.intermediate_size, mixer.conv_dim, mixer.conv_kernel_size)
    assert m.inner + m.conv_dim + m.num_heads == mixer.in_proj.out_features and m.dt_limit == (0.0, math.inf)
    assert (m.conv_bias, m.proj_bias) == (mixer.use_conv_bias, mixer.use_bias)
    assert cfg.rope_layers == (False,) * 4  # no rope: the attention layers see no positions but the order
    assert cfg.intermediate_size == 96 and cfg.moe.intermediate_size == 32 and cfg.moe.softmax_after_topk
    assert (cfg.attn_scale, cfg.embed_multiplier, cfg.residual_multiplier, cfg.logits_divisor) == (
        0.0078125,
        12.0,
        0.22,
        6.0,
    )
    dense = ModelConfig.from_hf({**raw, "num_local_experts": 0, "position_embedding_type": "rope"})
    assert dense.moe is None and dense.rope_layers is None
    # transformers 5's saved form: the new layer-type names, infinity as an object
    saved = {**raw, "layer_types": hf.layer_types, "time_step_limit": [0.0, {"__float__": "Infinity"}]}
    assert ModelConfig.from_hf(saved).mamba == m


@pytest.mark.parametrize(
    ("change", "key"),
    [
        ({"layer_types": ["mamba", "conv", "mamba", "attention"]}, "layer_types"),
        ({"layer_types": ["mamba"] * 4}, "layer_types"),
        ({"mamba_d_head": 12}, "mamba_d_head"),
        ({"mamba_n_groups": 3}, "mamba_n_groups"),
        ({"position_embedding_type": "alibi"}, "position_embedding_type"),
        ({"mamba_d_conv": 1}, "mamba_d_conv"),
    ],
)
def test_what_is_not_computed_is_refused_naming_the_key(change, key):
    with pytest.raises(UnsupportedModelError, match=key):
        ModelConfig.from_hf({**RELEASED, **change})


def _inputs(length: int, heads: int = 6, head_dim: int = 8, groups: int = 3, state: int = 5, seed: int = 0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((length, heads, head_dim)).astype(np.float32)
    dt = np.log1p(np.exp(rng.standard_normal((length, heads)))).astype(np.float32)  # softplus'd
    a = -np.exp(rng.standard_normal(heads)).astype(np.float32)
    b, c = (rng.standard_normal((length, groups, state)).astype(np.float32) for _ in range(2))
    d = rng.standard_normal(heads).astype(np.float32)
    s0 = rng.standard_normal((heads, head_dim, state)).astype(np.float32)
    return x, dt, a, b, c, d, s0


def _recurrence(x, dt, a, b, c, d, s0):
    """The definition, one token at a time in float64: S <- exp(dt A) S + dt x B^T; y = S C + D x."""
    heads, groups = x.shape[1], b.shape[1]
    s, ys = s0.astype(np.float64), []
    for t in range(x.shape[0]):
        bh, ch = np.repeat(b[t], heads // groups, 0), np.repeat(c[t], heads // groups, 0)  # head h: group h // (H/G)
        s = s * np.exp(dt[t] * a)[:, None, None] + (dt[t][:, None] * x[t])[:, :, None] * bh[:, None, :]
        ys.append(np.einsum("hpn,hn->hp", s, ch) + d[:, None] * x[t])
    return np.stack(ys), s


@pytest.mark.parametrize("length", [1, 64, 150])
def test_chunked_scan_and_step_equal_the_recurrence(length):
    import mlx.core as mx

    from lantern.backends.mlx import mamba2 as mlx_mamba2
    from lantern.backends.torch import mamba2 as torch_mamba2

    args = _inputs(length)
    want_y, want_s = _recurrence(*args)
    y, s = torch_mamba2.chunked(*(torch.from_numpy(v) for v in args))
    np.testing.assert_allclose(y.numpy(), want_y, atol=2e-4, rtol=1e-4)
    np.testing.assert_allclose(s.numpy(), want_s, atol=2e-4, rtol=1e-4)
    y, s = mlx_mamba2.chunked(*(mx.array(v) for v in args))
    np.testing.assert_allclose(np.array(y), want_y, atol=2e-4, rtol=1e-4)
    np.testing.assert_allclose(np.array(s), want_s, atol=2e-4, rtol=1e-4)
    # The decode step: a batch of two sequences, each its first token from its own state.
    x, dt, a, b, c, d, s0 = _inputs(2, seed=1)
    states = np.stack([s0, -s0])
    for step in (torch_mamba2.step, mlx_mamba2.step):
        conv = torch.from_numpy if step is torch_mamba2.step else mx.array
        y, s = step(conv(x), conv(dt), conv(a), conv(b), conv(c), conv(d), conv(states))
        y, s = (v.numpy() if isinstance(v, torch.Tensor) else np.array(v) for v in (y, s))
        for i in range(2):
            one_y, one_s = _recurrence(x[i : i + 1], dt[i : i + 1], a, b[i : i + 1], c[i : i + 1], d, states[i])
            np.testing.assert_allclose(y[i], one_y[0], atol=2e-5, rtol=1e-5)
            np.testing.assert_allclose(s[i], one_s, atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("backend", ["torch", "mlx"])
def test_an_attention_only_config_is_granite_4_micro_without_state(tmp_path_factory, backend):
    """granite-4.0-micro (not -h) ships as granitemoehybrid with every layer attention: no Mamba layer,
    so no state slots (prefix caching stays on); its greedy tokens equal transformers'."""
    from transformers import AutoModelForCausalLM

    from lantern.app.engine import LLM, SamplingParams
    from tests.fixtures.tiny_models import build_model

    path = build_model("granite_hybrid", tmp_path_factory.mktemp("micro"), layer_types=["full_attention"] * 4)
    llm = LLM(str(path), backend=backend, dtype="float32", num_kv_blocks=64)
    cfg = llm.engine.model_config
    assert cfg.mamba is None and not cfg.recurrent and cfg.num_kv_layers == 4
    ids = list(range(5, 40))
    got = llm.generate([ids], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))[0].outputs[0].token_ids
    ref = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
    want = ref.generate(torch.tensor([ids]), max_new_tokens=8, min_new_tokens=8, do_sample=False)[0, len(ids) :]
    assert got == want.tolist()
