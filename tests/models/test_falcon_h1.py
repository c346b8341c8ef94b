"""Falcon-H1 ("falcon_h1"): its config.json read as transformers' FalconH1Config and its modules read it
(the mixer's sizes, the μP vector over in_proj, the query scale), refusals in one line naming the key; the norm
before the gate against transformers; GGUF files as llama.cpp's converter writes them (every multiplier folded
into the weights; tests/fixtures/gguf_falcon_h1.py) and mlx_lm's own conversions (folded its way) on both
backends. Logits and greedy tokens of the tiny variants (falcon_h1, falcon_h1_norm) against transformers run in
tests/conformance; state and prefix-cache behaviour in tests/conformance/test_recurrent_*.py; serving in
tests/server/test_hybrid_serving.py."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest
import torch

from lantern.app.engine import LLM, SamplingParams
from lantern.app.models.errors import UnsupportedModelError
from lantern.app.models.loader import resolve_model
from lantern.app.models.spec import ModelConfig
from lantern.app.models.weight_stream import iter_weights
from tests.conformance.test_parity import PROMPT, hf_greedy, hf_model
from tests.fixtures.teacher_forcing import assert_matches_reference
from tests.fixtures.tiny_models import build_model
from tests.models.quant_logits import logits_error, tolerance

RELEASED = {  # Falcon-H1-0.5B-Instruct's keys and multipliers, its sizes scaled down
    "model_type": "falcon_h1",
    "vocab_size": 300,
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "mamba_d_conv": 4,
    "mamba_d_head": 16,
    "mamba_d_ssm": 128,
    "mamba_d_state": 16,
    "mamba_expand": 2,
    "mamba_n_groups": 1,
    "mamba_n_heads": 8,
    "mamba_norm_before_gate": False,
    "mamba_rms_norm": False,
    "mamba_use_mlp": True,
    "mamba_proj_bias": False,
    "projectors_bias": False,
    "attention_in_multiplier": 1.0,
    "attention_out_multiplier": 0.9375,
    "embedding_multiplier": 5.656854249492381,
    "key_multiplier": 0.39062499999999994,
    "lm_head_multiplier": 0.0390625,
    "mlp_multipliers": [0.8838834764831844, 0.5859375],
    "ssm_in_multiplier": 1.25,
    "ssm_multipliers": [0.3535533905932738, 0.25, 0.3535533905932738, 0.5, 0.3535533905932738],
    "ssm_out_multiplier": 0.23570226039551587,
    "rope_theta": 100000000000.0,
    "max_position_embeddings": 16384,
    "rms_norm_eps": 1e-5,
}


def test_released_config_reads_as_transformers_does():
    from transformers import FalconH1Config
    from transformers.models.falcon_h1.modeling_falcon_h1 import FalconH1Mixer, compute_mup_vector

    cfg = ModelConfig.from_hf(json.loads(json.dumps(RELEASED)))
    hf = FalconH1Config(**RELEASED)
    mixer, m = FalconH1Mixer(hf, 0), cfg.mamba
    assert m.mamba_layers == (True,) * 3 and m.parallel and cfg.num_kv_layers == 3 and cfg.recurrent
    assert (m.num_heads, m.head_dim, m.state_size, m.groups) == (8, hf.mamba_d_head, 16, 1)
    assert (m.inner, m.conv_dim, m.conv_kernel) == (mixer.intermediate_size, mixer.conv_dim, mixer.conv_kernel_size)
    assert m.inner + m.conv_dim + m.num_heads == mixer.in_proj.out_features and m.norm == "none"
    # in_proj's output times the μP vector, times ssm_in_multiplier (transformers: the input times it)
    want = (compute_mup_vector(hf) * hf.ssm_in_multiplier).flatten().numpy()
    got = np.ones(m.inner + m.conv_dim + m.num_heads, np.float32)
    for start, end, value in m.in_spans():
        got[start:end] = value
    np.testing.assert_allclose(got, want, rtol=1e-6)
    s = cfg.falcon_h1
    assert (s.attention_in, s.attention_out, s.ssm_out) == (1.0, 0.9375, RELEASED["ssm_out_multiplier"])
    assert (s.mlp_gate, s.mlp_down) == tuple(RELEASED["mlp_multipliers"])
    assert cfg.attn_scale == pytest.approx(16**-0.5 * RELEASED["key_multiplier"])
    assert cfg.embed_multiplier == RELEASED["embedding_multiplier"] and cfg.logits_divisor == 1 / 0.0390625
    assert cfg.rope_theta == 1e11 and cfg.max_position_embeddings == 16384
    # mamba_d_ssm states the mixer's width apart from mamba_expand x hidden_size (Falcon-H1-Tiny: 768 for 512);
    # absent it is FalconH1Config's 1024, null the expansion's
    for d_ssm, want in ((192, 192), (None, 128), ("absent", 1024)):
        raw = {**RELEASED, "mamba_d_ssm": d_ssm, "mamba_d_head": "auto"}
        raw = {k: v for k, v in raw.items() if v != "absent"}
        mamba = ModelConfig.from_hf(raw).mamba
        assert mamba.inner == FalconH1Mixer(FalconH1Config(**raw), 0).intermediate_size == want
        assert mamba.head_dim == want // 8
    # biases on in_proj / out_proj where ssm_in_multiplier is 1 (else refused: see below)
    biased = {**RELEASED, "mamba_proj_bias": True, "projectors_bias": True, "ssm_in_multiplier": 1.0}
    assert ModelConfig.from_hf(biased).mamba.proj_bias
    # the norm's two orders
    assert ModelConfig.from_hf({**RELEASED, "mamba_rms_norm": True}).mamba.norm == "gated"
    gated_first = {**RELEASED, "mamba_rms_norm": True, "mamba_norm_before_gate": True}
    assert ModelConfig.from_hf(gated_first).mamba.norm == "before_gate"


@pytest.mark.parametrize(
    ("change", "key"),
    [
        ({"attention_bias": True}, "attention_bias"),
        ({"mlp_bias": True}, "mlp_bias"),
        ({"projectors_bias": True}, "projectors_bias"),
        ({"ssm_multipliers": [1.0, 1.0]}, "ssm_multipliers"),
        ({"mlp_multipliers": "1.0"}, "mlp_multipliers"),
        ({"mamba_d_head": 12}, "mamba_d_head"),
        ({"lm_head_multiplier": 0}, "lm_head_multiplier"),
        ({"hidden_act": "gelu"}, "hidden_act"),
        ({"mamba_use_mlp": False}, "mamba_use_mlp"),
        # transformers scales in_proj's input by ssm_in_multiplier, so its bias is not: the models scale the output
        ({"mamba_proj_bias": True, "projectors_bias": True}, "mamba_proj_bias"),
    ],
)
def test_what_is_not_computed_is_refused_naming_the_key(change, key):
    with pytest.raises(UnsupportedModelError, match=key):
        ModelConfig.from_hf({**RELEASED, **change})


def test_norm_before_the_gate_matches_transformers(tmp_path_factory, backend):
    """mamba_norm_before_gate: RMSNorm_G(y) * silu(z), the other order than Falcon-H1R's."""
    path = build_model("falcon_h1_norm", tmp_path_factory.mktemp("before"), mamba_norm_before_gate=True)
    assert resolve_model(str(path)).spec.config.mamba.norm == "before_gate"
    llm = LLM(str(path), backend=backend, dtype="float32", block_size=4, prefill_chunk_size=8, num_kv_blocks=64)
    assert_matches_reference(llm, hf_model(str(path)), PROMPT, steps=12)


