"""Nemotron-H ("nemotron_h"): its config.json read as transformers' NemotronHConfig and its modules read it (the
released form: hybrid_override_pattern, num_hidden_layers, time_step_limit with an Infinity; transformers 5's
saved form: layers_block_type and no layer count), refusals in one line naming the key. Logits and greedy
tokens against transformers run in tests/conformance (nemotron_h), state through batching and preemption in
tests/conformance/test_recurrent_state.py, an mlx_lm folder in tests/models/test_mlx_moe_folders.py."""

from __future__ import annotations

import json
import math

import pytest

from lantern.app.models.errors import UnsupportedModelError
from lantern.app.models.spec import ModelConfig

RELEASED = {  # Nemotron-Nano-9B-v2's shape, scaled down
    "model_type": "nemotron_h",
    "architectures": ["NemotronHForCausalLM"],
    "vocab_size": 300,
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 7,
    "hybrid_override_pattern": "M-M*-M-",
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "mamba_num_heads": 8,
    "mamba_head_dim": 20,  # heads x head dim (160) is not 2 x hidden: the mixer's width is its own
    "n_groups": 2,
    "ssm_state_size": 16,
    "conv_kernel": 4,
    "expand": 2,
    "chunk_size": 128,
    "mlp_hidden_act": "relu2",
    "mamba_hidden_act": "silu",
    "use_conv_bias": True,
    "use_bias": False,
    "layer_norm_epsilon": 1e-5,
    "time_step_limit": [0.0, math.inf],
    "time_step_min": 0.001,
    "residual_in_fp32": False,
}

# Nemotron 3 Nano's keys (NVIDIA-Nemotron-3-Nano-30B-A3B), scaled down
MOE = {
    "hybrid_override_pattern": "M-EM*E-",
    "n_routed_experts": 8,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 32,
    "moe_shared_expert_intermediate_size": 48,
    "n_shared_experts": 1,
    "n_group": 1,
    "topk_group": 1,
    "norm_topk_prob": True,
    "routed_scaling_factor": 2.5,
    "num_nextn_predict_layers": 0,
}


def test_released_and_saved_configs_read_as_transformers_does():
    from transformers import NemotronHConfig
    from transformers.models.nemotron_h.modeling_nemotron_h import NemotronHMamba2Mixer, NemotronHMLP

    raw = json.loads(json.dumps(RELEASED))  # (json writes the limit as Infinity, as released files hold it)
    cfg = ModelConfig.from_hf(raw)
    hf = NemotronHConfig(**raw)
    mixer, mlp = NemotronHMamba2Mixer(hf, 0), NemotronHMLP(hf)
    m = cfg.mamba
    assert m.layer_kinds == hf.hybrid_override_pattern and cfg.num_layers == hf.num_hidden_layers == 7
    assert m.mamba_layers == tuple(t == "linear_attention" for t in hf.layers_block_type)
    assert cfg.num_kv_layers == 1 and cfg.recurrent and cfg.rope_layers == (False,) * 7  # NoPE
    assert (m.num_heads, m.head_dim, m.state_size, m.groups) == (8, mixer.head_dim, 16, mixer.n_groups)
    assert (m.inner, m.conv_dim, m.conv_kernel) == (mixer.intermediate_size, mixer.conv_dim, mixer.conv_kernel_size)
    assert m.inner + m.conv_dim + m.num_heads == mixer.in_proj.out_features
    # time_step_limit, as mlx_lm reads it (transformers' prefill alone clamps below at time_step_min instead)
    assert m.dt_limit == tuple(hf.time_step_limit) == (0.0, math.inf)
    assert (m.conv_bias, m.proj_bias, m.norm_eps) == (mixer.use_conv_bias, False, mixer.norm.variance_epsilon)
    assert cfg.intermediate_size == mlp.up_proj.out_features and cfg.rms_norm_eps == hf.layer_norm_epsilon
    assert (cfg.head_dim, cfg.num_kv_heads) == (hf.head_dim, hf.num_key_value_heads)
    # transformers 5's saved form: the list of block types, no layer count
    saved = {k: v for k, v in RELEASED.items() if k not in ("hybrid_override_pattern", "num_hidden_layers")}
    saved["layers_block_type"] = hf.layers_block_type
    saved["time_step_limit"] = [0.0, {"__float__": "Infinity"}]
    assert ModelConfig.from_hf(saved) == cfg
    # The first configs name the head size attention_head_dim (Nemotron-H-4B: 128 where hidden / heads is 96);
    # without either key it is NemotronHConfig's 128.
    first = {k: v for k, v in RELEASED.items() if k != "head_dim"} | {"hidden_size": 96, "num_attention_heads": 8}
    assert ModelConfig.from_hf({**first, "attention_head_dim": 32}).head_dim == 32
    assert ModelConfig.from_hf(first).head_dim == NemotronHConfig(**first).head_dim == 128


@pytest.mark.parametrize(
    ("change", "key"),
    [
        ({"hybrid_override_pattern": "M-M+-M-"}, "hybrid_override_pattern"),
        ({"hybrid_override_pattern": "M-M--M-"}, "hybrid_override_pattern"),  # no attention layer
        ({"layers_block_type": ["mamba", "conv"]}, "layers_block_type"),
        ({"mlp_hidden_act": "silu"}, "mlp_hidden_act"),
        ({"n_groups": 3}, "n_groups"),
        ({"attention_bias": True}, "attention_bias"),
        ({"sliding_window": 64}, "sliding_window"),
        ({"conv_kernel": 1}, "conv_kernel"),
        # Nemotron 3's experts: groups must split them, at least two to a group (ranked by their best two)
        ({**MOE, "n_group": 3}, "n_group"),
        ({**MOE, "n_group": 8}, "n_group"),
        ({**MOE, "n_group": 2, "topk_group": 3}, "n_group"),
        ({**MOE, "n_group": 2, "topk_group": 1, "num_experts_per_tok": 5}, "num_experts_per_tok"),
        ({**MOE, "n_shared_experts": 2}, "n_shared_experts"),
    ],
)
def test_what_is_not_computed_is_refused_naming_the_key(change, key):
    with pytest.raises(UnsupportedModelError, match=key):
        ModelConfig.from_hf({**RELEASED, **change})


