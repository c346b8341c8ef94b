"""TeleChat3 (`telechat3`) and XVERSE (`xverse`) folders: Llama under their own config keys. Each tiny folder is the
weights of a transformers Llama under the other config, served on both backends and compared with that Llama on its
own folder: TeleChat3's `telechat3-yarn` rope as YaRN with its attention factor 0.07 ln(factor) + 1 (vLLM's
TeleChat3RoPEScaledRotaryEmbedding: transformers computes YaRN with that factor stated), XVERSE under XverseConfig's
defaults (no KV-heads key: a head each). mlx_lm's telechat3 and its llama (its reader of xverse) are a second
reference on 4-bit folders its code made."""

from __future__ import annotations

import json
import math
import re
import shutil

import pytest

from lantern.app.models.spec import ModelConfig, UnsupportedModelError
from tests.fixtures.teacher_forcing import assert_close_to_mlx_lm, assert_file_matches_folder, quantized_by_mlx_lm
from tests.fixtures.tiny_models import build_model

_KEPT = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")
_KEPT += ("max_position_embeddings", "rms_norm_eps", "bos_token_id", "eos_token_id", "tie_word_embeddings")
_YARN = {"factor": 4.0, "original_max_position_embeddings": 64, "beta_fast": 32.0, "beta_slow": 1.0}


def _as(src, out, config: dict):
    """src's weights and tokenizer under another config.json (the shape keys kept)."""
    out.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.name != "config.json":
            shutil.copy(f, out / f.name)
    cfg = json.loads((src / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**{k: cfg[k] for k in _KEPT}, "hidden_act": "silu", **config}))
    return out


def telechat3_folder(src, out, yarn: bool):
    cfg = json.loads((src / "config.json").read_text())
    config = {"model_type": "telechat3", "architectures": ["Telechat3ForCausalLM"], "head_dim": cfg["head_dim"]}
    config |= {"num_key_value_heads": cfg["num_key_value_heads"], "rope_theta": 10000.0}
    config |= {"attention_bias": False, "mlp_bias": False, "torch_dtype": "float32"}
    if yarn:
        config["rope_scaling"] = {**_YARN, "rope_type": "telechat3-yarn", "type": "telechat3-yarn"}
    return _as(src, out, config)


def xverse_folder(src, out):
    """XVERSE-13B's config.json keys: no num_key_value_heads, no rope_theta (its code's base: 10000)."""
    return _as(src, out, {"model_type": "xverse", "architectures": ["XverseForCausalLM"], "torch_dtype": "float32"})


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("telechat3")
    yarn = {**_YARN, "rope_type": "yarn", "rope_theta": 10000.0, "attention_factor": 0.07 * math.log(4.0) + 1.0}
    llama_yarn = build_model("llama2", root / "llama_yarn", head_dim=16, rope_parameters=yarn)
    mha = build_model("llama2", root / "llama_mha", num_key_value_heads=4)
    return {
        "telechat3": (llama_yarn, telechat3_folder(llama_yarn, root / "telechat3", yarn=True)),
        "xverse": (mha, xverse_folder(mha, root / "xverse")),
    }


@pytest.mark.parametrize("kind", ["telechat3", "xverse"])
def test_folder_answers_as_llama(folders, kind, backend):
    """(the prompt and its 64 greedy tokens run past TeleChat3's original 64 positions: YaRN's long range)"""
    src, folder = folders[kind]
    assert_file_matches_folder(folder, src, backend, kind)


def test_configs_read_as_llamas(folders):
    telechat = ModelConfig.from_hf(json.loads((folders["telechat3"][1] / "config.json").read_text()))
    assert telechat.architecture == "telechat3" and telechat.family == "llama"
    assert telechat.rope_scaling["rope_type"] == "yarn"
    assert telechat.rope_scaling["attention_factor"] == pytest.approx(0.07 * math.log(4.0) + 1.0)
    xverse = ModelConfig.from_hf(json.loads((folders["xverse"][1] / "config.json").read_text()))
    assert (xverse.architecture, xverse.num_kv_heads, xverse.rope_theta) == ("xverse", xverse.num_heads, 10000.0)


@pytest.mark.parametrize("kind", ["telechat3", "xverse"])
def test_mlx_lm_made_folder_matches_mlx_lm(kind, tmp_path, backend, by_file_tokenizer):
    """mlx_lm's telechat3 (without rope scaling: it computes YaRN's own attention factor) and xverse (its llama)."""
    if kind == "telechat3":
        folder = telechat3_folder(build_model("llama2", tmp_path / "src", head_dim=16), tmp_path / kind, yarn=False)
    else:
        folder = xverse_folder(build_model("llama2", tmp_path / "src", num_key_value_heads=4), tmp_path / kind)
    assert_close_to_mlx_lm(quantized_by_mlx_lm(folder, tmp_path / "q4"), backend, kind)


_BASE = {"vocab_size": 400, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2}
_BASE |= {"num_attention_heads": 4, "max_position_embeddings": 256}


@pytest.mark.parametrize(
    ("model_type", "key", "extra"),
    [
        ("telechat3", "rope_scaling.mscale", {"mscale": 1.0}),  # (its factor reads none of these)
        ("telechat3", "rope_scaling.attention_factor", {"attention_factor": 1.2}),
        ("telechat3", "rope_scaling.original_max_position_embeddings", {"original_max_position_embeddings": None}),
        ("telechat3", "rope_scaling.factor", {"factor": 0}),
        ("telechat3", "mlp_bias", {"mlp_bias": True}),
        ("xverse", "num_experts", {"num_experts": 64}),  # XVERSE-MoE
        ("xverse", "quantization_bit", {"quantization_bit": 4}),
    ],
)
def test_what_lantern_does_not_compute_is_refused(model_type, key, extra):
    raw = {**_BASE, "model_type": model_type}
    if model_type == "telechat3":
        scaling = {**_YARN, "rope_type": "telechat3-yarn"}
        if key.startswith("rope_scaling."):
            scaling |= extra
        else:
            raw |= extra
        raw["rope_scaling"] = scaling
    else:
        raw |= extra
    with pytest.raises(UnsupportedModelError, match=f"^{re.escape(key)}="):
        ModelConfig.from_hf(raw)


def test_xverse_unstated_keys_take_its_config_classes_defaults():
    raw = {k: v for k, v in _BASE.items() if k != "max_position_embeddings"}
    cfg = ModelConfig.from_hf({**raw, "model_type": "xverse"})
    assert (cfg.rms_norm_eps, cfg.num_kv_heads, cfg.tie_word_embeddings) == (1e-6, 4, False)
    assert (cfg.max_position_embeddings, cfg.rope_theta) == (8192, 10000.0)
