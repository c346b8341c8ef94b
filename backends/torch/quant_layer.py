"""The base of the torch backend's quantized layers (quant_linear.py, vnni_linear.py, triton_linear.py):
out/in features, the optional bias, the generic forward over any batch shape, the embedding row
decoder, and the measurement of what a layer's stored form costs (record_error)."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from lantern.app.models.quant.affine import AffineWeight, ErrorLog, relative_error
from lantern.backends.torch.packed_decode import DENSE_ROWS

ERROR_SAMPLE = 1 << 18  # weights sampled to measure a conversion (a few MB of float32 at most)


class QuantLayer(nn.Module):
    """Common part: out_features / in_features, the optional bias, and the embedding row decoder."""

    bias: torch.Tensor | None
    # True where a float32 x costs what the model's dtype does and gives float32 out (a head then
    # returns float32 logits: bfloat16's steps of 1/128 of a value tie close candidates).
    float_x_is_free: bool = False

    def __init__(self, n: int, k: int):
        super().__init__()
        self.out_features, self.in_features = n, k
        self.register_buffer("bias", None)

    def matmul(self, x: torch.Tensor) -> torch.Tensor:  # x [M, K] contiguous -> [M, N] in x's dtype
        raise NotImplementedError

    def rows(self, ids: torch.Tensor) -> torch.Tensor:  # the weight's rows `ids` as float32 [T, K]
        raise NotImplementedError

    def embed(self, ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """The weight's rows `ids` in `dtype` (a quantized embedding's lookup): rows(), cast."""
        return self.rows(ids).to(dtype)

    def silu_mul(self, x: torch.Tensor) -> torch.Tensor | None:
        """SiLU(gate) * up of this layer's output, its rows a gated MLP's gate then up, where the layer makes it in
        one kernel with the product (TritonLinear's decode GEMV); None: the caller applies forward, then the
        activation."""
        return None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x2 = x.reshape(-1, self.in_features)
        if x2.shape[0] == 0:
            y = x2.new_empty((0, self.out_features))
        else:
            y = self.matmul(x2.contiguous())
        if self.bias is not None:
            y += self.bias
        return y.view(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


class PackedCpuLayer(QuantLayer):
    """A CPU layer whose matmul takes a decode step's [rows, K] input as it is (int4pack, VNNI)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # This layer runs ~4 times per decoder layer, and at one row the generic path's Python
        # (reshape, contiguous, view) is a real share of it.
        if x.dim() == 2 and 0 < x.shape[0] < DENSE_ROWS and self.bias is None:
            return self.matmul(x)
        return super().forward(x)


class PermutedInput(QuantLayer):
    """A GPTQ act-order weight: the inner layer holds the stored columns (groups made contiguous),
    and x's columns are gathered into that order first (one index_select of [rows, K] per call,
    shared by q/k/v when they stack). `rows` returns the weight's rows in input order."""

    def __init__(self, inner: QuantLayer, perm: torch.Tensor):
        super().__init__(inner.out_features, inner.in_features)
        self.inner = inner
        self.float_x_is_free = inner.float_x_is_free
        self.register_buffer("perm", perm)
        self.register_buffer("inverse", torch.argsort(perm).to(perm.dtype))

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner.matmul(x.index_select(1, self.perm))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() == 2 and x.shape[0] > 0 and self.bias is None:  # a step's rows: no reshapes around the gather
            return self.inner(x.index_select(1, self.perm))
        return super().forward(x)

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        return self.inner.rows(ids).index_select(1, self.inverse)


class QuantizedInput(QuantLayer):
    """A layer whose input is quantized per token first (AffineWeight.act_bits: BitNet's 8-bit activations):
    each row of x becomes round(x * q / max|x|) * max|x| / q, clamped to [-q - 1, q], q = 2**(bits - 1) - 1,
    computed in float32 as transformers' AutoBitLinear does (its BitLinear rounds in the activations' dtype: in
    bfloat16 the two part on ties), then cast back; the inner layer multiplies that."""

    def __init__(self, inner: QuantLayer, bits: int):
        super().__init__(inner.out_features, inner.in_features)
        self.inner = inner
        self.float_x_is_free = inner.float_x_is_free
        self.levels = float(2 ** (bits - 1) - 1)

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner.matmul(quantize_rows(x, self.levels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() == 2 and x.shape[0] > 0 and self.bias is None:  # a step's rows: no reshapes around it
            return self.inner(quantize_rows(x, self.levels))
        return super().forward(x)

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        return self.inner.rows(ids)


def quantize_rows(x: torch.Tensor, levels: float) -> torch.Tensor:
    """x with each row (last dim) on a symmetric grid of 2 * levels + 1 steps of max|row| / levels."""
    xf = x.float()
    scale = levels / xf.abs().amax(dim=-1, keepdim=True).clamp_(min=1e-5)
    return (xf * scale).round_().clamp_(-levels - 1, levels).div_(scale).to(x.dtype)


def record_error(errors: ErrorLog, src: AffineWeight, layer: QuantLayer, target: str, requantized: bool) -> None:
    """Measure what the stored form costs against `src`'s own values (on evenly spaced whole rows, at most
    ~1M weights) and log it unless the mapping is exact."""
    n, k = src.shape
    ids = np.unique(np.linspace(0, n - 1, min(n, max(1, ERROR_SAMPLE // k))).astype(np.int64))
    exact = AffineWeight(src.codes[ids], src.scales[ids], src.biases[ids], src.bits, src.group_size, src.source)
    stored = layer.rows(torch.from_numpy(ids).to(next(layer.buffers()).device)).cpu().numpy()
    error = relative_error(stored, exact.dequantize())
    if requantized or error > 2**-20:  # (float32 rounding of c * s + b vs (c - z) * s is not a loss)
        errors.add(src.source, target, error)


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")
