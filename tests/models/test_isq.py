"""--isq q4|q8 (in-situ quantization): a float checkpoint quantized while loading, on both backends.

The reference is transformers on the same float folder with every 2-D weight (but the MoE routers
and matrices too narrow for the layout, which --isq keeps in float) replaced by its round-to-nearest
quantized-then-dequantized value in the backend's layout — so a mismatch means Lantern computes
something other than the quantized weights it claims to hold.
"""

from __future__ import annotations

import logging
import math

import numpy as np
import pytest

from lantern.app.models.family_granite import granitemoe_name
from lantern.app.models.family_moe import is_router, moe_name
from lantern.app.models.isq import _NOT_MATRICES, MLA_FLOAT, IsqMode
from lantern.app.models.quant.affine import AffineWeight, quantize_affine
from tests.fixtures.tiny_models import ARCH_VARIANTS
from tests.models.quant_logits import logits_error, reference_folder, tolerance

# (bits, group, symmetric) each backend quantizes to: torch/CPU's aten int4pack and int8pack
# layouts (backends/torch/weights.py), MLX's affine group 32 (backends/mlx/weights.py).
MODES = {
    ("torch", "q4"): (4, 32, False),
    ("torch", "q8"): (8, 0, True),
    ("mlx", "q4"): (4, 32, False),
    ("mlx", "q8"): (8, 32, False),
}
# The input width each layout needs a multiple of (torch's int8pack reads 16 columns at a time).
COLUMN_UNIT = {("torch", "q8"): 16}


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

    with pytest.raises(ValueError, match="quantization must be q4, q8 or fp8"):
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


def isq_reference(backend: str, scheme: str):
    """What --isq holds, in float: every 2-D weight quantized then dequantized, except the MoE
    routers, latent attention's kv_b_proj and the matrices too narrow for the backend's layout,
    which stay exact."""
    bits, group, symmetric = MODES[(backend, scheme)]
    unit = COLUMN_UNIT.get((backend, scheme), 1)

    def transform(name, w):
        router = is_router(moe_name(granitemoe_name(name)))  # (GraniteMoE's router: block_sparse_moe.router.layer)
        if w.ndim == 3 and not router:  # experts stacked [E, out, in] (GraniteMoE): one by one
            return np.stack([transform(name, e) for e in w])
        if w.ndim != 2 or router or name.endswith(MLA_FLOAT):
            return w
        if w.shape[1] % math.lcm(group or 1, unit):
            return w
        return quantize_affine(w.astype("float32"), bits, group or w.shape[1], symmetric=symmetric).dequantize()

    return transform


@pytest.mark.parametrize("scheme", ["q4", "q8"])
# more MoE: tests/unit/test_moe_loading.py
@pytest.mark.parametrize("variant", ["mixtral", "deepseek_v3", "granite_hybrid_moe", "nemotron_h_latent"])
def test_isq_of_experts_and_latent_attention_matches_the_dequantized_reference(
    tiny_model_dir, tmp_path, backend, variant, scheme
):
    """Experts quantized one by one with the routers exact; DeepSeek V3's latent attention too,
    its 24-column q_b_proj kept in float (torch q8: int8pack segfaulted on it; q4 and MLX: not a
    multiple of the group of 32, nor is kv_b_proj's 16)."""
    from pathlib import Path

    src = Path(tiny_model_dir(variant))
    ref = reference_folder(src, tmp_path / "ref", isq_reference(backend, scheme))
    err = logits_error(str(src), str(ref), backend, quantization=scheme)
    assert err <= tolerance(backend, str(ref)), f"{backend} {scheme}: logits differ by {err:.4f} of their spread"
    assert logits_error(str(src), str(ref), backend) > err  # the quantization is real


class _Bar:
    """Stands in for tqdm: records the total and how far the bar got."""

    made: list = []

    def __init__(self, total=None, disable=False, **_):
        self.total, self.n = total, 0
        _Bar.made.append(self)

    def update(self, n=1):
        self.n += n

    def close(self):
        pass


@pytest.mark.parametrize("variant", list(ARCH_VARIANTS))
def test_isq_progress_counts_every_matrix_and_keeps_routers_in_float(tiny_model_dir, monkeypatch, variant):
    """The bar's total is exact (experts counted one by one, routers, latent attention's kv_b_proj
    and a tied head not at all), and every matrix is either quantized or kept in float for a reason
    the stream states."""
    import tqdm

    from lantern.app.models.loader import resolve_model
    from lantern.app.models.weight_stream import iter_weights

    monkeypatch.setattr(tqdm, "tqdm", _Bar)
    _Bar.made = []
    spec = resolve_model(tiny_model_dir(variant)).spec
    mode = IsqMode(8, 0, symmetric=True, col_multiple=16)  # torch/CPU q8
    quantized = kept = routers = 0
    for name, value in iter_weights(spec, "pt", mode, progress=True):
        if is_router(moe_name(name)) or name.endswith(MLA_FLOAT):
            assert not isinstance(value, AffineWeight), name
            routers += 1
        elif isinstance(value, AffineWeight):
            quantized += 1
        elif name == "model.embed_positions.weight" or name.endswith(_NOT_MATRICES):  # GPT-2's position table,
            assert not isinstance(value, AffineWeight)  # A.X-K2's norm gates, ...: kept float by name
        elif name.endswith(".weight") and value.ndim == 2 and not name.endswith("norm.weight"):
            assert value.shape[1] % 16, f"{name} {tuple(value.shape)} could have been quantized"
            kept += 1
    (bar,) = _Bar.made
    assert bar.total == bar.n == quantized + kept, (bar.total, bar.n, quantized, kept)
    # (3n: AltUp's routers; a latent attention's kv_b_proj, counted here too, in MLA models without experts as well)
    held = (spec.config.moe, spec.config.gemma3n, spec.config.mla)
    assert (routers > 0) == any(part is not None for part in held)


