"""Quantized linear and embedding layers of the torch backend: the weight stays quantized on the device.

An `AffineWeight` (or `Fp8Weight`) becomes one of these kernels (`select_kernel`):

- "vnni" (CPU with AVX512-VNNI, bits <= 8, input width a multiple of 32): vnni_linear.VnniLinear,
  int8 dot products of the 4- or 8-bit codes with x quantized per 32 columns; one kernel for every
  decode row count. The kernels below serve CPUs without VNNI (or LANTERN_CPU_KERNELS=0).
- "int4pack" (CPU, bits <= 4): aten's `_weight_int4pack_mm_for_cpu`, called directly (tensor-subclass
  wrappers eat the gain). It computes w = (q - 8) * scale + zero per group of 32/64/128/256 columns, so an
  affine code c with scale s and bias b maps exactly as q = c, zero = b + 8 * s (2- and 3-bit codes are
  valid 4-bit codes, moved to the middle of the range). Scales and zeros are stored in bf16 (the fast
  path needs bf16 activations: x is cast to bf16 inside), and that rounding is measured and logged.
  Group-16 modes (GGUF Q2_K/Q3_K) are requantized to 4-bit g32. The packed layout is [N/64][K][32 bytes]:
  byte b of column k in block j holds rows 64j+b (low nibble) and 64j+32+b (high nibble), so N is padded
  to a multiple of 64 and the embedding decodes rows from the same bytes. Batched decode steps (12 to
  255 float32 rows) read the same bytes with cpu_gemm's native kernel where it builds (x86 AVX-512):
  ~1.7x faster at 32 rows, the same results bit for bit.
- "int8pack" (CPU, bits 5..8): `_weight_int8pack_mm`, per-channel symmetric int8; exact when the source
  already is (a per-row scale and an integer zero point), else requantized. bf16 activations (measured
  4-40x faster than f32 for this op here). The op gets unit scales and the f32 per-row scale is applied
  to its output, so the stored weight is exact. Batched rows (2 to 255, float32) take cpu_gemm's
  native kernel where it builds: aten's values bit for bit, ~1.8x faster at 32 rows.
- "triton" (CUDA): triton_linear.TritonLinear on triton_quant's kernels: 4- and 8-bit affine codes
  (narrower ones widened, group 16 requantized to g32), fp4 (e2m1) nibbles with their own groups,
  and FP8 bytes that torch._scaled_mm does not take (block-wise scales, older GPUs), exactly.
- "fp8" (CUDA, compute capability >= 8.9, per-tensor or per-channel scale): `torch._scaled_mm` with a
  dynamic per-row activation scale. On a CPU (no FP8 matmul) an FP8 weight is requantized to 8-bit
  codes (g32 for "vnni", per-channel symmetric for "int8pack"; the error logged), half of bf16's bytes.
- "dense": the weight dequantized to `dtype` (one INFO line per reason).

A GPTQ act-order weight (`AffineWeight.perm`) takes the same kernels on its stored columns, wrapped in
quant_layer.PermutedInput, which gathers x's columns into the stored order first; a weight whose input is
quantized per token (`AffineWeight.act_bits`: BitNet) is wrapped in quant_layer.QuantizedInput.

Every conversion that is not exact adds its measured relative error to the caller's `ErrorLog`.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import replace

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from lantern.app.models.quant.affine import AffineWeight, ErrorLog, Fp8Weight, fp8_as_affine, regroup, requantize
from lantern.backends.torch import cpu_gemm, cpu_vnni_gemm, vnni_linear
from lantern.backends.torch.packed_decode import (
    BLOCK_N,
    DENSE_ROWS,
    check_int4pack_layout,
    dense_matmul,
    int4pack_block_rows,
    int4pack_layout_ok,
    int4pack_rows,
)
from lantern.backends.torch.quant_layer import (
    PackedCpuLayer,
    PermutedInput,
    QuantizedInput,
    QuantLayer,
    dtype_name,
    record_error,
)
from lantern.backends.torch.triton_linear import TRITON_GROUPS, TritonLinear, fp8_groups

logger = logging.getLogger(__name__)

INT4PACK_GROUPS = (256, 128, 64, 32)  # what _weight_int4pack_mm_for_cpu accepts, largest first
# _weight_int8pack_mm's AVX-512 loop reads 16 input columns at a time with aligned loads and no
# tail (AVX2 and NEON: 8): any other width, or activations not 32-byte aligned, are read out of
# bounds (wrong sums, or a segfault). aten/src/ATen/native/cpu/int8mm_kernel.cpp.
INT8PACK_COLS = 16
_INT8PACK_ALIGN = 32
_INT4_MM = torch.ops.aten._weight_int4pack_mm_for_cpu  # looked up once: ops.aten.<name> costs a dict walk per call
_FP8_MAX = 448.0  # largest finite e4m3fn value


def select_kernel(w: AffineWeight | Fp8Weight, device: torch.device | str) -> str:
    """The kernel a weight gets on `device`: "vnni", "int4pack", "int8pack", "triton", "fp8" or "dense"."""
    device = torch.device(device)
    if isinstance(w, Fp8Weight):
        if device.type != "cuda":  # no FP8 matmul: the 8-bit layer its requantization takes (_fp8_cpu_mode)
            mode = _fp8_cpu_mode(w)
            return "dense" if mode is None else ("vnni" if mode[1] else "int8pack")
        if _fp8_native(w, device):
            return "fp8"
        return "triton" if fp8_groups(w) is not None else "dense"
    if device.type == "cuda":
        return "triton" if w.shape[1] % TRITON_GROUPS[-1] == 0 else "dense"
    if vnni_linear.fits(w) and cpu_vnni_gemm.available():
        return "vnni"
    if w.bits <= 4:  # (fp4's 5-bit form takes int8: a uniform 4-bit grid costs ~9% on e2m1 values, int8 ~0.8%)
        if w.shape[1] % INT4PACK_GROUPS[-1]:
            return "dense"  # (K % 32: never in a real model)
        if _int4pack_usable():
            return "int4pack"
    return "int8pack" if w.shape[1] % INT8PACK_COLS == 0 else "dense"


@functools.cache
def _int4pack_usable() -> bool:
    """aten's int4pack layout is the one the decoders read on AVX-512 CPUs only; elsewhere (with no
    native kernels: no compiler, or not x86) 4-bit weights take int8 per channel, said once."""
    if int4pack_layout_ok():
        return True
    logger.warning(
        "aten packs int4 weights differently on this CPU (its ATen capability is not AVX-512): 4-bit weights "
        "are held as int8 per channel (requantized, error logged) instead"
    )
    return False


def quantized_linear(
    w: AffineWeight | Fp8Weight,
    bias: torch.Tensor | None,
    device: torch.device | str,
    dtype: torch.dtype,
    errors: ErrorLog,
    *,
    kernel: str | None = None,
) -> nn.Module:
    """A layer computing x @ W.T (+ bias) on the quantized weight; forward(x [..., in]) -> [..., out] in
    x's dtype. `kernel` overrides `select_kernel` (tests run the Triton path on CPU under the interpreter)."""
    device = torch.device(device)
    kernel = kernel or select_kernel(w, device)
    layer: QuantLayer
    if isinstance(w, AffineWeight) and w.act_bits is not None:  # BitNet: x quantized per token first
        if w.perm is not None:
            raise ValueError(f"{w.source}: an act-order weight whose input is quantized is not implemented")
        inner = quantized_linear(replace(w, act_bits=None), None, device, dtype, errors, kernel=kernel)
        layer = QuantizedInput(inner, w.act_bits)  # type: ignore[arg-type]
    elif isinstance(w, AffineWeight) and w.perm is not None:  # act-order: the layer gathers x
        inner = quantized_linear(w.stored(), None, device, dtype, errors, kernel=kernel)
        layer = PermutedInput(inner, torch.from_numpy(w.perm.astype(np.int64)).to(device))  # type: ignore[arg-type]
    elif isinstance(w, Fp8Weight):
        if kernel == "fp8":
            layer = Fp8Linear(w, device)
        elif kernel == "triton":
            layer = TritonLinear(w, device, dtype, errors)
        elif kernel in ("vnni", "int8pack"):  # CPU: 8-bit affine codes of the e4m3 values (error logged)
            bits, group, symmetric = (8, 32, False) if kernel == "vnni" else (8, 0, True)  # the kernel's own layout
            held, error = fp8_as_affine(w, bits, group, symmetric)
            errors.add(w.source, f"8-bit {f'g{group}' if group else 'per-channel'} (requantized)", error)
            layer = quantized_linear(held, None, device, dtype, errors, kernel=kernel)
        else:
            layer = _dense_fp8(w, device, dtype, errors)
    elif kernel == "vnni":
        layer = vnni_linear.VnniLinear(w, device)
        record_error(errors, w, layer, layer.target, layer.requantized)
    elif kernel == "int4pack":
        layer = Int4PackLinear(w, device, errors)
    elif kernel == "int8pack":
        layer = Int8PackLinear(w, device, errors)
    elif kernel == "triton":
        layer = TritonLinear(w, device, dtype, errors)
    elif kernel == "dense":
        errors.note(f"{w.source} {tuple(w.shape)}: no quantized kernel fits this shape on {device}; dequantized")
        layer = DenseLinear(torch.from_numpy(w.dequantize()), device, dtype)
    else:
        raise ValueError(f"unknown quantized kernel {kernel!r}")
    if bias is not None:
        layer.bias = bias.detach().to(device, dtype)
    return layer


