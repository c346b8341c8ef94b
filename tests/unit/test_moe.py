"""Mixture-of-experts layers against transformers' own sparse MoE blocks, on random inputs.

Reference: transformers 5's MixtralSparseMoeBlock / Qwen2MoeSparseMoeBlock / Qwen3MoeSparseMoeBlock
(float32) with random weights, copied into Lantern's torch and MLX SparseMoE. Batches of 3 tokens
(MLX's unsorted gather) and 48 tokens (sorted by expert), the grouped-matmul and per-expert-loop
paths of torch, and which layers are sparse against transformers' decoder layers.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lantern.app.models.family_moe import MoEConfig, configure, expert_part, moe_name
from lantern.app.models.spec import ModelConfig, UnsupportedModelError

BLOCKS = {
    "mixtral": ("mixtral", "MixtralSparseMoeBlock", {"num_local_experts": 6, "num_experts_per_tok": 2}),
    "qwen2_moe": (
        "qwen2_moe",
        "Qwen2MoeSparseMoeBlock",
        {
            "num_experts": 6,
            "num_experts_per_tok": 3,
            "moe_intermediate_size": 24,
            "shared_expert_intermediate_size": 40,
        },
    ),
    "qwen3_moe": (
        "qwen3_moe",
        "Qwen3MoeSparseMoeBlock",
        {"num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 24, "norm_topk_prob": True},
    ),
    "qwen3_moe_g32": (  # experts whose both dimensions hold whole quantization groups
        "qwen3_moe",
        "Qwen3MoeSparseMoeBlock",
        {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32, "norm_topk_prob": True},
    ),
    "qwen3_moe_raw": (  # top-k probabilities not renormalised
        "qwen3_moe",
        "Qwen3MoeSparseMoeBlock",
        {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 24, "norm_topk_prob": False},
    ),
}


def hf_config(model_type: str, **extra):
    from transformers import AutoConfig

    base = dict(
        vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64,
    )  # fmt: skip
    return AutoConfig.for_model(model_type, **{**base, **extra})


def hf_block(name: str):
    import importlib

    model_type, cls, extra = BLOCKS[name]
    config = hf_config(model_type, **extra)
    module = importlib.import_module(f"transformers.models.{model_type}.modeling_{model_type}")
    torch.manual_seed(0)
    block = getattr(module, cls)(config).eval()
    with torch.no_grad():
        for p in block.parameters():
            p.normal_(0, 0.3)
    return block, ModelConfig.from_hf(config.to_dict())


def lantern_weights(block) -> dict[str, torch.Tensor]:
    """transformers' block state under Lantern's stacked names (gate rows before up rows in both)."""
    sd = {k: v.detach().clone() for k, v in block.state_dict().items()}
    out = {"gate.weight": sd["gate.weight"], "experts.gate_up_proj": sd["experts.gate_up_proj"]}
    out["experts.down_proj"] = sd["experts.down_proj"]
    for k, v in sd.items():
        if k.startswith("shared_expert"):
            out[k] = v
    return out


def torch_moe(block, cfg: ModelConfig):
    from lantern.backends.torch.moe import SparseMoE

    moe = SparseMoE(cfg).eval()
    w = lantern_weights(block)
    with torch.no_grad():
        moe.gate.weight.copy_(w["gate.weight"])
        moe.experts.gate_up_proj.copy_(w["experts.gate_up_proj"])
        moe.experts.down_proj.copy_(w["experts.down_proj"])
        if moe.shared_expert is not None:
            moe.shared_expert_gate.weight.copy_(w["shared_expert_gate.weight"])
            gate_up = torch.cat([w["shared_expert.gate_proj.weight"], w["shared_expert.up_proj.weight"]])
            moe.shared_expert.gate_up_proj.weight.copy_(gate_up)
            moe.shared_expert.down_proj.weight.copy_(w["shared_expert.down_proj.weight"])
    return moe


def mlx_moe(block, cfg: ModelConfig):
    mx = pytest.importorskip("mlx.core")
    from lantern.backends.mlx.moe import SparseMoE

    moe = SparseMoE(cfg)
    w = lantern_weights(block)
    inner = cfg.moe.intermediate_size
    gate_up = w.pop("experts.gate_up_proj")
    w["experts.gate_proj.weight"] = gate_up[:, :inner]
    w["experts.up_proj.weight"] = gate_up[:, inner:]
    w["experts.down_proj.weight"] = w.pop("experts.down_proj")
    moe.load_weights([(k, mx.array(v.numpy())) for k, v in w.items()], strict=True)
    return moe


def reference(block, x: torch.Tensor) -> np.ndarray:
    with torch.no_grad():
        return block(x[None]).reshape(x.shape).numpy()


@pytest.mark.parametrize("tokens", [3, 48])
@pytest.mark.parametrize("name", list(BLOCKS))
def test_torch_moe_matches_transformers_block(name, tokens):
    block, cfg = hf_block(name)
    moe = torch_moe(block, cfg)
    x = torch.randn(tokens, cfg.hidden_size, generator=torch.Generator().manual_seed(tokens))
    ref = reference(block, x)
    with torch.no_grad():
        np.testing.assert_allclose(moe(x).numpy(), ref, atol=1e-5, rtol=1e-5)
        moe._grouped_mm_ok = False  # the fallback: one matmul per expert hit
        np.testing.assert_allclose(moe(x).numpy(), ref, atol=1e-5, rtol=1e-5)
        # The path CUDA graph capture takes without grouped matmuls: every expert over every token.
        ids, weights = moe.route(x)
        shared = moe(x).numpy() - moe.routed(x, ids, weights).numpy()
        np.testing.assert_allclose(moe._dense(x, ids, weights).numpy() + shared, ref, atol=1e-5, rtol=1e-5)
    assert np.abs(ref).max() > 0.1  # the block computes something


@pytest.mark.parametrize("tokens", [1, 5])
def test_biased_experts_dense_path_matches_grouped(tokens):
    """gpt-oss's experts (biases, clamped SwiGLU, softmax after top-k) through the capture-safe dense
    path and through the grouped one."""
    from lantern.backends.torch.moe import SparseMoE, clamped_swiglu

    cfg = ModelConfig.from_hf(
        hf_config("gpt_oss", num_local_experts=4, num_experts_per_tok=2, head_dim=8, swiglu_limit=2.0).to_dict()
    )
    moe = SparseMoE(
        cfg, router_bias=True, expert_bias=True, glu=clamped_swiglu(1.702, 2.0), softmax_after_topk=True
    ).eval()
    torch.manual_seed(1)
    with torch.no_grad():
        for p in moe.parameters():
            p.normal_(0, 0.5)
        x = torch.randn(tokens, cfg.hidden_size)
        ids, weights = moe.route(x)
        grouped = moe.routed(x, ids, weights).numpy()
        np.testing.assert_allclose(moe._dense(x, ids, weights).numpy(), grouped, atol=1e-5, rtol=1e-5)
    assert np.abs(grouped).max() > 0.1


@pytest.mark.parametrize("tokens", [3, 48])
@pytest.mark.parametrize("name", list(BLOCKS))
def test_mlx_moe_matches_transformers_block(name, tokens):
    mx = pytest.importorskip("mlx.core")
    from lantern.backends.mlx import moe as mlx_moe_module

    block, cfg = hf_block(name)
    moe = mlx_moe(block, cfg)
    x = torch.randn(tokens, cfg.hidden_size, generator=torch.Generator().manual_seed(tokens))
    pairs = tokens * cfg.moe.top_k
    assert (pairs >= mlx_moe_module.SORT_MIN_PAIRS) == (tokens == 48)  # both gather paths run
    np.testing.assert_allclose(np.array(moe(mx.array(x.numpy()))), reference(block, x), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("tokens", [3, 40])
def test_quantized_mlx_experts_match_their_dequantized_weights(tokens):
    """gather_qmm on stacked quantized experts == gather_mm on the same weights dequantized."""
    mx = pytest.importorskip("mlx.core")
    from lantern.backends.mlx.moe import QuantExpertLinear

    block, cfg = hf_block("qwen3_moe_g32")
    quantized, dequantized = mlx_moe(block, cfg), mlx_moe(block, cfg)
    for proj in ("gate_proj", "up_proj", "down_proj"):
        e, rows, cols = getattr(dequantized.experts, proj).weight.shape
        q, scales, biases = mx.quantize(getattr(dequantized.experts, proj).weight, group_size=32, bits=4)
        getattr(dequantized.experts, proj).weight = mx.dequantize(q, scales, biases, group_size=32, bits=4)
        layer = QuantExpertLinear(e, cols, rows, bits=4, group_size=32)
        layer.update({"weight": q, "scales": scales, "biases": biases})
        setattr(quantized.experts, proj, layer)
    x = mx.array(np.random.default_rng(tokens).standard_normal((tokens, cfg.hidden_size)).astype(np.float32))
    want = np.array(dequantized(x))
    np.testing.assert_allclose(np.array(quantized(x)), want, atol=1e-4, rtol=1e-4)
    assert np.abs(want - reference(block, torch.from_numpy(np.array(x)))).max() > 1e-3  # really quantized


@pytest.mark.parametrize(
    ("model_type", "extra", "sparse"),
    [
        ("mixtral", {}, [True] * 4),
        ("qwen2_moe", {"decoder_sparse_step": 2}, [False, True, False, True]),
        ("qwen3_moe", {"mlp_only_layers": [0, 3]}, [False, True, True, False]),
        ("qwen3_moe", {"decoder_sparse_step": 3, "mlp_only_layers": [2]}, [False, False, False, False]),
    ],
)
def test_sparse_layers_are_transformers_sparse_layers(model_type, extra, sparse):
    from transformers import AutoModelForCausalLM

    config = hf_config(model_type, **extra)
    model = AutoModelForCausalLM.from_config(config)
    hf_sparse = [not hasattr(layer.mlp, "gate_proj") for layer in model.model.layers]
    assert hf_sparse == sparse
    cfg = ModelConfig.from_hf(config.to_dict())
    if not any(sparse):
        assert cfg.moe is None  # a dense model in MoE clothing
    else:
        assert [cfg.moe.is_sparse(i) for i in range(4)] == sparse


def test_config_fields():
    fields = {"num_layers": 2}
    mixtral = configure("mixtral", {"num_local_experts": 8, "num_experts_per_tok": 2, "intermediate_size": 96}, fields)
    assert mixtral["moe"] == MoEConfig(8, 2, 96, norm_topk_prob=True, router_weights_fp32=True)
    qwen2 = configure("qwen2_moe", {"num_experts": 60, "moe_intermediate_size": 32, "qkv_bias": False}, fields)
    assert qwen2["moe"].shared_expert_size == 5632 and qwen2["moe"].top_k == 4
    assert qwen2["attention_bias"] is False and not qwen2["moe"].norm_topk_prob
    qwen3 = configure("qwen3_moe", {"num_local_experts": 16, "num_experts_per_tok": 4}, fields)  # the alias
    assert qwen3["moe"].num_experts == 16 and qwen3["moe"].shared_expert_size is None


@pytest.mark.parametrize(
    ("cfg", "key"),
    [
        ({"num_experts": 4, "num_experts_per_tok": 5}, "num_experts_per_tok=5"),
        ({"num_experts": 4, "num_experts_per_tok": 2, "topk_group": 2}, "topk_group=2"),
        ({"num_experts": 4, "num_experts_per_tok": 2, "scoring_func": "sigmoid"}, 'scoring_func="sigmoid"'),
        ({"num_experts": 4, "num_experts_per_tok": 2, "decoder_sparse_step": 0}, "decoder_sparse_step=0"),
    ],
)
def test_unimplemented_routing_is_refused_naming_the_key(cfg, key):
    with pytest.raises(UnsupportedModelError, match=key):
        configure("qwen3_moe", cfg, {"num_layers": 2})


def test_checkpoint_names_map_to_stacked_experts():
    assert (
        moe_name("model.layers.3.block_sparse_moe.experts.5.w1.weight")
        == "model.layers.3.mlp.experts.5.gate_proj.weight"
    )
    assert (
        moe_name("model.layers.3.block_sparse_moe.experts.5.w2.weight")
        == "model.layers.3.mlp.experts.5.down_proj.weight"
    )
    assert moe_name("model.layers.3.block_sparse_moe.gate.weight") == "model.layers.3.mlp.gate.weight"
    assert expert_part("model.layers.1.mlp.experts.7.up_proj.weight") == (
        "model.layers.1.mlp.experts",
        7,
        "up_proj",
        "weight",
    )
    assert expert_part("model.layers.1.mlp.shared_expert.up_proj.weight") is None
    assert expert_part("model.layers.1.mlp.up_proj.weight") is None


def test_tensor_parallel_moe_is_refused():
    from lantern.backends.torch.moe import SparseMoE
    from lantern.backends.torch.parallel import TPGroup

    _, cfg = hf_block("qwen3_moe")
    with pytest.raises(ValueError, match="tensor parallelism is not implemented for mixture-of-experts"):
        SparseMoE(cfg, TPGroup(rank=0, world=2))
