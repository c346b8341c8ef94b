"""GGUF files of GPT-2, StarCoder (GPT-BigCode), GPT-NeoX (Pythia), Falcon, OLMo (1), BLOOM and MPT, written as
llama.cpp's converter writes them (tests/fixtures/gguf_gpt_families.py: its metadata, GPT-2's matrices transposed,
GPT-NeoX's and Falcon's q/k/v regrouped, OLMo's q/k permuted), load on both backends: the config read from the
metadata is the checkpoint's, the weight stream gives the checkpoint's tensors in the model files' layout, and the
logits are transformers' on the file's values (1e-4, teacher-forced through the paged cache) with 64 greedy tokens
equal."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from lantern.app.models.loader import resolve_model
from lantern.app.models.quant.affine import AffineWeight
from lantern.app.models.spec import ModelConfig
from lantern.app.models.weight_stream import iter_weights
from tests.fixtures.gguf_gpt_families import convert_gpt_to_gguf
from tests.fixtures.teacher_forcing import assert_file_matches_folder
from tests.fixtures.tiny_models import build_model
from tests.models.quant_logits import logits_error, tolerance

# kind -> (tiny variant, config overrides, --outtype). Falcon's converter states a 2048-token context whatever the
# model's (the checkpoints say so too); it cannot convert a Falcon with biases (its q/k/v reshape takes the weight's
# shape), so the 40B shape here has none.
FILES = {
    "gpt2": ("gpt2", {"n_ctx": 256}, "f16"),  # the position table as position_embd, the tied head
    "gpt2_q8": ("gpt2", {"n_ctx": 256, "n_inner": 128}, "q8_0"),  # the position table in Q8_0 too
    "starcoder": ("gpt_bigcode", {}, "f16"),
    "gptneox": ("gpt_neox", {}, "f32"),
    "gptneox_seq": ("gpt_neox_seq", {}, "f16"),  # use_parallel_residual false
    "falcon": ("falcon", {"max_position_embeddings": 2048}, "f16"),
    "falcon_40b": ("falcon_40b", {"bias": False, "max_position_embeddings": 2048}, "f32"),
    "olmo": ("olmo1", {}, "f16"),  # q/k permuted as Llama's, clip_qkv as clamp_kqv, no norm tensors
    "bloom": ("bloom", {"seq_length": 256}, "f16"),  # ALiBi, per-head q/k/v regrouped, token_embd_norm
    "mpt": ("mpt", {"tie_word_embeddings": True}, "f16"),  # ALiBi's bias max, clamp_kqv, weight-only norms
}


@pytest.fixture(scope="module")
def gguf_file(tmp_path_factory):
    cache: dict[str, tuple[Path, Path]] = {}

    def get(kind: str) -> tuple[Path, Path]:
        if kind not in cache:
            variant, overrides, outtype = FILES[kind]
            root = tmp_path_factory.mktemp(kind)
            cache[kind] = convert_gpt_to_gguf(build_model(variant, root / "hf", **overrides), root, outtype)
        return cache[kind]

    return get


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("LANTERN_CACHE", str(tmp_path / "cache"))


@pytest.mark.parametrize("kind", list(FILES))
def test_config_and_weights_from_the_file_are_the_checkpoints(gguf_file, kind):
    path, ref = gguf_file(kind)
    loaded = resolve_model(str(path))
    expected = ModelConfig.from_hf(json.loads((ref / "config.json").read_text()))
    assert loaded.spec.config == expected
    folder = resolve_model(str(ref)).spec
    streamed = {n: _values(v) for n, v in iter_weights(loaded.spec, "pt", progress=False)}
    reference = {n: v.float().numpy() for n, v in iter_weights(folder, "pt", progress=False)}
    if expected.tie_word_embeddings:  # (transformers' folder may keep a copy of the tied head; the file does not)
        reference.pop("lm_head.weight", None)
    assert sorted(streamed) == sorted(reference)
    for name, value in streamed.items():
        np.testing.assert_array_equal(value, reference[name], err_msg=name)


def _values(value) -> np.ndarray:
    return value.dequantize() if isinstance(value, AffineWeight) else np.asarray(value, dtype=np.float32)


@pytest.mark.parametrize("kind", [k for k, (_, _, outtype) in FILES.items() if outtype != "q8_0"])
def test_logits_and_greedy_match_transformers(gguf_file, kind, backend):
    path, ref = gguf_file(kind)
    assert_file_matches_folder(path, ref, backend, kind, forced=32, greedy=64)


def test_q8_0_file_computes_within_the_quantized_kernels_bound(gguf_file, backend):
    """GPT-2 in Q8_0 (its matrices and position table): the backend's int8 path against transformers on the
    file's dequantized values, within the bound every quantized format is held to (quant_logits.tolerance)."""
    path, ref = gguf_file("gpt2_q8")
    assert logits_error(str(path), str(ref), backend) <= tolerance(backend, str(ref))
