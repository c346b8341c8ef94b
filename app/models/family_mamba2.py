"""Mamba-2 mixer layers (state-space duality, SSD) as hybrid models place them among attention layers:
IBM's Granite 4.0-H (model_type "granitemoehybrid"), NVIDIA's Nemotron-H (family_nemotron_h) and TII's Falcon-H1
(family_falcon_h1: the mixer beside attention in every layer), whose configs name its sizes their own way.

The maths (transformers' GraniteMoeHybridMambaLayer, the torch path that runs without the mamba_ssm
kernels): in_proj gives [z (d_inner) | xBC (d_inner + 2 G N) | dt (H)]; xBC goes through a causal
depthwise convolution (kernel conv_kernel, bias) and SiLU, then splits into x [H, P], B and C [G, N]
(head h reads group h // (H / G)). Per head, with A = -exp(A_log) and dt = softplus(dt + dt_bias)
clamped to dt_limit, each token does

    S <- exp(dt A) S + dt x B^T;  y = S C + D x          (S: [P, N] per head)

and the output is out_proj(RMSNorm_G(y * silu(z))), the norm taken over each of the G groups of
d_inner / G channels (its weight spans d_inner). Falcon-H1 may norm before the gate, RMSNorm_G(y) * silu(z),
or not at all, y * silu(z) (`norm`), and scales in_proj's five parts by its μP multipliers (`in_multipliers`).
Each sequence keeps the convolution's last K-1 inputs and every head's S: a state slot, as the gated DeltaNet
layers (family_qwen3_next) have.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from lantern.app.models.errors import refuse


@dataclass(frozen=True)
class Mamba2Config:
    mamba_layers: tuple[bool, ...]  # per layer: True for a Mamba-2 mixer, False for attention
    num_heads: int  # H
    head_dim: int  # P
    state_size: int  # N
    groups: int  # G: heads share B and C in groups
    conv_kernel: int  # K
    conv_bias: bool
    proj_bias: bool  # on in_proj and out_proj
    dt_limit: tuple[float, float]  # dt clamped to this range in the chunked form (transformers' time_step_limit)
    norm_eps: float
    # Nemotron-H's layers, one letter each: M a mixer, * attention, - an MLP, E experts (its pattern's letters,
    # family_nemotron_h); empty: Granite's, each layer a mixer or attention, then an MLP.
    layer_kinds: str = ""
    # Falcon-H1: every layer holds attention beside its mixer (all layers keep K/V and a state).
    parallel: bool = False
    # The output's gated norm: "gated" RMSNorm_G(y * silu(z)); "before_gate" RMSNorm_G(y) * silu(z); "none"
    # y * silu(z) (no norm weight).
    norm: str = "gated"
    # Falcon-H1's μP multipliers of in_proj's parts (z, x, B, C, dt), ssm_in_multiplier included; None: all 1.
    in_multipliers: tuple[float, float, float, float, float] | None = None

    @property
    def inner(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def conv_dim(self) -> int:
        return self.inner + 2 * self.groups * self.state_size

    def state_elements(self) -> tuple[int, int]:
        """Per Mamba layer and sequence: (convolution window values, SSM state values)."""
        return self.conv_dim * (self.conv_kernel - 1), self.num_heads * self.head_dim * self.state_size

    def in_spans(self) -> list[tuple[int, int, float]]:
        """(start, end, multiplier) of in_proj's output parts z, x, B, C, dt whose μP multiplier is not 1."""
        bc = self.groups * self.state_size
        spans, start = [], 0
        for width, value in zip((self.inner, self.inner, bc, bc, self.num_heads), self.in_multipliers or (1.0,) * 5):
            if value != 1.0:
                spans.append((start, start + width, value))
            start += width
        return spans

    def attention_layers(self) -> list[int]:
        if self.parallel:
            return list(range(len(self.mamba_layers)))
        if self.layer_kinds:
            return [i for i, kind in enumerate(self.layer_kinds) if kind == "*"]
        return [i for i, mamba in enumerate(self.mamba_layers) if not mamba]


_MAMBA_TYPES = ("mamba", "linear_attention")  # released configs / transformers 5's saved name
_ATTENTION_TYPES = ("attention", "full_attention")


def _json_float(value: Any) -> float:
    """A float from config.json: transformers 5 writes infinity as {"__float__": "Infinity"}."""
    if isinstance(value, dict) and "__float__" in value:
        value = value["__float__"]
    return float(value)


