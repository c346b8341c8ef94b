"""MLX and torch agree with each other on greedy tokens, architecture by architecture."""

from __future__ import annotations

import pytest

from lantern.app.engine import LLM, SamplingParams
from tests.conftest import ALL_VARIANTS

pytest.importorskip("mlx.core")
pytest.importorskip("torch")


@pytest.mark.parametrize("variant", ALL_VARIANTS)
def test_backends_agree_on_greedy_tokens(tiny_model_dir, variant):
    path = tiny_model_dir(variant)
    params = SamplingParams(temperature=0, max_tokens=48, ignore_eos=True)
    prompts = ["Continuous batching lets new requests join", "def add(a, b):"]
    outs = {
        b: [
            o.outputs[0].token_ids
            for o in LLM(path, backend=b, dtype="float32", block_size=4, num_kv_blocks=128).generate(prompts, params)
        ]
        for b in ("mlx", "torch")
    }
    assert outs["mlx"] == outs["torch"]
