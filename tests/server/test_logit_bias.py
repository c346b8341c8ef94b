"""`logit_bias` is honoured through the API on both backends: +100 on a token makes it the only
choice (greedy or sampled), -100 on the greedy token makes the runner-up win, and a biased
request in the same batch as an unbiased one leaves the other's output alone. Token texts are
checked against the model's own tokenizer loaded with transformers."""

from __future__ import annotations

import asyncio

import openai
import pytest
from transformers import AutoTokenizer

PROMPT = "Paged attention stores keys and"


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def tok(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir("llama2"))


def ids_of(tok, text: str) -> list[int]:
    """Every token id whose text is `text` (logprobs report token texts, not ids)."""
    return [i for i in range(len(tok)) if tok.decode([i]) == text]


def pick_token(tok, avoid: set[str]) -> int:
    """An ordinary token (not special, its text unique in the vocabulary) other than `avoid`."""
    special = set(tok.all_special_ids)
    for i in range(len(tok) - 1, 0, -1):
        text = tok.decode([i])
        if i not in special and text.strip() and text not in avoid and ids_of(tok, text) == [i]:
            return i
    raise AssertionError("no ordinary token in the vocabulary")


def greedy(client, **kw):
    return client.completions.create(model="tiny", prompt=PROMPT, temperature=0, **kw).choices[0]


def test_minus_100_on_the_greedy_token_lets_the_runner_up_win(client, tok):
    first = greedy(client, max_tokens=1, logprobs=2)
    top = first.logprobs.top_logprobs[0]
    best, runner_up = sorted(top, key=top.get, reverse=True)
    assert first.logprobs.tokens[0] == best
    banned = ids_of(tok, best)
    assert banned
    second = greedy(client, max_tokens=1, logprobs=2, logit_bias={str(t): -100 for t in banned})
    assert second.logprobs.tokens[0] == runner_up != best


def test_plus_100_forces_a_token_greedy_sampled_and_in_chat(client, tok):
    plain = greedy(client, max_tokens=4, logprobs=0)
    forced = pick_token(tok, set(plain.logprobs.tokens))
    bias = {str(forced): 100}
    r = greedy(client, max_tokens=4, logprobs=0, logit_bias=bias)
    assert r.logprobs.tokens == [tok.decode([forced])] * 4
    assert r.text == tok.decode([forced] * 4) and r.finish_reason == "length"
    sampled = client.completions.create(
        model="tiny", prompt=PROMPT, temperature=1.0, seed=7, n=3, max_tokens=4, logit_bias=bias
    )
    assert [c.text for c in sampled.choices] == [tok.decode([forced] * 4)] * 3
    msg = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=3, temperature=0, logit_bias=bias
    )
    assert msg.choices[0].message.content == tok.decode([forced] * 3)


def test_bias_stays_with_its_request_in_a_shared_batch(server, client, tok):
    plain = greedy(client, max_tokens=12).text
    forced = pick_token(tok, set())

    async def run():
        aclient = openai.AsyncOpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0)
        kw = {"model": "tiny", "prompt": PROMPT, "temperature": 0, "max_tokens": 12}
        results = await asyncio.gather(
            *(aclient.completions.create(**kw, logit_bias={str(forced): 100} if i % 2 else None) for i in range(6))
        )
        await aclient.close()
        return [r.choices[0].text for r in results]

    texts = asyncio.run(run())
    assert texts[0::2] == [plain] * 3
    assert texts[1::2] == [tok.decode([forced] * 12)] * 3
