"""Mamba and Falcon-Mamba (Mamba-1 mixers only), Mamba-2 and Jamba (Mamba-1 mixers among attention layers): released
config.json files read as transformers reads them, the scan's chunked form equal to its one-token steps, and a model
without attention served with the engine's own KV sizing (its pool holds no layer; blocks cost nothing). (Logits and
greedy tokens against transformers: the conformance variants mamba, falcon_mamba and jamba; batching, chunking,
preemption: test_recurrent_state; the server: tests/server/test_hybrid_serving.)"""

from __future__ import annotations

import logging

import pytest
import torch

from lantern.app.engine import LLM, SamplingParams
from lantern.app.models.errors import UnsupportedModelError
from lantern.app.models.family_mamba import CONTEXT
from lantern.app.models.spec import ModelConfig
from tests.conformance.test_parity import PROMPT, hf_greedy, hf_model

MAMBA_130M = {  # state-spaces/mamba-130m-hf
    "model_type": "mamba",
    "hidden_size": 768,
    "num_hidden_layers": 24,
    "vocab_size": 50280,
    "state_size": 16,
    "expand": 2,
    "conv_kernel": 4,
    "time_step_rank": 48,
    "use_bias": False,
    "use_conv_bias": True,
    "layer_norm_epsilon": 1e-5,
}
FALCON_MAMBA_7B = {  # tiiuae/falcon-mamba-7b
    "model_type": "falcon_mamba",
    "hidden_size": 4096,
    "num_hidden_layers": 64,
    "vocab_size": 65024,
    "state_size": 16,
    "expand": 16,  # (as released: FalconMambaConfig keeps the stated intermediate_size)
    "intermediate_size": 8192,
    "conv_kernel": 4,
    "time_step_rank": 256,
    "mixer_rms_eps": 1e-6,
    "tie_word_embeddings": False,
}


def test_released_configs_read_as_transformers_reads_them():
    mamba = ModelConfig.from_hf(MAMBA_130M)
    m = mamba.mamba1
    assert (m.inner, m.state_size, m.conv_kernel, m.dt_rank, m.bc_norm) == (1536, 16, 4, 48, "none")
    assert m.conv_bias and not m.proj_bias and mamba.tie_word_embeddings and mamba.recurrent
    assert mamba.num_kv_layers == 0 and mamba.max_context == CONTEXT and mamba.rms_norm_eps == 1e-5
    assert ModelConfig.from_hf({**MAMBA_130M, "time_step_rank": "auto"}).mamba1.dt_rank == 48  # ceil(768 / 16)
    falcon = ModelConfig.from_hf(FALCON_MAMBA_7B)
    assert (falcon.mamba1.inner, falcon.mamba1.dt_rank, falcon.mamba1.bc_norm) == (8192, 256, "weightless")
    assert not falcon.tie_word_embeddings
    with pytest.raises(UnsupportedModelError, match="hidden_act"):
        ModelConfig.from_hf({**MAMBA_130M, "hidden_act": "gelu"})


MAMBA_CODESTRAL = {  # mistralai/Mamba-Codestral-7B-v0.1 (model_type mamba2)
    "model_type": "mamba2",
    "hidden_size": 4096,
    "num_hidden_layers": 64,
    "num_heads": 128,
    "head_dim": 64,
    "state_size": 128,
    "n_groups": 8,
    "expand": 2,
    "conv_kernel": 4,
    "use_bias": False,
    "use_conv_bias": True,
    "time_step_limit": [0.0, float("inf")],
    "layer_norm_epsilon": 1e-5,
    "vocab_size": 32768,
}


def test_mamba2_config_reads_as_transformers_reads_it():
    cfg = ModelConfig.from_hf(MAMBA_CODESTRAL)
    m = cfg.mamba
    assert (m.num_heads, m.head_dim, m.state_size, m.groups, m.norm, m.norm_eps) == (128, 64, 128, 8, "gated", 1e-5)
    assert cfg.family == "nemotron_h" and m.layer_kinds == "M" * 64 and cfg.num_kv_layers == 0
    assert cfg.max_context == CONTEXT and not cfg.tie_word_embeddings
    with pytest.raises(UnsupportedModelError, match="num_heads"):
        ModelConfig.from_hf({**MAMBA_CODESTRAL, "num_heads": 96})
    for key, value in (("rms_norm", False), ("norm_before_gate", True)):
        with pytest.raises(UnsupportedModelError, match=key):
            ModelConfig.from_hf({**MAMBA_CODESTRAL, key: value})
    from lantern.app.models.family_nemotron_h import checkpoint_name

    kinds = cfg.mamba.layer_kinds  # Mamba-Codestral's file names its tensors model.backbone.* / model.lm_head.*
    assert checkpoint_name("model.backbone.layers.3.mixer.A_log", kinds) == "model.layers.3.mamba.A_log"
    assert checkpoint_name("model.lm_head.weight", kinds) == "lm_head.weight"
    assert checkpoint_name("backbone.norm_f.weight", kinds) == "model.norm.weight"


