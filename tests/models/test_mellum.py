"""JetBrains Mellum 2: config.json read as MellumConfig / MellumForCausalLM read it, refusals naming the key, and the
multi-token-prediction module a released checkpoint carries left unread. (Logits and greedy tokens on both backends:
the "mellum" variant in tests/conformance; an mlx_lm 4-bit folder: test_mlx_moe_folders.py.)"""

from __future__ import annotations

import pytest

from lantern.app.engine import LLM, SamplingParams
from lantern.app.models.spec import ModelConfig, UnsupportedModelError
from tests.conformance.test_parity import hf_greedy, hf_model
from tests.models.test_config_support import BASE

MELLUM = {**BASE, "num_hidden_layers": 4, "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32}
TYPES = ["sliding_attention", "full_attention", "sliding_attention", "full_attention"]


def test_config_means_what_transformers_builds():
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    keys = {**MELLUM, "layer_types": TYPES, "mlp_layer_types": ["dense", "sparse", "sparse", "dense"]}
    ours = ModelConfig.from_hf({"model_type": "mellum", **keys})
    ref = AutoConfig.for_model("mellum", **keys)
    model = AutoModelForCausalLM.from_config(ref, dtype=torch.float32).model
    for i, layer in enumerate(model.layers):
        assert ours.layer_windows[i] == layer.self_attn.sliding_window
        assert ours.moe.is_sparse(i) == hasattr(layer.mlp, "experts")
    assert ours.rope_theta == ref.rope_parameters["full_attention"]["rope_theta"] == 500000.0
    assert ours.local_rope_theta == ref.rope_parameters["sliding_attention"]["rope_theta"] == 10000.0
    assert ours.qk_norm and ours.moe.norm_topk_prob == ref.norm_topk_prob and ours.head_dim == ref.head_dim
    plain = ModelConfig.from_hf({"model_type": "mellum", **MELLUM})  # MellumConfig's default: every layer full
    assert plain.layer_windows is None and plain.local_rope_theta is None
    # a top-level rope_theta means nothing to MellumConfig: its nested default stands
    stated = ModelConfig.from_hf({"model_type": "mellum", **MELLUM, "rope_theta": 1e6})
    assert (
        stated.rope_theta
        == AutoConfig.for_model("mellum", **MELLUM, rope_theta=1e6).rope_parameters["full_attention"]["rope_theta"]
    )


@pytest.mark.parametrize(
    "extra,key",
    [
        ({"attention_bias": True}, "attention_bias"),
        ({"hidden_act": "gelu"}, "hidden_act"),
        ({"layer_types": ["full_attention"]}, "layer_types"),  # one for each layer
        ({"mlp_layer_types": ["moe"] * 4}, "mlp_layer_types"),
        ({"rope_parameters": {"rope_type": "default", "rope_theta": 1e4}}, "rope_parameters"),  # not nested by type
        (  # the sliding layers' rope is plain (Gemma 3's arrangement)
            {
                "layer_types": TYPES,
                "rope_parameters": {
                    "full_attention": {"rope_type": "default", "rope_theta": 5e5},
                    "sliding_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4},
                },
            },
            "sliding_attention.rope_type",
        ),
        ({"rope_scaling": {"rope_type": "linear", "factor": 2.0}}, "rope_scaling"),  # (MellumConfig drops it)
        (
            {
                "layer_types": TYPES,
                "rope_parameters": {
                    "full_attention": {"rope_type": "default", "rope_theta": 5e5},
                    "sliding_attention": {"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.5},
                },
            },
            "partial_rotary_factor",
        ),
        (  # sliding layers without their rope
            {"layer_types": TYPES, "rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 5e5}}},
            "rope_parameters",
        ),
    ],
)
def test_unimplemented_keys_are_refused_by_name(extra, key):
    with pytest.raises(UnsupportedModelError, match=key):
        ModelConfig.from_hf({"model_type": "mellum", **MELLUM, **extra})


@pytest.mark.parametrize("variant", ["mellum", "exaone_moe"])
def test_multi_token_prediction_module_is_left_unread(tiny_model_dir, tmp_path, backend, variant):
    """Released Mellum 2 and K-EXAONE checkpoints carry `mtp.*` (their PreTrainedModels ignore it): loaded without
    it, the same tokens."""
    import shutil

    from safetensors.torch import load_file, save_file

    folder = tmp_path / variant
    shutil.copytree(tiny_model_dir(variant), folder)
    tensors = load_file(folder / "model.safetensors")
    layer = {k.replace("model.layers.1.", "mtp.layers.0."): v.clone() for k, v in tensors.items() if ".layers.1." in k}
    save_file({**tensors, **layer}, folder / "model.safetensors", metadata={"format": "pt"})
    llm = LLM(str(folder), backend=backend, dtype="float32", num_kv_blocks=64)
    ids = llm.tokenizer.encode("Paged attention stores keys and values in blocks")
    out = llm.generate([ids], SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))[0]
    assert out.outputs[0].token_ids == hf_greedy(hf_model(str(folder)), ids, 12)
