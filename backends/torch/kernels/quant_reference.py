"""Plain-torch references of the quantized-matmul kernels in triton_quant.py.

Layout ("packed nibbles", the torch backend's CUDA format of a group-quantized weight):
- 4-bit codes: uint8 [N, K/2], byte j of row n = code[n, 2j] | code[n, 2j+1] << 4 (low nibble first);
- 8-bit codes: uint8 [N, K], one code per byte;
- scales, biases: [N, K / group_size], w[n, k] = code[n, k] * scales[n, k // g] + biases[n, k // g].

Read as little-endian uint32 words, both are MLX's packing of the same bits, which is what the tests
check against `mx.dequantize`.
"""

from __future__ import annotations

import torch

BITS = (4, 8)
GROUP_SIZES = (32, 64, 128)


def check_mode(bits: int, group_size: int) -> None:
    if bits not in BITS:
        raise ValueError(f"packed-nibble weights are 4- or 8-bit, not {bits}-bit")
    if group_size not in GROUP_SIZES:
        raise ValueError(f"group size must be one of {GROUP_SIZES}, not {group_size}")


def unpack_codes(packed: torch.Tensor, bits: int) -> torch.Tensor:
    """uint8 [N, K] codes of a packed weight (the inverse of triton_quant.pack_codes)."""
    if bits == 8:
        return packed
    lo = packed & 0xF
    hi = packed >> 4
    return torch.stack((lo, hi), dim=-1).reshape(packed.shape[0], packed.shape[1] * 2)


def dequantize_packed(
    packed: torch.Tensor, scales: torch.Tensor, biases: torch.Tensor, bits: int, group_size: int
) -> torch.Tensor:
    """float32 [N, K] weight of a packed one: code * scale + bias per group, computed in float32."""
    check_mode(bits, group_size)
    codes = unpack_codes(packed, bits)
    n, k = codes.shape
    if k % group_size or scales.shape != (n, k // group_size) or biases.shape != scales.shape:
        raise ValueError(
            f"codes [{n}, {k}] do not match scales {tuple(scales.shape)} / biases {tuple(biases.shape)} "
            f"for group size {group_size}"
        )
    w = codes.view(n, k // group_size, group_size).float()
    w = w * scales.float()[:, :, None] + biases.float()[:, :, None]
    return w.view(n, k)


def affine_matmul_reference(
    x: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor, biases: torch.Tensor, bits: int, group_size: int
) -> torch.Tensor:
    """x [M, K] @ W.T -> [M, N] in x's dtype, with W dequantized and the product taken in float32."""
    w = dequantize_packed(packed, scales, biases, bits, group_size)
    if x.shape[-1] != w.shape[1]:
        raise ValueError(f"x has {x.shape[-1]} input features, the weight {w.shape[1]}")
    return (x.float() @ w.T).to(x.dtype)
