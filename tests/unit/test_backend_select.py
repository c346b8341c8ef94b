"""Which backend and dtype `auto` resolves to on each kind of machine."""

from __future__ import annotations

import importlib.util
import io

import pytest

from lantern import backends


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


X86_FLAGS = "fpu vme de pse tsc msr pae mce cx8 apic sse sse2 avx avx2 avx512f avx512bw avx512_vnni"
CPUINFO = """processor\t: 0
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Platinum bf16-ready edition
flags\t\t: {flags}
bugs\t\t: spectre_v1

processor\t: 1
flags\t\t: {flags}
"""
ARM_CPUINFO = """processor\t: 0
BogoMIPS\t: 2000.00
Features\t: {flags}
CPU implementer\t: 0x41
"""


def fake_cpuinfo(monkeypatch, text: str | None) -> list[str]:
    """Serve `text` as /proc/cpuinfo to backends (None: the file does not exist); returns the paths opened."""
    opened: list[str] = []

    def fake_open(path, *args, **kwargs):
        opened.append(str(path))
        if str(path) != "/proc/cpuinfo":
            return open(path, *args, **kwargs)
        if text is None:
            raise FileNotFoundError(path)
        return io.StringIO(text)

    monkeypatch.setattr(backends, "open", fake_open, raising=False)
    return opened


@pytest.mark.parametrize(
    "cpuinfo, expected",
    [
        (CPUINFO.format(flags=X86_FLAGS), False),  # AVX-512 but not its BF16 subset; "bf16" in the model name
        (CPUINFO.format(flags=X86_FLAGS + " avx512_bf16"), True),  # Cooper Lake / Sapphire Rapids
        (CPUINFO.format(flags=X86_FLAGS.replace("avx512f", "amx_bf16 amx_tile")), True),  # AMX
        (ARM_CPUINFO.format(flags="fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics"), False),  # Neoverse N1
        (ARM_CPUINFO.format(flags="fp asimd sve sve2 i8mm bf16 svebf16"), True),  # Graviton 3 / Neoverse V1
        (None, False),  # no /proc/cpuinfo (macOS, Windows)
    ],
)
def test_cpu_bf16_flag_comes_from_proc_cpuinfo(monkeypatch, cpuinfo, expected):
    opened = fake_cpuinfo(monkeypatch, cpuinfo)
    assert backends.cpu_has_native_bf16() is expected
    assert opened == ["/proc/cpuinfo"]


def test_without_torch_mlx_is_the_fallback(monkeypatch):
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(backends, "_is_apple_silicon", lambda: False)
    monkeypatch.setattr(backends, "_mlx_available", lambda: True)
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "torch" else real_find_spec(name, *a)
    )
    assert backends.pick_backend("auto") == "mlx"
