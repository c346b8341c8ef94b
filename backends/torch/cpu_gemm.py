"""Native int4 and int8 GEMMs for batched CPU decode steps: kernels/cpu_quant_gemm.c, built on first use.

aten's `_weight_int4pack_mm_for_cpu` and `_weight_int8pack_mm` convert the weights again for every
few rows of x, so their cost grows with the rows: at 32 decode rows they compute at ~45-65 GFLOPS on
2 Xeon cores. The int4 kernel decodes each 64-row block once into float32 panels that stay in cache
(~1.7x faster at 32 rows); the int8 one shares each converted weight vector among 6 rows of x
(~1.8x, the head of a 49k-token vocabulary: 23 -> 13 ms). Both read aten's layouts in place (no
second copy of the weights) and give aten's results bit for bit (x and the output rounded to bf16 as
aten rounds them, the same weights and order of sums; the tests check it), so a row's logits do not
depend on how many rows share its step. x and y are float32, or bfloat16 in a bfloat16 model (the
same values: x is already bf16, and y is stored as the bf16 it was rounded to). They serve rows
MIN_ROWS (int4) / MIN_ROWS_INT8 (int8) .. DENSE_ROWS - 1: fewer rows stay on aten's kernels (one
row is bound by memory, and aten's int4 kernel reads it faster), prefill on the dense path.

Built on first use by native_build (x86-64 with AVX-512; elsewhere, without a compiler, or with
LANTERN_CPU_KERNELS=0 the layers keep aten's kernels). It is a torch custom op, so compiled decode
graphs call it like any extern kernel.
"""

from __future__ import annotations

import ctypes
import functools
import logging

import torch

from lantern.backends.torch import native_build

logger = logging.getLogger(__name__)

MIN_ROWS = 12  # below, aten's kernel is as fast or faster (at 8 rows: 0.9-1.4x the native one's time)
MIN_ROWS_INT8 = 2  # the int8 kernel is as fast as aten's from 2 rows on (a 49152 x 576 head: 0.8x its time)


@functools.cache
def _library() -> ctypes.CDLL | None:
    lib = native_build.load("cpu_quant_gemm.c", "batched int4/int8 decode uses aten's kernels")
    if lib is None:
        return None
    p, i64 = ctypes.c_void_p, ctypes.c_long
    c_int = ctypes.c_int
    lib.lantern_int4pack_mm.argtypes = [p, i64, i64, p, p, i64, i64, p, i64, c_int, c_int]  # ..., io_bf16, threads
    lib.lantern_int8pack_mm.argtypes = [p, i64, i64, p, p, i64, c_int, c_int]
    lib.lantern_int4pack_mm.restype = lib.lantern_int8pack_mm.restype = ctypes.c_int
    return lib


def available() -> bool:
    """Whether the native kernels serve batched int4/int8 steps in this process."""
    return _library() is not None


IO_DTYPES = (torch.float32, torch.bfloat16)  # what x (and so y) may be


def int4pack_mm(
    x: torch.Tensor, packed: torch.Tensor, scales_and_zeros: torch.Tensor, group_size: int, n: int
) -> torch.Tensor:
    """x [M, K] float32 or bfloat16 @ W.T -> [M, n] in x's dtype, W an int4pack weight
    (quant_linear.Int4PackLinear's buffers): the native kernel from MIN_ROWS rows, aten's below
    (chosen here, not by the caller, so that a compiled graph over a symbolic row count needs no
    guard on it). Requires available(); torch.ops.lantern.int4pack_mm is this op."""
    m, k = x.shape
    if m < MIN_ROWS:
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(x.to(torch.bfloat16), packed, group_size, scales_and_zeros)
        return y[:, :n].to(x.dtype) if x.dtype != torch.bfloat16 else y[:, :n].contiguous()
    lib = _library()
    if lib is None:
        raise RuntimeError("the native int4 CPU GEMM is not available")
    x = _io_input(x, "int4pack_mm")
    n_pad = scales_and_zeros.shape[1]
    if k % group_size or k % 2 or packed.numel() * 2 != n_pad * k or n > n_pad:
        raise ValueError(f"int4pack_mm: x {tuple(x.shape)} does not fit the packed weight [{n_pad}, {k}]")
    y = torch.empty((m, n), dtype=x.dtype)
    bf16 = int(x.dtype == torch.bfloat16)
    args = (x.data_ptr(), m, k, packed.data_ptr(), scales_and_zeros.data_ptr(), group_size, n_pad, y.data_ptr(), n)
    if lib.lantern_int4pack_mm(*args, bf16, torch.get_num_threads()) != 0:
        raise MemoryError("int4pack_mm: the kernel could not allocate its panels")
    return y


