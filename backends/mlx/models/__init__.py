"""One model file per family (ModelConfig.family); each builds its layers from ../layers.py."""

from __future__ import annotations

import importlib

import mlx.nn as nn

from lantern.app.models.spec import ModelConfig


def build_model(cfg: ModelConfig) -> nn.Module:
    """The family's CausalLM for cfg (backends/mlx/models/<family>.py)."""
    return importlib.import_module(f"lantern.backends.mlx.models.{cfg.family}").CausalLM(cfg)
