"""Plain-torch references of the quantized-matmul kernels in triton_quant.py and triton_gemv_dp4a.py.

Layout ("packed nibbles", the torch backend's CUDA format of a group-quantized weight):
- 4-bit codes: uint8 [N, K/2], byte j of row n = code[n, 2j] | code[n, 2j+1] << 4 (low nibble first);
- 8-bit codes: uint8 [N, K], one code per byte;
- scales, biases: [N, K / group_size], w[n, k] = code[n, k] * scales[n, k // g] + biases[n, k // g].

Read as little-endian uint32 words, both are MLX's packing of the same bits, which is what the tests
check against `mx.dequantize`.

"e2m1" weights (fp4: MXFP4, NVFP4) use the 4-bit layout with each nibble an e2m1 float (sign bit 3,
then 2 exponent bits and 1 mantissa bit: 0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives) and no
biases: w[n, k] = e2m1(code[n, k]) * scales[n, k // g], groups 16 to 128. "e4m3" weights (FP8) use
the 8-bit layout with each byte an e4m3fn float (decoded here by torch's float8_e4m3fn), no biases.
"""

from __future__ import annotations

import torch

from lantern.app.models.quant.microscaled import E2M1_VALUES  # the format's table (the kernels decode the bits)

BITS = (4, 8)
GROUP_SIZES = (32, 64, 128)
E2M1_GROUP_SIZES = (16, 32, 64, 128)


def check_mode(bits: int, group_size: int, code: str = "affine") -> None:
    if code == "e2m1":
        if bits != 4 or group_size not in E2M1_GROUP_SIZES:
            raise ValueError(f"e2m1 weights are 4-bit with groups of {E2M1_GROUP_SIZES}, not {bits}-bit g{group_size}")
        return
    if code != "affine":
        raise ValueError(f"unknown code kind {code!r} (affine or e2m1)")
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


def int8_activations(x: torch.Tensor, block: int = 32, level2: int = 254) -> torch.Tensor:
    """float32 x as the dp4a GEMV sees it: each `block` columns in two int8 levels, x ~ d (q1 + q2 / level2) with
    d = absmax / 127, q1 = round(x / d), q2 = round((x / d - q1) * level2) (to nearest, ties to even)."""
    m, k = x.shape
    xb = x.float().reshape(m, k // block, block)
    amax = xb.abs().amax(-1, keepdim=True)
    inv = torch.where(amax > 0, 127.0 / amax.clamp_min(1e-30), torch.zeros_like(amax))
    r = xb * inv
    q1 = torch.round(r)
    q2 = torch.round((r - q1) * level2)
    return ((q1 * level2 + q2) * (amax / (127.0 * level2))).reshape(m, k)


def int8_activation_matmul_reference(
    x: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor, biases: torch.Tensor, bits: int, group_size: int
) -> torch.Tensor:
    """What triton_gemv_dp4a computes, in float32, output in x's dtype: the dequantized weight against
    int8_activations(x)."""
    return affine_matmul_reference(int8_activations(x), packed, scales, biases, bits, group_size).to(x.dtype)


def dequantize_e2m1(packed: torch.Tensor, scales: torch.Tensor, group_size: int) -> torch.Tensor:
    """float32 [N, K] weight of packed e2m1 codes: value * scale per group, in float32."""
    check_mode(4, group_size, "e2m1")
    codes = unpack_codes(packed, 4)
    n, k = codes.shape
    if k % group_size or scales.shape != (n, k // group_size):
        raise ValueError(f"codes [{n}, {k}] do not match scales {tuple(scales.shape)} for group size {group_size}")
    values = torch.tensor(E2M1_VALUES, device=codes.device)[codes.long()]
    return (values.view(n, k // group_size, group_size) * scales.float()[:, :, None]).view(n, k)


def e2m1_matmul_reference(x: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor, group_size: int) -> torch.Tensor:
    """x [M, K] @ W.T -> [M, N] in x's dtype for an e2m1 weight, the product taken in float32."""
    w = dequantize_e2m1(packed, scales, group_size)
    if x.shape[-1] != w.shape[1]:
        raise ValueError(f"x has {x.shape[-1]} input features, the weight {w.shape[1]}")
    return (x.float() @ w.T).to(x.dtype)


def dequantize_e4m3(packed: torch.Tensor, scales: torch.Tensor, group_size: int) -> torch.Tensor:
    """float32 [N, K] weight of e4m3fn bytes: torch's float8_e4m3fn value * scale per group."""
    check_mode(8, group_size)
    n, k = packed.shape
    if k % group_size or scales.shape != (n, k // group_size):
        raise ValueError(f"codes [{n}, {k}] do not match scales {tuple(scales.shape)} for group size {group_size}")
    values = packed.contiguous().view(torch.float8_e4m3fn).float()
    return (values.view(n, k // group_size, group_size) * scales.float()[:, :, None]).view(n, k)