def int8pack_mm(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x [M, K] float32 or bfloat16 @ W.T -> [M, N] in x's dtype for a row-major int8 weight [N, K]
    with unit scales (quant_linear.Int8PackLinear scales the output): aten's `_weight_int8pack_mm`
    values bit for bit, from the native kernel from MIN_ROWS_INT8 rows, aten's below. Requires
    available(); torch.ops.lantern.int8pack_mm is this op."""
    m, k = x.shape
    n = weight.shape[0]
    if m < MIN_ROWS_INT8:
        ones = torch.ones(n, dtype=torch.bfloat16)
        return torch.ops.aten._weight_int8pack_mm(x.to(torch.bfloat16).contiguous(), weight, ones).to(x.dtype)
    lib = _library()
    if lib is None:
        raise RuntimeError("the native int8 CPU GEMM is not available")
    x = _io_input(x, "int8pack_mm")
    if k % 16 or weight.shape[1] != k or not weight.is_contiguous():
        raise ValueError(f"int8pack_mm: x {tuple(x.shape)} does not fit the int8 weight {tuple(weight.shape)}")
    y = torch.empty((m, n), dtype=x.dtype)
    bf16 = int(x.dtype == torch.bfloat16)
    if lib.lantern_int8pack_mm(x.data_ptr(), m, k, weight.data_ptr(), y.data_ptr(), n, bf16, torch.get_num_threads()):
        raise MemoryError("int8pack_mm: the kernel could not allocate its buffers")
    return y


def _io_input(x: torch.Tensor, op: str) -> torch.Tensor:
    """x contiguous in one of IO_DTYPES (another float dtype is refused: the output would not be in it)."""
    if x.dtype not in IO_DTYPES:
        raise TypeError(f"{op}: x must be float32 or bfloat16, not {x.dtype}")
    return x.contiguous()


def _fake_int4(x: torch.Tensor, packed: torch.Tensor, sz: torch.Tensor, group_size: int, n: int) -> torch.Tensor:
    return x.new_empty((x.shape[0], n))


def _fake_int8(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return x.new_empty((x.shape[0], weight.shape[0]))


def _register_ops() -> None:
    """torch.ops.lantern.int4pack_mm / int8pack_mm: plain Library ops rather than
    torch.library.custom_op (a call costs ~16 us instead of ~31), with fake implementations for
    compiled graphs. Once per process: a second import of this module (tests that reset lantern's
    modules) finds them defined; the Library is kept on torch.library, because collecting it would
    remove the ops from under graphs already compiled against them."""
    if hasattr(torch.ops.lantern, "int8pack_mm"):
        return
    lib = torch.library.Library("lantern", "FRAGMENT")
    lib.define("int4pack_mm(Tensor x, Tensor packed, Tensor scales_and_zeros, int group_size, int n) -> Tensor")
    lib.define("int8pack_mm(Tensor x, Tensor weight) -> Tensor")
    lib.impl("int4pack_mm", int4pack_mm, "CPU")
    lib.impl("int8pack_mm", int8pack_mm, "CPU")
    torch.library.register_fake("lantern::int4pack_mm", _fake_int4, lib=lib)
    torch.library.register_fake("lantern::int8pack_mm", _fake_int8, lib=lib)
    torch.library._lantern_cpu_gemm_ops = lib  # type: ignore[attr-defined]


_register_ops()
