"""GGUFs of InternLM2 / 2.5, XVERSE, Orion, Qwen (1) and MiniCPM 1 / 2 / 4 (llama.cpp's internlm2, xverse, orion,
qwen, minicpm): each written by tests/fixtures/gguf_llama_relatives.py as llama.cpp's converter writes it, from a
folder of the family whose maths it is (Llama, StableLM, Qwen2, Granite), served on both backends: logits within
1e-4 of transformers' on that folder through the paged cache, 64 greedy tokens equal."""

from __future__ import annotations

import math

import numpy as np
import pytest

from lantern.app.models.gguf_config import hf_config_from_gguf
from lantern.app.models.gguf_names import read_gguf_index
from lantern.app.models.spec import UnsupportedModelError
from tests.fixtures.gguf_llama_relatives import convert
from tests.fixtures.gguf_writer import rewrite_with
from tests.fixtures.teacher_forcing import assert_file_matches_folder
from tests.fixtures.tiny_models import build_model

# MiniCPM's scalars in a Granite folder: scale_emb 12, scale_depth 1.4 over sqrt(2 layers), queries at
# head_dim ** -0.5 (16 wide), logits divided by hidden_size / dim_model_base (64 / 16)
MINICPM = {
    "embedding_multiplier": 12.0,
    "attention_multiplier": 0.25,
    "residual_multiplier": 1.4 / math.sqrt(2),
    "logits_scaling": 4.0,
    "tie_word_embeddings": True,
}
_rng = np.random.default_rng(7)
LONGROPE = {
    "rope_type": "longrope",
    "rope_theta": 10000.0,
    "long_factor": [float(x) for x in 1.0 + 3.0 * _rng.random(8)],
    "short_factor": [float(x) for x in 1.0 + _rng.random(8)],
    "original_max_position_embeddings": 512,  # (the trained context: what the GGUF reader takes, as llama.cpp)
}
CASES = {
    "internlm2": ("llama2", {}),
    "xverse": ("llama2", {}),
    "orion": ("stablelm", {"partial_rotary_factor": 1.0, "use_qkv_bias": False}),
    # (the Qwen2 tokenizer's 401 tokens: llama.cpp's qwen wants the embedding as long as the token list)
    "qwen": ("qwen2", {"num_key_value_heads": 4, "vocab_size": 401}),
    "minicpm": ("granite", MINICPM),
    "minicpm_longrope": ("granite", {**MINICPM, "rope_parameters": LONGROPE, "max_position_embeddings": 512}),
}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("llama_relatives")
    out = {}
    for case, (variant, overrides) in CASES.items():
        src = build_model(variant, root / case, **overrides)
        out[case] = src, convert(src, root / f"tiny-{case}.gguf", case.split("_")[0])
    return out


def _config(path):
    index = read_gguf_index(str(path))
    return hf_config_from_gguf(index.metadata, {t.name: t for t in index.tensors}, path.name)


@pytest.mark.parametrize("case", list(CASES))
def test_gguf_matches_transformers(files, case, backend):
    src, path = files[case]
    assert_file_matches_folder(path, src, backend, case, forced=32, greedy=64)


def test_configs_read_as_the_family(files):
    assert _config(files["internlm2"][1])["model_type"] == "llama"
    orion = _config(files["orion"][1])
    assert (orion["model_type"], orion["rope_theta"]) == ("stablelm", 10000.0)  # (no base written: llama.cpp's)
    qwen = _config(files["qwen"][1])
    assert (qwen["intermediate_size"], qwen["num_key_value_heads"]) == (128, 4)  # half of feed_forward_length
    minicpm = _config(files["minicpm_longrope"][1])
    assert minicpm["rope_scaling"]["short_factor"] == pytest.approx(LONGROPE["short_factor"])


def test_minicpm_without_scalars_reads_minicpms_values(files, tmp_path):
    """A MiniCPM file without the three scale keys: 12, 1.4 / sqrt(layers) and hidden_size / 256 (dim_model_base
    256), what every MiniCPM shipped with; served, it computes the Granite folder holding those values."""
    src = build_model(
        "granite",
        tmp_path / "hf",
        **{**MINICPM, "logits_scaling": 64 / 256, "tie_word_embeddings": False},
    )
    path = convert(src, tmp_path / "plain.gguf", "minicpm", scalars=False)
    cfg = _config(path)
    assert (cfg["embedding_multiplier"], cfg["logits_scaling"]) == (12.0, 0.25)
    assert cfg["residual_multiplier"] == pytest.approx(1.4 / math.sqrt(2))
    assert_file_matches_folder(path, src, "torch", "minicpm without scalars", forced=16, greedy=16)


@pytest.mark.parametrize(
    "metadata,key",
    [
        ({"minicpm.expert_count": (4, "UINT32")}, "expert_count"),
        ({"minicpm.rope.scaling.original_context_length": (128, "UINT32")}, "original_context_length"),
        ({"minicpm.rope.scaling.type": ("yarn", "STRING")}, "rope.scaling.type"),
    ],
)
def test_minicpm_keys_it_does_not_implement_are_refused(files, metadata, key):
    import gguf

    typed = {k: (v, getattr(gguf.GGUFValueType, t)) for k, (v, t) in metadata.items()}
    path = rewrite_with(files["minicpm_longrope"][1], typed)
    with pytest.raises(UnsupportedModelError, match=key):
        _config(path)
