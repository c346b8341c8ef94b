"""gpt-oss (model_type "gpt_oss": openai/gpt-oss-20b, -120b): what its config.json means, as
transformers' GptOssConfig reads it (defaults included), and how its checkpoint's tensors reach the
model files of both backends.

The maths (transformers' modeling_gpt_oss):

- Attention: q/k/v/o projections with biases, query scale head_dim ** -0.5, one learned sink logit
  per head in the softmax's denominator (no value behind it), layers alternating sliding window
  (layer_types; by default even layers slide) and full attention. Rope: YaRN on the two halves of
  each head, *untruncated* correction range (rope_parameters truncate=false; both backends compute
  it exactly: rope_config.rope_scaling keeps the key for this family).
- Experts: the router is a linear layer with a bias; top-k of its logits, then a softmax over those
  k (not over all experts). Each expert: gate_up = x @ W + b with gate and up *interleaved* in the
  output columns, gate clamped above at swiglu_limit, up to [-limit, limit], then
  (up + 1) * gate * sigmoid(swiglu_alpha * gate), then down_proj with its bias.
- RMSNorm as Llama's; pre-norm residual blocks; untied head.

The checkpoint stores experts stacked per layer, transposed ([E, in, out]) with gate/up columns
interleaved, and in the OpenAI release MXFP4-quantized (`*_blocks` uint8 [E, out, in / 32, 16]: two
e2m1 codes per byte, low nibble first; `*_scales` uint8 [E, out, in / 32]: e8m0 exponents, bias 127).
checkpoint_tensors() turns them into the model files' layout: [E, out, in], gate rows then up rows,
the router named `mlp.gate` like the other mixtures. MXFP4 experts stay MXFP4 on MLX (packed codes
as uint32 + scales, for gather_qmm's mxfp4 mode). On torch each expert's projection becomes the
exact shared form of an fp4 weight (`MxWeight.portable()`: 5-bit codes, twice the e2m1 value + 12),
which the backend's layers keep at 4 bits: e2m1 nibbles in the Triton kernels (CUDA), 4-bit indices
into a 16-code table in the VNNI CPU kernels. CPUs without those kernels hold them as int8 per
channel (requantized: ~0.8% error on e2m1 values, logged by the layer; twice MXFP4's bytes).
A GGUF file's experts (llama.cpp's "gpt-oss": ggml MXFP4 blocks,
gate and up stored apart) reach checkpoint_tensors as the same blocks and scales, gate rows first
(gguf_arch.gptoss_experts; interleaved=False).
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from lantern.app.models.family_moe import MoEConfig
from lantern.app.models.quant.affine import AffineWeight
from lantern.app.models.quant.hf_formats import QuantScheme, parse_quant_scheme
from lantern.app.models.quant.microscaled import E2M1_VALUES, MxWeight, checked
from lantern.app.models.rope_config import rope_scaling
from lantern.app.models.spec import UnsupportedModelError

logger = logging.getLogger(__name__)

# GptOssConfig's defaults where config.json leaves a key out (several differ from from_hf's).
_DEFAULTS: dict[str, Any] = {
    "head_dim": 64,
    "num_local_experts": 128,
    "num_experts_per_tok": 4,
    "sliding_window": 128,
    "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-5,
    "swiglu_alpha": 1.702,
    "swiglu_limit": 7.0,
    "attention_bias": True,
}
_DEFAULT_THETA = 150000.0  # GptOssConfig.default_theta
# GptOssConfig.__post_init__'s rope when config.json has none.
_DEFAULT_ROPE = {
    "rope_type": "yarn",
    "factor": 32.0,
    "beta_fast": 32.0,
    "beta_slow": 1.0,
    "truncate": False,
    "original_max_position_embeddings": 4096,
}
_LAYER_TYPES = ("sliding_attention", "full_attention")


@dataclass(frozen=True)
class GptOssMoEConfig(MoEConfig):
    """MoEConfig's expert shapes plus gpt-oss's clamped SwiGLU (every layer is sparse)."""

    swiglu_alpha: float = 1.702  # sigmoid gain of the gate
    swiglu_limit: float = 7.0  # gate clamped above, up clamped to [-limit, limit]


def _refuse(key: str, value: Any, why: str) -> UnsupportedModelError:
    return UnsupportedModelError(f"{key}={json.dumps(value)} in config.json is not implemented{why}")


def configure(model_type: str, cfg: dict[str, Any], fields: dict[str, Any]) -> dict[str, Any]:
    """ModelConfig field overrides for a gpt_oss config.json (spec.ModelConfig.from_hf)."""
    if model_type != "gpt_oss":
        raise UnsupportedModelError(f"family_gptoss does not configure model_type {model_type!r}")
    full = {key: cfg[key] if cfg.get(key) is not None else value for key, value in _DEFAULTS.items()}
    scheme = _check_quantization(cfg)
    num_layers = fields["num_layers"]
    # GptOssConfig aliases num_experts to num_local_experts (either may be saved).
    experts = int(cfg.get("num_local_experts") or cfg.get("num_experts") or full["num_local_experts"])
    top_k = int(full["num_experts_per_tok"])
    if not 1 <= top_k <= experts:
        raise _refuse("num_experts_per_tok", top_k, f" (must be between 1 and the {experts} experts)")
    moe = GptOssMoEConfig(
        num_experts=experts,
        top_k=top_k,
        intermediate_size=int(fields["intermediate_size"]),
        norm_topk_prob=True,  # a softmax over the k chosen logits: the weights sum to 1
        swiglu_alpha=float(full["swiglu_alpha"]),
        swiglu_limit=float(full["swiglu_limit"]),
    )
    head_dim = int(full["head_dim"])
    max_pos = int(full["max_position_embeddings"])
    return {
        "head_dim": head_dim,
        "rms_norm_eps": float(full["rms_norm_eps"]),
        "max_position_embeddings": max_pos,
        "attention_bias": bool(full["attention_bias"]),
        # An explicit null is not the default: transformers raises on sliding layers without a window.
        "layer_windows": _windows(cfg, num_layers, cfg.get("sliding_window", _DEFAULTS["sliding_window"])),
        "moe": moe,
        "quantization": scheme,  # (OpenAI's MXFP4 experts: read by checkpoint_tensors, not as a QuantScheme)
        **_rope(cfg, head_dim, max_pos),
    }


def _check_quantization(cfg: dict[str, Any]) -> QuantScheme | None:
    """Float checkpoints, OpenAI's MXFP4 experts (read by checkpoint_tensors) and MLX-community folders
    (mlx_lm's `quantization`: its mxfp4 experts, 8-bit attention) are read; other quantizations are refused."""
    if cfg.get("quantization"):
        return parse_quant_scheme(cfg)
    q = cfg.get("quantization_config")
    if not q:
        return None
    method = q.get("quant_method") if isinstance(q, dict) else q
    if method is None and isinstance(q, dict):  # mlx_lm's folders may carry their scheme only here
        return parse_quant_scheme(cfg)
    if method != "mxfp4":
        raise _refuse("quantization_config.quant_method", method, " for gpt_oss (float, MXFP4 experts or MLX folders)")
    return None


def _windows(cfg: dict[str, Any], num_layers: int, window: Any) -> list[int | None] | None:
    """Per layer window from layer_types (GptOssConfig's default: even layers slide)."""
    layer_types = cfg.get("layer_types")
    if layer_types is None:
        layer_types = ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(num_layers)]
    bad = [t for t in layer_types if t not in _LAYER_TYPES]
    if bad or len(layer_types) != num_layers:
        raise _refuse("layer_types", bad[0] if bad else layer_types, f" (expected {num_layers} of {_LAYER_TYPES})")
    if "sliding_attention" not in layer_types:
        return None
    if not window:
        raise _refuse("sliding_window", cfg.get("sliding_window"), " with sliding_attention layers")
    return [int(window) if t == "sliding_attention" else None for t in layer_types]


