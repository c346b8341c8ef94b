"""Mamba (state-spaces/mamba-*-hf: model_type mamba) and Falcon-Mamba (tiiuae/falcon-mamba-7b*: falcon_mamba): a
stack of Mamba-1 selective-scan mixers and nothing else (Mamba-2's, model_type mamba2: Nemotron-H's model files with
a Mamba-2 block in every layer, _prepare_mamba2), as transformers' MambaConfig / FalconMambaConfig read
their config.json (defaults included), turned into ModelConfig fields (Mamba1Config).

The maths (transformers' MambaMixer, its torch path): in_proj gives [x | z] (d_inner each); x goes through a causal
depthwise convolution (kernel conv_kernel, bias where use_conv_bias) and SiLU; x_proj(x) gives [dt (rank R) | B | C]
(N each); dt = softplus(dt_proj(dt)) per channel. Per channel c, with A = -exp(A_log) [d_inner, N], each token does

    S_c <- exp(dt_c A_c) * S_c + dt_c x_c B;   y_c = S_c . C + D_c x_c          (S_c: [N])

and the output is out_proj(y * silu(z)). Each layer: x + mixer(RMSNorm(x)); a final RMSNorm (norm_f) and the head,
tied by default. Falcon-Mamba RMS-normalises dt (over R), B and C (over N) without weights (eps mixer_rms_eps)
right after x_proj. Each sequence keeps the convolution's last K-1 inputs and every channel's S: a state slot, as
the Mamba-2 layers (family_mamba2) have. The model has no attention: its K/V pool has no layers, and nothing limits
its context but memory (llama.cpp's converter states 2^20 tokens; so does Lantern).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from lantern.app.models.errors import UnsupportedModelError, refuse

CONTEXT = 1 << 20  # no positions: the context llama.cpp's converter states for these models
SCAN_CHUNK_ELEMENTS = 1 << 22  # a prefill chunk's [T, T, channels, N] decay weights: ~16 MB of float32
MAX_SCAN_CHUNK = 64


def scan_chunk_length(channels: int, state: int) -> int:
    """Tokens per chunk of the backends' chunked scan (backends/*/mamba1.py): T x T x channels x state near
    SCAN_CHUNK_ELEMENTS, between 1 and MAX_SCAN_CHUNK."""
    return max(1, min(MAX_SCAN_CHUNK, math.isqrt(SCAN_CHUNK_ELEMENTS // max(channels * state, 1))))


@dataclass(frozen=True)
class Mamba1Config:
    mamba_layers: tuple[bool, ...]  # per layer: True for a Mamba-1 mixer, False for attention (Jamba)
    inner: int  # d_inner: the channels, each with its own state
    state_size: int  # N
    conv_kernel: int  # K
    dt_rank: int  # R: x_proj's dt part, widened to d_inner by dt_proj
    conv_bias: bool
    proj_bias: bool  # on in_proj and out_proj
    # RMS norms of dt, B and C after x_proj: "none" (Mamba), "weightless" (Falcon-Mamba), "weighted" (Jamba)
    bc_norm: str = "none"
    norm_eps: float = 1e-6
    # Zamba's multi-head mixer: d_inner split into heads, each with its own x_proj and dt_proj (B and C per head)
    heads: int = 1

    def state_elements(self) -> tuple[int, int]:
        """Per Mamba layer and sequence: (convolution window values, SSM state values)."""
        return self.inner * (self.conv_kernel - 1), self.inner * self.state_size

    def attention_layers(self) -> list[int]:
        return [i for i, mamba in enumerate(self.mamba_layers) if not mamba]


# MambaConfig / FalconMambaConfig defaults for the keys a config.json may omit
_DEFAULTS = {"vocab_size": 50280, "hidden_size": 768, "num_hidden_layers": 32, "state_size": 16, "expand": 2}


def prepare(cfg: dict[str, Any]) -> dict[str, Any]:
    """The config in the keys ModelConfig.from_hf reads; a mixer-only model states no heads (one placeholder head,
    which no layer reads) and no context (CONTEXT)."""
    if cfg.get("model_type") == "mamba2":
        return _prepare_mamba2(cfg)
    out = {**_DEFAULTS, **cfg}
    hidden = out["hidden_size"]
    return {
        **out,
        # (MambaConfig / FalconMambaConfig keep a stated intermediate_size: falcon-mamba-7b's 8192 beside expand 16)
        "intermediate_size": int(out.get("intermediate_size") or out["expand"] * hidden),
        "num_attention_heads": 1,
        "num_key_value_heads": 1,
        "head_dim": 2,
        "max_position_embeddings": CONTEXT,
        "rms_norm_eps": out.get("layer_norm_epsilon", 1e-5),
        "tie_word_embeddings": out.get("tie_word_embeddings", True),
    }


# Mamba2Config's defaults, under the Nemotron-H names family_nemotron_h's mixer reader takes
_MAMBA2 = {"vocab_size": 32768, "hidden_size": 4096, "num_hidden_layers": 64, "expand": 2}
_MAMBA2_KEYS = {"num_heads": ("mamba_num_heads", 128), "head_dim": ("mamba_head_dim", 64)}
_MAMBA2_KEYS["state_size"] = ("ssm_state_size", 128)


def _prepare_mamba2(cfg: dict[str, Any]) -> dict[str, Any]:
    """Mamba-2 (Mamba2ForCausalLM: Mamba-Codestral, mamba2-*): its mixer keys under Nemotron-H's names (head_dim is
    the SSM heads' there, not attention's), every layer a Mamba-2 block."""
    out = {**_MAMBA2, **cfg}
    for key, (name, default) in _MAMBA2_KEYS.items():
        out[name] = cfg.get(key, default)
    out["hybrid_override_pattern"] = "M" * out["num_hidden_layers"]
    return {
        **out,
        "intermediate_size": int(out["expand"] * out["hidden_size"]),
        "num_attention_heads": 1,
        "num_key_value_heads": 1,
        "head_dim": 2,
        "max_position_embeddings": CONTEXT,
        "rms_norm_eps": out.get("layer_norm_epsilon", 1e-5),
    }


def configure(model_type: str, cfg: dict[str, Any], fields: dict[str, Any]) -> dict[str, Any]:
    """ModelConfig field overrides; refuses, naming the key, what Lantern does not compute."""
    if model_type == "mamba2":
        return _configure_mamba2(cfg, fields)
    if model_type not in ("mamba", "falcon_mamba"):
        raise UnsupportedModelError(f"family_mamba does not configure model_type {model_type!r}")
    if cfg.get("hidden_act", "silu") not in ("silu", "swish"):
        raise refuse("hidden_act", cfg["hidden_act"], " (the convolution's activation is SiLU in Lantern)")
    layers = fields["num_layers"]
    return {
        "mamba1": mixer_config(cfg, (True,) * layers, "weightless" if model_type == "falcon_mamba" else "none"),
        "rope_scaling": None,
    }


def _configure_mamba2(cfg: dict[str, Any], fields: dict[str, Any]) -> dict[str, Any]:
    """Nemotron-H's model files with an M (Mamba-2 block: x + mixer(RMSNorm(x))) in every layer: the mixer's gated
    RMSNorm over n_groups groups, eps layer_norm_epsilon as the blocks' norms."""
    from lantern.app.models.family_nemotron_h import mamba2_mixer

    if cfg.get("hidden_act", "silu") not in ("silu", "swish"):
        raise refuse("hidden_act", cfg["hidden_act"], " (the convolution's activation is SiLU in Lantern)")
    # (the gated RMSNorm of y * silu(z), as Mamba2Mixer computes it; configs that state otherwise are refused)
    for key, want in (("rms_norm", True), ("norm_before_gate", False)):
        if cfg.get(key, want) != want:
            raise refuse(key, cfg[key], " (Mamba2Mixer's norm is RMSNorm(y * silu(z)))")
    mixer = mamba2_mixer(cfg, "M" * fields["num_layers"], float(cfg.get("layer_norm_epsilon", 1e-5)))
    if mixer.inner != fields["intermediate_size"]:  # (Mamba2Mixer's in_proj is expand x hidden wide)
        raise refuse("num_heads", cfg.get("num_heads"), f" x head_dim is not expand x hidden_size ({mixer.inner})")
    return {
        "rms_norm_eps": mixer.norm_eps,
        "rope_layers": (False,) * fields["num_layers"],
        "rope_scaling": None,
        "mamba": mixer,
        "moe": None,
    }


