"""RWKV-7 "Goose" (fla-hub/rwkv7-* and RWKV's G1 releases in flash-linear-attention's layout: model_type rwkv7, no
transformers class), its config.json turned into ModelConfig fields (Rwkv7Config). mlx_lm's rwkv7 model is the
reference the tests hold it to.

The maths, per layer (layer 0 first LayerNorms its input, pre_norm): a time mix under attn_norm and a channel mix
under ffn_norm, each added to the residual. Both mix each token's input x with the previous token's (x_prev; the
first token of a sequence sees zeros): xx = x_prev - x, and per projection x_* = x + xx * mu_* (mu: x_r, x_w, x_k,
x_v, x_a, x_g). With H heads of size Dh:

    r, k, v = r_proj(x_r), k_proj(x_k), v_proj(x_v);  iclr = sigmoid(a_lora(x_a));  g = g_lora(x_g)  (sigmoid inside)
    v <- v + (v_first - v) * sigmoid(v_lora(x_v))     (layers after 0; v_first: layer 0's v of the same token)
    w = exp(-e^-0.5 * sigmoid(w_lora(x_w)))           (the decay, in float32; w_lora: tanh between its two maps)
    kk = l2norm_per_head(k * k_k);  k <- k * (1 + (iclr - 1) * k_a);  a = -kk;  b = kk * iclr

and per head a state S [Dh (values), Dh (keys)] carried from token to token:

    S <- S diag(w) + (S a) b^T + v k^T;    y = S r

then y is LayerNormed per head (g_norm, eps head_dim x norm_eps), y += (r . (k * r_k))_head * v, and o_proj(y * g)
leaves the time mix. The channel mix: value(relu(key(x_k))^2) with its own token shift (mu x_k). A final LayerNorm
and the head. Each sequence keeps, per layer, both mixes' last input and S: a state slot, as Mamba's layers have.
No attention and no positions: the K/V pool has no layers and nothing but memory limits the context.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from lantern.app.models.errors import UnsupportedModelError, refuse
from lantern.app.models.family_mamba import CONTEXT

# flash-linear-attention's RWKV7Config defaults for the keys a config.json may omit
_DEFAULTS = {
    "head_dim": 64,
    "decay_low_rank_dim": 64,
    "gate_low_rank_dim": 128,
    "a_low_rank_dim": 64,
    "v_low_rank_dim": 16,
    "hidden_ratio": 4.0,
    "norm_eps": 1e-5,
    "vocab_size": 32000,
    "tie_word_embeddings": False,
}


@dataclass(frozen=True)
class Rwkv7Config:
    heads: int
    head_dim: int
    decay_rank: int  # w_lora's
    gate_rank: int  # g_lora's
    a_rank: int  # a_lora's
    v_rank: int  # v_lora's (layers after the first)
    norm_eps: float  # the LayerNorms'

    @property
    def group_norm_eps(self) -> float:
        """g_norm's: head_dim x norm_eps, as flash-linear-attention's GroupNorm takes it (64e-5 in every released
        model, the constant mlx_lm's and llama.cpp's graphs use)."""
        return self.head_dim * self.norm_eps

    def state_elements(self, hidden: int) -> tuple[int, int]:
        """Per layer and sequence: (token-shift values of both mixes, wkv state values: float32)."""
        return 2 * hidden, self.heads * self.head_dim * self.head_dim

    def attention_layers(self) -> list[int]:
        return []


def prepare(cfg: dict[str, Any]) -> dict[str, Any]:
    """The config in the keys ModelConfig.from_hf reads: heads of head_dim (attention's placeholders: no layer
    attends), intermediate_size as RWKV7Config derives it, no context limit (CONTEXT)."""
    out = {**_DEFAULTS, **{k: v for k, v in cfg.items() if v is not None}}
    hidden, head_dim = out["hidden_size"], out["head_dim"]
    heads = out.get("num_heads") or hidden // head_dim
    if heads * head_dim != hidden:
        raise refuse("head_dim", head_dim, f" ({heads} heads of it must make hidden_size {hidden})")
    if not out.get("intermediate_size"):  # (RWKV7Config: hidden_ratio x hidden_size, up to a multiple of 32)
        width = int(hidden * out["hidden_ratio"])
        out["intermediate_size"] = 32 * ((width + 31) // 32)
    return {
        **out,
        "num_attention_heads": heads,
        "num_key_value_heads": heads,
        "max_position_embeddings": CONTEXT,
        "rms_norm_eps": out["norm_eps"],
    }


# keys whose other values change maths Lantern computes one way: (key, what flash-linear-attention's RWKV-7 does)
_FIXED = (
    ("hidden_act", "sqrelu"),
    ("norm_first", True),
    ("norm_bias", True),
)


def configure(model_type: str, cfg: dict[str, Any], fields: dict[str, Any]) -> dict[str, Any]:
    """ModelConfig field overrides for an rwkv7 config.json; refuses, naming the key, what it does not compute."""
    if model_type != "rwkv7":
        raise UnsupportedModelError(f"family_rwkv7 does not configure model_type {model_type!r}")
    for key, value in _FIXED:
        if cfg.get(key, value) != value:
            raise refuse(key, cfg[key], f" (RWKV-7's {key} is {value!r})")
    value_dim = cfg.get("value_dim")  # (newer flash-linear-attention configs state one per layer)
    if value_dim is not None and set(value_dim if isinstance(value_dim, list) else [value_dim]) != {
        fields["hidden_size"]
    }:
        raise refuse("value_dim", value_dim, " (values as wide as the hidden size only)")
    if cfg.get("attn") is not None:  # (flash-linear-attention's hybrids: softmax attention in some layers)
        raise refuse("attn", cfg["attn"], " (RWKV-7 layers only)")
    rwkv = Rwkv7Config(
        heads=fields["num_heads"],
        head_dim=fields["head_dim"],
        decay_rank=int(cfg["decay_low_rank_dim"]),
        gate_rank=int(cfg["gate_low_rank_dim"]),
        a_rank=int(cfg["a_low_rank_dim"]),
        v_rank=int(cfg["v_low_rank_dim"]),
        norm_eps=float(cfg["norm_eps"]),
    )
    return {"rwkv7": rwkv, "rope_scaling": None}


def checkpoint_name(name: str) -> str:
    """The embedding under the model files' name (the rest keeps flash-linear-attention's names)."""
    return name.replace("model.embeddings.", "model.embed_tokens.", 1)


_PER_CHANNEL = (".x_r", ".x_w", ".x_k", ".x_v", ".x_a", ".x_g")  # [1, 1, D] in the checkpoint: [D] here
_PER_HEAD = (".k_k", ".k_a", ".r_k", ".g_norm.weight", ".g_norm.bias")  # [D]: [H, Dh] here (as mlx_lm's sanitize)


def checkpoint_tensors(source: Iterator[tuple[str, Any]], spec: Any) -> Iterator[tuple[str, Any]]:
    """The token-shift mixes as vectors and the per-head vectors as [heads, head_dim], whichever shape the folder
    (flash-linear-attention's or mlx_lm's) or GGUF (gguf_tensors first) stored."""
    rwkv = spec.config.rwkv7
    if spec.weight_format == "gguf":
        source = gguf_tensors(source)
    for name, value in source:
        if name.endswith(_PER_CHANNEL):
            value = value.reshape(-1)
        elif name.endswith(_PER_HEAD):
            value = value.reshape(rwkv.heads, rwkv.head_dim)
        yield name, value


_MIXES = ("x_r", "x_w", "x_k", "x_v", "x_a", "x_g")  # (the fused tensor's order: llama.cpp's lerp_list)


def gguf_tensors(source: Iterator[tuple[str, Any]]) -> Iterator[tuple[str, Any]]:
    """llama.cpp's RWKV-7 tensors (named by gguf_arch.ARCH_LAYER["rwkv7"]) as flash-linear-attention's: the six
    token-shift mixes out of lerp_fused [6, 1, 1, D], each LoRA's bias0 as lora.2.bias, suffix-less vectors without
    the `.weight` the reader gives them, layer 0's placeholder v LoRA (copies of its a LoRA) dropped."""
    for name, value in source:
        if name.endswith(".attn.lerp_fused.weight"):
            base = name[: -len("lerp_fused.weight")]
            rows = value.reshape(len(_MIXES), -1)
            for i, mix in enumerate(_MIXES):
                yield base + mix, rows[i]
            continue
        if name.startswith("model.layers.0.attn.v_lora."):
            continue
        name = name.replace(".bias0.weight", ".lora.2.bias")
        for vector in (".attn.k_k.", ".attn.k_a.", ".attn.r_k.", ".ffn.x_k."):
            if name.endswith(vector + "weight"):
                name = name[: -len(".weight")]
        yield name, value