def _rope(cfg: dict[str, Any], head_dim: int, max_pos: int) -> dict[str, Any]:
    """rope_theta and rope_scaling with GptOssConfig's defaults: transformers 5's rope_parameters or
    the older rope_scaling + rope_theta (what the released config.json has); neither: YaRN x32."""
    params = dict(cfg.get("rope_parameters") or {})
    params.update(cfg.get("rope_scaling") or {})
    theta = cfg.get("rope_theta") or params.pop("rope_theta", None) or _DEFAULT_THETA
    params.pop("rope_theta", None)
    if not params:
        params = dict(_DEFAULT_ROPE)
    rope_cfg = {"model_type": "gpt_oss", "head_dim": head_dim}
    return {"rope_theta": float(theta), "rope_scaling": rope_scaling(rope_cfg, params, max_pos)}


# ---- checkpoint tensors ------------------------------------------------------------------------------
_EXPERTS = re.compile(r"^(.*\.mlp\.experts)\.(gate_up_proj|down_proj)(_bias|_blocks|_scales)?$")


def checkpoint_tensors(
    source: Iterator[tuple[str, Any]], framework: str, interleaved: bool = True
) -> Iterator[tuple[str, Any]]:
    """A gpt-oss checkpoint's tensors in the model files' terms (module docstring). Float experts
    come out as `<layer>.mlp.experts.{gate_up_proj,down_proj}` [E, out, in] (gate rows first) with
    `..._bias` [E, out]; MXFP4 ones on MLX ("mlx") as the same names holding packed uint32 codes
    [E, out, in / 8] plus `..._scales` uint8 [E, out, in / 32], on torch ("pt") as one exact 5-bit
    AffineWeight (MxWeight.portable()) per expert and projection (`<layer>.mlp.experts.<e>.<gate|up|down>_proj.weight`,
    the names of per-expert checkpoints), the biases still stacked. interleaved=False: gate_up's
    rows are already gate rows first (a GGUF file's, joined by gguf_arch.gptoss_experts)."""
    halves: dict[str, dict[str, Any]] = {}  # MXFP4 blocks waiting for their scales, or the reverse
    for name, value in source:
        if ".mlp.router." in name:
            yield name.replace(".mlp.router.", ".mlp.gate."), value
            continue
        m = _EXPERTS.match(name)
        if m is None:
            yield name, value
            continue
        path, proj, suffix = m.group(1), m.group(2), m.group(3) or ""
        gate_up = proj == "gate_up_proj"
        if suffix == "":  # float [E, in, out]
            value = _transposed(value)
            yield f"{path}.{proj}", _gate_rows_first(value) if gate_up else value
        elif suffix == "_bias":
            yield f"{path}.{proj}_bias", _gate_rows_first(value) if gate_up and interleaved else value
        else:
            pair = halves.setdefault(f"{path}.{proj}", {})
            pair[suffix] = value
            if len(pair) < 2:
                continue
            del halves[f"{path}.{proj}"]
            blocks, scales = pair["_blocks"], pair["_scales"]
            if tuple(blocks.shape)[:-1] != tuple(scales.shape) or blocks.shape[-1] != 16:
                raise ValueError(
                    f"{path}.{proj}: MXFP4 blocks {tuple(blocks.shape)} do not match scales {scales.shape}"
                )
            if gate_up and interleaved:
                blocks, scales = _gate_rows_first(blocks), _gate_rows_first(scales)
            if framework == "mlx":
                import mlx.core as mx

                blocks = blocks if isinstance(blocks, mx.array) else mx.array(blocks)  # GGUF's are numpy
                e, rows, groups, _ = blocks.shape  # 32 codes = 16 bytes = 4 uint32 per group, little-endian
                yield f"{path}.{proj}", blocks.reshape(e, rows, groups * 16).view(mx.uint32)
                yield f"{path}.{proj}_scales", scales
            else:
                for e in range(blocks.shape[0]):  # one expert's unpacked codes at a time
                    weight = mxfp4_weight(blocks[e], scales[e])
                    if gate_up:
                        inner = weight.shape[0] // 2
                        yield f"{path}.{e}.gate_proj.weight", weight.rows(0, inner)
                        yield f"{path}.{e}.up_proj.weight", weight.rows(inner, 2 * inner)
                    else:
                        yield f"{path}.{e}.down_proj.weight", weight
    if halves:
        prefix, got = next(iter(halves.items()))
        raise ValueError(f"checkpoint has {prefix}{next(iter(got))} without its MXFP4 partner")


