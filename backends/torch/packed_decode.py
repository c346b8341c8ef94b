"""aten's packed CPU weight layouts decoded back to floats, and the dense prefill path built on it.

int4pack (`_convert_weight_to_int4pack_for_cpu`) is [N/64][K][32 bytes]: byte j of a 64-row block
holds row j in its low nibble and row j + 32 in its high one; weights are (q - 8) * scale + zero
with bf16 [K/g, N, 2] scales and zeros. The decoders serve a quantized embedding's rows
(int4pack_rows) and whole row blocks for dense_matmul: from DENSE_ROWS rows on (prefill), decoding
the weight and one float GEMM beats the packed kernels on a CPU (they compute at ~130 GFLOPS,
MKL's float32 GEMM at ~300 on 2 Xeon cores: 2.1-2.5x faster at 2048 rows, even at ~256).
Decode steps stay on the packed kernels.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
import torch.nn.functional as F

BLOCK_N = 64  # the int4pack layout's row block
DENSE_ROWS = 256
DENSE_CHUNK = 1 << 22  # weight elements decoded at once: bounds the transient float copy (16 MB f32)


def int4pack_rows(packed: torch.Tensor, sz: torch.Tensor, ids: torch.Tensor, k: int, g: int) -> torch.Tensor:
    """float32 rows `ids` of an int4pack weight, decoded from its [N/64][K][32] bytes and bf16 scales."""
    blocks = packed.view(-1, k, 32)
    b = ids % BLOCK_N
    byte = blocks[ids // BLOCK_N, :, b % 32]  # [T, K]
    codes = (byte >> ((b >= 32).to(torch.uint8) * 4)[:, None]) & 15
    scale = sz[:, ids, 0].t().float()[:, :, None]  # [T, K/g, 1]
    zero = sz[:, ids, 1].t().float()[:, :, None]
    return ((codes.view(ids.shape[0], -1, g).float() - 8) * scale + zero).view(ids.shape[0], k)


def int4pack_block_rows(packed: torch.Tensor, sz: torch.Tensor, start: int, stop: int, k: int, g: int) -> torch.Tensor:
    """float32 rows start..stop (start a multiple of 64) of an int4pack weight: a [rows, K] view of a
    contiguous [K, rows] tensor (what a GEMM reads as W.T without a copy).

    Written column-major because that is the layout's own order (a block's bytes run along K for
    each of its rows), so the nibbles are read in place: one strided multiply-add per nibble, ~45% less
    time than decoding to row-major (which shuffled the codes and made four float passes)."""
    first, last = start // BLOCK_N, -(-stop // BLOCK_N)
    nb, groups = last - first, k // g
    blocks = packed.view(-1, k, 32)[first:last].permute(1, 0, 2).reshape(groups, g, nb, 32)  # a view
    s = sz[:, first * BLOCK_N : last * BLOCK_N, 0].float().view(groups, 1, nb, 2, 32)
    z = sz[:, first * BLOCK_N : last * BLOCK_N, 1].float().view(groups, 1, nb, 2, 32)
    out = torch.empty((groups, g, nb, 2, 32), dtype=torch.float32, device=packed.device)
    # (q - 8) in int8, then zero + (q - 8) * scale in float32 (the product is exact), one pass per nibble
    torch.addcmul(z[..., 0, :], (blocks & 15).view(torch.int8).sub_(8), s[..., 0, :], out=out[..., 0, :])
    torch.addcmul(z[..., 1, :], (blocks >> 4).view(torch.int8).sub_(8), s[..., 1, :], out=out[..., 1, :])
    cols = out.view(k, nb * BLOCK_N)
    return cols[:, start - first * BLOCK_N : stop - first * BLOCK_N].t()


@functools.cache
def check_int4pack_layout() -> None:
    """Both decoders assume aten's int4pack byte layout (its AVX-512 one); raises where it differs."""
    if not int4pack_layout_ok():
        raise RuntimeError(f"torch {torch.__version__}: the int4pack CPU layout is not the one quant_linear decodes")


@functools.cache
def int4pack_layout_ok() -> bool:
    """Whether aten packs int4 weights here as the decoders read them: the layout follows the CPU's
    ATen capability (AVX-512, AVX2 and the plain build each lay out blocks differently), checked once."""
    codes = torch.randint(0, 16, (BLOCK_N, 32), generator=torch.Generator().manual_seed(0), dtype=torch.int32)
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes, 2)
    sz = torch.stack((torch.ones(1, BLOCK_N), torch.full((1, BLOCK_N), 8.0)), dim=-1).to(torch.bfloat16)
    got = int4pack_rows(packed, sz, torch.arange(BLOCK_N), 32, 32)
    blocks = int4pack_block_rows(packed, sz, 0, BLOCK_N, 32, 32)
    return torch.equal(got, codes.float()) and torch.equal(blocks, codes.float())


def dense_matmul(
    x: torch.Tensor, n: int, k: int, align: int, decoded_rows: Callable[[int, int, torch.dtype], torch.Tensor]
) -> torch.Tensor:
    """x [M, K] @ W.T with W decoded (decoded_rows(start, stop, dtype) -> the rows in the GEMM's dtype,
    each computed in float32 and rounded once) a chunk of rows at a time: the prefill path of the
    packed CPU layers (DENSE_ROWS). Exact float32 weights in a float32 GEMM, so this is no less accurate
    than the packed kernels (which round x to bfloat16)."""
    xc = x if gemm_dtype(x) == x.dtype else x.float()
    step = max(align, DENSE_CHUNK // max(k, 1) // align * align)
    if step >= n:
        return F.linear(xc, decoded_rows(0, n, xc.dtype)).to(x.dtype)
    y = x.new_empty((x.shape[0], n))
    for start in range(0, n, step):
        stop = min(n, start + step)
        y[:, start:stop] = F.linear(xc, decoded_rows(start, stop, xc.dtype))
    return y


def gemm_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype the dense prefill GEMM runs in: float32 for half-precision activations on a CPU
    without native bfloat16 (its bf16 GEMM is ~5x slower than float32 there)."""
    if x.dtype == torch.float32 or x.device.type != "cpu" or _cpu_bf16():
        return x.dtype
    return torch.float32


@functools.cache
def _cpu_bf16() -> bool:
    from lantern.backends import cpu_has_native_bf16

    return cpu_has_native_bf16()
