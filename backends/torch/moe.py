"""Sparse mixture-of-experts MLP for torch: Mixtral, Qwen2-MoE (shared expert), Qwen3-MoE, and
gpt-oss through SparseMoE's options (router and expert biases, softmax over the top-k logits,
clamped SwiGLU: `BiasedExperts`).

Routing (app/models/family_moe.py): softmax over all experts in float32, top-k, renormalised when
the config says so. The experts are one of:

- `StackedExperts` (float): gate_up_proj [E, 2I, H] (gate rows, then up) and down_proj [E, H, I]; ungated
  experts (MoEConfig.gated false, Nemotron 3: down(act(up(x)))) hold up's [E, I, H] as gate_up_proj.
  On CUDA the Triton fused-MoE kernel (kernels/triton_moe.py); elsewhere the (token, expert) pairs
  are sorted by expert and each projection is one grouped matmul over the experts' row groups
  (torch._grouped_mm, or a loop over the experts hit where that op is missing), with no per-token
  Python loop.
- `QuantExperts` (quantized checkpoints, --isq): one quant_linear layer per expert and projection,
  the weights staying quantized. On CPU the same sorted grouping with one quantized matmul per
  expert hit; on CUDA, when every expert shares one mode (4/8-bit affine; e2m1: MXFP4 / NVFP4; e4m3: FP8),
  they are also held as stacked packed tensors (`stack_for_cuda`) that the fused kernel dequantizes
  in registers. gpt-oss's quantized experts (MXFP4, exact: family_gptoss; --isq) are QuantExperts
  too, holding BiasedExperts' stacked biases (`QuantExperts.replacing`).

On CUDA every kind takes the fused kernel, with the experts' biases and the layer's `activate` (act(gate) * up,
gpt-oss's clamped SwiGLU or an ungated act(up), run in torch between its two GEMMs); so a decode step under a
CUDA graph reads only the chosen experts' weights. Quantized experts that could not be stacked take the grouped path
(eagerly) or, under capture, every expert (`_dense`).

Tensor parallelism is not implemented for MoE layers (refused at construction).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from lantern.app.models.spec import ModelConfig
from lantern.backends.torch.kernels import ops
from lantern.backends.torch.layers import ACTIVATIONS, MLP
from lantern.backends.torch.parallel import TPGroup

logger = logging.getLogger(__name__)


class StackedExperts(nn.Module):
    """gated=False (Nemotron 3's down(act(up(x))) experts): gate_up_proj holds up's inner rows alone."""

    def __init__(self, num_experts: int, hidden: int, inner: int, gated: bool = True):
        super().__init__()
        self.gated = gated
        # An explicit empty tensor: on the meta device while the model is built, filled by weights.py.
        self.gate_up_proj = nn.Parameter(torch.empty(num_experts, (1 + gated) * inner, hidden), requires_grad=False)
        self.down_proj = nn.Parameter(torch.empty(num_experts, hidden, inner), requires_grad=False)


class BiasedExperts(nn.Module):
    """StackedExperts' two projections plus a bias per expert and output row (gpt-oss). A class of
    its own: its checkpoints store the four tensors stacked, so the loader fills them by name
    rather than expert by expert."""

    gated = True

    def __init__(self, num_experts: int, hidden: int, inner: int):
        super().__init__()
        self.gate_up_proj = nn.Parameter(torch.empty(num_experts, 2 * inner, hidden), requires_grad=False)
        self.down_proj = nn.Parameter(torch.empty(num_experts, hidden, inner), requires_grad=False)
        self.gate_up_proj_bias = nn.Parameter(torch.empty(num_experts, 2 * inner), requires_grad=False)
        self.down_proj_bias = nn.Parameter(torch.empty(num_experts, hidden), requires_grad=False)


def clamped_swiglu(alpha: float, limit: float) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """gpt-oss's expert activation: gate clamped above at limit, up to [-limit, limit], then
    (up + 1) * gate * sigmoid(alpha * gate)."""

    def glu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        gate = gate.clamp(max=limit)
        up = up.clamp(-limit, limit)
        return (up + 1) * (gate * torch.sigmoid(gate * alpha))

    return glu


class Unset(nn.Module):
    """A quantized expert's projection not yet read from the checkpoint (weights.py checks none is left)."""


class QuantExperts(nn.Module):
    """gated=False: each gate_up_proj layer is the expert's up projection alone."""

    def __init__(self, num_experts: int, gated: bool = True):
        super().__init__()
        self.gated = gated
        self.gate_up_proj = nn.ModuleList([Unset() for _ in range(num_experts)])
        self.down_proj = nn.ModuleList([Unset() for _ in range(num_experts)])
        self.packed: tuple | None = None  # (gate_up, down) PackedExperts for the CUDA kernel
        self.gate_up_proj_bias: nn.Parameter | None = None  # [E, 2I] and [E, H]: gpt-oss only
        self.down_proj_bias: nn.Parameter | None = None

    @classmethod
    def replacing(cls, module: nn.Module) -> QuantExperts:
        """Quantized experts taking the place of float ones (StackedExperts / BiasedExperts) when
        the checkpoint's first expert arrives quantized; BiasedExperts' stacked biases (float, filled
        by name before or after the swap) move over as they are."""
        new = cls(module.gate_up_proj.shape[0], module.gated)
        if isinstance(module, BiasedExperts):
            new.gate_up_proj_bias, new.down_proj_bias = module.gate_up_proj_bias, module.down_proj_bias
        return new

    def stack_for_cuda(self) -> None:
        """Also hold the experts as stacked packed tensors for the fused kernel, when they are all
        Triton layers of one mode (else the per-expert path runs)."""
        from lantern.backends.torch.kernels.moe_reference import PackedExperts
        from lantern.backends.torch.triton_linear import TritonLinear

        stacks = []
        for layers in (self.gate_up_proj, self.down_proj):
            if not all(isinstance(m, TritonLinear) for m in layers):
                return
            if len({(m.code, m.bits, m.group_size) for m in layers}) != 1:
                return
            first = layers[0]
            # float codes' scales are held in the model's dtype where exact, else float32: one dtype for the stack
            scale_dtype = first.scales.dtype if len({m.scales.dtype for m in layers}) == 1 else torch.float32
            biases = None if first.biases is None else torch.stack([m.biases for m in layers])
            scales = torch.stack([m.scales.to(scale_dtype) for m in layers])
            packed = torch.stack([m.packed for m in layers])
            stacks.append(PackedExperts(packed, scales, biases, first.bits, first.group_size, first.code))
        self.packed = (stacks[0], stacks[1])
        # One copy on the device: each expert's layer now reads views of the stacks.
        for layers, stack in zip((self.gate_up_proj, self.down_proj), stacks):
            for e, m in enumerate(layers):
                m.packed, m.scales = stack.packed[e], stack.scales[e]
                m.biases = None if stack.biases is None else stack.biases[e]


def sparsemixer(logits: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """PhiMoE's SparseMixer at inference (transformers' sparsemixer, eval mode): (expert ids [T, 2], weights [T, 2]).
    Expert one is the best logit, weighted by the softmax over the logits within 2 eps (relative to
    max(|logit|, best)) of it; expert two the best of the others, weighted by the softmax of the others within
    that margin of it; in the logits' dtype, not renormalised."""
    ids, weights = [], []
    scores = logits
    for _ in range(2):
        best, idx = scores.max(dim=-1, keepdim=True)
        margin = (best - logits) / logits.abs().clamp(min=best) > 2 * eps
        weights.append(torch.softmax(scores.masked_fill(margin, float("-inf")), dim=-1).gather(-1, idx))
        ids.append(idx)
        scores = scores.scatter(-1, idx, float("-inf"))
    return torch.cat(ids, dim=-1), torch.cat(weights, dim=-1)


class SparseMoE(nn.Module):
    sum_float32 = False  # True: each token's k expert outputs summed in float32 (Nemotron 3, as transformers)

    def __init__(
        self,
        cfg: ModelConfig,
        tp: TPGroup = TPGroup(),
        router_bias: bool = False,
        expert_bias: bool = False,
        glu: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
        softmax_after_topk: bool = False,
    ):
        """Options (gpt-oss; the defaults are the Mixtral / Qwen routers): router_bias: the router
        has a bias; expert_bias: BiasedExperts; glu: how gate and up combine (default
        act(gate) * up); softmax_after_topk: weights are a softmax over the k chosen logits."""
        super().__init__()
        if tp.active:
            raise ValueError(
                "tensor parallelism is not implemented for mixture-of-experts models; "
                "serve this model with --tensor-parallel-size 1"
            )
        moe = cfg.moe
        self.num_experts, self.top_k = moe.num_experts, moe.top_k
        self.norm_topk_prob, self.fp32_weights = moe.norm_topk_prob, moe.router_weights_fp32
        self.act = ACTIVATIONS[cfg.hidden_act]
        act = self.act
        self.glu = glu or (lambda gate, up: act(gate) * up)
        # silu(gate) * up, the Triton kernels' own activation (made in the decode GEMV's epilogue): unless a family
        # replaces glu after this (Step 3.5's clamp) or activate, routed passes activate=None to fused_moe
        self._kernels_glu = self.glu if glu is None and cfg.hidden_act == "silu" else None
        self.softmax_after_topk = softmax_after_topk
        self.sparsemixer_eps = moe.sparsemixer_eps
        self.gate = nn.Linear(cfg.hidden_size, moe.num_experts, bias=router_bias)  # the router
        self.gated = moe.gated
        hidden = moe.latent_size or cfg.hidden_size  # (Nemotron 3's LatentMoE: the caller projects in and out)
        if expert_bias:
            self.experts: nn.Module = BiasedExperts(moe.num_experts, hidden, moe.intermediate_size)
        else:
            self.experts = StackedExperts(moe.num_experts, hidden, moe.intermediate_size, moe.gated)
        self.shared_expert: nn.Module | None = None
        if moe.shared_expert_size:
            self.shared_expert = MLP(cfg, tp, moe.shared_expert_size)
            self.shared_expert_gate = nn.Linear(cfg.hidden_size, 1, bias=False)
        self._grouped_mm_ok = hasattr(torch, "_grouped_mm")

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(expert ids [T, k], weights [T, k]): float32 for Mixtral, x's dtype for the Qwen routers;
        gpt-oss: top-k of the logits, then their softmax in x's dtype."""
        if self.softmax_after_topk:
            values, ids = torch.topk(self.gate(x), self.top_k, dim=-1)
            return ids, torch.softmax(values, dim=-1, dtype=values.dtype)
        if self.sparsemixer_eps is not None:
            return sparsemixer(self.gate(x), self.sparsemixer_eps)
        probs = torch.softmax(self.gate(x), dim=-1, dtype=torch.float32)
        weights, ids = torch.topk(probs, self.top_k, dim=-1)
        if self.norm_topk_prob:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return ids, weights if self.fp32_weights else weights.to(x.dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ids, weights = self.route(x)
        out = self.routed(x, ids, weights)
        if self.shared_expert is not None:
            out = out + torch.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)
        return out

    def routed(self, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        experts = self.experts
        if x.shape[0] == 0:
            return torch.zeros_like(x)
        if ops.use_triton(x):
            kernel_weights = None
            if isinstance(experts, (StackedExperts, BiasedExperts)):
                kernel_weights = (experts.gate_up_proj, experts.down_proj)
            elif experts.packed is not None:
                kernel_weights = experts.packed
            if kernel_weights is not None:
                from lantern.backends.torch.kernels.triton_moe import fused_moe

                biases = {"gate_up_bias": getattr(experts, "gate_up_proj_bias", None)}
                biases["down_bias"] = getattr(experts, "down_proj_bias", None)
                return fused_moe(x, *kernel_weights, ids, weights, activate=self._kernel_activation(), **biases)
        if x.is_cuda and torch.cuda.is_current_stream_capturing() and not self._capturable_grouped_mm(x):
            return self._dense(x, ids, weights)  # the per-expert loop reads counts on the host
        k = self.top_k
        flat = ids.reshape(-1)
        order = torch.argsort(flat, stable=True)  # pairs grouped by expert
        token = order // k
        # A fixed-size count (bincount's size depends on the ids: a host sync, which CUDA graph capture
        # refuses on the grouped path gpt-oss takes there).
        counts = torch.zeros(self.num_experts, dtype=torch.long, device=flat.device).index_add_(
            0, flat, torch.ones_like(flat)
        )
        y = self._grouped(x[token], counts, flat[order])
        y = y * weights.reshape(-1)[order, None]  # float32 weights: the product in float32 (Mixtral)
        acc = torch.float32 if self.sum_float32 else x.dtype  # (the k shares rounded to x's dtype, as Mixtral's)
        return torch.zeros(x.shape, dtype=acc, device=x.device).index_add_(0, token, y.to(acc)).to(x.dtype)

    def _grouped_mm_usable(self) -> bool:
        """False once torch._grouped_mm failed here (settled by the eager warm-up before a capture)."""
        return isinstance(self.experts, (StackedExperts, BiasedExperts)) and self._grouped_mm_ok

    def _capturable_grouped_mm(self, x: torch.Tensor) -> bool:
        """torch._grouped_mm has a device kernel for bfloat16 only: other dtypes take a fallback that
        reads the offsets on the host (seen on an H200 with float32), which a CUDA graph refuses."""
        return x.dtype == torch.bfloat16 and self._grouped_mm_usable()

    def _grouped(self, xs: torch.Tensor, counts: torch.Tensor, expert_ids: torch.Tensor) -> torch.Tensor:
        """Rows of xs grouped by expert (counts[e] rows each; expert_ids: each row's) through their
        experts' MLPs."""
        experts = self.experts
        biased = isinstance(experts, BiasedExperts)
        # On CPU torch._grouped_mm is a loop of matmuls over every expert, empty ones too: when few are hit
        # (decode: a few tokens times top-k) the loop below over the hit ones alone is cheaper.
        few = not xs.is_cuda and xs.shape[0] < 4 * self.num_experts
        if self._grouped_mm_usable() and not few:
            offsets = torch.cumsum(counts, 0).to(torch.int32)
            try:
                h = torch._grouped_mm(xs, experts.gate_up_proj.transpose(1, 2), offs=offsets)
                if biased:
                    h = h + experts.gate_up_proj_bias[expert_ids]
                y = torch._grouped_mm(self.activate(h), experts.down_proj.transpose(1, 2), offs=offsets)
                return y + experts.down_proj_bias[expert_ids] if biased else y
            except (RuntimeError, NotImplementedError) as exc:  # no kernel for this device / dtype
                logger.info("torch._grouped_mm unavailable (%s); one matmul per expert instead", exc)
                self._grouped_mm_ok = False
        outs = []
        start = 0
        for e, n in enumerate(counts.tolist()):
            if n == 0:
                continue
            outs.append(self._expert(e, xs[start : start + n]))
            start += n
        return torch.cat(outs)

    def _kernel_activation(self) -> Callable[[torch.Tensor], torch.Tensor] | None:
        """What fused_moe applies between its GEMMs: None (its own silu(gate) * up) where that is this layer's."""
        plain = self.gated and self.glu is self._kernels_glu and type(self).activate is SparseMoE.activate
        return None if plain else self.activate

    def activate(self, h: torch.Tensor) -> torch.Tensor:
        """The experts' first projection's output [.., 2I] (gate, then up) -> glu(gate, up) [.., I]; for
        ungated experts ([.., I], up alone) act(up)."""
        return self.glu(*h.chunk(2, dim=-1)) if self.gated else self.act(h)

    def _expert(self, e: int, rows: torch.Tensor) -> torch.Tensor:
        """Expert e's MLP over rows."""
        experts = self.experts
        if isinstance(experts, (StackedExperts, BiasedExperts)):
            biased = isinstance(experts, BiasedExperts)
            gate_up_bias = experts.gate_up_proj_bias[e] if biased else None
            h = F.linear(rows, experts.gate_up_proj[e], gate_up_bias)
            down_bias = experts.down_proj_bias[e] if biased else None
            return F.linear(self.activate(h), experts.down_proj[e], down_bias)
        # QuantExperts: one quantized matmul per expert, its stacked biases added (gpt-oss)
        h = experts.gate_up_proj[e](rows)
        if experts.gate_up_proj_bias is not None:
            h = h + experts.gate_up_proj_bias[e]
        y = experts.down_proj[e](self.activate(h))
        return y if experts.down_proj_bias is None else y + experts.down_proj_bias[e]

    def _dense(self, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """Every expert over every token, weighted by its routing weight (0 where not chosen). No
        host sync, so CUDA graph capture takes it where the grouped matmul is unavailable (float32,
        quantized experts): decode batches are small, and at a few tokens per expert the step reads
        every expert's weights anyway."""
        combine = torch.zeros(x.shape[0], self.num_experts, dtype=weights.dtype, device=x.device)
        combine.scatter_(1, ids, weights)
        out = torch.zeros(x.shape, dtype=torch.promote_types(x.dtype, weights.dtype), device=x.device)
        for e in range(self.num_experts):
            out += self._expert(e, x) * combine[:, e : e + 1]
        return out.to(x.dtype)