# ---- GGUF, as llama.cpp's converter writes it -------------------------------------------------------------
@pytest.fixture(scope="module")
def gguf_file(tmp_path_factory):
    from tests.fixtures.gguf_falcon_h1 import convert_falcon_h1

    made: dict[tuple[str, str], tuple[Path, Path, Path]] = {}

    def get(variant: str, outtype: str) -> tuple[Path, Path, Path]:
        """(file, reference holding the values it stores, the original float folder)."""
        if (variant, outtype) not in made:
            root = tmp_path_factory.mktemp(f"{variant}-{outtype}")
            src = build_model(variant, root / "hf")
            made[variant, outtype] = (*convert_falcon_h1(src, root, outtype), src)
        return made[variant, outtype]

    return get


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("LANTERN_CACHE", str(tmp_path / "cache"))


def test_gguf_config_is_the_checkpoints_with_its_multipliers_folded(gguf_file):
    path, ref, _ = gguf_file("falcon_h1_norm", "f16")
    spec = resolve_model(str(path)).spec
    assert spec.config == ModelConfig.from_hf(json.loads((ref / "config.json").read_text()))
    assert spec.config.mamba.norm == "gated" and spec.config.tie_word_embeddings  # ssm_norm present; no output
    streamed = {n: np.asarray(v, dtype=np.float32) for n, v in iter_weights(spec, "pt", progress=False)}
    held = {n: v.numpy() for n, v in iter_weights(resolve_model(str(ref)).spec, "pt", progress=False)}
    assert sorted(streamed) == sorted(held)
    for name, value in streamed.items():
        np.testing.assert_allclose(value, held[name], rtol=1e-6, atol=1e-7, err_msg=name)


