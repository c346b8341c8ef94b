"""The CPU quantized layer on int8 dot products (cpu_vnni_gemm): 4-bit codes for weights of up to
4 bits, 8-bit codes for 5 to 8, each group's scale and bias in float16. Wider codes that take at most
16 values in 32-wide groups (GGUF's IQ4_NL/IQ4_XS, IQ3_XXS/IQ3_S, IQ2_XXS, IQ1_S, MXFP4; bitsandbytes
nf4/fp4) are held as 4-bit indices into a table of 16 codes (`codebook`): the values exactly, at 4 bits
per weight. (The group-16 ones, IQ2_XS/IQ2_S/IQ1_M/NVFP4, are requantized to 8-bit groups of 32 first.)

Every affine format whose group is a multiple of 32 maps exactly (GGUF Q4_0/Q4_1/Q4_K/Q5_*/Q8_0,
MLX 4/8-bit, AWQ/GPTQ, --isq): narrower codes are valid wider ones as they are (w = s * q + b needs
no shift), and only float16's rounding of the scales and biases can differ from the source (GGUF's
own scales are float16: exact). Group-16 formats (Q2_K, Q3_K, Q6_K) are requantized to group 32 at
their container's width, the measured error logged. Decode steps (1 to DENSE_ROWS - 1 rows) take the
kernel; prefill decodes the weight a chunk at a time into one float GEMM (packed_decode.dense_matmul).
"""

from __future__ import annotations

import numpy as np
import torch

from lantern.app.models.quant.affine import AffineWeight, requantize
from lantern.backends.torch import cpu_vnni_gemm as vnni
from lantern.backends.torch.packed_decode import DENSE_ROWS, dense_matmul
from lantern.backends.torch.quant_layer import PackedCpuLayer

_VNNI_MM = None  # torch.ops.lantern.vnni_mm once built (looked up once: an attribute walk per call otherwise)


def fits(w: AffineWeight) -> bool:
    """Whether the kernel takes this weight: bits <= 8, input width a multiple of 32."""
    return w.bits <= 8 and w.shape[1] % vnni.XG == 0


class VnniLinear(PackedCpuLayer):
    """`target` says what the weight became, `requantized` whether that lost more than rounding."""

    float_x_is_free = True  # the kernel quantizes x itself, from float32 or bfloat16 alike

    def __init__(self, w: AffineWeight, device: torch.device):
        global _VNNI_MM
        if not vnni.available():
            raise RuntimeError("the VNNI CPU kernels are not available on this machine")
        _VNNI_MM = torch.ops.lantern.vnni_mm
        self._mm = torch.ops.lantern.vnni_mm_codebook
        n, k = w.shape
        super().__init__(n, k)
        self.bits = 4 if w.bits <= 4 else 8
        self.requantized = w.group_size % vnni.XG != 0
        if self.requantized:
            w = requantize(w, self.bits, vnni.XG)[0]
        self.group_size = w.group_size
        lookup = vnni.codebook(w) if self.bits == 8 else None
        codes, table = lookup if lookup is not None else (w.codes, None)
        if table is not None:
            self.bits = 4
        self.register_buffer("codes", vnni.pack_codes(codes, self.bits).to(device))
        self.register_buffer("lut", None if table is None else torch.from_numpy(table).to(device))
        scales, out_scale = vnni.pack_scales(np.asarray(w.scales), np.asarray(w.biases))
        self.register_buffer("scales", scales.to(device))
        self.register_buffer("out_scale", out_scale.to(device))
        g = "per-channel" if w.group_size == k else f"g{w.group_size}"
        how = "requantized, " if self.requantized else ""
        kind = "4-bit codebook of 8-bit codes" if table is not None else f"{self.bits}-bit"
        self.target = f"{kind} {g} ({how}f16 scales, x in two int8 levels)"

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] >= DENSE_ROWS:
            return dense_matmul(x, self.out_features, self.in_features, vnni.BLOCK, self._decoded_rows)
        xin = x if x.dtype in vnni.IO_DTYPES else x.float()
        args = (xin, self.codes, self.scales, self.out_scale, self.group_size, self.out_features, self.bits)
        y = _VNNI_MM(*args) if self.lut is None else self._mm(*args, self.lut)
        return y if y.dtype == x.dtype else y.to(x.dtype)

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        k, g = self.in_features, self.group_size
        return vnni.decode_rows(self.codes, self.scales, self.out_scale, ids, k, g, self.bits, self.lut)

    def _decoded_rows(self, start: int, stop: int, dtype: torch.dtype) -> torch.Tensor:
        k, g = self.in_features, self.group_size
        args = (self.codes, self.scales, self.out_scale, start, stop, k, g, self.bits, dtype, self.lut)
        return vnni.decode_block_rows(*args)
