"""A GGUF file's rope scaling as the config.json rope_scaling it was converted from.

llama.cpp's converter states it two ways. rope.scaling.* keys (linear, YaRN: TextModel.
set_gguf_parameters) are read by `stated_rope_scaling`. A Llama 3.1 / 3.2 checkpoint's
`rope_scaling {rope_type: llama3, ...}` is written as no key at all but a tensor, rope_freqs.weight
(LlamaModel.generate_extra_tensors): F32 [rope dims / 2], each frequency's divisor of theta's
inverse frequency (1 above the high-frequency band edge, `factor` below the low one, a smooth ramp
between). transformers' GGUF reader drops it; `rope_freqs_scaling` maps it back to the llama3 keys
exactly or refuses the file naming the tensor.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from lantern.app.models.spec import UnsupportedModelError

if TYPE_CHECKING:
    from lantern.app.models.gguf_config import _Meta

ROPE_FREQS = "rope_freqs.weight"
# Where the converter writes rope_freqs for a llama3 rope and Lantern's config is Llama's
# (Mistral and Mixtral files are "llama" too). Other converters write it with other meanings
# (Gemma 4's 1e30 for unrotated dims, Step3): refused.
# (EXAONE's, Llama 4's, Apertus's, Deci's and Nanbeige's converters write the llama3 rope as llama's does)
_LLAMA3_ARCHS = ("llama", "exaone", "exaone4", "exaone-moe", "llama4", "apertus", "deci", "nanbeige")
# The converter writes no key for original_max_position_embeddings. llama3's divisors depend on
# it only through low/high_freq_factor's ratios to it (band edges original / factor, ramp
# original / wavelength), so Llama 3's 8192 (the converter's default too) is taken and the two
# factors are solved against it: a file converted from another original length gets the factors
# that give the same divisors.
_ORIGINAL_CONTEXT = 8192
_REL = 1e-5  # the tensor is float32; transformers' divisors must equal it to this relative error


# rope.scaling.* -> rope_scaling's key, for what the converter copies from config.json as stated.
_YARN_KEYS = {"yarn_beta_fast": "beta_fast", "yarn_beta_slow": "beta_slow", "yarn_attn_factor": "attention_factor"}


# llama.cpp architectures converted by its DeepseekV2Model (latent attention, DeepSeek's YaRN keys)
MLA_ARCHITECTURES = ("deepseek2", "deepseek32", "glm-dsa", "mistral4")


def stated_rope_scaling(meta: _Meta) -> dict[str, Any] | None:
    """rope.scaling.* as config.json's rope_scaling (linear, YaRN; other types are passed on for
    ModelConfig to accept or refuse; Phi-3 reads its own). llama.cpp's converter copies config.json's
    beta_fast / _slow, attention_factor and extrapolation_factor as stated (TextModel.set_gguf_parameters;
    its runtime reads them for few architectures, transformers and Lantern compute the checkpoint
    with them); an extrapolation factor other than 1 is refused (transformers has none).
    yarn_log_multiplier is DeepSeek's 0.1 * mscale_all_dim, elsewhere llama.cpp's mscale_all_dim
    against an mscale of 1 (transformers' ratio of the two). attn_factor: see _attn_factor."""
    kind, factor = meta.get("rope.scaling.type"), meta.get("rope.scaling.factor")
    plain = kind in (None, "none") or (kind == "linear" and factor in (None, 1.0))
    out: dict[str, Any] = {"rope_type": str(kind), "factor": float(factor) if factor is not None else None}
    if kind != "yarn":
        _attn_factor(meta, None)
        return None if plain else {k: v for k, v in out.items() if v is not None}
    original = meta.get("rope.scaling.original_context_length")
    out["original_max_position_embeddings"] = int(original) if original is not None else None
    stated = {hf: meta.get(f"rope.scaling.{key}") for key, hf in _YARN_KEYS.items()}
    out.update({hf: float(v) for hf, v in stated.items() if v is not None})
    ext = meta.get("rope.scaling.yarn_ext_factor")
    if ext is not None and float(ext) != 1.0:
        raise UnsupportedModelError(
            f"{meta.label}{meta.arch}.rope.scaling.yarn_ext_factor={float(ext)} is not implemented "
            "(YaRN's extrapolation mix is 1, as in transformers)"
        )
    log_mul = meta.get("rope.scaling.yarn_log_multiplier")
    if log_mul and meta.arch in MLA_ARCHITECTURES:
        # 0.1 * mscale_all_dim; llama.cpp takes mscale == mscale_all_dim, as DeepSeek configs state them
        mscale = round(float(log_mul) / 0.1, 6)
        out.update(mscale=mscale, mscale_all_dim=mscale)
    elif log_mul:
        out.update(mscale=1.0, mscale_all_dim=float(log_mul))
    rope = {k: v for k, v in out.items() if v is not None}
    _attn_factor(meta, rope)
    return rope


def _attn_factor(meta: _Meta, yarn: dict[str, Any] | None) -> None:
    """Fold llama.cpp's rope.scaling.attn_factor (its runtime multiplies the rope's own scale by it)
    into YaRN's attention_factor, or refuse it: without YaRN (HF scales no other rope), beside a
    yarn_attn_factor (which llama.cpp does not read: the two disagree), for DeepSeek (llama.cpp
    scales its softmax by it too)."""
    value = meta.get("rope.scaling.attn_factor")
    if value is None or float(value) == 1.0:
        return
    why = "without YaRN (transformers scales no other rope)" if yarn is None else ""
    if yarn and "attention_factor" in yarn:
        why = f"beside {meta.arch}.rope.scaling.yarn_attn_factor (llama.cpp and transformers disagree)"
    elif yarn and meta.arch in MLA_ARCHITECTURES:
        why = "for DeepSeek (llama.cpp scales the attention softmax by it too)"
    if why:
        key = f"{meta.arch}.rope.scaling.attn_factor={float(value)}"
        raise UnsupportedModelError(f"{meta.label}{key} is not implemented {why}")
    yarn["attention_factor"] = _yarn_scale(yarn) * float(value)


def _yarn_scale(yarn: dict[str, Any]) -> float:
    """YaRN's cos / sin scale without a stated attention_factor (transformers' and llama.cpp's)."""
    factor, m, m_all = float(yarn.get("factor") or 1.0), yarn.get("mscale"), yarn.get("mscale_all_dim")

    def get_mscale(x: float) -> float:
        return 0.1 * x * math.log(factor) + 1.0 if factor > 1 else 1.0

    return get_mscale(m) / get_mscale(m_all) if m and m_all else get_mscale(1.0)


def rope_freqs_scaling(meta: _Meta, tensors: dict[str, Any], stated: dict[str, Any] | None) -> dict[str, Any] | None:
    """The rope_scaling of a file: `stated` (from rope.scaling.*) when it has no rope_freqs tensor;
    otherwise llama3's keys recovered from the tensor, or None when every divisor is 1 (plain rope).
    Recovery: factor is the largest divisor, low/high_freq_factor are solved from the ramp (or the
    band edges when the ramp has too few frequencies to fix them), and the result is accepted only
    if transformers' own llama3 initialiser gives back the tensor (relative 1e-5). Anything else is
    refused in one line naming the tensor."""
    t = tensors.get(ROPE_FREQS)
    if t is None:
        return stated
    where = f"{meta.label}tensor {ROPE_FREQS} (per-frequency rope divisors)"
    if meta.arch not in _LLAMA3_ARCHS:
        raise UnsupportedModelError(f"{where} is not implemented for architecture {meta.arch}")
    if stated:
        raise UnsupportedModelError(
            f"{where} beside {meta.arch}.rope.scaling.type={stated['rope_type']} is not implemented "
            "(llama.cpp applies both)"
        )
    if getattr(t.tensor_type, "name", "") != "F32":  # what the converter writes; F16 could not meet _REL
        raise UnsupportedModelError(
            f"{where} of type {getattr(t.tensor_type, 'name', t.tensor_type)} is not implemented (F32 only)"
        )
    divisors = np.asarray(t.data, dtype=np.float32).reshape(-1).astype(np.float64)
    head_dim = int(meta.get("attention.key_length") or 0)
    head_dim = head_dim or int(meta.need("embedding_length")) // int(meta.scalar("attention.head_count"))
    dims = int(meta.get("rope.dimension_count") or head_dim)
    return llama3_from_divisors(divisors, float(meta.get("rope.freq_base", 10000.0)), dims, where)


def llama3_from_divisors(divisors: np.ndarray, theta: float, dims: int, where: str) -> dict[str, Any] | None:
    """The llama3 (or linear) rope_scaling whose per-frequency divisors over a `dims`-wide rope of base `theta` are
    `divisors`; None when every one is 1; refused naming `where` when none gives them back."""
    if divisors.size * 2 != dims or not np.all(np.isfinite(divisors)) or np.any(divisors <= 0):
        raise UnsupportedModelError(
            f"{where} is not implemented: it holds {divisors.size} values, not a positive divisor for "
            f"each of the {dims // 2} rope frequencies"
        )
    if np.all(divisors == 1.0):
        return None
    for scaling in _candidates(divisors, theta, dims):
        if np.allclose(_divisors(scaling, theta, dims), divisors, rtol=_REL, atol=0.0):
            return scaling
    raise UnsupportedModelError(
        f"{where} is not implemented: its values are no llama3 rope scaling (factor, low/high_freq_factor "
        f"against original_max_position_embeddings {_ORIGINAL_CONTEXT}) of rope base {theta:g}"
    )


def _candidates(divisors: np.ndarray, theta: float, dims: int) -> Iterator[dict[str, Any]]:
    """llama3 scalings that may give `divisors`, the likeliest (shortest decimals) first.

    On the ramp, 1 / divisor = (1 - s) / factor + s with s = (original / wavelength - low) /
    (high - low): s is affine in original / wavelength, so two ramp frequencies fix low and high
    (a least-squares line through all of them). One ramp frequency fixes one of the two: Meta's
    low 1 or high 4 is taken for the other. With none, every pair of edges inside the gap between
    the last unscaled and the first fully scaled frequency gives the same divisors."""
    factor = float(str(np.float32(divisors.max())))  # float32's shortest decimal: 8.0, not 8.000000xx
    if factor <= 1.0:
        return
    if np.allclose(divisors, factor, rtol=_REL, atol=0.0):
        # every frequency divided alike: linear scaling's maths exactly
        yield {"rope_type": "linear", "factor": factor}
        return
    wavelen = 2 * math.pi / _inv_freq(theta, dims)
    high = np.isclose(divisors, 1.0, rtol=_REL, atol=0.0)
    low = np.isclose(divisors, factor, rtol=_REL, atol=0.0)
    ramp = ~(high | low)
    x = _ORIGINAL_CONTEXT / wavelen[ramp]
    s = (1.0 / divisors[ramp] - 1.0 / factor) / (1.0 - 1.0 / factor)
    pairs: list[tuple[float, float]] = []
    if ramp.sum() >= 2:
        slope, lo = np.polyfit(s, x, 1)
        pairs.append((float(lo), float(lo + slope)))
    elif ramp.sum() == 1 and 0.0 < s[0] < 1.0:
        pairs += [(1.0, 1.0 + (x[0] - 1.0) / s[0]), ((x[0] - 4.0 * s[0]) / (1.0 - s[0]), 4.0)]
    elif ramp.sum() == 0:
        pairs.append((1.0, 4.0))
        if high.any() and low.any():
            w_a, w_b = wavelen[high].max(), wavelen[low].min()
            pairs.append(
                (
                    _ORIGINAL_CONTEXT / (w_a ** (1 / 3) * w_b ** (2 / 3)),
                    _ORIGINAL_CONTEXT / (w_a ** (2 / 3) * w_b ** (1 / 3)),
                )
            )
    for lo, hi in pairs:
        for digits in (0, 1, 2, 3, 4, 5, 6, None):
            lo_r, hi_r = (lo, hi) if digits is None else (round(lo, digits), round(hi, digits))
            if 0.0 < lo_r < hi_r and math.isfinite(hi_r):
                yield {
                    "rope_type": "llama3",
                    "factor": factor,
                    "low_freq_factor": float(lo_r),
                    "high_freq_factor": float(hi_r),
                    "original_max_position_embeddings": _ORIGINAL_CONTEXT,
                }


def _inv_freq(theta: float, dims: int) -> np.ndarray:
    """Plain rope's inverse frequencies in float32, as the converter and transformers compute them."""
    return (1.0 / (np.float32(theta) ** (np.arange(0, dims, 2).astype(np.float32) / np.float32(dims)))).astype(
        np.float32
    )


def _divisors(scaling: dict[str, Any], theta: float, dims: int) -> np.ndarray:
    """Plain over scaled inverse frequencies, from transformers' own initialiser (torch is optional
    with the MLX backend: without it, `_numpy_divisors`, the same float32 arithmetic)."""
    if scaling["rope_type"] == "linear":
        return np.full(dims // 2, scaling["factor"], dtype=np.float64)
    try:
        import torch
        from transformers import LlamaConfig
        from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    except ImportError:
        return _numpy_divisors(scaling, theta, dims)
    original = scaling["original_max_position_embeddings"]
    config = LlamaConfig(
        hidden_size=dims,
        num_attention_heads=1,
        head_dim=dims,
        max_position_embeddings=2 * original,  # longer than the original, as the initialiser expects
        rope_parameters={**scaling, "rope_theta": theta},
    )
    scaled, _ = ROPE_INIT_FUNCTIONS["llama3"](config, torch.device("cpu"))
    plain = 1.0 / (theta ** (torch.arange(0, dims, 2, dtype=torch.int64).to(dtype=torch.float) / dims))
    return (plain / scaled).double().numpy()


def _numpy_divisors(scaling: dict[str, Any], theta: float, dims: int) -> np.ndarray:
    """transformers' _compute_llama3_parameters in numpy float32 (its band tests and ramp)."""
    inv = _inv_freq(theta, dims)
    factor, lo, hi = (np.float32(scaling[k]) for k in ("factor", "low_freq_factor", "high_freq_factor"))
    original = np.float32(scaling["original_max_position_embeddings"])
    wavelen = np.float32(2 * math.pi) / inv
    scaled = np.where(wavelen > original / lo, inv / factor, inv)
    smooth = (original / wavelen - lo) / (hi - lo)
    ramp = ~(wavelen < original / hi) & ~(wavelen > original / lo)
    scaled = np.where(ramp, (1 - smooth) * scaled / factor + smooth * scaled, scaled)
    return (inv / scaled.astype(np.float32)).astype(np.float64)


def longrope_tensors(meta: _Meta, tensors: dict[str, Any], cfg: dict[str, Any]) -> dict[str, Any] | None:
    """LongRoPE as MiniCPM's converters write it (MiniCPMModel, MiniCPM3Model): the factors as two tensors,
    rope_factors_long / _short, beside (MiniCPM's) or without (MiniCPM3's) rope.scaling.type longrope, and the
    trained context as the pretraining length (llama.cpp's n_ctx_orig: the short factors unless a context past it
    is served; the attention factor then 1, as transformers computes it for that ratio). None without the tensors."""
    if meta.get("rope.scaling.original_context_length") is not None:  # (llama.cpp's switch to the long factors)
        raise UnsupportedModelError(f"{meta.label}{meta.arch}.rope.scaling.original_context_length is not implemented")
    stated = meta.get("rope.scaling.type")
    if stated not in (None, "none", "longrope"):
        raise UnsupportedModelError(f"{meta.label}{meta.arch}.rope.scaling.type={stated} is not implemented here")
    long, short = tensors.get("rope_factors_long.weight"), tensors.get("rope_factors_short.weight")
    if (long is None) != (short is None) or (long is None and stated == "longrope"):
        raise UnsupportedModelError(f"{meta.label}LongRoPE needs both rope_factors_long and rope_factors_short")
    if long is None:
        return None
    _attn_factor(meta, None)
    return {
        "type": "longrope",
        "long_factor": [float(x) for x in np.asarray(long.data, dtype=np.float32)],
        "short_factor": [float(x) for x in np.asarray(short.data, dtype=np.float32)],
        "original_max_position_embeddings": cfg["max_position_embeddings"],
    }
