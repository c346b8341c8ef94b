"""Mistral 4 (model_type "mistral4"): DeepSeek-V3's latent attention and experts with a softmax router that
ranks groups by their two best scores, YaRN and Llama 4's query temperature. config.json read as
transformers' Mistral4Config reads it (its default rope included), the router against transformers'
Mistral4TopkRouter on both backends, the fused expert tensors Mistral ships split per expert, refusals,
and an MLX-format folder made by mlx_lm. Logits and greedy tokens (the temperature stepping within the
test sequence) run in tests/conformance (mistral4)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lantern.app.models.spec import ModelConfig, UnsupportedModelError

BASE = {
    "vocab_size": 400,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "num_hidden_layers": 2,
    "kv_lora_rank": 16,
    "qk_rope_head_dim": 8,
    "qk_nope_head_dim": 16,
    "v_head_dim": 12,
    "moe_intermediate_size": 32,
    "n_routed_experts": 8,
}


def ours(**extra) -> ModelConfig:
    return ModelConfig.from_hf({"model_type": "mistral4", **BASE, **extra})


def hf(**extra):
    from transformers import Mistral4Config

    return Mistral4Config.from_dict({"model_type": "mistral4", **BASE, **extra})


@pytest.mark.parametrize(
    "extra",
    [
        {},  # Mistral4Config's default rope: YaRN x128 from 8192, mscale 1 / 1, temperature beta 0.1
        {"n_group": 2, "topk_group": 1, "num_experts_per_tok": 2, "first_k_dense_replace": 1, "q_lora_rank": None},
    ],
)
def test_config_matches_transformers(extra):
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import yarn_get_mscale

    cfg, ref = ours(**extra), hf(**extra)
    m, moe, rope = cfg.mla, cfg.moe, ref.rope_parameters
    assert (m.kv_lora_rank, m.q_lora_rank, m.qk_rope_head_dim, m.rope_interleave) == (
        ref.kv_lora_rank,
        ref.q_lora_rank,
        ref.qk_rope_head_dim,
        ref.rope_interleave,
    )
    assert (moe.scoring, moe.topk_method, moe.n_group, moe.topk_group, moe.top_k) == (
        "softmax",
        "noaux_tc",
        ref.n_group,
        ref.topk_group,
        ref.num_experts_per_tok,
    )
    assert moe.norm_topk_prob == ref.norm_topk_prob and moe.shared_size == ref.moe_intermediate_size
    assert [moe.is_sparse(i) for i in range(2)] == [i >= ref.first_k_dense_replace for i in range(2)]
    assert cfg.rope_scaling["rope_type"] == "yarn" and cfg.rope_scaling["factor"] == rope["factor"]
    assert cfg.rope_theta == rope["rope_theta"] and cfg.max_position_embeddings == ref.max_position_embeddings
    mscale = yarn_get_mscale(rope["factor"], rope["mscale_all_dim"])
    assert cfg.attn_scale == pytest.approx(ref.qk_head_dim**-0.5 * mscale * mscale)
    t = cfg.attn_temperature
    assert (t.beta, t.length) == (rope["llama_4_scaling_beta"], rope["original_max_position_embeddings"])
    assert cfg.mtp_layers == 0


@pytest.mark.parametrize(
    "extra,key",
    [
        ({"rope_parameters": {"rope_type": "default", "partial_rotary_factor": 0.5}}, "partial_rotary_factor"),
        ({"n_group": 3}, "n_group"),
        ({"hidden_act": "gelu"}, "hidden_act"),
        ({"attention_bias": True}, "attention_bias"),
    ],
)
def test_unimplemented_keys_are_refused_by_name(extra, key):
    with pytest.raises(UnsupportedModelError, match=key):
        ours(**extra)


def test_router_matches_transformers():
    import mlx.core as mx
    from transformers.models.mistral4.modeling_mistral4 import Mistral4TopkRouter

    from lantern.backends.mlx.models.deepseek import DeepSeekMoE as MlxMoE
    from lantern.backends.torch.models.deepseek import DeepSeekMoE as TorchMoE
    from lantern.backends.torch.parallel import TPGroup

    extra = {"n_routed_experts": 16, "num_experts_per_tok": 4, "n_group": 4, "topk_group": 2}
    extra.update(routed_scaling_factor=2.0, first_k_dense_replace=0)
    ref = Mistral4TopkRouter(hf(**extra))
    torch.manual_seed(0)
    with torch.no_grad():
        ref.weight.copy_(torch.randn_like(ref.weight))
    x = torch.randn(64, BASE["hidden_size"])
    with torch.no_grad():
        _, ref_w, ref_ids = ref(x)
    want = [dict(zip(i.tolist(), w.tolist())) for i, w in zip(ref_ids, ref_w)]
    # The groups must matter: an unrestricted top-k picks other experts for some tokens.
    plain = torch.topk(torch.softmax(x @ ref.weight.T, -1), 4).indices
    assert any(sorted(p) != sorted(s) for p, s in zip(plain.tolist(), want))
    cfg = ours(**extra)
    torch_moe = TorchMoE(cfg, TPGroup())
    torch_moe.gate.weight.data = ref.weight.detach().clone()
    mlx_moe = MlxMoE(cfg)
    mlx_moe.gate.weight = mx.array(ref.weight.detach().numpy())
    for ids, w in (torch_moe.route(x), mlx_moe.route(mx.array(x.numpy()))):
        got = [dict(zip(i.tolist(), v.tolist())) for i, v in zip(np.asarray(ids).copy(), np.asarray(w).copy())]
        for g, r in zip(got, want):
            assert sorted(g) == sorted(r)
            np.testing.assert_allclose([g[e] for e in sorted(g)], [r[e] for e in sorted(r)], rtol=1e-5, atol=1e-6)


def test_fused_experts_are_split_per_expert(tiny_model_dir):
    """transformers saves Mistral 4's experts fused (gate_up_proj [E, 2I, H], down_proj [E, H, I]), as
    Mistral ships them: the stream hands the models each expert's own gate, up and down rows."""
    from safetensors.numpy import load_file

    from lantern.app.models.loader import resolve_model
    from lantern.app.models.weight_stream import iter_weights

    path = tiny_model_dir("mistral4")
    stored = load_file(f"{path}/model.safetensors")
    fused = stored["model.layers.1.mlp.experts.gate_up_proj"]
    assert fused.ndim == 3 and "model.layers.1.mlp.experts.0.gate_proj.weight" not in stored
    names = dict(iter_weights(resolve_model(path).spec, "pt", progress=False))
    inner = fused.shape[1] // 2
    for e in (0, 7):
        np.testing.assert_array_equal(
            names[f"model.layers.1.mlp.experts.{e}.gate_proj.weight"].numpy(), fused[e, :inner]
        )
        np.testing.assert_array_equal(names[f"model.layers.1.mlp.experts.{e}.up_proj.weight"].numpy(), fused[e, inner:])
        np.testing.assert_array_equal(
            names[f"model.layers.1.mlp.experts.{e}.down_proj.weight"].numpy(),
            stored["model.layers.1.mlp.experts.down_proj"][e],
        )


