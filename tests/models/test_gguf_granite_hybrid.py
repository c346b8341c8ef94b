"""Granite 4.0-H GGUF files as llama.cpp's converter writes them (tests/fixtures/gguf_granite.py: the Mamba
layers marked by no KV heads, A as -exp(A_log), the squeezed convolution, q/k permuted, the dense shared_mlp
as ffn_* or as the _shexp tensors beside experts) and the same models as mlx_lm folders load on both backends
and compute what transformers computes on the values the file holds; the config read from the metadata
alone is the checkpoint's. Granite 3 MoE (granitemoe) and Nemotron-H (nemotron_h) GGUFs ride on the same
converter classes."""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path

import numpy as np
import pytest
import torch

from lantern.app.engine import LLM, SamplingParams
from lantern.app.models.loader import resolve_model
from lantern.app.models.quant.affine import quantize_affine
from lantern.app.models.spec import ModelConfig
from lantern.app.models.weight_stream import iter_weights
from tests.conformance.test_parity import PROMPT, hf_greedy, hf_model
from tests.fixtures.gguf_granite import convert_granite
from tests.fixtures.teacher_forcing import assert_matches_reference
from tests.fixtures.tiny_models import build_model
from tests.models.quant_logits import logits_error, reference_folder, tolerance, torch_cpu_vnni

# kind -> (tiny variant, config overrides, --outtype)
FILES = {
    "dense": ("granite_hybrid", {}, "f16"),  # NoPE attention, two B/C groups, shared_mlp as ffn_*
    "moe": ("granite_hybrid_moe", {}, "f16"),  # rope (as Bamba's files), experts beside the shared_mlp (_shexp)
    "granitemoe": ("granitemoe", {}, "f16"),  # Granite 3 MoE: GraniteMoeModel's file, q/k permuted
    "nemotron_h": ("nemotron_h", {}, "f16"),  # NemotronHModel's: a mixer, attention or a relu^2 MLP per layer
    # Nemotron 3 (nemotron_h_moe): stacked ungated experts under grouped sigmoid routing, a dense layer among them
    "nemotron_h_moe": ("nemotron_h_moe", {"n_group": 1}, "f16"),  # (the converter writes no used-group count)
    "nemotron_h_latent": ("nemotron_h_latent", {}, "f16"),  # LatentMoE: ffn_latent_down / ffn_latent_up
    # every matrix Q8_0 (rows of whole 32-blocks): the mixer's projections stay quantized too
    "moe_q8_0": ("granite_hybrid_moe", {"mamba_d_head": 32, "hidden_size": 64, "shared_intermediate_size": 64}, "q8_0"),
}


@pytest.fixture(scope="module")
def gguf_file(tmp_path_factory):
    made: dict[str, tuple[Path, Path]] = {}

    def get(kind: str) -> tuple[Path, Path]:
        if kind not in made:
            variant, overrides, outtype = FILES[kind]
            root = tmp_path_factory.mktemp(kind)
            made[kind] = convert_granite(build_model(variant, root / "hf", **overrides), root, outtype)
        return made[kind]

    return get


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("LANTERN_CACHE", str(tmp_path / "cache"))


@pytest.mark.parametrize("kind", ["dense", "moe", "granitemoe", "nemotron_h", "nemotron_h_moe", "nemotron_h_latent"])
def test_config_and_tensors_from_the_file_are_the_checkpoints(gguf_file, kind):
    path, ref = gguf_file(kind)
    spec = resolve_model(str(path)).spec
    raw = json.loads((ref / "config.json").read_text())
    expected = ModelConfig.from_hf(raw)
    if raw.get("position_embedding_type", "rope") != "rope":  # the converter states 2**20 positions for NoPE models
        expected = dataclasses.replace(expected, max_position_embeddings=2**20)
    if kind.startswith("nemotron_h"):  # NoPE too
        expected = dataclasses.replace(expected, max_position_embeddings=2**20)
    assert spec.config == expected
    # What the weight stream hands the models from the file is what it hands them from the checkpoint.
    streamed = {n: np.asarray(v, dtype=np.float32) for n, v in iter_weights(spec, "pt", progress=False)}
    held = {n: v.numpy() for n, v in iter_weights(resolve_model(str(ref)).spec, "pt", progress=False)}
    assert sorted(streamed) == sorted(held)
    for name, value in streamed.items():
        np.testing.assert_allclose(value, held[name], rtol=1e-6, atol=1e-7, err_msg=name)