_MLX_BIAS = re.compile(r"^(.*\.mlp\.experts)\.(gate_proj|up_proj|down_proj)\.bias$")


def mlx_expert_biases(source: Iterator[tuple[str, Any]]) -> Iterator[tuple[str, Any]]:
    """mlx_lm's gpt-oss folders (mlx-community's): the stacked expert biases `experts.<proj>.bias` [E, out]
    as the model files take them (after checkpoint_tensors): `experts.gate_up_proj_bias` [E, 2I], gate
    rows first, and `experts.down_proj_bias`. (Their expert weights arrive per expert, split by
    weight_stream.split_switch_mlp.)"""
    gates: dict[str, Any] = {}
    for name, value in source:
        m = _MLX_BIAS.match(name)
        if m is None:
            yield name, value
            continue
        path, proj = m.group(1), m.group(2)
        if proj == "down_proj":
            yield f"{path}.down_proj_bias", value
            continue
        pair = gates.setdefault(path, {})
        pair[proj] = value
        if len(pair) == 2:
            del gates[path]
            yield (
                f"{path}.gate_up_proj_bias",
                _namespace(value).concatenate([pair["gate_proj"], pair["up_proj"]], axis=1),
            )
    if gates:
        raise ValueError(f"{next(iter(gates))}: a gate_proj bias without its up_proj one (or the reverse)")