def test_mlx_format_folder_computes_what_it_stores(tmp_path, backend):
    """An mlx-community-style 4-bit folder made by mlx_lm (its sanitize stacks the fused experts into
    switch_mlp and splits kv_b_proj per head): logits vs transformers on the values it stores."""
    pytest.importorskip("mlx_lm")
    from tests.fixtures.mlx_lm_folders import convert
    from tests.fixtures.tiny_models import ARCH_VARIANTS
    from tests.models.quant_logits import logits_error, tolerance

    # latent and head widths mlx_lm's 32-wide groups divide; the rope still 8 of each query head's 40
    rope = {**ARCH_VARIANTS["mistral4"][1]["rope_parameters"], "partial_rotary_factor": 8 / 40}
    wide = {"kv_lora_rank": 64, "qk_nope_head_dim": 32, "v_head_dim": 32, "rope_parameters": rope}
    quant, ref = convert("mistral4", tmp_path, mode="affine", **wide)
    assert logits_error(str(quant), str(ref), backend) <= tolerance(backend, str(ref))


def test_yarn_without_its_original_length_takes_transformers_fill_in():
    """transformers fills YaRN's original_max_position_embeddings from max_position_embeddings; the
    temperature's step length is that same number."""
    rope = {"type": "yarn", "factor": 4.0, "llama_4_scaling_beta": 0.1, "rope_theta": 10000.0}
    cfg, ref = (
        ours(rope_parameters=dict(rope), max_position_embeddings=512),
        hf(rope_parameters=dict(rope), max_position_embeddings=512),
    )
    assert cfg.attn_temperature.length == ref.rope_parameters["original_max_position_embeddings"] == 512


