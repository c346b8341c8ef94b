"""Which backend and dtype `auto` resolves to on each kind of machine."""
from __future__ import annotations

import importlib.util

import pytest

import backends


def test_named_backends_pass_through_and_unknown_names_fail():
    assert backends.pick_backend("mlx") == "mlx"
    assert backends.pick_backend("torch") == "torch"
    with pytest.raises(ValueError, match="backend must be one of"):
        backends.pick_backend("cuda")


def test_apple_silicon_prefers_mlx_in_bfloat16(monkeypatch):
    monkeypatch.setattr(backends, "_is_apple_silicon", lambda: True)
    monkeypatch.setattr(backends, "_mlx_available", lambda: True)
    assert backends.pick_backend("auto") == "mlx"
    assert backends.default_dtype("mlx") == "bfloat16"


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch not installed")
def test_plain_cpu_prefers_torch_in_float32(monkeypatch):
    monkeypatch.setattr(backends, "_is_apple_silicon", lambda: False)
    monkeypatch.setattr(backends, "_torch_cuda", lambda: False)
    assert backends.pick_backend("auto") == "torch"
    assert backends.default_dtype("torch") == "float32"
    assert backends.default_dtype("mlx") == "float32"


def test_without_torch_mlx_is_the_fallback(monkeypatch):
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(backends, "_is_apple_silicon", lambda: False)
    monkeypatch.setattr(backends, "_mlx_available", lambda: True)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "torch" else real_find_spec(name, *a))
    assert backends.pick_backend("auto") == "mlx"