@pytest.mark.parametrize("kind", ["dense", "moe", "granitemoe", "nemotron_h", "nemotron_h_moe", "nemotron_h_latent"])
def test_logits_and_greedy_match_transformers(gguf_file, kind, backend):
    path, ref = gguf_file(kind)
    llm = LLM(str(path), backend=backend, dtype="float32", block_size=4, prefill_chunk_size=8, num_kv_blocks=64)
    try:
        model = hf_model(str(ref))
        assert_matches_reference(llm, model, PROMPT, steps=16)
        ids = llm.tokenizer.encode(PROMPT)
        out = llm.generate([ids], SamplingParams(temperature=0, max_tokens=24, ignore_eos=True))
        assert out[0].outputs[0].token_ids == hf_greedy(model, ids, 24)
    finally:
        llm.engine.shutdown()


def test_partial_rope_is_refused_naming_the_key(gguf_file, tmp_path):
    """A granitehybrid file whose attention rotates part of each head (Bamba's attn_rotary_emb) is refused."""
    from lantern.app.models.gguf_config import hf_config_from_gguf
    from lantern.app.models.gguf_names import read_gguf_index
    from lantern.app.models.spec import UnsupportedModelError

    index = read_gguf_index(str(gguf_file("moe")[0]))
    tensors = {t.name: t for t in index.tensors}
    assert hf_config_from_gguf(index.metadata, tensors)["position_embedding_type"] == "rope"
    partial = {**index.metadata, "granitehybrid.rope.dimension_count": 8}
    with pytest.raises(UnsupportedModelError, match=r"rope\.dimension_count"):
        hf_config_from_gguf(partial, tensors)


def test_nemotron_3_expert_groups_need_their_used_count(gguf_file):
    """NemotronHModel writes expert_group_count but not how many groups a token may use: with more than one
    group that is refused, naming the key; with the used count stated, both reach the config."""
    from lantern.app.models.gguf_config import hf_config_from_gguf
    from lantern.app.models.gguf_names import read_gguf_index
    from lantern.app.models.spec import UnsupportedModelError

    index = read_gguf_index(str(gguf_file("nemotron_h_moe")[0]))
    tensors = {t.name: t for t in index.tensors}
    cfg = hf_config_from_gguf(index.metadata, tensors)
    assert (cfg["hybrid_override_pattern"], cfg["n_group"], cfg["routed_scaling_factor"]) == ("M-EM*E", 1, 2.5)
    grouped = {**index.metadata, "nemotron_h_moe.expert_group_count": 2}
    with pytest.raises(UnsupportedModelError, match=r"expert_group_used_count"):
        hf_config_from_gguf(grouped, tensors)
    stated = hf_config_from_gguf({**grouped, "nemotron_h_moe.expert_group_used_count": 1}, tensors)
    assert (stated["n_group"], stated["topk_group"]) == (2, 1)


def test_q8_0_file_stays_quantized_and_matches_what_the_backend_holds(gguf_file, backend, tmp_path, caplog):
    """MLX and torch's VNNI layers hold Q8_0 exactly; aten's int8pack (torch without VNNI) requantizes to
    int8 per channel (logged), so the reference holds that there."""
    path, ref = gguf_file("moe_q8_0")
    exact = backend == "mlx" or torch_cpu_vnni()
    stream = iter_weights(resolve_model(str(path)).spec, "pt", progress=False)
    blocks = {n.rsplit(".", 2)[-2] for n, v in stream if not isinstance(v, torch.Tensor)}  # what stays quantized
    assert {"in_proj", "out_proj", "q_proj", "gate_proj", "down_proj"} <= blocks, blocks

    def held(name: str, w: np.ndarray) -> np.ndarray:
        if exact or w.ndim != 2 or "norm" in name or "conv1d" in name or name.endswith("router.layer.weight"):
            return w
        return quantize_affine(w.astype(np.float32), 8, w.shape[1], symmetric=True).dequantize()

    reference = reference_folder(ref, tmp_path / "held", held)
    with caplog.at_level(logging.INFO):
        err = logits_error(str(path), str(reference), backend)
    assert err <= tolerance(backend, str(reference)), f"{backend}: {err:.4f}"