# The mixer's config keys: Mamba's / Falcon-Mamba's, and Jamba's mamba_* names for the same sizes
_MIXER_KEYS = {
    "state": ("state_size", "mamba_d_state"),
    "conv": ("conv_kernel", "mamba_d_conv"),
    "rank": ("time_step_rank", "mamba_dt_rank"),
    "conv_bias": ("use_conv_bias", "mamba_conv_bias"),
    "proj_bias": ("use_bias", "mamba_proj_bias"),
}


def mixer_config(cfg: dict[str, Any], layers: tuple[bool, ...], bc_norm: str, eps_key: str = "mixer_rms_eps"):
    """The Mamba-1 mixers' sizes as the config states them (Mamba's keys, or Jamba's mamba_* keys)."""
    hidden = cfg["hidden_size"]
    jamba = cfg.get("model_type") == "jamba"
    key = {what: names[jamba] for what, names in _MIXER_KEYS.items()}
    # (Mamba's width: prepare's intermediate_size, a stated one or expand x hidden)
    inner = int(cfg.get("mamba_expand", 2) * hidden) if jamba else int(cfg["intermediate_size"])
    rank = cfg.get(key["rank"], "auto")
    return Mamba1Config(
        mamba_layers=layers,
        inner=inner,
        state_size=int(cfg.get(key["state"], 16)),
        conv_kernel=int(cfg.get(key["conv"], 4)),
        dt_rank=math.ceil(hidden / 16) if rank == "auto" else int(rank),
        conv_bias=bool(cfg.get(key["conv_bias"], True)),
        proj_bias=bool(cfg.get(key["proj_bias"], False)),
        bc_norm=bc_norm,
        norm_eps=float(cfg.get(eps_key, 1e-6)),
    )


