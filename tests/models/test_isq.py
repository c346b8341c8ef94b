"""--isq q4|q8 (in-situ quantization): a float checkpoint quantized while loading, on both backends.

The reference is transformers on the same float folder with every 2-D weight replaced by its
round-to-nearest quantized-then-dequantized value in the backend's layout — so a mismatch means
Lantern computes something other than the quantized weights it claims to hold.
"""

from __future__ import annotations

import logging

import pytest

from lantern.app.models.quant.affine import quantize_affine
from tests.models.quant_logits import logits_error, reference_folder, tolerance

# (bits, group, symmetric) each backend quantizes to: torch/CPU's aten int4pack and int8pack
# layouts (backends/torch/weights.py), MLX's affine group 32 (backends/mlx/weights.py).
MODES = {
    ("torch", "q4"): (4, 32, False),
    ("torch", "q8"): (8, 0, True),
    ("mlx", "q4"): (4, 32, False),
    ("mlx", "q8"): (8, 32, False),
}


@pytest.mark.parametrize("scheme", ["q4", "q8"])
@pytest.mark.parametrize("variant", ["llama2", "qwen2", "qwen3"])
def test_isq_logits_match_the_dequantized_reference(tiny_model_dir, tmp_path, backend, variant, scheme):
    from pathlib import Path

    bits, group, symmetric = MODES[(backend, scheme)]
    src = Path(tiny_model_dir(variant))

    def quantized(name, w):
        if w.ndim != 2:
            return w
        return quantize_affine(w.astype("float32"), bits, group or w.shape[1], symmetric=symmetric).dequantize()

    ref = reference_folder(src, tmp_path / "ref", quantized)
    err = logits_error(str(src), str(ref), backend, quantization=scheme)
    assert err <= tolerance(backend, str(ref)), f"{backend} {scheme}: logits differ by {err:.4f} of their spread"
    # ... and the quantization is real: the float model's own logits are further away.
    err_float = logits_error(str(src), str(ref), backend)
    assert err_float > err, (err_float, err)


def test_isq_logs_progress_and_keeps_weights_small(tiny_model_dir, backend, caplog):
    from lantern.app.engine import LLM

    path = tiny_model_dir("llama2")
    with caplog.at_level(logging.INFO):
        full = LLM(path, backend=backend, dtype="float32", num_kv_blocks=8).engine
        q4 = LLM(path, backend=backend, dtype="float32", num_kv_blocks=8, quantization="q4").engine
    assert "in-situ quantization" in caplog.text
    full_bytes = _weight_bytes(full)
    assert _weight_bytes(q4) < 0.45 * full_bytes  # 4-bit codes + scales vs float32


def _weight_bytes(engine) -> int:
    backend = engine.backend
    if backend.name == "mlx":
        return backend.weight_bytes
    from lantern.backends.torch.quant_linear import quantized_bytes

    return quantized_bytes(backend.model)


def test_isq_refuses_an_unknown_scheme(tiny_model_dir):
    from lantern.app.engine import LLM

    with pytest.raises(ValueError, match="quantization must be q4 or q8"):
        LLM(tiny_model_dir("llama2"), quantization="q3")


@pytest.mark.parametrize(("variant", "scheme"), [("llama2", "q4"), ("qwen2", "q4"), ("llama2", "q8")])
def test_isq_weights_shard_over_two_ranks(tiny_model_dir, tmp_path, variant, scheme):
    """Tensor parallelism slices the quantized weights along whole groups (q/k/v and gate/up by
    rows, o_proj and down_proj by input columns; a per-channel q8 row keeps its scale): 2 gloo
    ranks compute the same quantized model."""
    from pathlib import Path

    bits, group, symmetric = MODES[("torch", scheme)]
    src = Path(tiny_model_dir(variant))

    def quantized(name, w):
        if w.ndim != 2:
            return w
        return quantize_affine(w, bits, group or w.shape[1], symmetric=symmetric).dequantize()

    ref = reference_folder(src, tmp_path / "ref", quantized)
    err = logits_error(str(src), str(ref), "torch", quantization=scheme, tensor_parallel_size=2)
    assert err <= tolerance("torch", str(ref))
