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
def test_plain_cpu_prefers_torch_in_bfloat16_only_where_the_cpu_has_it(monkeypatch):
    monkeypatch.setattr(backends, "_is_apple_silicon", lambda: False)
    monkeypatch.setattr(backends, "_torch_cuda", lambda: False)
    assert backends.pick_backend("auto") == "torch"
    monkeypatch.setattr(backends, "cpu_has_native_bf16", lambda: False)
    assert backends.default_dtype("torch") == "float32"
    monkeypatch.setattr(backends, "cpu_has_native_bf16", lambda: True)
    assert backends.default_dtype("torch") == "bfloat16"
    assert backends.default_dtype("mlx") == "float32"  # MLX's CPU kernels have no fast bf16 path


def test_cpu_flags_are_read():
    flags = open("/proc/cpuinfo").read() if __import__("os").path.exists("/proc/cpuinfo") else ""
    assert backends.cpu_has_native_bf16() == any(f in flags.split() for f in ("avx512_bf16", "amx_bf16", "bf16"))


def test_without_torch_mlx_is_the_fallback(monkeypatch):
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(backends, "_is_apple_silicon", lambda: False)
    monkeypatch.setattr(backends, "_mlx_available", lambda: True)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "torch" else real_find_spec(name, *a))
    assert backends.pick_backend("auto") == "mlx"
