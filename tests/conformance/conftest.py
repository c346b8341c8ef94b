"""The conformance suite runs once per backend: every backend must pass the same tests."""
from __future__ import annotations

import importlib.util

import pytest

BACKENDS = [
    pytest.param(name, marks=pytest.mark.skipif(importlib.util.find_spec(mod) is None, reason=f"{mod} not installed"))
    for name, mod in (("mlx", "mlx"), ("torch", "torch"))
]


@pytest.fixture(scope="module", params=BACKENDS)
def backend(request) -> str:
    return request.param
