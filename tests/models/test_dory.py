"""NVIDIA Nemotron-Labs Dory (dory): nGPT's unit-sphere layers (L2 norms without weights, learned interpolation
rates, per-channel query / gate / MLP / logit scales) with a recurrent section run in loops, each pass keeping its
own K/V, sliding layers on their own rope base. Tiny random models built and saved by transformers' DoryForCausalLM
(its backbone.* / g_proj names); Lantern's logits equal transformers' through the paged cache on both backends, for
transformers' folder and for the released layout (attention and MLP as blocks 2i / 2i+1, layer_types with "mlp"
entries and doubled counts); what it cannot compute is refused by name."""

from __future__ import annotations

import json
import re

import pytest

from lantern.app.models.errors import UnsupportedModelError
from lantern.app.models.spec import ModelConfig

SHAPE = {"hidden_size": 64, "intermediate_size": 96, "num_attention_heads": 4, "num_key_value_heads": 2}
SHAPE |= {"head_dim": 16, "num_hidden_layers": 6, "n_input_layers": 2, "n_output_layers": 2, "n_recurrent_loops": 3}


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    import torch
    from transformers import DoryConfig, DoryForCausalLM

    from tests.fixtures.tiny_models import build_tokenizer

    out = tmp_path_factory.mktemp("dory")
    tokenizer = build_tokenizer(out)
    ids = {"bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id}
    config = DoryConfig(vocab_size=len(tokenizer), sliding_window=6, **SHAPE, **ids)
    torch.manual_seed(0)
    model = DoryForCausalLM(config).eval()
    with torch.no_grad():  # (the scales start as constants: made to differ per channel, so each is read right)
        for p in model.parameters():
            if p.dim() == 1:
                p.mul_(1.0 + 0.3 * torch.rand_like(p))
    model.save_pretrained(str(out), safe_serialization=True)
    return out, model


def _assert_matches(folder, reference, backend) -> None:
    from tests.fixtures.teacher_forcing import assert_serves_like

    def check(cfg):  # the recurrent pair kept once per loop
        assert (cfg.num_layers, cfg.num_kv_layers) == (6, 2 + 3 * 2 + 2)

    assert_serves_like(folder, reference, backend, check)


def test_logits_match_transformers(folder, backend):
    _assert_matches(*folder, backend)


def test_the_released_layout_reads_as_transformers_reads_it(folder, tmp_path, backend):
    """nvidia's layout: each layer as an attention block layers.{2i} (mixer.*, attn_alpha) and an MLP block
    layers.{2i+1} (mixer.*, mlp_alpha); layer_types with an "mlp" entry after each and every count doubled."""
    from tests.models.quant_logits import relaid_folder

    out, model = folder
    cfg = json.loads((out / "config.json").read_text())
    assert "mlp" in cfg["layer_types"]  # (transformers saves the released layout of the config already)

    def released(name, value):
        m = re.match(r"backbone\.layers\.(\d+)\.(self_attn|mlp|lambda_1|lambda_2)(.*)$", name)
        if m is None:
            return {name: value}
        i, part, rest = int(m.group(1)), m.group(2), m.group(3)
        block = {"self_attn": (2 * i, "mixer"), "mlp": (2 * i + 1, "mixer")}.get(part)
        block = block or {"lambda_1": (2 * i, "attn_alpha"), "lambda_2": (2 * i + 1, "mlp_alpha")}[part]
        return {f"backbone.layers.{block[0]}.{block[1]}{rest}": value}

    _assert_matches(relaid_folder(out, tmp_path / "released", released), model, backend)


def _base(**extra) -> dict:
    return {"model_type": "dory", "vocab_size": 300, **SHAPE, **extra}


def test_the_config_reads_as_dory_config_reads_it():
    cfg = ModelConfig.from_hf(_base())
    assert cfg.num_layers == 6 and cfg.dory.n_recurrent == 2 and cfg.kv_layers == 2 + 3 * 2 + 2
    assert cfg.layer_windows == [1024, 1024, 1024, None, 1024, 1024]  # DoryConfig: every 4th layer full
    assert (cfg.rope_theta, cfg.local_rope_theta) == (10_000_000.0, 10_000.0)


@pytest.mark.parametrize(
    "extra, key",
    [
        ({"recurrent_kv_cache_mode": "last_loop"}, "recurrent_kv_cache_mode"),
        ({"tie_word_embeddings": True}, "tie_word_embeddings"),
        ({"attention_bias": True}, "attention_bias"),
        ({"hidden_act": "gelu"}, "hidden_act"),
        ({"rope_parameters": {"rope_type": "default", "rope_theta": 1e6}}, "rope_parameters"),  # (not by layer type)
    ],
)
def test_what_it_cannot_compute_is_refused_by_name(extra, key):
    with pytest.raises(UnsupportedModelError, match=key):
        ModelConfig.from_hf(_base(**extra))


def test_tensor_parallelism_is_refused():
    from lantern.backends.torch.parallel import local_config

    with pytest.raises(ValueError, match="Dory"):
        local_config(ModelConfig.from_hf(_base()), 2)


@pytest.mark.parametrize("scheme", ["q4", "q8"])
def test_isq_matches_the_dequantized_reference(folder, tmp_path, backend, scheme, caplog):
    """--isq over q, k, v, the gate, o and the MLP (the per-channel scales stay exact), every matrix counted."""
    from tests.models.quant_logits import assert_isq_matches_reference

    assert_isq_matches_reference(folder[0], tmp_path / "ref", backend, scheme, caplog)
