"""Loading mixture-of-experts checkpoints: experts stacked while streaming, quantized ones kept quantized.

References are transformers on float folders: for `--isq` the float folder with every 2-D weight
replaced by its quantized-then-dequantized value in the backend's layout (as tests/models/test_isq.py
does); for a quantized checkpoint, the folder of its dequantized weights (tests/fixtures/hf_quant_writers).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fixtures.hf_quant_writers import writer
from tests.models.quant_logits import logits_error, reference_folder, tolerance
from tests.models.test_isq import isq_reference

BACKENDS = ["mlx", "torch"]


def expert_modules(engine) -> list[object]:
    model = engine.backend.model
    return [layer.mlp.experts for layer in model.model.layers if hasattr(layer.mlp, "experts")]


def assert_experts_quantized(engine) -> None:
    experts = expert_modules(engine)
    assert experts
    if engine.backend.name == "mlx":
        from lantern.backends.mlx.moe import QuantExpertLinear

        assert all(isinstance(e.down_proj, QuantExpertLinear) for e in experts)
    else:
        from lantern.backends.torch.moe import QuantExperts
        from lantern.backends.torch.quant_linear import QuantLayer, StackedLinear

        assert all(isinstance(e, QuantExperts) for e in experts)
        layers = [m for e in experts for m in [*e.gate_up_proj, *e.down_proj]]
        # gate and up quantized differently (act-order permutations that differ) stay a stack of two
        layers = [p for m in layers for p in (m.parts if isinstance(m, StackedLinear) else [m])]
        assert all(isinstance(m, QuantLayer) for m in layers)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(("variant", "scheme"), [("qwen2_moe", "q4"), ("mixtral", "q4"), ("qwen3_moe", "q8")])
def test_isq_on_moe_matches_the_dequantized_reference(tiny_model_dir, tmp_path, backend, variant, scheme):
    from lantern.app.engine import LLM

    src = Path(tiny_model_dir(variant))
    # --isq keeps the routers in float (app/models/isq.py): so does the reference.
    ref = reference_folder(src, tmp_path / "ref", isq_reference(backend, scheme))
    err = logits_error(str(src), str(ref), backend, quantization=scheme)
    assert err <= tolerance(backend, str(ref)), f"{backend} {variant} {scheme}: {err:.4f} of the logits' spread"
    assert logits_error(str(src), str(ref), backend) > err  # the quantization is real
    engine = LLM(str(src), backend=backend, dtype="float32", num_kv_blocks=8, quantization=scheme).engine
    assert_experts_quantized(engine)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", ["gptq8", "mlx_mxfp4"])
def test_quantized_moe_checkpoint_stays_quantized(tmp_path, backend, kind):
    """A GPTQ 8-bit per-channel folder (one quantized tensor per expert, float router), and an MLX
    mxfp4 one (router quantized too, dequantized at load): both backends hold the exact values (torch
    int8pack / 5-bit codes, MLX g128/g32 or gather_qmm's mxfp4 mode), so they match the dequantized weights."""
    from lantern.app.engine import LLM

    quant, ref = writer(kind, tmp_path, variant="qwen3_moe")
    err = logits_error(str(quant), str(ref), backend)
    assert err <= tolerance(backend, str(ref)), f"{backend}: {err:.4f}"
    assert_experts_quantized(LLM(str(quant), backend=backend, dtype="float32", num_kv_blocks=8).engine)


def test_nvfp4_experts_keep_their_global_scales_on_mlx(tmp_path):
    """compressed-tensors NVFP4 experts, each with its own global scale: MLX stacks them for
    gather_qmm in nvfp4 mode and multiplies each expert's output by its scale (float32)."""
    pytest.importorskip("mlx.core")
    from lantern.app.engine import LLM
    from lantern.backends.mlx.moe import QuantExpertLinear

    quant, ref = writer("ct_nvfp4", tmp_path, variant="qwen3_moe")
    err = logits_error(str(quant), str(ref), "mlx")
    assert err <= tolerance("mlx", str(ref)), f"{err:.4f}"
    engine = LLM(str(quant), backend="mlx", dtype="float32", num_kv_blocks=8).engine
    experts = expert_modules(engine)
    assert experts and all(isinstance(e.down_proj, QuantExpertLinear) for e in experts)
    down = experts[0].down_proj
    assert down.mode == "nvfp4" and down.global_scale.shape == (down.weight.shape[0],)
    assert len(set(down.global_scale.tolist())) > 1  # one per expert, not one for all


@pytest.mark.parametrize("backend", BACKENDS)
def test_act_order_moe_checkpoint(tmp_path, backend, caplog):
    """GPTQ act-order experts (each its own column permutation): torch keeps one gathering layer per
    expert, exactly; MLX's stacked gather_qmm takes no per-expert gather, so they are requantized to
    8 bits in input order there (logged, and within the tolerance of the file's values)."""
    import logging

    from lantern.app.engine import LLM
    from lantern.app.models.quant.affine import quantize_affine

    quant, ref = writer("gptq_act", tmp_path, variant="qwen3_moe")
    if backend == "mlx":  # the reference holds what MLX holds: each expert's file values as 8-bit g32

        def held(name, w):
            return quantize_affine(w, 8, 32).dequantize() if ".experts." in name and w.ndim == 2 else w

        ref = reference_folder(ref, tmp_path / "held", held)
    with caplog.at_level(logging.WARNING):
        err = logits_error(str(quant), str(ref), backend)
    assert err <= tolerance(backend, str(ref)), f"{backend}: {err:.4f}"
    assert ("in input order (stacked experts)" in caplog.text) == (backend == "mlx"), caplog.text
    assert_experts_quantized(LLM(str(quant), backend=backend, dtype="float32", num_kv_blocks=8).engine)


@pytest.mark.parametrize("backend", BACKENDS)
def test_missing_expert_is_named(tiny_model_dir, tmp_path, backend):
    import shutil

    from safetensors.numpy import load_file, save_file

    from lantern.app.engine import LLM

    src = Path(tiny_model_dir("mixtral"))
    out = tmp_path / "broken"
    shutil.copytree(src, out)
    weights = load_file(str(out / "model.safetensors"))
    del weights["model.layers.1.block_sparse_moe.experts.2.w3.weight"]
    save_file(weights, str(out / "model.safetensors"))
    with pytest.raises(ValueError, match=r"model\.layers\.1\.mlp\.experts"):
        LLM(str(out), backend=backend, dtype="float32", num_kv_blocks=8)


def test_float_experts_are_stacked_in_place(tiny_model_dir):
    """torch: each layer's experts are one [E, 2I, H] and one [E, H, I] tensor holding the checkpoint's
    values (gate rows before up rows), and nothing else of the experts remains."""
    import torch
    from safetensors.torch import load_file

    from lantern.app.engine import LLM

    path = tiny_model_dir("mixtral")
    engine = LLM(path, backend="torch", dtype="float32", num_kv_blocks=8).engine
    file = load_file(str(Path(path) / "model.safetensors"))
    experts = engine.backend.model.model.layers[1].mlp.experts
    names = [n for n, _ in experts.named_parameters()]
    assert names == ["gate_up_proj", "down_proj"]
    inner = experts.down_proj.shape[2]
    stem = "model.layers.1.block_sparse_moe.experts.3"
    assert torch.equal(experts.gate_up_proj[3, :inner], file[f"{stem}.w1.weight"])
    assert torch.equal(experts.gate_up_proj[3, inner:], file[f"{stem}.w3.weight"])
    assert torch.equal(experts.down_proj[3], file[f"{stem}.w2.weight"])