def checkpoint_name(name: str) -> str | None:
    """A Mamba / Falcon-Mamba checkpoint's tensor under the model files' name (backbone.* as model.*, each block's
    norm as input_layernorm, its mixer as mamba)."""
    if name.startswith("backbone."):
        name = "model." + name.removeprefix("backbone.")
    if name.startswith("model.embeddings."):
        return "model.embed_tokens." + name.removeprefix("model.embeddings.")
    if name.startswith("model.norm_f."):
        return "model.norm." + name.removeprefix("model.norm_f.")
    parts = name.split(".")
    if len(parts) > 4 and parts[:2] == ["model", "layers"]:
        if parts[3] == "norm":
            parts[3] = "input_layernorm"
        elif parts[3] == "mixer":
            parts[3] = "mamba"
        return ".".join(parts)
    return name


def checkpoint_tensors(source: Iterator[tuple[str, Any]]) -> Iterator[tuple[str, Any]]:
    """A folder's Mamba-1 convolution kernels as [C, 1, K]: mlx_lm saves them [C, K, 1] (its Conv1d layout)."""
    for name, value in source:
        if name.endswith(".mamba.conv1d.weight") and value.shape[-1] == 1 and value.shape[1] != 1:
            value = value.swapaxes(1, 2) if hasattr(value, "swapaxes") else value.transpose(1, 2)
        yield name, value


def gguf_tensors(source: Iterator[tuple[str, Any]]) -> Iterator[tuple[str, Any]]:
    """llama.cpp's Mamba-1 tensors (its MambaModel) as the checkpoint held them: A_log back from ssm_a = -exp(A_log),
    the convolution's squeezed [C, K] kernel as [C, 1, K]. The converter writes these in F32."""
    import numpy as np

    for name, value in source:
        if name.endswith(".mamba.A_log"):
            value = np.log(-np.asarray(value, dtype=np.float32))
        elif name.endswith(".mamba.conv1d.weight") and len(value.shape) == 2:
            value = np.asarray(value)[:, None, :]
        yield name, value
