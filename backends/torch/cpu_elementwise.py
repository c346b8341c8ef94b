"""Native elementwise steps for bfloat16 layers on a CPU: kernels/cpu_elementwise.c, built on first use.

RMSNorm (with its residual add), rotary embedding and SiLU(gate) * up each run as several torch ops
on a CPU, every one a pass over memory; here each is one pass (the roundings stay torch's, see the C
file). Eager steps only: inside a torch.compile graph (compiled decode) inductor fuses the same ops
itself, and a ctypes call there would break the graph, so `serves` says no while compiling.
"""

from __future__ import annotations

import ctypes
import functools

import torch

from lantern.backends.torch import native_build


@functools.cache
def _library() -> ctypes.CDLL | None:
    lib = native_build.load("cpu_elementwise.c", "bf16 norms, rope and activations run as torch ops", avx2=True)
    if lib is None:
        return None
    p, i64, f32 = ctypes.c_void_p, ctypes.c_long, ctypes.c_float
    lib.lantern_rms_norm_bf16.argtypes = [p, i64, i64, i64, p, i64, i64, p, f32, i64, i64, p, p]
    lib.lantern_rope_bf16.argtypes = [p, i64, i64, p, p, i64, i64, i64, p]
    lib.lantern_silu_mul_bf16.argtypes = [p, i64, i64, i64, p]
    for fn in (lib.lantern_rms_norm_bf16, lib.lantern_rope_bf16, lib.lantern_silu_mul_bf16):
        fn.restype = None
    return lib


def serves(x: torch.Tensor) -> bool:
    """Whether x (a bf16 activation on a CPU, outside a compiled graph) takes the native steps."""
    return (
        x.dtype == torch.bfloat16
        and x.device.type == "cpu"
        and not torch.compiler.is_compiling()
        and _library() is not None
    )


def _rows(x: torch.Tensor) -> tuple[int, int, int] | None:
    """(inner, outer stride, inner stride): x's rows (its last dim) as [outer][inner] rows with one stride
    each (a token's heads inside a projection's output), or None when they are not so spaced."""
    if x.dim() < 2 or x.stride(-1) != 1:
        return None
    if x.dim() == 2:
        return 1, x.stride(0), 0
    for k in range(x.dim() - 3):  # dims before the last two flatten into one with a single stride
        if x.shape[k] != 1 and x.stride(k) != x.stride(k + 1) * x.shape[k + 1]:
            return None
    return x.shape[-2], x.stride(-3), x.stride(-2)


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """reference.rms_norm for bf16 x, weight and residual: (normed, x + residual); None when the layout
    does not suit the kernel (the caller then takes the reference)."""
    n = x.shape[-1]
    xr = _rows(x)
    rr = None if residual is None else _rows(residual)
    if (
        xr is None
        or x.dtype != torch.bfloat16
        or weight.dtype != torch.bfloat16
        or weight.shape != (n,)
        or (residual is not None and (rr is None or residual.shape != x.shape or residual.dtype != x.dtype))
    ):
        return None
    lib = _library()
    assert lib is not None
    w = weight.contiguous()
    out = torch.empty(x.shape, dtype=x.dtype)
    h = x if residual is None else torch.empty(x.shape, dtype=x.dtype)
    rows = x.numel() // max(n, 1)
    lib.lantern_rms_norm_bf16(
        x.data_ptr(), xr[0], xr[1], xr[2], None if residual is None else residual.data_ptr(),
        0 if rr is None else rr[1], 0 if rr is None else rr[2], w.data_ptr(), eps, rows, n, out.data_ptr(),
        None if residual is None else h.data_ptr(),
    )  # fmt: skip
    return out, h


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor | None:
    """reference.rotary for bf16 x [T, H, D] (any strides with unit last one), float32 cos/sin [T, D];
    None when the layout does not suit the kernel."""
    if (
        x.dtype != torch.bfloat16
        or x.dim() != 3
        or x.stride(-1) != 1
        or x.shape[-1] % 2
        or cos.dtype != torch.float32
        or sin.dtype != torch.float32
        or cos.shape != (x.shape[0], x.shape[-1])
        or sin.shape != cos.shape
    ):
        return None
    lib = _library()
    assert lib is not None
    cos, sin = cos.contiguous(), sin.contiguous()
    out = torch.empty(x.shape, dtype=x.dtype)
    t, h, d = x.shape
    lib.lantern_rope_bf16(
        x.data_ptr(), x.stride(0), x.stride(1), cos.data_ptr(), sin.data_ptr(), t, h, d, out.data_ptr()
    )
    return out


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor | None:
    """SiLU(gate) * up for bf16 gate_up [T, 2n] (gate first), as the MLP computes it in torch; None
    when the layout does not suit the kernel."""
    if gate_up.dtype != torch.bfloat16 or gate_up.dim() != 2 or gate_up.stride(-1) != 1 or gate_up.shape[-1] % 2:
        return None
    lib = _library()
    assert lib is not None
    t, n = gate_up.shape[0], gate_up.shape[-1] // 2
    out = torch.empty((t, n), dtype=gate_up.dtype)
    lib.lantern_silu_mul_bf16(gate_up.data_ptr(), gate_up.stride(0), t, n, out.data_ptr())
    return out