def test_f32_gguf_computes_what_transformers_computes_on_the_original(gguf_file, backend):
    """Folding the multipliers into the weights is exact up to float32 rounding: an untied file answers as the
    checkpoint it came from."""
    path, _, src = gguf_file("falcon_h1", "f32")
    llm = LLM(str(path), backend=backend, dtype="float32", block_size=4, prefill_chunk_size=8, num_kv_blocks=64)
    try:
        model = hf_model(str(src))
        assert_matches_reference(llm, model, PROMPT, steps=12, atol=2e-4)
        ids = llm.tokenizer.encode(PROMPT)
        out = llm.generate([ids], SamplingParams(temperature=0, max_tokens=24, ignore_eos=True))
        assert out[0].outputs[0].token_ids == hf_greedy(model, ids, 24)
    finally:
        llm.engine.shutdown()


def test_tied_gguf_computes_what_llama_cpp_computes(gguf_file, backend):
    """A tied file has no output tensor: llama.cpp's head is the stored (scaled) embedding, without the head's
    multiplier; the reference with every multiplier at 1 computes just that."""
    path, ref, _ = gguf_file("falcon_h1_norm", "f16")
    llm = LLM(str(path), backend=backend, dtype="float32", block_size=4, prefill_chunk_size=8, num_kv_blocks=64)
    try:
        assert_matches_reference(llm, hf_model(str(ref)), PROMPT, steps=12)
    finally:
        llm.engine.shutdown()


def test_q8_0_gguf_stays_quantized(gguf_file, backend, caplog):
    path, ref, _ = gguf_file("falcon_h1", "q8_0")
    stream = iter_weights(resolve_model(str(path)).spec, "pt", progress=False)
    blocks = {n.rsplit(".", 2)[-2] for n, v in stream if not isinstance(v, torch.Tensor)}  # what stays quantized
    assert {"in_proj", "out_proj", "q_proj", "o_proj", "gate_proj", "down_proj"} <= blocks, blocks
    with caplog.at_level(logging.INFO):
        err = logits_error(str(path), str(ref), backend)
    assert err <= tolerance(backend, str(ref)), f"{backend}: {err:.4f}"


# ---- mlx_lm's conversions ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    pytest.importorskip("mlx_lm")
    from tests.fixtures.mlx_lm_folders import convert

    made: dict[tuple, tuple[Path, Path]] = {}

    def get(variant: str, mode: str | None, **config: object) -> tuple[Path, Path]:
        key = (variant, mode, *sorted(config.items()))
        if key not in made:
            made[key] = convert(variant, tmp_path_factory.mktemp(f"{variant}-{mode}"), mode=mode, **config)
        return made[key]

    return get


@pytest.mark.parametrize(("variant", "config"), [("falcon_h1", {}), ("falcon_h1_norm", {"mamba_n_groups": 1})])
def test_float_mlx_lm_folder_is_the_original_model(converted, backend, variant, config):
    """mlx_lm's sanitize folds most multipliers into the weights, attention_in into q and k only, and not
    key_multiplier (mlx_lm then computes without it): read with the rest restored, the folder answers as the
    checkpoint it came from (the variants' key_multiplier and attention_in_multiplier are not 1; the second is
    tied: its head's multiplier over the embedding's)."""
    folder, _ = converted(variant, None, **config)
    assert resolve_model(str(folder)).spec.config.falcon_h1.ssm_out == 1.0  # (folded)
    original = folder.parent / f"{variant}-float"
    llm = LLM(str(folder), backend=backend, dtype="float32", block_size=4, prefill_chunk_size=8, num_kv_blocks=64)
    assert_matches_reference(llm, hf_model(str(original)), PROMPT, steps=8, atol=1e-4)


def test_4bit_mlx_lm_folder_computes_the_model_on_the_values_it_holds(converted, backend):
    """The 4-bit folder against transformers on the values it stores (dequantized, under the checkpoint's names)
    with the config its folded weights mean (the float folder above checks that reading against the original)."""
    from lantern.app.models.family_falcon_h1 import folded_by_mlx_lm

    folder, ref = converted("falcon_h1", "affine")
    raw = json.loads((folder / "config.json").read_text())
    unfolded = {k: v for k, v in folded_by_mlx_lm(raw, folder).items() if not k.startswith("quantization")}
    (ref / "config.json").write_text(json.dumps({**json.loads((ref / "config.json").read_text()), **unfolded}))
    err = logits_error(str(folder), str(ref), backend)
    assert err <= tolerance(backend, str(ref)), f"{backend}: {err:.4f}"


def test_mlx_lm_folder_with_grouped_norm_is_refused(converted):
    """mlx_lm norms the mixer's output over its whole width, whatever mamba_n_groups says: such a folder
    holds neither model, so it is refused naming the key."""
    folder, _ = converted("falcon_h1_norm", None)
    with pytest.raises(UnsupportedModelError, match="mamba_n_groups"):
        resolve_model(str(folder))
