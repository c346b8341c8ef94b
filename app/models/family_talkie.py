"""Talkie (talkie-1930-13b and its instruction-tuned release, in the HF layout lewtun/talkie-1930-13b-it-hf: model_type
"talkie", remote code, no transformers class), its config.json turned into ModelConfig fields. mlx_lm's talkie model
and llama.cpp's graph are the references the tests and scripts/check_gguf_vs_llamacpp.py hold it to.

The maths: the embedding RMS-normed (every norm of Talkie has no weight, eps float32's machine epsilon, as F.rms_norm
without an eps) and kept as e; each block adds a_attn * attention(norm(x)), then a_mlp * mlp(norm(x)), then
s * e (learned scalars per block: attn_gain, mlp_gain, embed_skip). Attention: full multi-head q / k / v, the rope
turned the other way round (ModelConfig.rope_reversed), q and k RMS-normed after it, q times a learned gain per
head (head_gain); a SiLU-gated MLP (mlp_gate, mlp_linear, mlp_resid); the final norm and a bare lm_head matrix
times a learned scalar (lm_head_gain). llama.cpp's converter folds the reversed rope into q / k (the second half of
each head's rows negated: a plain rope on them gives the same scores), the gains into `.scale` tensors and the
head's gain into logit_scale; a GGUF is read so (gguf_tensors).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import numpy as np

from lantern.app.models.errors import check_silu, refuse
from lantern.app.models.spec import UnsupportedModelError

# mlx_lm's ModelArgs defaults (talkie-1930-13b's shape) for the keys a config.json may leave out
DEFAULTS: dict[str, Any] = {
    "vocab_size": 65540,
    "hidden_size": 5120,
    "num_hidden_layers": 40,
    "num_attention_heads": 40,
    "head_dim": 128,
    "intermediate_size": 13696,
    "rope_theta": 1_000_000.0,
    "max_position_embeddings": 2048,
    "rms_norm_eps": float(np.finfo(np.float32).eps),
}


def configure(model_type: str, cfg: dict[str, Any], fields: dict[str, Any]) -> dict[str, Any]:
    """ModelConfig field overrides for a talkie config.json; refuses, naming the key, what it does not compute."""
    if model_type != "talkie":
        raise UnsupportedModelError(f"family_talkie does not configure model_type {model_type!r}")
    check_silu(cfg, "Talkie")
    if fields["num_kv_heads"] != fields["num_heads"]:
        raise refuse("num_key_value_heads", cfg.get("num_key_value_heads"), " (Talkie's heads each have K/V)")
    if cfg.get("tie_word_embeddings"):
        raise refuse("tie_word_embeddings", True, " (Talkie's head is its own matrix)")
    # (a GGUF: llama.cpp's converter negated the q / k rows the reversed rope turns, and states the head's gain)
    absorbed = bool(cfg.get("talkie_rope_absorbed"))
    out: dict[str, Any] = {"qk_norm": True, "qk_norm_after_rope": True, "rope_reversed": not absorbed}
    out |= {"embed_norm": True, "tie_word_embeddings": False}
    if cfg.get("logit_scale") is not None:
        out["logits_divisor"] = 1.0 / float(cfg["logit_scale"])
    return out


_NAMES = (
    (re.compile(r"^model\.embed\."), "model.embed_tokens."),
    (re.compile(r"^model\.blocks\.(\d+)\."), r"model.layers.\1."),
    (re.compile(r"\.attn\.attn_query\."), ".self_attn.q_proj."),
    (re.compile(r"\.attn\.attn_key\."), ".self_attn.k_proj."),
    (re.compile(r"\.attn\.attn_value\."), ".self_attn.v_proj."),
    (re.compile(r"\.attn\.attn_resid\."), ".self_attn.o_proj."),
    (re.compile(r"\.attn\.head_gain\.head_g$"), ".self_attn.head_gain"),
    (re.compile(r"\.(attn_gain|mlp_gain|embed_skip)\.a_g$"), r".\1"),
    (re.compile(r"\.mlp\.mlp_gate\."), ".mlp.gate_proj."),
    (re.compile(r"\.mlp\.mlp_linear\."), ".mlp.up_proj."),
    (re.compile(r"\.mlp\.mlp_resid\."), ".mlp.down_proj."),
    (re.compile(r"^lm_head$"), "lm_head.weight"),  # (a bare parameter in the checkpoint)
    (re.compile(r"^lm_head\."), "lm_head."),  # (mlx_lm-quantized folders: lm_head.weight / scales / biases)
    (re.compile(r"^lm_head_gain\.w_g$"), "model.lm_head_gain"),
)


def checkpoint_name(name: str) -> str | None:
    """A Talkie tensor under the model files' names; None for precomputed rotary tables (never read)."""
    if "rotary" in name or name.endswith((".cos", ".sin")):
        return None
    for pattern, new in _NAMES:
        name = pattern.sub(new, name)
    return name


def checkpoint_tensors(source: Iterator[tuple[str, Any]], spec: Any) -> Iterator[tuple[str, Any]]:
    """A GGUF's tensors as the folders' (gguf_tensors); a folder's as they are, each gain a vector."""
    if spec.weight_format == "gguf":
        yield from gguf_tensors(source)
        return
    for name, value in source:
        yield name, (value.reshape(-1) if name.endswith(_GAINS) else value)


_GAINS = (".head_gain", ".attn_gain", ".mlp_gain", ".embed_skip", "model.lm_head_gain")


def gguf_tensors(source: Iterator[tuple[str, Any]]) -> Iterator[tuple[str, Any]]:
    """llama.cpp's talkie tensors (gguf_arch names them) as the folders': the per-head gain [1, H] and the scalars
    as vectors without the `.weight` the reader gives them; the head's gain is the file's logit_scale
    (ModelConfig.logits_divisor), so the model's own gain is 1."""
    for name, value in source:
        stem = name.removesuffix(".weight")
        if stem.endswith(_GAINS):  # (the scalars as `.scale` tensors, the per-head gain as attn_q_norm [1, H])
            name, value = stem, value.reshape(-1)
        yield name, value
    yield "model.lm_head_gain", np.ones(1, dtype=np.float32)
