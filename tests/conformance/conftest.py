"""The conformance suite runs once per backend: every backend must pass the same tests."""

from __future__ import annotations

import importlib.util

import pytest

BACKENDS = [
    pytest.param(name, marks=pytest.mark.skipif(importlib.util.find_spec(mod) is None, reason=f"{mod} not installed"))
    for name, mod in (("mlx", "mlx"), ("torch", "torch"))
] + [pytest.param("torch-cuda", marks=pytest.mark.gpu)]  # `pytest -m gpu` on a CUDA machine


@pytest.fixture(scope="module", params=BACKENDS)
def backend(request) -> str:
    if request.param == "torch-cuda":
        import torch

        if not torch.cuda.is_available():
            pytest.skip("no CUDA device")
        return "torch"  # the torch backend puts itself on the GPU when there is one
    return request.param
