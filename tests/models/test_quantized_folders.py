"""Quantized Hugging Face folders (MLX-community, AWQ, GPTQ, FP8, compressed-tensors) load quantized on
both backends and compute what the file holds.

Folders are written by tests/fixtures/hf_quant_writers.py (AWQ/GPTQ packed by the test from random
integers following the published layouts); the reference is transformers on the DEQUANTIZED
weights, through Lantern's paged cache. Where a backend has no exact layout for a module it
converts it to a stated mode and logs the error; the reference applies the same round-to-nearest
conversion to those modules (see test_quantized_gguf.py for why "close to the file" is no bound).
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest

from lantern.app.models.quant.affine import quantize_affine
from tests.fixtures.hf_quant_writers import writer
from tests.models.quant_logits import logits_error, reference_folder, tolerance, torch_cpu_vnni

PER_CHANNEL_INT8 = (8, 0, True)
# (backend, kind) -> {module name fragment: (bits, group (0: per row), symmetric)} converted modules
# by aten's int8pack layer (torch on a CPU without AVX512-VNNI; the VNNI layers hold them exactly).
CONVERTED = {
    ("torch", "mlx8"): {"": PER_CHANNEL_INT8},  # every quantized tensor: 8-bit g32 -> int8 per channel
    ("torch", "mlx_mixed"): {"embed_tokens": PER_CHANNEL_INT8, "layers.0.mlp.down_proj": PER_CHANNEL_INT8},
    ("torch", "bnb_nf4"): {"proj": PER_CHANNEL_INT8},  # the 8-bit codes of 64-weight blocks
    ("torch", "bnb_fp4"): {"proj": PER_CHANNEL_INT8},
    ("torch", "mlx_mxfp4"): {"": PER_CHANNEL_INT8},  # 5-bit codes (twice each e2m1 value, +12)
    ("torch", "mlx_nvfp4"): {"": PER_CHANNEL_INT8},
    ("torch", "ct_mxfp4"): {"proj": PER_CHANNEL_INT8},
    ("torch", "ct_nvfp4"): {"proj": PER_CHANNEL_INT8},
    ("torch", "modelopt_nvfp4"): {"proj": PER_CHANNEL_INT8},
    ("torch", "gptq_dynamic"): {"down_proj": PER_CHANNEL_INT8},  # its 8-bit g64 modules
    ("torch", "autoround"): {"layers.0.self_attn.k_proj": PER_CHANNEL_INT8},  # 8-bit g32
}
# Converted on every torch CPU: nvfp4's 16-wide groups have no layout (the VNNI layers take 8-bit g32).
ALWAYS_CONVERTED = {
    ("torch", "mlx_nvfp4"): {"": (8, 32, False)},
    ("torch", "ct_nvfp4"): {"proj": (8, 32, False)},
    ("torch", "modelopt_nvfp4"): {"proj": (8, 32, False)},
}
BNB_LEVELS = ("bnb_nf4", "bnb_fp4")  # levels held as 8-bit codes: round(127 * w / block absmax)


# No FP8 matmul on MLX or a CPU: FP8 weights are requantized to 8-bit codes (half of bf16's bytes):
# g32 affine on MLX and torch's VNNI layers, per-channel symmetric int8 for aten's int8pack
FP8_KINDS = ("fp8", "fp8_tensor", "fbgemm_fp8", "ct_fp8", "ct_fp8_block", "modelopt_fp8")
FP8_G32 = {("mlx", kind): {"proj": (8, 32, False)} for kind in FP8_KINDS}
FP8_TORCH = {True: (8, 32, False), False: PER_CHANNEL_INT8}  # by whether the VNNI layers serve


def converted_modules() -> dict:
    vnni = torch_cpu_vnni()
    fp8 = {("torch", kind): {"proj": FP8_TORCH[vnni]} for kind in (*FP8_KINDS, "ct_mxfp8", "modelopt_mxfp8")}
    fp8["torch", "mlx_mxfp8"] = {"proj": FP8_TORCH[vnni], "lm_head": FP8_TORCH[vnni]}  # (its embedding: float)
    # Mixed folders, module by module: FP8 as above, NVFP4 as nvfp4 (on both CPU layouts the same 8-bit
    # mode as FP8), MXFP8 native on MLX, int4 g64 exact everywhere.
    mixed = {
        ("mlx", "modelopt_mixed"): {"layers.0.self_attn": (8, 32, False), "down_proj": (8, 32, False)},
        ("mlx", "ct_mixed"): {"self_attn": (8, 32, False)},
        ("torch", "modelopt_mixed"): {"proj": FP8_TORCH[vnni]},
        ("mlx", "modelopt_moe"): {"self_attn": (8, 32, False)},
        ("torch", "modelopt_moe"): {"proj": FP8_TORCH[vnni]},
        ("torch", "ct_mixed"): {"self_attn": FP8_TORCH[vnni], "layers.0.mlp.down_proj": FP8_TORCH[vnni]},
    }
    return {**(ALWAYS_CONVERTED if vnni else CONVERTED), **FP8_G32, **fp8, **mixed}


# modules a kind's config keeps in float (never converted)
FLOAT_MODULES = {
    "mlx_mixed": "model.layers.1.self_attn.v_proj.weight",
    "modelopt_mixed": "model.layers.1.self_attn.o_proj.weight",
    "ct_mixed": "model.layers.1.mlp.down_proj.weight",
}


KINDS = [
    "mlx4",
    "mlx8",
    "mlx_mixed",
    "awq",
    "gptq",
    "gptq_asym",
    "gptq8",
    "gptq_v2",
    "gptq3",
    "gptq2",
    "gptq_act",
    "fp8",
    "fp8_tensor",
]
KINDS += ["ct_w4a16", "ct_w4_asym", "ct_w4_act", "ct_w8a16", "ct_w8a8", "ct_fp8", "ct_fp8_block"]  # compressed-tensors
KINDS += ["bnb_nf4", "bnb_fp4", "bnb8"]
KINDS += ["mlx_mxfp4", "mlx_nvfp4", "mlx_mxfp8"]  # MLX's microscaled modes (written with MLX's own quantize)
KINDS += ["ct_nvfp4", "ct_mxfp4", "ct_mxfp8"]  # compressed-tensors' (NVFP4 with its per-tensor global scale)
KINDS += ["modelopt_fp8", "modelopt_nvfp4"]  # NVIDIA ModelOpt (FP8 KV-cache scales skipped; hf_quant_config.json)
KINDS += ["fbgemm_fp8"]  # Meta's FP8 (a scale per row)
KINDS += ["gptq_dynamic", "autoround", "autoround_awq"]  # modes per module: GPTQModel's dynamic, AutoRound
KINDS += ["modelopt_mixed", "ct_mixed", "modelopt_mxfp8"]  # several schemes in one model; ModelOpt's MXFP8
KINDS += ["modelopt_moe"]  # NVFP4 experts of a MoE (qwen3_moe) beside FP8 attention and MXFP8 dense MLPs
VARIANT = {"modelopt_moe": "qwen3_moe"}  # (llama2 otherwise)


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    cache = {}

    def get(kind: str):
        if kind not in cache:
            cache[kind] = writer(kind, tmp_path_factory.mktemp(kind), VARIANT.get(kind, "llama2"))
        return cache[kind]

    return get


def held_reference(backend: str, kind: str, ref: Path, out: Path) -> Path:
    rules = converted_modules().get((backend, kind), {})

    def held(name, w):
        if w.ndim != 2 or "norm" in name:
            return w
        if kind in BNB_LEVELS and "proj" in name:  # the documented rounding of each level, on the file's values
            blocks = w.astype(np.float64).reshape(w.shape[0], -1, 64)
            step = np.abs(blocks).max(axis=-1, keepdims=True) / 127
            v = blocks / step  # 127 * level, up to float32 rounding: FP4's 0.5 is a tie (63.5), kept one
            v = np.where(np.abs(2 * v - np.rint(2 * v)) < 1e-3, np.rint(2 * v) / 2, v)
            w = (np.rint(v) * step).reshape(w.shape).astype(np.float32)  # half to even, as the reader
        for fragment, (bits, group, symmetric) in rules.items():
            if fragment in name and name != FLOAT_MODULES.get(kind):
                return quantize_affine(w.astype("float32"), bits, group or w.shape[1], symmetric=symmetric).dequantize()
        return w

    return reference_folder(ref, out, held)


@pytest.mark.parametrize("kind", KINDS)
def test_quantized_folder_logits_match_what_the_backend_holds(folders, backend, kind, tmp_path, caplog):
    quant, ref = folders(kind)
    held = held_reference(backend, kind, Path(ref), tmp_path / "held")
    with caplog.at_level(logging.INFO):
        err = logits_error(str(quant), str(held), backend)
    assert err <= tolerance(backend, str(held)), f"{backend} {kind}: {err:.4f}"
    converted = [line for line in caplog.text.splitlines() if "relative error" in line and "requantized" in line]
    if backend == "mlx":
        converted = [line for line in caplog.text.splitlines() if "relative error" in line]
    assert bool(converted) == ((backend, kind) in converted_modules()), caplog.text


@pytest.mark.parametrize("kind", ["awq", "bnb_nf4", "mlx_mxfp4"])
def test_quantized_folder_stays_small(folders, backend, kind):
    """4-bit AWQ weights take about a quarter of the float32 model's bytes (+ scales), not more; so do
    bitsandbytes nf4 ones (8-bit codes on MLX, 4-bit codebook indices on torch's VNNI layers)."""
    from lantern.app.engine import LLM

    quant, ref = folders(kind)
    sizes = {}
    for name, path in (("quant", quant), ("float", ref)):
        engine = LLM(str(path), backend=backend, dtype="float32", num_kv_blocks=8).engine
        if backend == "mlx":
            sizes[name] = engine.backend.weight_bytes
        else:
            from lantern.backends.torch.quant_linear import quantized_bytes

            sizes[name] = quantized_bytes(engine.backend.model)
    # the float embedding and head stay float in these files: only the projections shrink
    assert sizes["quant"] < 0.75 * sizes["float"], sizes


@pytest.mark.parametrize("kind", ["fp8", "fp8_tensor", "gptq8", "gptq_act"])
def test_quantized_folder_shards_over_two_ranks(folders, kind):
    """FP8 per-tensor scales and per-channel GPTQ slice along the shards; 128x128 FP8 blocks that
    a 64-wide shard would cut are dequantized for that layer (logged); act-order o/down projections,
    whose input columns are scattered, are requantized to 8 bits in input order for the split (logged)."""
    quant, ref = folders(kind)
    err = logits_error(str(quant), str(ref), "torch", tensor_parallel_size=2)
    assert err <= tolerance("torch", str(ref)), f"{kind}: {err:.4f}"
