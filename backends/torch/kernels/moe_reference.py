"""Plain-torch reference of the fused mixture-of-experts kernel (triton_moe.py).

For each token t and each of its k experts e = topk_ids[t, j] with weight w = topk_weights[t, j]:

    h = x[t] @ gate_up[e].T (+ b1[e])   ([2I]: gate rows first, then up; float32 accumulation, stored in x's dtype)
    a = glu(h[:I], h[I:])               (default act(gate) * up; in x's dtype)
                                        (ungated experts, gated=False: gate_up holds up's I rows, a = act(h))
    y[t] += w * (a @ down[e].T (+ b2[e]))  (float32, rounded to x's dtype per pair; the k pairs summed in float32)

b1 / b2 are optional per-expert output biases (gpt-oss). Experts are float tensors [E, N, K] or,
quantized, a `PackedExperts` in the packed-nibble layout of quant_reference.py (affine codes, or
e2m1 codes without biases) with one leading expert axis. Written as a loop over experts with masks: slow,
obviously right, and a different algorithm from the kernel's sorted, block-aligned grouped GEMM.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from lantern.backends.torch.kernels.quant_reference import dequantize_e2m1, dequantize_e4m3, dequantize_packed

ACTIVATIONS = {
    "silu": F.silu,
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "relu2": lambda x: F.relu(x).square(),  # Nemotron 3's ungated experts
}


@dataclass
class PackedExperts:
    """E group-quantized matrices: packed uint8 [E, N, K * bits / 8], scales / biases [E, N, K / group];
    code "e2m1" (4-bit fp4 codes) or "e4m3" (FP8 bytes): no biases (None)."""

    packed: torch.Tensor
    scales: torch.Tensor
    biases: torch.Tensor | None
    bits: int
    group_size: int
    code: str = "affine"

    @property
    def shape(self) -> tuple[int, int, int]:
        e, n, _ = self.packed.shape
        return e, n, self.scales.shape[2] * self.group_size

    def dequantize(self, e: int) -> torch.Tensor:
        """Expert e's weight as float32 [N, K]."""
        if self.code == "e2m1":
            return dequantize_e2m1(self.packed[e], self.scales[e], self.group_size)
        if self.code == "e4m3":
            return dequantize_e4m3(self.packed[e], self.scales[e], self.group_size)
        assert self.biases is not None
        return dequantize_packed(self.packed[e], self.scales[e], self.biases[e], self.bits, self.group_size)


Experts = torch.Tensor | PackedExperts


def expert_weight(w: Experts, e: int) -> torch.Tensor:
    return w.dequantize(e) if isinstance(w, PackedExperts) else w[e].float()


def fused_moe_reference(
    x: torch.Tensor,
    gate_up: Experts,
    down: Experts,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    act: str = "silu",
    *,
    glu: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
    gate_up_bias: torch.Tensor | None = None,
    down_bias: torch.Tensor | None = None,
    gated: bool = True,
) -> torch.Tensor:
    """x [T, H], gate_up [E, 2I, H], down [E, H, I], topk_ids / topk_weights [T, k] -> [T, H] in x's dtype.
    glu(gate, up) replaces act(gate) * up; biases [E, 2I] / [E, H] are added to each expert's outputs.
    gated=False: gate_up is up alone [E, I, H], and the activation is act(up)."""
    t, h = x.shape
    num_experts = gate_up.shape[0]
    inner = gate_up.shape[1] // 2
    combine = glu or (lambda gate, up: ACTIVATIONS[act](gate) * up)
    out = torch.zeros(t, h, dtype=torch.float32, device=x.device)
    for e in range(num_experts):
        tokens, slots = torch.nonzero(topk_ids == e, as_tuple=True)
        if tokens.numel() == 0:
            continue
        hidden = x[tokens].float() @ expert_weight(gate_up, e).T
        if gate_up_bias is not None:
            hidden = hidden + gate_up_bias[e].float()
        hidden = hidden.to(x.dtype)
        a = combine(hidden[:, :inner], hidden[:, inner:]) if gated else ACTIVATIONS[act](hidden)
        y = a.float() @ expert_weight(down, e).T
        if down_bias is not None:
            y = y + down_bias[e].float()
        y = (y * topk_weights[tokens, slots].float()[:, None]).to(x.dtype)
        out.index_add_(0, tokens, y.float())
    return out.to(x.dtype)
