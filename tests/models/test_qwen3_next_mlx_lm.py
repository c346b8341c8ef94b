"""Qwen3-Next folders made by mlx_lm (mlx-community's layout): convolution weights [C, K, 1], norms stored
as 1 + weight, experts stacked in switch_mlp, 8-bit routers. Read back on both backends: the float
conversion computes what transformers computes on the original model, the 4-bit one what mlx_lm
itself computes on the folder."""

from __future__ import annotations

from pathlib import Path

import pytest

from lantern.app.engine import LLM
from tests.fixtures.teacher_forcing import assert_matches_reference, mlx_lm_error

pytest.importorskip("mlx_lm")

PROMPT = "Paged attention stores keys and values in blocks, while continuous batching"


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    from tests.fixtures.mlx_lm_folders import convert

    made: dict[str, tuple[Path, Path]] = {}

    def get(mode: str | None) -> tuple[Path, Path]:
        if mode not in made:
            made[mode] = convert("qwen3_next", tmp_path_factory.mktemp(f"q3n-{mode}"), mode=mode)
        return made[mode]

    return get


def test_float_mlx_lm_folder_equals_the_original_model(converted, backend):
    import torch
    from transformers import AutoModelForCausalLM

    folder, _ = converted(None)
    original = folder.parent / "qwen3_next-float"
    assert (folder / "model.safetensors").exists() and original.is_dir()
    llm = LLM(str(folder), backend=backend, dtype="float32", block_size=4, prefill_chunk_size=8, num_kv_blocks=64)
    ref = AutoModelForCausalLM.from_pretrained(original, dtype=torch.float32).eval()
    assert_matches_reference(llm, ref, PROMPT, steps=8, atol=1e-4)


def test_4bit_mlx_lm_folder_computes_what_mlx_lm_computes(converted, backend):
    folder, _ = converted("affine")
    llm = LLM(str(folder), backend=backend, dtype="float32", block_size=4, prefill_chunk_size=8, num_kv_blocks=64)
    worst, scale = mlx_lm_error(llm, folder, PROMPT, [5, 17, 42, 99, 7, 3])
    print(f"{backend}: worst |diff| {worst:.2e} of logits up to {scale:.1f}")
    assert worst < (2e-3 if backend == "mlx" else 2e-2) * scale  # torch: activations in bf16 in its int4 kernel
