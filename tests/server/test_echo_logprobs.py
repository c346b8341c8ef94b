"""Completions with echo and logprobs, as OpenAI's legacy endpoint returns them and lm-evaluation-harness reads them
for log-likelihoods: the prompt's tokens first, each with its log-probability given the tokens before it (none for
the first) and its most likely alternatives, then the generated tokens'. And vLLM's prompt_logprobs on completions
and chat: per prompt position the token's logprob and rank with the k most likely. Driven by the official openai
client on each backend; the numbers are transformers' log-softmax on the same tiny model."""

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


def test_echo_without_logprobs_and_logprobs_without_echo_are_unchanged(client):
    echoed = client.completions.create(model="tiny", prompt=PROMPTS[0], max_tokens=2, temperature=0, echo=True)
    assert echoed.choices[0].logprobs is None and echoed.choices[0].text.startswith(PROMPTS[0])
    plain = client.completions.create(model="tiny", prompt=PROMPTS[0], max_tokens=2, temperature=0, logprobs=1)
    assert len(plain.choices[0].logprobs.tokens) == 2 and plain.choices[0].logprobs.token_logprobs[0] is not None
    assert plain.choices[0].logprobs.text_offset[0] == 0  # (no echo: the generated text's own offsets)


def _assert_vllm_form(scored, ids: list[int], reference, k: int) -> None:
    with torch.no_grad():
        ref = torch.log_softmax(reference(torch.tensor([ids])).logits[0], dim=-1).numpy()
    assert len(scored) == len(ids) and scored[0] is None
    for j in range(1, len(ids)):
        entry, row = scored[j], ref[j - 1]
        mine = entry[str(ids[j])]
        assert abs(mine["logprob"] - row[ids[j]]) < 1e-4 and mine["rank"] == int((row >= row[ids[j]]).sum())
        best = [int(t) for t in np.argsort(-row)[:k]]
        assert set(entry) == {str(ids[j]), *map(str, best)}
        assert all(entry[str(t)]["rank"] == r for r, t in enumerate(best, start=1) if t != ids[j])


def test_vllm_prompt_logprobs_on_completions_and_chat(client, server, reference):
    tok = server.engine.tokenizer
    r = client.completions.create(
        model="tiny", prompt=PROMPTS[1], max_tokens=2, temperature=0, extra_body={"prompt_logprobs": 2}
    )
    _assert_vllm_form(r.choices[0].model_extra["prompt_logprobs"], tok.encode(PROMPTS[1]), reference, 2)
    assert r.choices[0].logprobs is None  # (logprobs not asked: only the prompt's)
    messages = [{"role": "user", "content": PROMPTS[0]}]
    chat = client.chat.completions.create(
        model="tiny", messages=messages, max_tokens=2, temperature=0, extra_body={"prompt_logprobs": 1}
    )
    scored = chat.model_extra["prompt_logprobs"]  # (top-level, as vLLM's chat response has it)
    assert len(scored) == chat.usage.prompt_tokens and scored[0] is None
    for entry in scored[1:]:  # the prompt's token (its rank) and the most likely one (rank 1)
        assert 1 <= len(entry) <= 2 and 1 in {e["rank"] for e in entry.values()}
        assert all(e["logprob"] <= 0 and e["decoded_token"] is not None for e in entry.values())


def test_prompt_logprobs_with_a_stream_or_out_of_range_is_refused_by_name(client):
    # (with echo's own logprobs beside it, an invalid prompt_logprobs is refused, not replaced)
    bad = (
        {"prompt_logprobs": 1, "stream": True},
        {"prompt_logprobs": 21},
        {"prompt_logprobs": -1, "echo": True, "logprobs": 2},
    )
    for extra in bad:
        with pytest.raises(openai.BadRequestError) as err:
            client.completions.create(model="tiny", prompt=PROMPTS[0], max_tokens=2, extra_body=extra)
        assert err.value.body["param"] == "prompt_logprobs"
