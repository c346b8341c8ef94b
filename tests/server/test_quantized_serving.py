"""Quantized folders of this session's formats served over HTTP on both backends, through the official
openai SDK: a GPTQ act-order folder (each layer gathers its input), an MLX-community mxfp4 folder and a
compressed-tensors NVFP4 one (its global scale). The server's greedy tokens are transformers' greedy
tokens on the folder's dequantized weights (tests/fixtures/hf_quant_writers writes both folders), so
what is checked is the served answer itself, streamed and not."""

from __future__ import annotations

import numpy as np
import openai
import pytest
import torch
from transformers import AutoTokenizer

from tests.conformance.test_parity import hf_model
from tests.fixtures.hf_quant_writers import writer
from tests.server.conftest import BACKENDS, start_server

KINDS = ["gptq_act", "mlx_mxfp4", "ct_nvfp4"]
PROMPTS = [[5, 17, 42, 99, 7, 250, 13], [300, 12, 8, 77], [64, 65, 66, 67, 68, 69], [201, 3, 150, 150, 9]]
STEPS = 6


@pytest.fixture(scope="module", params=KINDS)
def folders(request, tmp_path_factory):
    return writer(request.param, tmp_path_factory.mktemp(request.param))


def reference_tokens(ref: str) -> tuple[list[int], list[int], float]:
    """Of PROMPTS, the one whose greedy continuation (transformers on the dequantized weights) is
    furthest from a tie: (prompt, tokens, the smallest gap between the chosen logit and the
    runner-up over its steps, in units of the logits' spread). A near tie could flip either way.
    The check is on text: a lone UTF-8 continuation byte decodes to U+FFFD whichever it is, so a
    token of that kind is only checked through the tokens after it (the gap makes a flip unlikely)."""
    hf = hf_model(ref)
    hf.generation_config.eos_token_id = None
    best: tuple[list[int], list[int], float] = ([], [], -1.0)
    for prompt in PROMPTS:
        with torch.no_grad():
            out = hf.generate(torch.tensor([prompt]), max_new_tokens=STEPS, do_sample=False, pad_token_id=0)
            tokens = out[0, len(prompt) :].tolist()
            logits = hf(torch.tensor([prompt + tokens])).logits[0, len(prompt) - 1 : -1].numpy()
        top2 = np.sort(logits, axis=-1)[:, -2:]
        gap = float(((top2[:, 1] - top2[:, 0]) / logits.std(axis=-1)).min())
        if gap > best[2]:
            best = (prompt, tokens, gap)
    return best


@pytest.mark.parametrize("backend", BACKENDS)
def test_served_greedy_tokens_are_the_reference_ones(folders, backend):
    quant, ref = folders
    prompt, want, gap = reference_tokens(str(ref))
    assert gap > 0.02, gap  # torch/CPU's kernels take bf16 activations (~1% of the spread here)
    server = start_server(str(quant), backend=backend)
    try:
        client = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0)
        args = dict(model="tiny", prompt=prompt, max_tokens=STEPS, temperature=0, extra_body={"ignore_eos": True})
        done = client.completions.create(**args)
        streamed = client.completions.create(**args, stream=True)
        text = "".join(chunk.choices[0].text for chunk in streamed if chunk.choices)
    finally:
        server.stop()
    choice = done.choices[0]
    assert choice.finish_reason == "length" and done.usage.completion_tokens == STEPS
    assert text == choice.text
    # The same tokens: their text, less trailing bytes of an unfinished UTF-8 character (held back)
    expected = AutoTokenizer.from_pretrained(str(quant)).decode(want, skip_special_tokens=True)
    assert choice.text == expected.rstrip("\ufffd")
