"""Shared by the quantized-model tests: Lantern's logits through the paged cache vs transformers run
on the DEQUANTIZED weights (the exact values the quantized file holds)."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lantern.app.engine import LLM
from tests.conformance.test_parity import PROMPT, hf_model
from tests.fixtures.teacher_forcing import teacher_forced_logits


def relaid_folder(src: Path, out: Path, relay: Callable[[str, np.ndarray], dict[str, np.ndarray]]) -> Path:
    """A copy of the folder `src` (its other files as they are) whose tensors are relay(name, w): the names and
    values each one becomes (none: dropped)."""
    from safetensors.numpy import load_file, save_file

    out.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.suffix != ".safetensors" and f.is_file():
            shutil.copy(f, out / f.name)
    for f in src.glob("*.safetensors"):
        relaid = {k2: v2 for k, v in load_file(str(f)).items() for k2, v2 in relay(k, v).items()}
        save_file(relaid, str(out / f.name), metadata={"format": "pt"})
    return out


def reference_folder(src: Path, out: Path, transform: Callable[[str, np.ndarray], np.ndarray]) -> Path:
    """A copy of the float folder `src` whose weights went through `transform(name, w)`."""
    return relaid_folder(src, out, lambda k, v: {k: np.ascontiguousarray(transform(k, v), dtype=np.float32)})


def logits_error(model: str, reference: str, backend: str, steps: int = 6, dtype: str = "float32", **options) -> float:
    """Largest |ours - transformers| over the prompt's last position and `steps` decode steps,
    teacher-forced on transformers' greedy tokens, divided by the reference logits' spread."""
    llm = LLM(model, backend=backend, dtype=dtype, block_size=4, prefill_chunk_size=8, num_kv_blocks=64, **options)
    try:
        engine = llm.engine
        prompt_ids = llm.tokenizer.encode(PROMPT)
        hf = hf_model(reference)
        hf.generation_config.eos_token_id = None
        with torch.no_grad():
            out = hf.generate(torch.tensor([prompt_ids]), max_new_tokens=steps, do_sample=False, pad_token_id=0)
            ref_tokens = out[0, len(prompt_ids) :].tolist()
            ref_logits = hf(torch.tensor([prompt_ids + ref_tokens])).logits[0].numpy()
        worst = 0.0
        compared = 0
        for pos, ours in teacher_forced_logits(engine, prompt_ids, ref_tokens):
            ref = ref_logits[pos]
            assert np.isfinite(ours).all(), f"non-finite logits at position {pos}"  # max() would skip a NaN
            worst = max(worst, float(np.abs(ours - ref).max() / ref.std()))
            compared += 1
        assert compared == steps
    finally:
        llm.engine.shutdown()
    return worst


def torch_cpu_vnni() -> bool:
    """Whether the torch backend's CPU layers are the VNNI ones here (AVX512-VNNI: 4-bit codes of
    up to 4 bits, 8-bit of 5..8, any group that is a multiple of 32 held exactly), rather than aten's
    int4pack / per-channel int8pack (which requantize 5..8-bit groups to int8 per channel)."""
    from lantern.backends.torch import cpu_vnni_gemm

    return cpu_vnni_gemm.available()


_BF16_BASELINE: dict[str, float] = {}


def tolerance(backend: str, reference: str) -> float:
    """How far Lantern may be from transformers on the dequantized weights.

    MLX computes in float32 on exactly those values: 2e-3 of the logits' spread. torch/CPU's int4
    and int8 kernels take bfloat16 activations (their fast path; each layer is checked to 2^-6 in
    tests/unit/test_torch_quant_linear.py), and these random 2-layer models amplify rounding by
    orders of magnitude, so the bound is calibrated on the same model: 5x what running the float
    reference itself in bfloat16 costs, and never below 0.15.
    """
    if backend == "mlx":
        return 2e-3
    if reference not in _BF16_BASELINE:
        _BF16_BASELINE[reference] = logits_error(reference, reference, "torch", dtype="bfloat16")
    return max(0.15, 5 * _BF16_BASELINE[reference])


def assert_isq_matches_reference(
    src: Path, out: Path, backend: str, scheme: str, caplog: Any, exact: Callable[[str], bool] | None = None
) -> None:
    """--isq `scheme` of the float folder `src` against transformers on what it holds (tests/models/test_isq's
    isq_reference; `exact`: the checkpoint tensors --isq keeps float beside those), the quantization real (the float
    model further away) and every matrix counted by the progress bar (quantize_stream saw exactly isq_candidates'
    matrices)."""
    import logging

    from lantern.app.models import isq
    from tests.models.test_isq import isq_reference

    quantized = isq_reference(backend, scheme)
    ref = reference_folder(src, out, lambda n, w: w if exact is not None and exact(n) else quantized(n, w))
    with caplog.at_level(logging.DEBUG, logger=isq.__name__):
        err = logits_error(str(src), str(ref), backend, quantization=scheme)
    assert err <= tolerance(backend, str(ref)), f"{backend} {scheme}: logits differ by {err:.4f} of their spread"
    assert logits_error(str(src), str(ref), backend) > err
    assert "were expected" not in caplog.text
