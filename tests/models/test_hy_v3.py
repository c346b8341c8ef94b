"""HY-V3 (model_type hy_v3): config.json read as transformers' HYV3Config reads it, what Lantern does not compute
refused by name, and a folder as released -- the router, its bias and the shared experts under their stored names,
multi-token-prediction layers after the stack -- loading and answering as transformers does. (The tiny folder's
logits and greedy tokens against transformers: tests/conformance, variant hy_v3.)"""

from __future__ import annotations

import pytest

from lantern.app.models.errors import UnsupportedModelError
from lantern.app.models.family_llama_moe import checkpoint_name
from lantern.app.models.spec import ModelConfig

BASE = {
    "model_type": "hy_v3",
    "hidden_size": 64,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
}


def test_config_matches_transformers():
    from transformers import HYV3Config

    cfg, ref = ModelConfig.from_hf(dict(BASE)), HYV3Config(**BASE)
    moe = cfg.moe
    assert (moe.num_experts, moe.top_k, moe.intermediate_size) == (
        ref.num_experts,
        ref.num_experts_per_tok,
        ref.moe_intermediate_size,
    )
    assert moe.routed_scaling_factor == ref.router_scaling_factor and moe.correction_bias and moe.norm_topk_prob
    assert moe.shared_size == ref.moe_intermediate_size * ref.num_shared_experts
    assert [moe.is_sparse(i) for i in range(3)] == [kind == "sparse" for kind in ref.mlp_layer_types]
    assert cfg.qk_norm and cfg.rope_theta == ref.rope_parameters["rope_theta"] and cfg.head_dim == ref.head_dim


@pytest.mark.parametrize(
    ("extra", "key"),
    [
        ({"mlp_layer_types": ["dense", "sparse"]}, "mlp_layer_types"),  # 2 types for 3 layers
        ({"num_experts_per_tok": 300}, "num_experts_per_tok"),
        ({"attention_bias": True}, "attention_bias"),
        ({"hidden_act": "gelu"}, "hidden_act"),
    ],
)
def test_unimplemented_keys_are_refused_by_name(extra, key):
    with pytest.raises(UnsupportedModelError, match=key):
        ModelConfig.from_hf({**BASE, **extra})


def test_released_names_map_to_deepseeks():
    assert checkpoint_name("model.layers.3.mlp.router.gate.weight") == "model.layers.3.mlp.gate.weight"
    assert checkpoint_name("model.layers.3.mlp.expert_bias") == "model.layers.3.mlp.gate.e_score_correction_bias"
    assert (
        checkpoint_name("model.layers.3.mlp.shared_mlp.up_proj.weight")
        == "model.layers.3.mlp.shared_experts.up_proj.weight"
    )


def test_prediction_layers_after_the_stack_are_skipped(tmp_path, backend):
    """A copy of the tiny folder with a third layer's tensors stored past its two-layer stack (as the released
    checkpoints store their multi-token-prediction layer) answers as the folder does."""
    from safetensors.numpy import load_file, save_file

    from lantern.app.engine import LLM
    from tests.conformance.test_parity import PROMPT, hf_model
    from tests.fixtures.teacher_forcing import assert_matches_reference
    from tests.fixtures.tiny_models import build_model

    folder = build_model("hy_v3", tmp_path / "hy")
    ref = hf_model(str(folder))
    tensors = load_file(str(folder / "model.safetensors"))
    extra = {k.replace("model.layers.1.", "model.layers.2."): v for k, v in tensors.items() if "layers.1." in k}
    save_file({**tensors, **extra}, str(folder / "model.safetensors"), metadata={"format": "pt"})
    llm = LLM(str(folder), backend=backend, dtype="float32", block_size=4, prefill_chunk_size=8, num_kv_blocks=64)
    try:
        assert_matches_reference(llm, ref, PROMPT, steps=4)
    finally:
        llm.engine.shutdown()


def test_llama_cpp_gguf_computes_what_transformers_computes(tmp_path, backend):
    """llama.cpp's HYV3Model file (F32; a mixture wherever the file holds a router, here not only past a dense
    prefix): Lantern on it computes what transformers computes on the folder."""
    from tests.fixtures.gguf_hy_v3 import convert_hy_v3
    from tests.fixtures.teacher_forcing import assert_file_matches_folder
    from tests.fixtures.tiny_models import build_model

    kinds = ["sparse", "dense", "sparse"]
    src = build_model("hy_v3", tmp_path / "hf", num_hidden_layers=3, mlp_layer_types=kinds, num_shared_experts=2)
    path = convert_hy_v3(src, tmp_path / "tiny-hy-v3.gguf")
    assert_file_matches_folder(path, src, backend, "hy_v3")