def test_fused_fp8_experts_are_refused_by_name(tiny_model_dir, tmp_path):
    """Mistral 4's FP8 release: fused expert tensors with their own scales, which no reader here takes yet."""
    import shutil

    from safetensors.torch import load_file, save_file

    from lantern.app.models.loader import resolve_model
    from lantern.app.models.weight_stream import iter_weights

    path = tmp_path / "fp8"
    shutil.copytree(tiny_model_dir("mistral4"), path)
    weights = load_file(str(path / "model.safetensors"))
    weights["model.layers.1.mlp.experts.down_proj_scale_inv"] = torch.ones(8, 1, 1)
    save_file(weights, str(path / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(UnsupportedModelError, match="down_proj_scale_inv"):
        list(iter_weights(resolve_model(str(path)).spec, "pt", progress=False))


def test_a_linear_rope_takes_no_original_length():
    """transformers fills the original length for llama3 / YaRN / LongRoPE only: a linear rope loads."""
    cfg = ours(rope_parameters={"type": "linear", "factor": 2.0, "rope_theta": 1e4}, max_position_embeddings=512)
    assert cfg.rope_scaling == {"rope_type": "linear", "factor": 2.0}


@pytest.mark.parametrize("temperature", [False, True])
@pytest.mark.parametrize("backend", ["torch", "mlx"])
def test_gguf_answers_as_transformers(tmp_path, monkeypatch, temperature, backend):
    """A mistral4 GGUF (llama.cpp's Mistral4Model, a DeepseekV2Model: the stacked experts as they are, kv_b_proj split
    into attn_k_b / attn_v_b, YaRN with 0.1 * mscale_all_dim as the log multiplier) computes what transformers
    computes on its checkpoint. The converter from transformers' config writes no query temperature (llama.cpp then
    applies none): without attention.temperature_scale the file is the model with llama_4_scaling_beta 0; with it,
    the model with it."""
    import json

    from lantern.app.engine import LLM
    from tests.conformance.test_parity import PROMPT, hf_model
    from tests.fixtures.gguf_families import convert_to_gguf
    from tests.fixtures.teacher_forcing import assert_matches_reference
    from tests.fixtures.tiny_models import ARCH_VARIANTS, build_model

    monkeypatch.setenv("LANTERN_CACHE", str(tmp_path / "cache"))
    rope = dict(ARCH_VARIANTS["mistral4"][1]["rope_parameters"])
    beta, rope["llama_4_scaling_beta"] = rope["llama_4_scaling_beta"], 0.0  # (0: Mistral4's scale of exactly 1)
    src = build_model("mistral4", tmp_path / "hf", rope_parameters=rope)
    path, ref = convert_to_gguf(src, tmp_path / "gguf")
    if temperature:  # (as a file from Mistral's own format states it): the reference model has it too
        import gguf

        from tests.fixtures.gguf_writer import rewrite_with

        keys = {"mistral4.attention.temperature_scale": (beta, gguf.GGUFValueType.FLOAT32)}
        keys["mistral4.attention.temperature_length"] = (
            rope["original_max_position_embeddings"],
            gguf.GGUFValueType.UINT32,
        )
        path = rewrite_with(path, keys)
        cfg = json.loads((ref / "config.json").read_text())
        cfg["rope_parameters"]["llama_4_scaling_beta"] = beta
        (ref / "config.json").write_text(json.dumps(cfg))
    llm = LLM(str(path), backend=backend, dtype="float32", block_size=4, prefill_chunk_size=8, num_kv_blocks=64)
    cfg = llm.engine.model_config
    assert cfg.architecture == "mistral4" and cfg.moe.scoring == "softmax" and cfg.mla.rope_interleave
    assert (cfg.attn_temperature is not None) == temperature
    assert_matches_reference(llm, hf_model(ref), PROMPT, steps=24)  # (past the original length of 16: YaRN and
    # the temperature both at work)


def test_gguf_keys_llama_cpp_reads_otherwise_are_refused(tmp_path, monkeypatch):
    """A temperature without its step length (llama.cpp's graph asserts on it) and a YaRN log multiplier other than
    0.1 (llama.cpp's mistral4 keeps mscale 1: no config computes what it then computes) are refused by name."""
    import gguf

    from lantern.app.models.loader import resolve_model
    from lantern.app.models.spec import UnsupportedModelError
    from tests.fixtures.gguf_families import convert_to_gguf
    from tests.fixtures.gguf_writer import rewrite_with
    from tests.fixtures.tiny_models import ARCH_VARIANTS, build_model

    monkeypatch.setenv("LANTERN_CACHE", str(tmp_path / "cache"))
    rope = {**ARCH_VARIANTS["mistral4"][1]["rope_parameters"], "llama_4_scaling_beta": 0.0}
    path, _ = convert_to_gguf(build_model("mistral4", tmp_path / "hf", rope_parameters=rope), tmp_path / "gguf")
    f32 = gguf.GGUFValueType.FLOAT32
    for key, value, named in (
        ("mistral4.attention.temperature_scale", 0.1, "temperature_length"),
        ("mistral4.rope.scaling.yarn_log_multiplier", 0.0707, "yarn_log_multiplier"),
    ):
        bad = rewrite_with(path, {key: (value, f32)})
        with pytest.raises(UnsupportedModelError, match=named):
            resolve_model(str(bad))
        bad.unlink()