def quantized_embedding(
    w: AffineWeight | Fp8Weight, device: torch.device | str, dtype: torch.dtype, errors: ErrorLog, **kw
) -> nn.Module:
    """An embedding table kept quantized: forward(ids) -> [T, hidden] in `dtype`, logits(h) -> [T, vocab]
    (a tied lm_head reads the same stored tensors)."""
    return QuantEmbedding(quantized_linear(w, None, device, dtype, errors, **kw), dtype)


def stacked_linear(parts: list[nn.Module]) -> nn.Module:
    """Fused q/k/v or gate/up projections whose parts have different quantization modes."""
    return StackedLinear(parts)


def quantized_bytes(module: nn.Module) -> int:
    """Device bytes of the layer's tensors (quantized codes, scales, bias), each storage counted once."""
    seen: set[int] = set()
    total = 0
    for t in list(module.buffers()) + list(module.parameters()):
        key = t.untyped_storage().data_ptr()
        if key not in seen:
            seen.add(key)
            total += t.untyped_storage().nbytes()
    return total


# ---- the layers ---------------------------------------------------------------------------------------------
class Int4PackLinear(PackedCpuLayer):
    def __init__(self, w: AffineWeight, device: torch.device, errors: ErrorLog):
        n, k = w.shape
        super().__init__(n, k)
        check_int4pack_layout()
        src = w
        exact = regroup(w, INT4PACK_GROUPS) if w.bits <= 4 else None
        w = exact if exact is not None else requantize(w, 4, 32)[0]
        self.group_size = w.group_size
        n_pad = -(-n // BLOCK_N) * BLOCK_N
        # Narrower codes move to the middle of the 4-bit range (2-bit c -> c + 6), so that zero = b + 2s
        # stays small: near the ends, (q - 8) * s and zero would cancel and their bf16 rounding would not.
        shift = 8 - (1 << (w.bits - 1))
        scales = F.pad(torch.from_numpy(np.ascontiguousarray(w.scales)), (0, 0, 0, n_pad - n))
        zeros = F.pad(torch.from_numpy(w.biases + (8 - shift) * w.scales), (0, 0, 0, n_pad - n))
        # In blocks of 64 rows (the layout's unit), ~4 MiB of int32 codes at a time, shifted and
        # padded per block: loading never holds more than that beyond the codes themselves.
        rows = max(BLOCK_N, (1 << 20) // max(k, 1) // BLOCK_N * BLOCK_N)
        packed = torch.empty(n_pad, k // 2, dtype=torch.uint8)
        for i in range(0, n_pad, rows):
            chunk = torch.from_numpy(np.ascontiguousarray(w.codes[i : i + rows])).to(torch.int32)
            if shift:
                chunk += shift
            if chunk.shape[0] < min(rows, n_pad - i):
                chunk = F.pad(chunk, (0, 0, 0, min(rows, n_pad - i) - chunk.shape[0]), value=8)  # 8: weight 0
            packed[i : i + rows] = torch.ops.aten._convert_weight_to_int4pack_for_cpu(chunk, 2)
        self.register_buffer("packed", packed.to(device))
        # [K/g, N, 2] (scale, zero) in bf16, the op's layout
        sz = torch.stack((scales, zeros), dim=-1).transpose(0, 1).contiguous().to(torch.bfloat16)
        self.register_buffer("scales_and_zeros", sz.to(device))
        # Decided here, not per call: a compiled graph cannot trace the build-and-load behind it.
        self.native_batched = torch.device(device).type == "cpu" and cpu_gemm.available()
        target = f"int4 g{w.group_size} ({'requantized, ' if exact is None else ''}bf16 scales)"
        record_error(errors, src, self, target, exact is None)

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] >= DENSE_ROWS:
            return dense_matmul(x, self.out_features, self.in_features, BLOCK_N, self._decoded_rows)
        if x.shape[0] > 1 and x.dtype in cpu_gemm.IO_DTYPES and self.native_batched:
            # batched decode: cpu_gemm's kernel (from its MIN_ROWS; the op picks, so graphs need no guard)
            sz, n = self.scales_and_zeros, self.out_features
            return torch.ops.lantern.int4pack_mm(x, self.packed, sz, self.group_size, n)
        y = _INT4_MM(x.to(torch.bfloat16).contiguous(), self.packed, self.group_size, self.scales_and_zeros)
        if y.shape[1] != self.out_features:
            y = y[:, : self.out_features]
        return y.to(x.dtype) if y.dtype != x.dtype else y.contiguous()

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        return int4pack_rows(self.packed, self.scales_and_zeros, ids, self.in_features, self.group_size)

    def _decoded_rows(self, start: int, stop: int, dtype: torch.dtype) -> torch.Tensor:
        k, g = self.in_features, self.group_size
        return int4pack_block_rows(self.packed, self.scales_and_zeros, start, stop, k, g).to(dtype)


class Int8PackLinear(QuantLayer):
    def __init__(self, w: AffineWeight, device: torch.device, errors: ErrorLog):
        n, k = w.shape
        super().__init__(n, k)
        offset, scale = _per_channel_int8(w)
        exact = offset.size > 0
        if exact:
            q = _minus(w.codes, offset)
        else:
            r = requantize(w, 8, 0, symmetric=True)[0]  # codes centred on 128
            q, scale = _minus(r.codes, np.full(n, 128, np.int16)), r.scales[:, 0]
        self.register_buffer("weight", torch.from_numpy(q).to(device))
        self.register_buffer("scale", torch.from_numpy(np.ascontiguousarray(scale, np.float32)).to(device))
        # The op multiplies by bf16 scales; unit ones keep the f32 scale exact (applied to the output).
        self.register_buffer("ones", torch.ones(n, dtype=torch.bfloat16, device=device))
        self.native_batched = torch.device(device).type == "cpu" and k % 16 == 0 and cpu_gemm.available()
        record_error(errors, w, self, "int8 per-channel (requantized)", not exact)

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] >= DENSE_ROWS:
            return dense_matmul(x, self.out_features, self.in_features, 1, self._decoded_rows)
        if x.shape[0] > 1 and x.dtype in cpu_gemm.IO_DTYPES and self.native_batched:
            return torch.ops.lantern.int8pack_mm(x, self.weight).mul_(self.scale)  # aten's values, faster
        xb = x.to(torch.bfloat16)
        if not xb.is_contiguous() or xb.data_ptr() % _INT8PACK_ALIGN:  # a view of bf16 activations
            xb = xb.clone(memory_format=torch.contiguous_format)
        y = torch.ops.aten._weight_int8pack_mm(xb, self.weight, self.ones)
        return y.mul_(self.scale) if x.dtype == torch.bfloat16 else y.to(x.dtype).mul_(self.scale)

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        return self.weight[ids].float() * self.scale[ids, None]

    def _decoded_rows(self, start: int, stop: int, dtype: torch.dtype) -> torch.Tensor:
        return self.weight[start:stop].float().mul_(self.scale[start:stop, None]).to(dtype)


class Fp8Linear(QuantLayer):
    """e4m3 weight with a per-tensor or per-output-channel scale; each activation row quantized per
    call with its own amax scale (row-wise, so one request's outliers never coarsen another's)."""

    def __init__(self, w: Fp8Weight, device: torch.device):
        n, k = w.shape
        super().__init__(n, k)
        data = torch.from_numpy(np.ascontiguousarray(w.data)).view(torch.float8_e4m3fn)
        self.register_buffer("weight", data.to(device))
        scale = np.broadcast_to(np.asarray(w.scale, np.float32).reshape(1, -1), (1, n))
        self.register_buffer("weight_scale", torch.from_numpy(np.ascontiguousarray(scale)).to(device))

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        x_scale = (x.abs().amax(dim=-1, keepdim=True).float() / _FP8_MAX).clamp(min=1e-12)  # [M, 1]
        xq = (x.float() / x_scale).clamp(-_FP8_MAX, _FP8_MAX).to(torch.float8_e4m3fn)
        # Row-wise scaling wants a bf16 output on Hopper.
        y = torch._scaled_mm(xq, self.weight.t(), scale_a=x_scale, scale_b=self.weight_scale, out_dtype=torch.bfloat16)
        return y.to(x.dtype)

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        return self.weight[ids].float() * self.weight_scale[0, ids, None]


class DenseLinear(QuantLayer):
    """A dequantized weight (no kernel for the format on this device)."""

    def __init__(self, weight: torch.Tensor, device: torch.device, dtype: torch.dtype):
        super().__init__(*weight.shape)
        self.register_buffer("weight", weight.to(device, dtype))

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x.to(self.weight.dtype), self.weight).to(x.dtype)

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        return self.weight[ids].float()