JAMBA_V01 = {  # ai21labs/Jamba-v0.1
    "model_type": "jamba",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "num_experts": 16,
    "num_experts_per_tok": 2,
    "attn_layer_period": 8,
    "attn_layer_offset": 4,
    "expert_layer_period": 2,
    "expert_layer_offset": 1,
    "mamba_d_state": 16,
    "mamba_d_conv": 4,
    "mamba_expand": 2,
    "mamba_dt_rank": 256,
    "mamba_conv_bias": True,
    "mamba_proj_bias": False,
    "rms_norm_eps": 1e-6,
    "vocab_size": 65536,
}


def test_jamba_config_reads_as_transformers_reads_it():
    from transformers import JambaConfig

    jamba = ModelConfig.from_hf(JAMBA_V01)
    reference = JambaConfig(**{k: v for k, v in JAMBA_V01.items() if k != "model_type"})
    kinds = reference.layers_block_type
    assert jamba.mamba1.mamba_layers == tuple(k == "mamba" for k in kinds)
    assert jamba.num_kv_layers == kinds.count("attention") == 4 and jamba.rope_layers == (False,) * 32
    assert [jamba.moe.is_sparse(i) for i in range(32)] == [n > 1 for n in reference.layers_num_experts]
    m = jamba.mamba1
    assert (m.inner, m.dt_rank, m.bc_norm, m.norm_eps) == (8192, 256, "weighted", 1e-6)
    assert m.conv_bias and not m.proj_bias
    assert not jamba.moe.norm_topk_prob and jamba.moe.intermediate_size == 14336
    assert ModelConfig.from_hf({**JAMBA_V01, "num_experts": 1}).moe is None  # Jamba Reasoning 3B's dense MLPs
    with pytest.raises(UnsupportedModelError, match="attn_layer_offset"):  # no layer attends
        ModelConfig.from_hf({**JAMBA_V01, "attn_layer_period": 64, "attn_layer_offset": 40})
    for key in ("attn_layer_offset", "expert_layer_offset"):  # an offset past its period (JambaConfig raises)
        with pytest.raises(UnsupportedModelError, match=key):
            ModelConfig.from_hf({**JAMBA_V01, key: 9})
    assert ModelConfig.from_hf({**JAMBA_V01, "num_experts": None, "num_local_experts": 8}).moe.num_experts == 8


@pytest.mark.parametrize("length", [1, 7, 130])
def test_chunked_scan_equals_its_steps(length):
    """The prefill's chunked scan (chunks of scan_chunk_length tokens) against the decode step taken token by
    token, from a non-zero state."""
    from lantern.backends.torch import mamba1

    g = torch.Generator().manual_seed(0)
    channels, n = 96, 8
    x, b, c = (torch.randn(length, k, generator=g) for k in (channels, n, n))
    dt = torch.nn.functional.softplus(torch.randn(length, channels, generator=g))
    a = -torch.rand(channels, n, generator=g) * 2
    d, s0 = torch.randn(channels, generator=g), torch.randn(channels, n, generator=g)
    y, end = mamba1.chunked(x, dt, a, b, c, d, s0)
    s, ys = s0[None], []
    for t in range(length):
        out, s = mamba1.step(x[t : t + 1], dt[t : t + 1], a, b[t : t + 1], c[t : t + 1], d, s)
        ys.append(out[0])
    torch.testing.assert_close(y, torch.stack(ys), atol=1e-4, rtol=1e-4)  # (float32 sums in another order)
    torch.testing.assert_close(end, s[0], atol=1e-4, rtol=1e-4)


def test_a_model_without_attention_is_served_with_the_engines_own_sizing(tiny_model_dir, backend, caplog):
    """No num_kv_blocks: the sizing gives blocks that hold no K/V (0 bytes each) for the default room, and the
    model answers as transformers does."""
    path = tiny_model_dir("mamba")
    with caplog.at_level(logging.INFO):
        llm = LLM(path, backend=backend, dtype="float32")
    assert llm.engine.model_config.num_kv_layers == 0 and len(llm.engine.backend.pool.k) == 0
    assert "KV cache:" in caplog.text and "0.0 MiB" in caplog.text
    prompt_ids = llm.tokenizer.encode(PROMPT)
    out = llm.generate([prompt_ids], SamplingParams(temperature=0, max_tokens=32, ignore_eos=True))
    assert out[0].outputs[0].token_ids == hf_greedy(hf_model(path), prompt_ids, 32)


@pytest.fixture(scope="module")
def mlx_lm_mamba(tmp_path_factory):
    """A tiny Mamba quantized by mlx_lm (4-bit g32): its convolution kernels saved [C, K, 1]."""
    pytest.importorskip("mlx_lm")
    from tests.fixtures.teacher_forcing import quantized_by_mlx_lm
    from tests.fixtures.tiny_models import build_model

    out = tmp_path_factory.mktemp("mamba-mlx-lm")
    return quantized_by_mlx_lm(build_model("mamba", out / "float"), out / "mlx")


def test_4bit_mlx_lm_mamba_computes_what_mlx_lm_computes(mlx_lm_mamba, backend):
    from tests.fixtures.teacher_forcing import assert_close_to_mlx_lm

    assert_close_to_mlx_lm(mlx_lm_mamba, backend, "mamba")
