"""The error a model that Lantern cannot serve raises, and the one-line refusal of a config value."""

from __future__ import annotations

import json
from typing import Any


class UnsupportedModelError(ValueError):
    pass


def refuse(key: str, value: Any, why: str = "") -> UnsupportedModelError:
    return UnsupportedModelError(f"{key}={json.dumps(value)} in config.json is not implemented{why}")


_SILU = {"silu", "swish"}  # one function under two names in transformers' ACT2FN


def check_silu(cfg: dict[str, Any], family: str) -> None:
    """Refuse a hidden_act other than SiLU for a family whose MLP Lantern computes SiLU-gated."""
    act = cfg.get("hidden_act", "silu")
    if act not in _SILU:
        raise refuse("hidden_act", act, f"; {family}'s MLP is SiLU-gated in Lantern")


def check_attention_types(
    types: Any, layers: int, allowed: tuple[str, ...] = ("sliding_attention", "full_attention")
) -> None:
    """Refuse, naming layer_types, anything but one of `allowed` (sliding_attention / full_attention) for each layer."""
    if not isinstance(types, (list, tuple)) or len(types) != layers or set(types) - set(allowed):
        raise refuse("layer_types", types, f" ({' or '.join(allowed)} for each of the {layers} layers)")
