"""Completions with echo and logprobs, as OpenAI's legacy endpoint returns them and lm-evaluation-harness reads them
for log-likelihoods: the prompt's tokens first, each with its log-probability given the tokens before it (none for
the first) and its most likely alternatives, then the generated tokens'. Driven by the official openai client on
each backend; the numbers are transformers' log-softmax on the same tiny model."""

from __future__ import annotations

import numpy as np
import openai
import pytest
import torch

from tests.conformance.test_parity import hf_model

PROMPTS = ["Paged attention stores keys and values in blocks", "Continuous batching admits new requests"]


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused")


@pytest.fixture(scope="module")
def reference(tiny_model_dir):
    return hf_model(tiny_model_dir("llama2"))


def _assert_prompt_scored(lps, ids: list[int], tokenizer, reference) -> None:
    with torch.no_grad():
        ref = torch.log_softmax(reference(torch.tensor([ids])).logits[0], dim=-1).numpy()
    assert lps.token_logprobs[0] is None and lps.top_logprobs[0] is None
    for j in range(1, len(ids)):
        assert abs(lps.token_logprobs[j] - ref[j - 1, ids[j]]) < 1e-4, f"prompt token {j}"
        best = np.argsort(-ref[j - 1])[:3]
        assert len(lps.top_logprobs[j]) == len({tokenizer.decode([int(t)]) for t in best})
    texts = lps.tokens[: len(ids)]
    assert lps.text_offset[: len(ids)] == list(np.cumsum([0] + [len(t) for t in texts[:-1]]))


def test_echo_with_logprobs_scores_the_prompt_then_the_completion(client, server, reference):
    tok = server.engine.tokenizer
    r = client.completions.create(model="tiny", prompt=PROMPTS, max_tokens=1, temperature=0, echo=True, logprobs=3)
    for prompt, choice in zip(PROMPTS, r.choices, strict=True):
        ids = tok.encode(prompt)
        lps = choice.logprobs
        assert len(lps.tokens) == len(lps.token_logprobs) == len(ids) + 1  # (lm-eval's [ctxlen:-1] slices these)
        _assert_prompt_scored(lps, ids, tok, reference)
        with torch.no_grad():
            last = torch.log_softmax(reference(torch.tensor([ids])).logits[0, -1], dim=-1)
        assert abs(lps.token_logprobs[-1] - float(last.max())) < 1e-4  # greedy: the most likely next token
        assert choice.text.startswith(prompt)


def test_streamed_echo_carries_the_prompt_logprobs_in_its_first_chunk(client, server, reference):
    tok = server.engine.tokenizer
    kw = {"model": "tiny", "prompt": PROMPTS[0], "max_tokens": 3, "temperature": 0, "echo": True, "logprobs": 3}
    whole = client.completions.create(**kw).choices[0].logprobs
    chunks = [c for c in client.completions.create(stream=True, **kw) if c.choices and c.choices[0].logprobs]
    streamed = [lp for c in chunks for lp in c.choices[0].logprobs.token_logprobs]
    assert streamed == whole.token_logprobs and len(streamed) == len(tok.encode(PROMPTS[0])) + 3
    _assert_prompt_scored(chunks[0].choices[0].logprobs, tok.encode(PROMPTS[0]), tok, reference)


def test_echo_without_logprobs_and_logprobs_without_echo_are_unchanged(client, server):
    tok = server.engine.tokenizer
    echoed = client.completions.create(model="tiny", prompt=PROMPTS[0], max_tokens=2, temperature=0, echo=True)
    assert echoed.choices[0].logprobs is None and echoed.choices[0].text.startswith(PROMPTS[0])
    plain = client.completions.create(model="tiny", prompt=PROMPTS[0], max_tokens=2, temperature=0, logprobs=1)
    assert len(plain.choices[0].logprobs.tokens) == 2 and plain.choices[0].logprobs.token_logprobs[0] is not None
    assert plain.choices[0].logprobs.text_offset[0] == 0 and tok.encode(PROMPTS[0])
