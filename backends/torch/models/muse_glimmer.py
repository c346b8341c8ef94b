"""Muse Glimmer's language model in torch over a flattened token batch (maths in app/models/family_muse_glimmer.py;
the MLX file has the same layout): Gemma's sandwich layer (its post-sublayer norms at their own eps) around attention
with weightless q/k norms and a sigmoid output gate; a weightless norm on the embedding, a weighted final norm.
"""

from __future__ import annotations

from lantern.app.models.spec import ModelConfig
from lantern.backends.torch.models import gemma
from lantern.backends.torch.models.hrm_text import PlainRMSNorm
from lantern.backends.torch.parallel import TPGroup


class DecoderLayer(gemma.DecoderLayer):
    qk_norm = PlainRMSNorm  # (q/k norms without weights; the post-sublayer norms' eps: cfg.post_norm_eps)


class CausalLM(gemma.CausalLM):
    decoder_layer = DecoderLayer
    final_norm = gemma.FloatRMSNorm  # (a plain weighted norm, not Gemma's 1 + w; the product in float32)

    def __init__(self, cfg: ModelConfig, tp: TPGroup = TPGroup()):
        super().__init__(cfg, tp)
        self.model.embed_norm = PlainRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)  # (cfg.embed_norm: weightless)
