"""The torch backend's CUDA quantized layer: one of triton_quant's kernels on the weight as stored.

What a weight becomes (`TritonLinear.code`):
- "affine": 4- and 8-bit "packed nibbles" with a scale and bias per group of 32/64/128 columns.
  Narrower codes widen exactly (2/3-bit -> 4, 5..7-bit -> 8), larger groups split exactly (g256 ->
  g128, per-channel -> g128), group 16 is requantized to g32 (error logged).
- "e2m1": fp4 weights (MXFP4 / NVFP4 from any reader: the 5-bit form `microscaled.e2m1_codes`
  recognises) keep their nibbles and groups (16 or 32), exactly.
- "e4m3": FP8 weights that torch._scaled_mm does not take (block-wise scales, as DeepSeek-V3 and
  Qwen3-FP8 ship; GPUs without FP8 matmuls, compute capability < 8.9) keep their bytes, with each
  row's scales laid out per group of input columns (`fp8_groups`): a 128x128 block scale is one
  scale per row and 128-column group, a per-channel or per-tensor one is repeated across groups.
Scales are held in the model's dtype where that holds them exactly (MXFP4's powers of two, an
NVFP4 file's e4m3 scales), else in float32; activations enter the kernels in the model's dtype.
"""

from __future__ import annotations

import numpy as np
import torch

from lantern.app.models.quant.affine import AffineWeight, ErrorLog, Fp8Weight, regroup, requantize
from lantern.app.models.quant.microscaled import E2M1_VALUES, e2m1_codes
from lantern.backends.torch.kernels.quant_reference import E2M1_GROUP_SIZES
from lantern.backends.torch.quant_layer import QuantLayer, dtype_name, record_error

TRITON_GROUPS = (128, 64, 32)


