"""MLX-format mixture-of-experts folders (mlx-community's `*-4bit` MoE models: experts stacked in `switch_mlp`
tensors; DeepSeek-V3's kv_b_proj split per head; gpt-oss's `MXFP4-Q8` layout: mxfp4 experts with stacked
biases, 8-bit attention and router), and those of the newer dense families, load on both backends and
compute what the folder holds.

The folders are made by mlx_lm itself (tests/fixtures/mlx_lm_folders.py: its sanitize stacks the experts,
its quantize_model quantizes, its save writes); the reference is transformers on the values the folder
stores (`mx.dequantize`), under the float model's per-expert names, through Lantern's paged cache.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest

from lantern.app.models.quant.affine import quantize_affine
from tests.models.quant_logits import logits_error, reference_folder, tolerance, torch_cpu_vnni

pytest.importorskip("mlx_lm")

# latent and head widths that mlx_lm's 32-wide groups divide (so the per-head halves are quantized too)
MLA_WIDE = {"kv_lora_rank": 64, "qk_nope_head_dim": 32, "v_head_dim": 32}
GLM5_KEYS = {"topk_method": "noaux_tc", "scoring_func": "sigmoid", "moe_layer_freq": 1}
# case -> (variant, convert options)
CASES = {
    "qwen3_moe-4bit": ("qwen3_moe", {"mode": "affine", "group": 32, "bits": 4}),
    "mixtral-4bit-g64": ("mixtral", {"mode": "affine", "group": 64, "bits": 4}),  # block_sparse_moe, w1/w2/w3
    "qwen2_moe-8bit": ("qwen2_moe", {"mode": "affine", "group": 32, "bits": 8}),  # plus a shared expert
    "qwen3_moe-nvfp4-gs": ("qwen3_moe", {"mode": "nvfp4", "group": None, "bits": None, "global_scale": True}),
    "qwen3_moe-float": ("qwen3_moe", {"mode": None}),  # an MLX-format float conversion: stacked floats
    # DeepSeek-V3 / Kimi: kv_b_proj stored as per-head embed_q / unembed_out halves, each quantized
    "deepseek_v3-4bit": ("deepseek_v3", {"mode": "affine", **MLA_WIDE}),
    "deepseek_v2-4bit": ("deepseek_v2_yarn", {"mode": "affine", **MLA_WIDE}),  # kv_b_proj kept whole
    # DeepSeek-V3.2: V3's halves plus the indexer's wq_b / wk quantized (its weights_proj too, read dequantized)
    "deepseek_v32-4bit": ("deepseek_v32", {"mode": "affine", **MLA_WIDE, "index_head_dim": 32}),
    # GLM-5's layout (mlx_lm reads the released config's router keys; its loader wants an indexer in every layer)
    "glm_moe_dsa-4bit": (
        "glm_moe_dsa",
        {"mode": "affine", **MLA_WIDE, "index_head_dim": 32, "indexer_types": ["full"] * 3, **GLM5_KEYS},
    ),
    "glm4_moe-4bit": ("glm4_moe", {"mode": "affine", "head_dim": 32}),  # GLM-4.5-Air-4bit's layout
    "glm4_moe_lite-4bit": ("glm4_moe_lite", {"mode": "affine", **MLA_WIDE}),  # GLM-4.7-Flash-4bit's
    "ernie4_5_moe-4bit": ("ernie4_5_moe", {"mode": "affine", "head_dim": 32}),  # moe_statics router bias
    # dense families whose maths live in config keys mlx_lm reads too (NoPE layers; Granite's scalars)
    "smollm3-4bit": ("smollm3", {"mode": "affine"}),
    "granite-4bit": ("granite", {"mode": "affine"}),
    "granitemoe-4bit": ("granitemoe", {"mode": "affine"}),  # fused input_linear / output_linear experts
    # Granite 4.0-H: the conv kernel in MLX's layout, the experts under block_sparse_moe.switch_mlp beside the
    # fused shared_mlp; without experts mlx_lm names the shared_mlp `mlp` (and sizes it intermediate_size)
    "granite_hybrid-4bit": ("granite_hybrid", {"mode": "affine", "mamba_d_head": 32, "intermediate_size": 96}),
    "granite_hybrid_moe-4bit": ("granite_hybrid_moe", {"mode": "affine", "mamba_d_head": 64, "intermediate_size": 64}),
    "nemotron_h-4bit": ("nemotron_h", {"mode": "affine", "mamba_head_dim": 32}),  # backbone.* names, one mixer each
    # Nemotron 3: ungated experts stacked as switch_mlp.fc1 / fc2, the router's correction bias kept in float
    "nemotron_h_moe-4bit": (
        "nemotron_h_moe",
        {"mode": "affine", "mamba_head_dim": 32, "moe_shared_expert_intermediate_size": 64},
    ),
    "olmo3-4bit": ("olmo3", {"mode": "affine"}),  # q/k norms over whole projections, sliding layers
    "olmoe-4bit": ("olmoe", {"mode": "affine", "intermediate_size": 64}),  # switch_mlp experts, whole q/k norms
    # block_sparse_moe.switch_mlp, the bias beside the gate (mlx_lm reads the released shared_intermediate_size)
    "minimax_m2-4bit": ("minimax_m2", {"mode": "affine", "shared_intermediate_size": 0}),
    "seed_oss-4bit": ("seed_oss", {"mode": "affine"}),  # q/k/v biases
    # q/k norms after the rope (query_layernorm / key_layernorm), the NTK-alpha rope mlx_lm reads as rope_scaling
    "hunyuan_dense-4bit": ("hunyuan_dense", {"mode": "affine", "head_dim": 32}),
    # xIELU's scalars squeezed by mlx_lm, its norms' own names; the released configs' keys mlx_lm reads
    "apertus-4bit": ("apertus", {"mode": "affine", "mlp_bias": False, "post_norm": False, "qk_norm": True}),
    # LFM2-MoE (LFM2-8B-A1B-4bit's layout): feed_forward.switch_mlp, gate_proj/up/down for w1/w3/w2, expert_bias
    "lfm2_moe-4bit": ("lfm2_moe", {"mode": "affine", "intermediate_size": 128, "moe_intermediate_size": 64}),
    # Arcee Trinity: mlp.router.gate and mlp.expert_bias beside stacked experts, the attention's gate_proj quantized
    "afmoe-4bit": ("afmoe", {"mode": "affine"}),
    # Mellum 2: every layer sparse (mlx_lm has no dense ones), ropes nested by layer type (YaRN full, plain sliding)
    "mellum-4bit": ("mellum", {"mode": "affine", "mlp_layer_types": ["sparse"] * 4}),
    # Laguna: per-layer query heads, g_proj, the router's bias under `experts`, shared_expert; ropes nested by type
    "laguna-4bit": ("laguna", {"mode": "affine"}),
    # K-EXAONE: the router's bias beside the gate; mlx_lm reads the released config's is_moe_layer
    "exaone_moe-4bit": ("exaone_moe", {"mode": "affine", "is_moe_layer": [False, True, True, True]}),
    "cohere2-4bit": ("cohere2", {"mode": "affine", "tie_word_embeddings": True}),  # parallel block, NoPE globals
    # per-head q/k norms, NoPE global layers; the pattern as EXAONE's configs state it (mlx_lm reads it)
    "exaone4-4bit": (
        "exaone4",
        {
            "mode": "affine",
            "head_dim": 32,
            "sliding_window_pattern": "LG",
            "layer_types": ["sliding_attention", "full_attention"],
        },
    ),
}


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    from tests.fixtures.mlx_lm_folders import convert, convert_gptoss

    made: dict[str, tuple[Path, Path]] = {}

    def get(case: str) -> tuple[Path, Path]:
        if case == "gpt_oss-mxfp4-q8" and case not in made:  # mlx-community's gpt-oss layout
            made[case] = convert_gptoss(tmp_path_factory.mktemp(case))
        if case not in made:
            variant, options = CASES[case]
            made[case] = convert(variant, tmp_path_factory.mktemp(case), **options)
        return made[case]

    return get


def _held(backend: str, case: str) -> tuple[int, int, bool] | None:
    """The mode torch's CPU layers hold a case's quantized tensors in where they have no exact layout."""
    if backend != "torch":
        return None
    vnni = torch_cpu_vnni()
    if case == "qwen3_moe-nvfp4-gs":  # nvfp4's 16-wide groups: 8-bit g32 (VNNI) or int8 per channel
        return (8, 32, False) if vnni else (8, 0, True)
    if case in ("qwen2_moe-8bit", "gpt_oss-mxfp4-q8") and not vnni:  # aten's int8pack: per channel
        return (8, 0, True)
    return None


@pytest.mark.parametrize("case", [*CASES, "gpt_oss-mxfp4-q8"])
def test_mlx_moe_folder_logits_match_what_the_backend_holds(folders, backend, case, tmp_path, caplog):
    quant, ref = folders(case)
    held = _held(backend, case)
    if held is not None:
        bits, group, symmetric = held

        def held_rows(w: np.ndarray) -> np.ndarray:
            return quantize_affine(w.astype("float32"), bits, group or w.shape[1], symmetric=symmetric).dequantize()

        def hold(name: str, w: np.ndarray) -> np.ndarray:
            if name.endswith(("experts.gate_up_proj", "experts.down_proj")):  # gpt-oss: [E, in, out]
                return np.stack([held_rows(expert.T).T for expert in w])
            if w.ndim != 2 or "norm" in name or name.endswith((".gate.weight", "gate.weight", "router.weight")):
                return w  # routers are used dequantized (the file's values exactly)
            return held_rows(w)

        ref = reference_folder(ref, tmp_path / "held", hold)
    with caplog.at_level(logging.INFO):
        err = logits_error(str(quant), str(ref), backend)
    assert err <= tolerance(backend, str(ref)), f"{backend} {case}: {err:.4f}"
    # (torch's VNNI layers also log their int8 activations' error: "requantized" marks a weight converted)
    converted = [line for line in caplog.text.splitlines() if "relative error" in line]
    if backend == "torch":
        converted = [line for line in converted if "requantized" in line]
    assert bool(converted) == (held is not None), caplog.text


def test_stacked_experts_are_split_into_the_checkpoint_names(folders):
    """What the weight stream hands the models: per-expert names, each expert its own slice, quantized."""
    from lantern.app.models.loader import resolve_model
    from lantern.app.models.quant.affine import AffineWeight
    from lantern.app.models.weight_stream import iter_weights

    quant, _ = folders("qwen3_moe-4bit")
    names = dict(iter_weights(resolve_model(str(quant)).spec, "pt", progress=False))
    experts = [n for n in names if ".mlp.experts." in n]
    assert not any("switch_mlp" in n for n in names)
    assert len(experts) == 8 * 3 and "model.layers.1.mlp.experts.7.down_proj.weight" in experts
    first, last = (
        names["model.layers.1.mlp.experts.0.gate_proj.weight"],
        names["model.layers.1.mlp.experts.7.gate_proj.weight"],
    )
    assert isinstance(first, AffineWeight) and first.shape == (32, 128) and first.bits == 4
    assert not np.array_equal(first.codes, last.codes)


def test_deepseek_v3_per_head_halves_join_back_into_the_checkpoints_kv_b(folders, tmp_path):
    """An MLX-format float DeepSeek-V3 (mlx_lm's embed_q / unembed_out, unquantized): the kv_b_proj the
    stream hands the models is the float checkpoint's own, bit for bit (the fixture's reference is not
    used: it joins the halves by the same rule)."""
    from safetensors.numpy import load_file

    from lantern.app.models.loader import resolve_model
    from lantern.app.models.weight_stream import iter_weights
    from tests.fixtures.mlx_lm_folders import convert

    quant, _ = convert("deepseek_v3", tmp_path, mode=None, **MLA_WIDE)
    names = dict(iter_weights(resolve_model(str(quant)).spec, "pt", progress=False))
    source = load_file(str(tmp_path / "deepseek_v3-float" / "model.safetensors"))
    for layer in (0, 1):
        name = f"model.layers.{layer}.self_attn.kv_b_proj.weight"
        np.testing.assert_array_equal(names[name], source[name])
