"""One model file per family (ModelConfig.family); each builds its layers from ../layers.py."""

from __future__ import annotations

import importlib

from torch import nn

from lantern.app.models.spec import ModelConfig
from lantern.backends.torch.parallel import TPGroup


def build_model(cfg: ModelConfig, tp: TPGroup) -> nn.Module:
    """The family's CausalLM for cfg (backends/torch/models/<family>.py); with tp.world > 1 one rank's shard."""
    return importlib.import_module(f"lantern.backends.torch.models.{cfg.family}").CausalLM(cfg, tp)