def test_checkpoint_names_reach_the_model_files(tiny_model_dir):
    """backbone.* as model.*, each block's norm as input_layernorm, its mixer under its kind's name; every
    tensor the checkpoint holds is a parameter of the model (MLX's: torch fuses q/k/v as it loads)."""
    from mlx.utils import tree_flatten

    from lantern.app.models.loader import resolve_model
    from lantern.app.models.weight_stream import iter_weights
    from lantern.backends.mlx.models.nemotron_h import CausalLM

    spec = resolve_model(tiny_model_dir("nemotron_h")).spec
    names = {n for n, _ in iter_weights(spec, "pt", progress=False)}
    assert {"model.embed_tokens.weight", "model.norm.weight", "model.layers.0.mamba.A_log"} <= names
    assert {"model.layers.1.mlp.up_proj.weight", "model.layers.3.self_attn.q_proj.weight"} <= names
    assert "model.layers.3.input_layernorm.weight" in names and not any("backbone" in n for n in names)
    params = {n for n, _ in tree_flatten(CausalLM(spec.config).parameters())}
    assert names == params


@pytest.mark.parametrize("latent", [None, 24])
def test_expert_layers_read_as_transformers_builds_them(latent):
    """E layers: DeepSeek-V3's sigmoid router (biased choice, groups, scaled weights) over ungated relu^2 experts,
    one relu^2 shared expert, and LatentMoE's projections; the other layers have no experts."""
    from transformers import NemotronHConfig
    from transformers.models.nemotron_h.modeling_nemotron_h import NemotronHMoE

    raw = {**RELEASED, **MOE, "moe_latent_size": latent}
    cfg, hf = ModelConfig.from_hf(raw), NemotronHConfig(**raw)
    ref = NemotronHMoE(hf)
    moe = cfg.moe
    assert cfg.mamba.layer_kinds == hf.hybrid_override_pattern == "M-EM*E-"
    assert [moe.is_sparse(i) for i in range(7)] == [t == "moe" for t in hf.layers_block_type]
    assert (moe.num_experts, moe.top_k) == (ref.experts.num_experts, ref.gate.top_k) == (8, 2)
    width = latent or hf.hidden_size
    assert ref.experts.up_proj.shape == (8, moe.intermediate_size, width) and not moe.gated
    assert ref.experts.down_proj.shape == (8, width, moe.intermediate_size)
    assert moe.latent_size == latent and ref.shared_experts.up_proj.out_features == moe.shared_size == 48
    assert (moe.scoring, moe.topk_method, moe.correction_bias) == ("sigmoid", "noaux_tc", True)
    assert (moe.n_group, moe.topk_group) == (ref.gate.num_group, ref.gate.topk_group)
    assert (moe.norm_topk_prob, moe.routed_scaling_factor) == (ref.gate.norm_topk_prob, 2.5)
    assert ref.gate.e_score_correction_bias.shape == (8,) and moe.router_weights_fp32


def test_expert_checkpoint_names_reach_the_model_files(tiny_model_dir):
    """The E layers' experts, router (with its correction bias) and shared expert under `mlp`; the latent
    projections too; every tensor a parameter of the MLX model, and each expert kept apart for the loaders."""
    from mlx.utils import tree_flatten

    from lantern.app.models.loader import resolve_model
    from lantern.app.models.weight_stream import iter_weights
    from lantern.backends.mlx.models.nemotron_h import CausalLM

    spec = resolve_model(tiny_model_dir("nemotron_h_latent")).spec
    names = {n for n, _ in iter_weights(spec, "pt", progress=False)}
    layer = "model.layers.2.mlp"
    assert {f"{layer}.gate.weight", f"{layer}.gate.e_score_correction_bias", f"{layer}.fc1_latent_proj.weight"} <= names
    assert {f"{layer}.experts.5.up_proj.weight", f"{layer}.shared_experts.down_proj.weight"} <= names
    assert not any(".gate_proj." in n for n in names)  # ungated
    params = {n for n, _ in tree_flatten(CausalLM(spec.config).parameters())}
    stacked = {n for n in names if ".experts." in n}
    assert (names - stacked) | {f"{layer}.experts.up_proj.weight", f"{layer}.experts.down_proj.weight"} == params


def test_a_gate_projection_on_ungated_experts_is_refused_naming_it(tiny_model_dir, backend, tmp_path):
    """Nemotron 3's experts compute down(relu(up(x))^2): a checkpoint that also carries an expert's gate_proj
    is some other model under this config, refused on both backends naming the tensor (not loaded with the
    gate ignored)."""
    import shutil
    from pathlib import Path

    from safetensors.numpy import load_file, save_file

    from lantern.app.engine import LLM

    folder = tmp_path / "with_gate"
    shutil.copytree(Path(tiny_model_dir("nemotron_h_moe")), folder)
    weights = load_file(str(folder / "model.safetensors"))
    up = weights["backbone.layers.2.mixer.experts.0.up_proj.weight"]
    weights["backbone.layers.2.mixer.experts.0.gate_proj.weight"] = up.copy()
    save_file(weights, str(folder / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"experts\.0\.gate_proj: this model's experts have no gate projection"):
        LLM(str(folder), backend=backend, dtype="float32", num_kv_blocks=16)
