"""GGUF files of Qwen3-Next, Qwen3.5 and Qwen3.5-MoE as llama.cpp's converter writes them
(tests/fixtures/gguf_qwen3_next.py: A as -exp(A_log), 1 + w norms, the squeezed convolution,
Qwen3-Next's split qkvz, Qwen3.5's value heads tiled) load on both backends and compute what
transformers computes on the checkpoint; the config read from the metadata is the checkpoint's."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from lantern.app.engine import LLM, SamplingParams
from lantern.app.models.loader import resolve_model
from lantern.app.models.spec import ModelConfig
from tests.conformance.test_parity import PROMPT, hf_greedy, hf_model
from tests.fixtures.gguf_qwen3_next import convert_qwen3_next
from tests.fixtures.teacher_forcing import assert_matches_reference
from tests.fixtures.tiny_models import build_model

# kind -> (tiny variant, config overrides, --outtype, converter options)
FILES = {
    "qwen3next": ("qwen3_next", {"mlp_only_layers": []}, "f16", {}),  # llama.cpp's qwen3next: every MLP sparse
    "qwen3next_ssm_in": ("qwen3_next", {"mlp_only_layers": []}, "f32", {"ssm_in": True}),  # its first files
    "qwen35": ("qwen3_5", {"linear_num_value_heads": 4}, "f32", {}),  # 2 key heads, 4 value heads: tiled
    "qwen35moe": ("qwen3_5_moe", {}, "f16", {}),
}


@pytest.fixture(scope="module")
def gguf_file(tmp_path_factory):
    made: dict[str, tuple[Path, Path]] = {}

    def get(kind: str) -> tuple[Path, Path]:
        if kind not in made:
            variant, overrides, outtype, options = FILES[kind]
            root = tmp_path_factory.mktemp(kind)
            made[kind] = convert_qwen3_next(build_model(variant, root / "hf", **overrides), root, outtype, **options)
        return made[kind]

    return get


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("LANTERN_CACHE", str(tmp_path / "cache"))


@pytest.mark.parametrize("kind", list(FILES))
def test_config_from_metadata_is_the_checkpoints(gguf_file, kind):
    path, ref = gguf_file(kind)
    ours = resolve_model(str(path)).spec.config
    expected = ModelConfig.from_hf(json.loads((ref / "config.json").read_text()))
    # Only the projections' layout differs: how llama.cpp stores them, which the model files read.
    next_ = kind.startswith("qwen3next")
    layout = {"fused_qkvz": kind == "qwen3next_ssm_in", "fused_ba": next_, "v_heads_tiled": not next_}
    expected = dataclasses.replace(expected, linear_attn=dataclasses.replace(expected.linear_attn, **layout))
    assert ours == expected


@pytest.mark.parametrize("kind", list(FILES))
def test_logits_and_greedy_match_transformers(gguf_file, kind, backend):
    path, ref = gguf_file(kind)
    llm = LLM(str(path), backend=backend, dtype="float32", block_size=4, prefill_chunk_size=8, num_kv_blocks=64)
    model = hf_model(str(ref))
    assert_matches_reference(llm, model, PROMPT, steps=16)
    prompt_ids = llm.tokenizer.encode(PROMPT)
    out = llm.generate([prompt_ids], SamplingParams(temperature=0, max_tokens=32, ignore_eos=True))
    assert out[0].outputs[0].token_ids == hf_greedy(model, prompt_ids, 32)