class QuantEmbedding(nn.Module):
    def __init__(self, table: QuantLayer, dtype: torch.dtype):
        super().__init__()
        self.table, self.dtype = table, dtype

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        flat = ids.reshape(-1)
        return self.table.embed(flat, self.dtype).view(*ids.shape, self.table.in_features)

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        return self.table(h)


class StackedLinear(nn.Module):
    def __init__(self, parts: list[nn.Module]):
        super().__init__()
        self.parts = nn.ModuleList(parts)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([p(x) for p in self.parts], dim=-1)


# ---- helpers ------------------------------------------------------------------------------------------------
def _minus(codes: np.ndarray, offset: np.ndarray) -> np.ndarray:
    """int8 codes - offset per row, without an int16 copy of the whole table (embeddings are large)."""
    if np.all(offset == 128):  # c - 128 as int8 is c with its top bit flipped
        return (codes ^ np.uint8(0x80)).view(np.int8)
    out = np.empty(codes.shape, np.int8)
    step = max(1, (1 << 22) // max(codes.shape[1], 1))
    for r in range(0, codes.shape[0], step):
        out[r : r + step] = codes[r : r + step].astype(np.int16) - offset[r : r + step, None]
    return out


def _per_channel_int8(w: AffineWeight) -> tuple[np.ndarray, np.ndarray]:
    """(zero point per row, scale per row) when `w` is exactly s * (c - zero) with one scale and an integer
    zero point per row and c - zero within int8; else two empty arrays."""
    none = np.empty(0, np.int16), np.empty(0, np.float32)
    s, b = w.scales, w.biases
    if not (np.all(s == s[:, :1]) and np.all(b == b[:, :1])) or np.any(s[:, 0] <= 0):
        return none
    scale = s[:, 0]
    offset = np.rint(-b[:, 0] / scale)
    if not np.array_equal((-offset * scale).astype(np.float32), b[:, 0]):
        return none
    if w.codes.size and (np.any(w.codes.min(axis=1) - offset < -128) or np.any(w.codes.max(axis=1) - offset > 127)):
        return none
    return offset.astype(np.int16), scale.astype(np.float32)


def _fp8_cpu_mode(w: Fp8Weight) -> tuple[int, int, bool] | None:
    """(bits, group (0: per row), symmetric) an FP8 weight takes on a CPU, which has no FP8 matmul:
    8-bit g32 for the VNNI layers (half of bf16's bytes, ~0.3% off the e4m3 values), else per-channel
    symmetric int8, which aten's int8pack holds exactly; None where neither takes its width."""
    cols = w.shape[1]
    if cols % 32 == 0 and cpu_vnni_gemm.available():
        return 8, 32, False
    return (8, 0, True) if cols % INT8PACK_COLS == 0 else None


def _fp8_native(w: Fp8Weight, device: torch.device) -> bool:
    n, k = w.shape
    if w.block is not None or np.asarray(w.scale).size not in (1, n) or n % 16 or k % 16:
        return False
    return torch.cuda.get_device_capability(device) >= (8, 9)


def _dense_fp8(w: Fp8Weight, device: torch.device, dtype: torch.dtype, errors: ErrorLog) -> DenseLinear:
    if device.type != "cuda":
        reason = f"no FP8 matmul on a CPU, and its {w.shape[1]} input columns fit no 8-bit layout"
    elif w.block is not None:
        reason = f"its {w.block[0]}x{w.block[1]} block scales fit no group of the Triton kernels"
    else:
        reason = f"its {w.shape[1]} input columns are no multiple of the Triton kernels' groups (32)"
    errors.note(f"FP8 weights ({w.source}) dequantized to {dtype_name(dtype)} on {device.type}: {reason}")
    return DenseLinear(torch.from_numpy(w.dequantize(np.float32)), device, dtype)
