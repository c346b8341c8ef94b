"""GGUF files of Mamba, Falcon-Mamba, Mamba-2 and Jamba, written as llama.cpp's converter writes them
(tests/fixtures/gguf_mamba.py), load on both backends: the config read from the metadata is the checkpoint's, the
weight stream gives the checkpoint's tensors (A_log back from -exp(A_log), the convolution unsqueezed), and the
logits are transformers' on the file's values (1e-4, teacher-forced through the paged cache) with 32 greedy tokens
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
from tests.fixtures.gguf_mamba import convert_mamba
from tests.fixtures.teacher_forcing import assert_file_matches_folder
from tests.fixtures.tiny_models import build_model

FILES = {
    "mamba": ("mamba", "f32"),
    "falcon_mamba": ("falcon_mamba", "f16"),
    "mamba2": ("mamba2", "f16"),
    "jamba": ("jamba", "f32"),  # KV heads per layer, experts stacked, the mixer's weighted norms
}


@pytest.fixture(scope="module")
def gguf_file(tmp_path_factory):
    cache: dict[str, tuple[Path, Path]] = {}

    def get(kind: str) -> tuple[Path, Path]:
        if kind not in cache:
            variant, outtype = FILES[kind]
            root = tmp_path_factory.mktemp(kind)
            cache[kind] = convert_mamba(build_model(variant, root / "hf"), root, outtype)
        return cache[kind]

    return get


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("LANTERN_CACHE", str(tmp_path / "cache"))


def _values(value) -> np.ndarray:
    return value.dequantize() if isinstance(value, AffineWeight) else np.asarray(value, dtype=np.float32)


@pytest.mark.parametrize("kind", list(FILES))
def test_config_and_weights_from_the_file_are_the_checkpoints(gguf_file, kind):
    path, ref = gguf_file(kind)
    loaded = resolve_model(str(path))
    expected = ModelConfig.from_hf(json.loads((ref / "config.json").read_text()))
    assert loaded.spec.config == expected
    streamed = {n: _values(v) for n, v in iter_weights(loaded.spec, "pt", progress=False)}
    folder = resolve_model(str(ref)).spec
    reference = {n: v.float().numpy() for n, v in iter_weights(folder, "pt", progress=False)}
    if expected.tie_word_embeddings:
        reference.pop("lm_head.weight", None)
    assert sorted(streamed) == sorted(reference)
    for name, value in streamed.items():
        np.testing.assert_allclose(value.reshape(reference[name].shape), reference[name], rtol=1e-6, err_msg=name)


@pytest.mark.parametrize("kind", list(FILES))
def test_logits_and_greedy_match_transformers(gguf_file, kind, backend):
    path, ref = gguf_file(kind)
    assert_file_matches_folder(path, ref, backend, kind, forced=16, greedy=32)
