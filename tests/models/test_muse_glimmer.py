"""Meta's Muse Glimmer (muse_glimmer / muse_glimmer_text): Gemma's sandwich layer with weightless q/k norms, q scaled
by qk_scale_factor, a sigmoid output gate, NoPE full layers among sliding ones, a weightless norm on the embedding,
logits scaled then soft-capped. A tiny MuseGlimmerForConditionalGeneration built and saved by transformers (its
vision tower skipped); Lantern's logits equal transformers' on text through the paged cache on both backends, for
that folder and for mlx-community's flat text-only layout; what it cannot compute is refused by name."""

from __future__ import annotations

import json

import pytest

from lantern.app.models.errors import UnsupportedModelError
from lantern.app.models.spec import ModelConfig

TEXT = {"hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 5, "num_attention_heads": 4}
TEXT |= {"num_key_value_heads": 2, "head_dim": 16, "sliding_window": 6, "post_norm_eps": 0.3}  # (an eps that matters)
VISION = {"hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 1, "num_attention_heads": 2}
VISION |= {"patch_size": 2, "pos_emb_height": 4, "pos_emb_width": 4}


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    import torch
    from transformers import MuseGlimmerConfig, MuseGlimmerForConditionalGeneration

    from tests.fixtures.tiny_models import build_tokenizer

    out = tmp_path_factory.mktemp("muse_glimmer")
    tokenizer = build_tokenizer(out)
    ids = {"bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id, "pad_token_id": 0}
    config = MuseGlimmerConfig(text_config={"vocab_size": len(tokenizer), **TEXT, **ids}, vision_config=VISION)
    torch.manual_seed(0)
    model = MuseGlimmerForConditionalGeneration(config).eval()
    with torch.no_grad():  # (the centered norms start at 0: made to differ per channel, so each is read right)
        for name, p in model.named_parameters():
            if p.dim() == 1 and "language_model" in name:
                p.add_(0.3 * torch.randn_like(p))
    model.save_pretrained(str(out), safe_serialization=True)
    return out, model


def _check(cfg) -> None:  # every 4th layer counted back from the last is full and NoPE
    assert cfg.layer_windows == [None, 6, 6, 6, None] and cfg.rope_layers == (False, True, True, True, False)


def test_logits_match_transformers(folder, backend):
    from tests.fixtures.teacher_forcing import assert_serves_like

    assert_serves_like(*folder, backend, _check)


def test_mlx_communitys_flat_text_folder_reads_the_same(folder, tmp_path, backend):
    """mlx_lm's conversions: the text config's keys at the top (model_type muse_glimmer), model.* / lm_head names."""
    from safetensors.numpy import load_file, save_file

    from tests.fixtures.teacher_forcing import assert_serves_like

    out, model = folder
    flat = tmp_path / "flat"
    flat.mkdir()
    for f in out.iterdir():
        if f.name not in ("model.safetensors", "config.json"):
            (flat / f.name).write_bytes(f.read_bytes())
    cfg = json.loads((out / "config.json").read_text())
    (flat / "config.json").write_text(json.dumps({**cfg["text_config"], "model_type": "muse_glimmer"}))
    tensors = {
        ("model." + n.removeprefix("model.language_model.") if n.startswith("model.language_model.") else n): v
        for n, v in load_file(str(out / "model.safetensors")).items()
        if not n.startswith(("model.vision", "model.multi_modal", "model.adapter"))
    }
    save_file(tensors, str(flat / "model.safetensors"), metadata={"format": "pt"})
    assert_serves_like(flat, model, backend, _check)


def _base(**extra) -> dict:
    return {"model_type": "muse_glimmer_text", "vocab_size": 300, **TEXT, **extra}


@pytest.mark.parametrize(
    "extra, key",
    [
        ({"layer_rope_theta": [0, 1e4, 1e4, 1e4, 0]}, "layer_rope_theta"),
        ({"layer_types": ["chunked_attention"] * 5}, "layer_types"),
        ({"hidden_activation": "gelu"}, "hidden_activation"),
        ({"attention_bias": True}, "attention_bias"),
    ],
)
def test_what_it_cannot_compute_is_refused_by_name(extra, key):
    with pytest.raises(UnsupportedModelError, match=key):
        ModelConfig.from_hf(_base(**extra))
