"""MLX and torch agree with each other on greedy tokens, architecture by architecture."""

from __future__ import annotations

import pytest

from lantern.app.engine import LLM, SamplingParams
from tests.conftest import ALL_VARIANTS

pytest.importorskip("mlx.core")
pytest.importorskip("torch")


# Variants whose own maths has exact ties, where which of the equal candidates each backend keeps is arbitrary
# (their tokens against transformers: tests/conformance/test_parity.py)
TIES = {
    # A.X-K2's grouped router scores the experts of unchosen groups 0, as its reference fills them: once a chosen
    # group's expert scores below 0, top-k picks among several experts at exactly 0
    "axk2_grouped",
}


@pytest.mark.parametrize("variant", [v for v in ALL_VARIANTS if v not in TIES])
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