def fp8_groups(w: Fp8Weight) -> tuple[int, np.ndarray] | None:
    """(group size, float32 scales [rows, cols / group]) giving each row's scale per group of input
    columns, or None where the kernels' groups cannot express the scales (a block width that is no
    multiple of 32, a ragged last column block)."""
    rows, cols = w.shape
    scale = np.asarray(w.scale, dtype=np.float32)
    if w.block is None:
        group = next((g for g in TRITON_GROUPS if cols % g == 0), None)
        if group is None or scale.size not in (1, rows):
            return None
        per_row = np.broadcast_to(scale.reshape(-1, 1), (rows, 1))
        return group, np.ascontiguousarray(np.repeat(per_row, cols // group, axis=1))
    b0, b1 = w.block
    group = next((g for g in TRITON_GROUPS if b1 % g == 0), None)
    if group is None or cols % b1 or scale.shape != (-(-rows // b0), cols // b1):
        return None
    per_row = np.repeat(scale, b0, axis=0)[:rows]  # [rows, cols / b1]
    return group, np.ascontiguousarray(np.repeat(per_row, b1 // group, axis=1))


class TritonLinear(QuantLayer):
    """`code` "affine", "e2m1" or "e4m3" (module docstring); forward(x) in x's dtype."""

    def __init__(self, w: AffineWeight | Fp8Weight, device: torch.device, dtype: torch.dtype, errors: ErrorLog):
        from lantern.backends.torch.kernels import triton_gemv_dp4a, triton_quant  # CUDA (or the interpreter) only

        n, k = w.shape
        super().__init__(n, k)
        self.dtype = dtype  # x's dtype inside the kernel (the scales may be float32)
        self._affine, self._float = triton_quant.affine_matmul, triton_quant.float_matmul  # bound once
        self._dp4a, self._gemv_rows = triton_gemv_dp4a, triton_quant.GEMV_MAX_M
        self.register_buffer("lut", None)  # e2m1: the values' table, for rows()
        if isinstance(w, Fp8Weight):
            grouped = fp8_groups(w)
            if grouped is None:
                raise ValueError(f"{w.source} {w.shape}: its scales fit no group of {TRITON_GROUPS}")
            self.code, self.bits, self.group_size = "e4m3", 8, grouped[0]
            self.register_buffer("packed", torch.from_numpy(np.ascontiguousarray(w.data)).to(device))
            self._float_scales(grouped[1], device)
            return  # (the same bytes and scales: nothing to measure)
        fp4 = e2m1_codes(w) if w.group_size in E2M1_GROUP_SIZES else None
        if fp4 is not None:  # MXFP4 / NVFP4 values: 4-bit e2m1 codes with the file's groups, exactly
            codes, scales = fp4
            self.code, self.bits, self.group_size = "e2m1", 4, w.group_size
            self.register_buffer("packed", triton_quant.pack_codes(torch.from_numpy(codes), 4).to(device))
            self.lut = torch.tensor(E2M1_VALUES, device=device)
            held = self._float_scales(scales, device)
            record_error(errors, w, self, f"e2m1 g{w.group_size} ({dtype_name(held)} scales)", False)
            return
        src = w
        bits = 4 if w.bits <= 4 else 8
        exact = regroup(w, TRITON_GROUPS)
        w = exact if exact is not None else requantize(w, bits, 32)[0]
        self.code, self.bits, self.group_size = "affine", bits, w.group_size
        self.register_buffer("packed", triton_quant.pack_codes(torch.from_numpy(w.codes), bits).to(device))
        self.register_buffer("scales", torch.from_numpy(w.scales).to(device, dtype))
        self.register_buffer("biases", torch.from_numpy(w.biases).to(device, dtype))
        if device.type == "cuda" and dtype in (torch.bfloat16, torch.float16) and triton_gemv_dp4a.mode() == "dp4a":
            triton_gemv_dp4a.verify(device)  # once, here: never inside a CUDA graph's capture
        target = f"{bits}-bit g{w.group_size} ({'requantized, ' if exact is None else ''}{dtype_name(dtype)} scales)"
        record_error(errors, src, self, target, exact is None)

    def _float_scales(self, scales: np.ndarray, device: torch.device) -> torch.dtype:
        """Float codes' scales, in the model's dtype where it holds them exactly, else float32; no biases."""
        exact = torch.from_numpy(np.ascontiguousarray(scales, dtype=np.float32))
        held = exact.to(self.dtype)
        if not torch.equal(held.float(), exact):
            held = exact
        self.register_buffer("scales", held.to(device))
        self.biases = None
        return held.dtype

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        xc = x.to(self.dtype)
        if self.code == "affine":
            y = self._affine(xc, self.packed, self.scales, self.biases, self.bits, self.group_size)
        else:
            y = self._float(xc, self.packed, self.scales, self.group_size, self.code)
        return y.to(x.dtype)

    def silu_mul(self, x: torch.Tensor) -> torch.Tensor | None:
        """A decode step's gate_up and its SiLU(gate) * up in one dp4a GEMV (the epilogue pairs each gate row with its
        up row in float32): two kernels and a round trip of gate_up fewer a layer. None where that GEMV does not
        take x (more rows, float codes, a bias, another dtype, LANTERN_GEMV=float)."""
        x2 = x.reshape(-1, self.in_features)
        if (
            self.code != "affine"
            or self.bias is not None
            or x.dtype != self.dtype
            or not 0 < x2.shape[0] <= self._gemv_rows
            or not self._dp4a.enabled(x2, self.bits, self.group_size)
        ):
            return None
        y = self._dp4a.gemv(x2, self.packed, self.scales, self.biases, self.bits, self.group_size, gated=True)
        return y.view(*x.shape[:-1], self.out_features // 2)

    def embed(self, ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """rows(ids).to(dtype); for affine codes on CUDA in one kernel (triton_fused.affine_rows), the same values."""
        if self.code != "affine" or not self.packed.is_cuda:
            return self.rows(ids).to(dtype)
        from lantern.backends.torch.kernels import triton_fused

        return triton_fused.affine_rows(self.packed, self.scales, self.biases, self.bits, self.group_size, ids, dtype)

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        p = self.packed[ids]
        if self.bits == 4:
            p = torch.stack((p & 15, p >> 4), dim=-1).reshape(p.shape[0], -1)
        t, g = p.shape[0], self.group_size
        scales = self.scales[ids].float()[:, :, None]
        if self.code == "e2m1":
            values = self.lut[p.long()]
        elif self.code == "e4m3":
            values = p.contiguous().view(torch.float8_e4m3fn).float()
        else:
            return (p.view(t, -1, g).float() * scales + self.biases[ids].float()[:, :, None]).view(t, self.in_features)
        return (values.view(t, -1, g) * scales).view(t, self.in_features)