def test_int8pack_takes_only_widths_it_can_read_and_aligned_activations(monkeypatch):
    """aten's int8pack kernel reads 16 columns at a time with aligned loads: a 24-column matrix
    goes to the dense kernel, and a bf16 activation view at an odd offset is copied first. (On a
    CPU with AVX512-VNNI those layers are VNNI ones: switched off here as on a CPU without it.)"""
    import numpy as np
    import torch

    from lantern.app.models.quant.affine import ErrorLog
    from lantern.backends.torch import cpu_vnni_gemm
    from lantern.backends.torch.quant_linear import quantized_linear, select_kernel

    monkeypatch.setattr(cpu_vnni_gemm, "available", lambda: False)

    rng = np.random.default_rng(0)
    narrow = quantize_affine(rng.standard_normal((48, 24)).astype(np.float32), 8, 24, symmetric=True)
    assert select_kernel(narrow, "cpu") == "dense"
    w = quantize_affine(rng.standard_normal((48, 64)).astype(np.float32), 8, 64, symmetric=True)
    assert select_kernel(w, "cpu") == "int8pack"
    layer = quantized_linear(w, None, "cpu", torch.bfloat16, ErrorLog())
    flat = torch.randn(5 * 64 + 3).to(torch.bfloat16)
    view = flat[3:].view(5, 64)  # contiguous, 6 bytes past an aligned address
    expected = torch.from_numpy(w.dequantize()) @ view.float().T
    got = layer(view).float().T
    assert torch.allclose(got, expected, rtol=2e-2, atol=2e-2 * float(expected.abs().max()))


# ---- --isq fp8 --------------------------------------------------------------------------------------
def test_isq_fp8_rows_are_e4m3_of_each_rows_scale():
    """fp8: each row's largest magnitude becomes e4m3's 448, and every weight is within e4m3's rounding
    (3 mantissa bits: half a step is 2^-4 of the value, or 2^-10 times the scale below its normals)."""
    import numpy as np
    import torch

    w = torch.randn(70, 256) * torch.rand(70, 1) * 3
    w[5] = 0.0  # an all-zero row keeps a positive scale
    q = IsqMode(8, 0, kind="fp8").quantize(w)
    assert q.data.dtype == np.uint8 and q.scale.shape == (70, 1) and q.block is None and q.scale.min() > 0
    codes = torch.from_numpy(q.data).view(torch.float8_e4m3fn).float()
    nonzero = [r for r in range(70) if r != 5]
    assert torch.equal(codes.abs().amax(dim=1)[nonzero], torch.full((69,), 448.0))
    exact = w.numpy()
    bound = np.maximum(np.abs(exact) * 2.0**-4, q.scale * 2.0**-10) * 1.0001
    assert np.all(np.abs(q.dequantize() - exact) <= bound)
    assert np.all(q.dequantize()[5] == 0)


def test_isq_fp8(tiny_model_dir, tmp_path, backend):
    """--isq fp8: on MLX every 2-D weight but the embedding and head (kept float, as vLLM's fp8 does) in
    MLX's mxfp8 mode (mx.quantize's codes, mx.dequantize the reference); torch on a CPU refuses it in
    one line naming q8 (no FP8 kernel: it would only be dequantized). On a GPU: test_isq_fp8_on_a_gpu."""
    from pathlib import Path

    from lantern.app.engine import LLM

    src = Path(tiny_model_dir("llama2"))
    if backend == "torch":
        with pytest.raises(ValueError, match=r"--isq fp8 needs a CUDA GPU .* on a CPU .* use --isq q8") as err:
            LLM(str(src), backend="torch", dtype="float32", num_kv_blocks=8, quantization="fp8")
        assert "\n" not in str(err.value)
        return
    import mlx.core as mx
    import numpy as np

    def mxfp8(name, w):
        if w.ndim != 2 or name in ("model.embed_tokens.weight", "lm_head.weight"):  # fp8 keeps them float
            return w
        packed, scales = mx.quantize(mx.array(w.astype("float32")), group_size=32, bits=8, mode="mxfp8")
        values = mx.dequantize(packed, scales, None, group_size=32, bits=8, mode="mxfp8")
        return np.array(values.astype(mx.float32))

    ref = reference_folder(src, tmp_path / "ref", mxfp8)
    err = logits_error(str(src), str(ref), "mlx", quantization="fp8")
    assert err <= tolerance("mlx", str(ref)), f"mlx fp8: logits differ by {err:.4f} of their spread"
    assert logits_error(str(src), str(ref), "mlx") > err  # the float model is further away


@pytest.mark.gpu
def test_isq_fp8_on_a_gpu(tiny_model_dir, tmp_path):
    """On a GPU: e4m3 weights with a scale per row (through torch._scaled_mm from compute capability
    8.9, the Triton e4m3 kernels before), against transformers on the same rows' e4m3 values (torch's
    own cast)."""
    from pathlib import Path

    import torch

    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    src = Path(tiny_model_dir("llama2"))

    def fp8(name, w):
        if w.ndim != 2 or w.shape[1] % 32 or name in ("model.embed_tokens.weight", "lm_head.weight"):
            return w
        t = torch.from_numpy(w.astype("float32"))
        scale = t.abs().amax(dim=1, keepdim=True).clamp(min=1e-12) / 448.0
        return ((t / scale).to(torch.float8_e4m3fn).float() * scale).numpy()

    ref = reference_folder(src, tmp_path / "ref", fp8)
    err = logits_error(str(src), str(ref), "torch", quantization="fp8", dtype="bfloat16")  # (torch picks the GPU)
    assert err <= tolerance("torch", str(ref))