def _transposed(value: Any) -> Any:
    """[E, in, out] -> [E, out, in], laid out anew (torch views would stay strided)."""
    out = value.swapaxes(1, 2)
    return out.contiguous() if hasattr(out, "contiguous") else out


def _gate_rows_first(value: Any) -> Any:
    """Axis 1 (the projection's outputs) reordered from gate/up interleaved (g0, u0, g1, u1, ...)
    to all gate rows, then all up rows: what `.chunk(2)` and the split gate/up layers take."""
    xp = _namespace(value)
    return xp.concatenate([value[:, 0::2], value[:, 1::2]], axis=1)


def _namespace(value: Any) -> Any:
    """The array library of value: numpy, torch or mlx.core (all have concatenate(axis=))."""
    module = type(value).__module__.split(".")[0]
    if module == "torch":
        import torch

        return torch
    if module == "mlx":
        import mlx.core as mx

        return mx
    import numpy as np

    return np


def dequantize_mxfp4(blocks: Any, scales: Any) -> Any:
    """torch uint8 blocks [..., G, 16] and scales [..., G] -> bfloat16 [..., G * 32], exactly:
    each code is an e2m1 value (microscaled.E2M1_VALUES), low nibble first, times 2 ** (scale - 127); every
    such product fits bfloat16's 8-bit mantissa and exponent. One expert at a time, so the
    temporaries stay small (a 20B layer's gate_up is 32 experts x 5760 x 2880 values)."""
    import torch

    lut = torch.tensor(E2M1_VALUES, dtype=torch.bfloat16)
    blocks, scales = torch.as_tensor(blocks), torch.as_tensor(scales)
    *lead, groups, width = blocks.shape
    out = torch.empty(*lead, groups, 2 * width, dtype=torch.bfloat16)
    for i in range(blocks.shape[0]):
        codes = blocks[i].to(torch.int64)
        values = torch.stack([lut[codes & 0x0F], lut[codes >> 4]], dim=-1).flatten(-2)
        power = torch.exp2(scales[i].to(torch.float32) - 127.0).to(torch.bfloat16)
        out[i] = values * power[..., None]
    return out.reshape(*lead, groups * 2 * width)


def mxfp4_weight(blocks: Any, scales: Any) -> AffineWeight:
    """One expert's MXFP4 matrix (blocks uint8 [rows, G, 16], scales uint8 [rows, G]) as the exact
    shared form of fp4 (module docstring): 16 bytes a group, low nibble first, are MLX's mxfp4 words."""
    blocks, scales = np.asarray(blocks), np.asarray(scales)
    rows, groups, _ = blocks.shape
    words = np.ascontiguousarray(blocks, np.uint8).reshape(rows, groups * 16).view("<u4")
    fp4 = MxWeight("mxfp4", words.astype(np.uint32, copy=False), np.ascontiguousarray(scales, np.uint8), "MXFP4")
    w = checked(fp4, "gpt-oss experts").portable()
    assert isinstance(w, AffineWeight)
    return w
