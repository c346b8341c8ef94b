"""`--isq q4|q8|fp8` (in-situ quantization): a float checkpoint's matrices quantized on their way from
the weight stream to the backend, with a progress bar whose total is exact for every family.

fp8 (vLLM's `--quantization fp8`) is e4m3 weights where a backend computes on them: one scale per
output row on CUDA GPUs (torch._scaled_mm from compute capability 8.9, the Triton e4m3 kernels on
older ones; backends/torch/weights.isq_mode refuses it on a CPU, where it would only be dequantized),
MLX's mxfp8 mode (a power-of-two scale per 32 weights) on MLX.

What stays in float, and why:
- the MoE routers (and Qwen2-MoE's shared-expert gate): a few KB per layer that decide which
  experts run; quantizing them changes the choice of experts, not just the numbers;
- matrices whose input width the backend's kernels cannot take (IsqMode.col_multiple and the
  group size): torch's CPU int8 kernel reads 16 columns at a time with no tail, so a narrower or
  ragged width would be read past its end (a 24-column DeepSeek q_b_proj segfaulted);
- 1-D tensors (norms, biases), and a tied lm_head (the embedding serves as the head);
- with fp8, the embedding and the lm_head (as vLLM's fp8 keeps them: e4m3's 3-bit mantissa costs most
  on the logits, and torch has no FP8 row gather for the table);
- latent attention's kv_b_proj (DeepSeek): the absorbed attention reads its matrix, never the layer,
  so a quantized one is made dense after loading anyway (models' finish_load): quantizing it would
  keep the same bytes and add only its error.

Experts stacked per layer ([E, out, in]: gpt-oss) are split into one quantized matrix per expert
under per-expert names, so the loaders keep them quantized as they keep per-expert checkpoints';
the progress bar counts them one by one. Matrices a checkpoint already quantized (MXFP4 experts,
GGUF blocks) pass through and leave the bar's total.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from lantern.app.engine.contract import ModelSpec
from lantern.app.models.family_moe import is_router, moe_name
from lantern.app.models.quant.affine import AffineWeight, Fp8Weight, quantize_affine
from lantern.app.models.quant.microscaled import MxWeight
from lantern.app.models.quant.mlx_packed import MlxPacked

logger = logging.getLogger(__name__)
MLA_FLOAT = ".self_attn.kv_b_proj.weight"  # latent attention's matrix read whole (module docstring)
# 2-D, read by row, not multiplied: GPT-2's position table; an encoder's position / token-type tables and
# MPNet's relative-position bias (small, and every input reads them)
_NOT_MATRICES = (
    "norm.weight",
    ".loop_gate.weight",
    ".W_down.weight",  # (A.X-K2's norm gates: tiny, feeding a sigmoid on every channel; float as its fp8 release keeps)
    ".W_up.weight",  # (IQuest-Coder Loop's per-head gate vectors: a row per head, float as mlx_lm keeps them)
    "model.embed_positions.weight",
    "embeddings.position_embeddings.weight",
    "embeddings.token_type_embeddings.weight",
    "relative_attention_bias.weight",
)
# kept float by fp8 (module docstring): the decoders' embedding and head, an encoder's word table
_TABLES = (
    "model.embed_tokens.weight",
    "lm_head.weight",
    "embeddings.word_embeddings.weight",
    "embeddings.tok_embeddings.weight",
)

ISQ_SCHEMES = ("q4", "q8", "fp8")
_FP8_MAX = 448.0  # largest finite e4m3fn value


@dataclass(frozen=True)
class IsqMode:
    """How a backend wants `--isq` weights laid out: bits, group size (0 = per row), symmetric,
    and the multiple of input columns its kernel needs (1: any width the group divides)."""

    bits: int
    group_size: int
    symmetric: bool = False
    col_multiple: int = 1
    kind: str = "affine"  # "affine" | "fp8" (e4m3, a scale per row: Fp8Weight) | "mxfp8" (MLX's mode: MxWeight)

    def fits(self, cols: int) -> bool:
        """True when a matrix with `cols` input columns can be quantized in this layout."""
        return cols % math.lcm(self.group_size or 1, self.col_multiple) == 0

    @property
    def label(self) -> str:
        if self.kind == "fp8":
            return "FP8 e4m3 per-channel"
        if self.kind == "mxfp8":
            return "mxfp8 (e4m3, g32)"
        return f"{self.bits}-bit " + (f"g{self.group_size}" if self.group_size else "per-channel")

    def quantize(self, value: Any) -> AffineWeight | Fp8Weight | MxWeight:
        """One float matrix [out, in] in this layout."""
        if self.kind == "fp8":
            return _fp8_rows(value)
        if self.kind == "mxfp8":
            return _mlx_mx(value, "mxfp8")
        group = self.group_size or value.shape[1]
        return quantize_affine(value, self.bits, group, symmetric=self.symmetric, source=f"ISQ {self.label}")


def isq_candidates(cfg: Any) -> int:
    """How many matrices of a model the stream considers for quantization: every 2-D weight but
    the routers and a tied head, experts one by one (the progress bar's total)."""
    encoder = getattr(cfg, "encoder", None)
    if encoder is not None:  # the word table, then each layer's (the encoder's config says how many)
        return 1 + encoder.matrices_per_layer * cfg.num_layers
    total = 1 if cfg.tie_word_embeddings else 2  # embedding (+ lm_head)
    if getattr(cfg, "gemma4", None) is not None:
        return total + _gemma4_candidates(cfg) + _gemma3n_candidates(cfg)
    mamba1 = getattr(cfg, "mamba1", None)
    if mamba1 is not None and getattr(cfg, "zamba2", None) is not None:  # Zamba: in_proj, out_proj per layer (the
        # heads' x_proj / dt_proj are 3-D); the shared block's q, k, v, o, gate, up, down; a linear per hybrid layer
        return total + 2 * cfg.num_layers + 7 + len(cfg.zamba2.hybrid_layers)
    if mamba1 is not None and all(mamba1.mamba_layers):  # Mamba: in_proj, x_proj, dt_proj, out_proj per layer
        return total + 4 * cfg.num_layers
    kinds = cfg.mamba.layer_kinds if getattr(cfg, "mamba", None) is not None else ""
    if kinds:  # Nemotron-H: one mixer per layer; a Mamba-2 mixer's in_proj and out_proj, q, k, v and o, up and down;
        moe = cfg.moe  # Nemotron 3's experts: up and down each, the shared expert's, the latent projections
        experts = 0 if moe is None else 2 * moe.num_experts + 2 + (2 if moe.latent_size else 0)
        return total + sum({"M": 2, "*": 4, "-": 2, "E": experts}[kind] for kind in kinds)
    zamba2 = getattr(cfg, "zamba2", None)
    if zamba2 is not None:  # a mixer's in_proj, out_proj per layer; q, k, v, o, gate_up, down per shared block;
        per_hybrid = 1 + 2 + (6 if zamba2.attention_adapters else 0)  # linear and the adapters' pairs per hybrid layer
        return total + 2 * cfg.num_layers + 6 * zamba2.num_blocks + per_hybrid * len(zamba2.hybrid_layers)
    nas = getattr(cfg, "nas", None)
    if nas is not None:  # Nemotron-NAS: q, k, v, o, one linear map or nothing; gate, up, down or nothing
        per_kind = {"attention": 4, "linear": 1, "none": 0}
        return total + sum(per_kind[kind] + (3 if width else 0) for kind, width in zip(nas.attention, nas.mlp_widths))
    mla = cfg.mla
    # MLA: q_proj or q_a_proj + q_b_proj, kv_a_proj_with_mqa, o_proj (kv_b_proj stays float); else q, k, v, o.
    attention = (2 + (2 if mla.q_lora_rank else 1)) if mla is not None else 4
    gated = getattr(cfg, "attn_output_gate", False) or getattr(cfg, "dory", None) is not None
    attention += 1 if gated or (mla is not None and mla.head_gate) else 0  # AFMoE's (Dory's, Ling 3.0's) gate
    attention = 1 if cfg.family == "jetmoe" else attention  # JetMoE: kv_proj (its experts' q / o are 3-D: float)
    linear = getattr(cfg, "linear_attn", None)
    for layer in range(cfg.num_layers):
        if linear is not None and linear.linear_layers[layer] and cfg.family == "kimi_linear":
            total += 7 if linear.full_rank else 9  # KDA: q, k, v, f_a, f_b, b, g_a, g_b, o (Ling 3.0: f, g)
        elif linear is not None and linear.linear_layers[layer]:  # gated DeltaNet: its projections and out_proj
            # (q/k/v and z fused, or qkv and z; OLMo Hybrid's q, k, v and its gate apart)
            qkvz = 1 if linear.fused_qkvz else 4 if cfg.family == "olmo_hybrid" else 2
            total += qkvz + (1 if linear.fused_ba else 2) + 1
        elif getattr(cfg, "short_conv", None) is not None and cfg.short_conv.conv_layers[layer]:
            total += 2  # LFM2's short conv: in_proj, out_proj
        elif getattr(cfg, "rglru", None) is not None and cfg.rglru.recurrent_layers[layer]:
            total += 3  # RG-LRU's linear_x, linear_y, linear_out (its block-diagonal gates are 3-D: kept float)
        elif getattr(cfg, "mamba", None) is not None and cfg.mamba.mamba_layers[layer]:
            total += 2 + (attention if cfg.mamba.parallel else 0)  # Mamba-2: in_proj, out_proj (Falcon-H1: attention)
        else:
            total += attention
            if mla is not None and mla.indexer is not None and mla.indexer.runs(layer):
                total += 2  # DeepSeek Sparse Attention's indexer: wq_b, wk (weights_proj stays float: a router)
        moe = cfg.moe
        if moe is None or not moe.is_sparse(layer):
            ungated = cfg.family in ("apertus", "arcee", "jais2", "phi", "mpt", "nanochat")
            total += 2 if ungated else 3  # gate, up, down (theirs: no gate)
        else:  # stacked experts (gpt-oss) count one by one too: quantize_stream splits them
            shared = moe.shared_expert_size or getattr(moe, "shared_size", 0)  # Qwen2-MoE / DeepSeek
            shared = shared or cfg.family in ("granite_hybrid", "llama4")  # Granite 4.0-H's shared_mlp, Llama 4's
            total += 3 * moe.num_experts + (3 if shared else 0)
    return total


def _gemma4_candidates(cfg: Any) -> int:
    """Gemma 4's matrices past the embedding: q and o everywhere, k (and v, unless V is K's projection on a
    full layer) where a layer computes K/V; the per-layer-embedding table, projection and each layer's
    gate and projection; the dense MLP, and the experts one by one."""
    g4, moe = cfg.gemma4, cfg.moe
    total = 2 if g4.ple_dim else 0
    for layer in range(cfg.num_layers):
        total += 2 + (2 if g4.ple_dim else 0) + 3 + (3 * moe.num_experts if moe is not None else 0)
        if g4.writes_kv(layer):
            total += 1 if g4.k_eq_v and not g4.is_sliding(layer) else 2
    return total


def _gemma3n_candidates(cfg: Any) -> int:
    """Gemma 3n's matrices beside Gemma 4's: the AltUp projections into and out of its streams, and each layer's
    LAuReL pair (its AltUp router and coefficients are routers, not counted)."""
    blocks = getattr(cfg, "gemma3n", None)
    return 0 if blocks is None else 2 * (blocks.altup_inputs - 1) + 2 * cfg.num_layers


def quantize_stream(
    source: Iterator[tuple[str, Any]], isq: IsqMode, spec: ModelSpec, progress: bool = True
) -> Iterator[tuple[str, Any]]:
    """The weight stream with its float matrices quantized to `isq` (see the module docstring)."""
    from tqdm import tqdm

    cfg = spec.config
    total = isq_candidates(cfg)
    bar = tqdm(total=total, desc=f"quantizing to {isq.label}", unit="tensor", disable=not progress, leave=False)
    done = seen = already = routers = latent = tables = 0
    narrow: list[tuple[str, int]] = []
    try:
        for name, value in source:
            if cfg.tie_word_embeddings and name == "lm_head.weight":
                continue  # the embedding serves as the head: quantizing this copy would be wasted
            if isinstance(value, (AffineWeight, Fp8Weight, MxWeight, MlxPacked)):
                already += 1
                if not is_router(moe_name(name)):  # a checkpoint-quantized matrix: not ours to count
                    bar.total -= 1
                yield name, value
                continue
            stacked = _STACKED.match(name) if len(value.shape) == 3 else None
            if stacked is not None:
                matrices = _stacked_matrices(stacked.group(2), value.shape[0])
                if not _is_float(value):  # MXFP4 codes kept packed for MLX: not ours to count
                    already += matrices
                    bar.total -= matrices
                    yield name, value
                    continue
                seen += matrices
                moe = cfg.moe
                if not (isq.fits(cfg.hidden_size) and isq.fits(moe.intermediate_size)):
                    # Both projections or neither: the loaders hold one layer's experts one way.
                    narrow.append((name, value.shape[2]))
                    bar.update(matrices)
                    yield name, value
                    continue
                yield from _split_stacked(stacked.group(1), stacked.group(2), value, isq)
                del value
                done += matrices
                bar.update(matrices)
                continue
            if not name.endswith(".weight") or len(value.shape) != 2 or name.endswith(_NOT_MATRICES):
                yield name, value  # (Command R+'s q/k norms have a weight row per head; GPT-2's position table)
                continue
            if is_router(moe_name(name)):
                routers += 1
                yield name, value
                continue
            if isq.kind != "affine" and name in _TABLES:  # fp8 keeps them float, as vLLM's fp8 does
                tables += 1
                seen += 1
                bar.update(1)
                yield name, value
                continue
            if cfg.mla is not None and name.endswith(MLA_FLOAT):
                latent += 1
                yield name, value
                continue
            seen += 1
            cols = value.shape[1]
            if not isq.fits(cols):
                narrow.append((name, cols))
                bar.update(1)
                yield name, value
                continue
            # Converted to float32 a few rows at a time (a 128k-row embedding never is, whole).
            quantized = isq.quantize(value)
            del value
            yield name, quantized
            done += 1
            bar.update(1)
    finally:
        bar.close()
    _report(isq, done, routers, narrow, already, latent, tables)
    if seen != total:  # a family whose matrices isq_candidates does not know: only the bar is off
        logger.debug("in-situ quantization saw %d matrices; %d were expected", seen, total)


# Experts stacked per layer, [E, out, in] (gpt-oss after family_gptoss.checkpoint_tensors; gate rows first).
_STACKED = re.compile(r"^(.*\.mlp\.experts)\.(gate_up_proj|down_proj)$")


def _stacked_matrices(proj: str, num_experts: int) -> int:
    """The per-expert matrices a stacked tensor holds (gate_up: a gate and an up per expert)."""
    return num_experts * (2 if proj == "gate_up_proj" else 1)


def _is_float(value: Any) -> bool:
    dtype = str(value.dtype)
    return "float" in dtype  # torch.float32 / bfloat16, mlx.core.float16, numpy float32


def _split_stacked(path: str, proj: str, value: Any, isq: IsqMode) -> Iterator[tuple[str, Any]]:
    """A stacked [E, out, in] float tensor as one quantized matrix per expert, under the names of
    per-expert checkpoints (`<path>.<e>.<gate|up|down>_proj.weight`), which both backends' loaders
    keep quantized (torch: moe.QuantExperts; MLX: stacked again for gather_qmm)."""
    for e in range(value.shape[0]):
        w = isq.quantize(value[e])
        if proj == "down_proj":
            yield f"{path}.{e}.down_proj.weight", w
        else:
            inner = w.shape[0] // 2
            yield f"{path}.{e}.gate_proj.weight", w.rows(0, inner)
            yield f"{path}.{e}.up_proj.weight", w.rows(inner, 2 * inner)


def _fp8_rows(value: Any) -> Fp8Weight:
    """e4m3 codes with one float32 scale per row (its largest magnitude / 448), a few MB at a time."""
    import numpy as np
    import torch

    w = torch.as_tensor(value)
    rows, cols = w.shape
    data = torch.empty((rows, cols), dtype=torch.uint8)
    scales = torch.empty((rows, 1), dtype=torch.float32)
    step = max(1, (1 << 20) // max(cols, 1))
    for r in range(0, rows, step):
        part = w[r : r + step].float()
        scale = part.abs().amax(dim=1, keepdim=True).clamp(min=1e-12) / _FP8_MAX
        data[r : r + step] = (part / scale).clamp(-_FP8_MAX, _FP8_MAX).to(torch.float8_e4m3fn).view(torch.uint8)
        scales[r : r + step] = scale
    return Fp8Weight(data.numpy(), np.ascontiguousarray(scales.numpy()), None, "ISQ FP8 e4m3 per-channel")


def _mlx_mx(value: Any, mode: str) -> MxWeight:
    """MLX's own quantizer in a microscaled mode (the MLX loader computes on the result as stored)."""
    import mlx.core as mx
    import numpy as np

    w = value if isinstance(value, mx.array) else mx.array(np.asarray(value, dtype=np.float32))
    packed, scales = mx.quantize(w, mode=mode)[:2]
    return MxWeight(mode, np.array(packed), np.array(scales), f"ISQ {mode}")


def _report(
    isq: IsqMode, done: int, routers: int, narrow: list[tuple[str, int]], already: int, latent: int, tables: int = 0
) -> None:
    kept = f"; {routers} router matrices kept in float" if routers else ""
    kept += f"; the embedding{' and head' if tables > 1 else ''} kept in float" if tables else ""
    kept += f"; {latent} latent attention kv_b_proj matrices kept in float" if latent else ""
    logger.info("in-situ quantization: %d tensors to %s%s", done, isq.label, kept)
    if narrow:
        unit = math.lcm(isq.group_size or 1, isq.col_multiple)
        name, cols = narrow[0]
        logger.warning(
            "in-situ quantization kept %d matrices in float: their input width is not a multiple of %d "
            "(the %s kernel's unit), e.g. %s with %d columns",
            len(narrow),
            unit,
            isq.label,
            name,
            cols,
        )
    if already:
        logger.info("in-situ quantization left %d tensors as the checkpoint quantized them", already)
