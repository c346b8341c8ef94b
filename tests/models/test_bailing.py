"""Ling / Ring 2.0 (`bailing_moe`, BailingMoeV2's config keys): no transformers class exists, so two references
nobody here wrote — transformers' SarvamMoE (the same layer and tensor names: llama.cpp's converter says Sarvam-30B
is BailingMoeV2 with a full rope) on the same weights, and mlx_lm's own bailing_moe model on an mlx_lm-made 4-bit
folder. Config keys that ask for maths Lantern does not compute (biases, a normalised head, Ling 2.0's routing
switched off) are refused by name."""

from __future__ import annotations

import dataclasses
import json
import shutil

import numpy as np
import pytest

from lantern.app.engine import LLM
from lantern.app.models.spec import ModelConfig, UnsupportedModelError
from tests.conformance.test_parity import PROMPT, hf_model
from tests.fixtures.teacher_forcing import assert_matches_reference
from tests.fixtures.tiny_models import build_model

# a tiny Sarvam-30B with Ling 2.0's half rope; its heads as wide as hidden / heads (mlx_lm's bailing_moe's rule)
SARVAM = {"partial_rotary_factor": 0.5, "head_dim": 16, "attention_bias": False}


def ling_config(cfg: dict) -> dict:
    """A SarvamMoE config.json as a Ling 2.0 one states the same model."""
    rope = cfg.get("rope_parameters") or {}
    keep = ("vocab_size", "hidden_size", "intermediate_size", "moe_intermediate_size", "num_hidden_layers")
    keep += ("num_attention_heads", "num_key_value_heads", "max_position_embeddings", "rms_norm_eps", "n_group")
    keep += ("topk_group", "num_experts_per_tok", "norm_topk_prob", "routed_scaling_factor", "first_k_dense_replace")
    keep += ("tie_word_embeddings", "bos_token_id", "eos_token_id", "pad_token_id", "head_dim")
    return {
        **{k: cfg[k] for k in keep if k in cfg},
        "model_type": "bailing_moe",
        "architectures": ["BailingMoeV2ForCausalLM"],
        "rope_theta": rope.get("rope_theta", 8e6),
        "partial_rotary_factor": rope.get("partial_rotary_factor", 1.0),
        "num_experts": cfg["n_routed_experts"],
        "num_shared_experts": cfg["n_shared_experts"],
        "use_qk_norm": True,
        "use_qkv_bias": False,
        "use_bias": False,
        "norm_head": False,
        "score_function": "sigmoid",
        "moe_router_enable_expert_bias": True,
    }


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """(the Sarvam folder transformers reads, the same weights as a Ling folder)."""
    root = tmp_path_factory.mktemp("ling")
    src = build_model("sarvam_moe", root / "sarvam", **SARVAM)
    ling = root / "ling"
    shutil.copytree(src, ling)
    (ling / "config.json").write_text(json.dumps(ling_config(json.loads((src / "config.json").read_text()))))
    return src, ling


def test_config_is_sarvams_with_its_rope(folders):
    src, ling = folders
    ours = ModelConfig.from_hf(json.loads((ling / "config.json").read_text()))
    theirs = ModelConfig.from_hf(json.loads((src / "config.json").read_text()))
    assert ours.architecture == "bailing_moe"
    assert ours == dataclasses.replace(theirs, architecture="bailing_moe")
    assert ours.rope_scaling["partial_rotary_factor"] == 0.5 and ours.moe.n_group == 2


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("moe_router_enable_expert_bias", False),
        ("use_bias", True),
        ("norm_head", True),
        ("head_dim", 32),
        ("moe_router_enable_routed_scaling", False),
    ],
)
def test_other_maths_is_refused_by_name(folders, key, value):
    cfg = json.loads((folders[1] / "config.json").read_text())
    with pytest.raises(UnsupportedModelError, match=key):
        ModelConfig.from_hf({**cfg, key: value})


@pytest.mark.parametrize("backend", ["torch", "mlx"])
def test_ling_folder_answers_as_sarvam(folders, backend):
    src, ling = folders
    llm = LLM(str(ling), backend=backend, dtype="float32", block_size=4, prefill_chunk_size=8, num_kv_blocks=64)
    assert_matches_reference(llm, hf_model(src), PROMPT)


@pytest.fixture(scope="module")
def mlx_folder(folders, tmp_path_factory):
    """mlx_lm's own 4-bit conversion of the Ling folder (its bailing_moe model, quantize_model and save), and the
    Sarvam reference holding the values it stores."""
    from mlx_lm.utils import load, quantize_model, save

    from tests.fixtures.mlx_lm_folders import _reference

    src, ling = folders
    root = tmp_path_factory.mktemp("ling-mlx")
    model, tokenizer, config = load(str(ling), return_config=True, lazy=True)
    model, config = quantize_model(model, config, 32, 4)
    save(root / "q4", str(ling), model, tokenizer, config)
    return root / "q4", _reference(src, root / "q4", root / "ref")


@pytest.mark.parametrize("backend", ["torch", "mlx"])
def test_mlx_lm_folder_answers_as_what_it_holds(mlx_folder, backend):
    """Lantern on the 4-bit folder against SarvamMoE on the values it holds, within the bound the other quantized
    folders are held to (tests/models/quant_logits: torch's int4 kernels take bfloat16 activations)."""
    from tests.models.quant_logits import logits_error, tolerance

    quant, ref = mlx_folder
    err = logits_error(str(quant), str(ref), backend)
    assert err <= tolerance(backend, str(ref)), f"{backend}: {err:.4f}"


def test_mlx_lm_itself_agrees(mlx_folder):
    """mlx_lm's bailing_moe forward on its own folder: the prompt's last logits equal Lantern's (MLX backend)."""
    import mlx.core as mx
    from mlx_lm.utils import load

    from tests.fixtures.teacher_forcing import teacher_forced_logits

    quant, _ = mlx_folder
    model, _ = load(str(quant))
    llm = LLM(str(quant), backend="mlx", dtype="float32", block_size=4, num_kv_blocks=64)
    ids = llm.tokenizer.encode(PROMPT)
    theirs = np.array(model(mx.array([ids]))[0, -1].astype(mx.float32))
    ours = next(iter(teacher_forced_logits(llm.engine, ids, [0])))[1]
    np.testing.assert_allclose(ours, theirs, atol=1e-4, rtol=0)
