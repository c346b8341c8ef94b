"""What a backend is handed to load a model: normalized hyper-parameters plus where weights live."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# model_type -> what differs from plain Llama. One table instead of a class per architecture.
ARCHITECTURES: dict[str, dict[str, Any]] = {
    "llama": {},
    "mistral": {},
    "qwen2": {"attention_bias": True},
    "qwen3": {"qk_norm": True},
}


class UnsupportedModelError(ValueError):
    pass


@dataclass
class ModelConfig:
    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict[str, Any] | None
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool = False
    qk_norm: bool = False
    eos_token_ids: list[int] = field(default_factory=list)
    bos_token_id: int | None = None
    quantization: dict[str, Any] | None = None  # MLX-style {"group_size", "bits"} of an HF folder

    @classmethod
    def from_hf(cls, cfg: dict[str, Any]) -> "ModelConfig":
        model_type = cfg.get("model_type", "")
        if model_type not in ARCHITECTURES:
            raise UnsupportedModelError(
                f"unsupported architecture {model_type!r} ({', '.join(cfg.get('architectures') or [])}); "
                f"supported: {', '.join(sorted(ARCHITECTURES))}"
            )
        traits = ARCHITECTURES[model_type]
        heads = cfg["num_attention_heads"]
        head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads
        # transformers >= 5 folds rope_theta and rope_scaling into rope_parameters.
        rope = dict(cfg.get("rope_parameters") or {})
        theta = cfg.get("rope_theta", rope.get("rope_theta", 10000.0))
        scaling = cfg.get("rope_scaling") or rope
        rope_type = (scaling or {}).get("rope_type", (scaling or {}).get("type", "default"))
        if rope_type in ("default", None):
            scaling = None
        else:
            scaling = {k: v for k, v in scaling.items() if k != "rope_theta"}
            scaling["rope_type"] = rope_type
        eos = cfg.get("eos_token_id")
        eos_ids = [eos] if isinstance(eos, int) else list(eos or [])
        return cls(
            architecture=model_type,
            vocab_size=cfg["vocab_size"],
            hidden_size=cfg["hidden_size"],
            intermediate_size=cfg["intermediate_size"],
            num_layers=cfg["num_hidden_layers"],
            num_heads=heads,
            num_kv_heads=cfg.get("num_key_value_heads") or heads,
            head_dim=head_dim,
            rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
            rope_theta=float(theta),
            rope_scaling=scaling,
            max_position_embeddings=cfg.get("max_position_embeddings", 4096),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            attention_bias=bool(cfg.get("attention_bias", traits.get("attention_bias", False))),
            qk_norm=traits.get("qk_norm", False),
            eos_token_ids=eos_ids,
            bos_token_id=cfg.get("bos_token_id"),
            quantization=cfg.get("quantization"),
        )


@dataclass
class ModelSpec:
    """A resolved model: config, weight files and their format ("safetensors" or "gguf")."""

    name: str
    config: ModelConfig
    weight_format: str
    weight_files: list[Path]
    dtype: str = "float32"


@dataclass
class ModelInfo:
    """What the backend reports after loading."""

    num_params: int
    weight_bytes: int
    max_model_len: int
    vocab_size: int