def granite_mamba(cfg: dict[str, Any], layers: int, hidden: int) -> Mamba2Config:
    """Granite 4.0-H's Mamba-2 sizes from its config.json (GraniteMoeHybridConfig's keys and defaults)."""
    types = cfg.get("layer_types") or cfg.get("layers_block_type") or ["mamba"] * layers
    if len(types) != layers or any(t not in (*_MAMBA_TYPES, *_ATTENTION_TYPES) for t in types):
        raise refuse("layer_types", types, f" (mamba or attention for each of the {layers} layers)")
    return mixer_config(cfg, hidden, tuple(t in _MAMBA_TYPES for t in types))


def mixer_config(cfg: dict[str, Any], hidden: int, mamba_layers: tuple[bool, ...], **extra: Any) -> Mamba2Config:
    """The mixer's sizes from the mamba_* keys Granite 4.0-H and Falcon-H1 share (their config classes' defaults
    agree); Falcon-H1's mamba_d_ssm states the mixer's width where Granite's is mamba_expand x hidden_size."""
    heads = int(cfg.get("mamba_n_heads", 128))
    inner = cfg.get("mamba_d_ssm")
    width_key = "mamba_d_ssm" if inner is not None else f"mamba_expand x {hidden}"
    inner = int(inner) if inner is not None else int(float(cfg.get("mamba_expand", 2)) * hidden)  # (as transformers)
    head_dim = cfg.get("mamba_d_head", "auto")
    head_dim = inner // heads if head_dim in (None, "auto") else int(head_dim)
    if heads * head_dim != inner:
        raise refuse("mamba_d_head", head_dim, f" (mamba_n_heads x mamba_d_head must be {width_key})")
    groups = int(cfg.get("mamba_n_groups", 1))
    if groups < 1 or heads % groups:
        raise refuse("mamba_n_groups", groups, f" (must divide the {heads} heads)")
    limit = [_json_float(v) for v in cfg.get("time_step_limit") or (0.0, math.inf)]
    out = Mamba2Config(
        mamba_layers=mamba_layers,
        num_heads=heads,
        head_dim=head_dim,
        state_size=int(cfg.get("mamba_d_state", 256)),
        groups=groups,
        conv_kernel=int(cfg.get("mamba_d_conv", 4)),
        conv_bias=bool(cfg.get("mamba_conv_bias", True)),
        proj_bias=bool(cfg.get("mamba_proj_bias", False)),
        dt_limit=(limit[0], limit[1]),
        norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        **extra,
    )
    if out.conv_kernel < 2:
        raise refuse("mamba_d_conv", out.conv_kernel, " (must be at least 2)")
    if cfg.get("hidden_act", "silu") != "silu":
        raise refuse("hidden_act", cfg.get("hidden_act"), " for a Mamba-2 hybrid (SiLU)")
    return out


# ---- stored layouts ------------------------------------------------------------------------------------
# The mixer's tensors as the model files load them (transformers' names and shapes): conv1d.weight
# [C, 1, K], A_log / D / dt_bias [H], norm.weight [inner].
def checkpoint_tensors(source: Iterator[tuple[str, Any]]) -> Iterator[tuple[str, Any]]:
    """An mlx_lm folder's convolution kernel [C, K, 1] (MLX's Conv1d layout) as the checkpoint's [C, 1, K];
    other tensors and layouts pass as they are."""
    for name, value in source:
        if name.endswith(".mamba.conv1d.weight") and len(value.shape) == 3 and value.shape[-1] == 1:
            value = value.swapaxes(1, 2)
        yield name, value


def gguf_tensors(source: Iterator[tuple[str, Any]]) -> Iterator[tuple[str, Any]]:
    """llama.cpp's Mamba-2 tensors (convert_hf_to_gguf's Mamba2Model) as the checkpoint held them: A_log
    back from ssm_a = -exp(A_log) stored [H, 1], D from [H, 1], the group norm's weight from [G, inner / G],
    the convolution's squeezed [C, K] kernel as [C, 1, K]. The converter writes these in F32."""
    import numpy as np

    for name, value in source:
        if name.endswith(".mamba.A_log"):
            value = np.log(-np.asarray(value, dtype=np.float32).reshape(-1))
        elif name.endswith((".mamba.D", ".mamba.norm.weight")):
            value = np.asarray(value).reshape(-1)
        elif name.endswith(".mamba.conv1d.weight") and len(value.shape) == 2:
            value = np.asarray(value)[:, None, :]
        yield name, value
