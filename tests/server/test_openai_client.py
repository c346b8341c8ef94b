"""The server driven by the official openai client: sync, async, streaming, n, logprobs, seeds, stops."""

from __future__ import annotations

import asyncio

import openai
import pytest

from lantern.app.engine import LLM, SamplingParams

MSG = [{"role": "user", "content": "Tell me about paged attention."}]


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused")


def test_models_and_chat(client):
    assert [m.id for m in client.models.list().data] == ["tiny"]
    r = client.chat.completions.create(model="tiny", messages=MSG, max_tokens=10, temperature=0)
    assert r.object == "chat.completion" and r.model == "tiny" and r.id.startswith("chatcmpl-")
    choice = r.choices[0]
    assert choice.message.role == "assistant" and choice.message.content
    assert choice.finish_reason in ("stop", "length")
    assert r.usage.completion_tokens <= 10 and r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_cached_tokens_count_the_shared_prefix(client):
    """A prompt seen before is served from the prefix cache: whole 4-token blocks, never the
    last prompt token (its logits must be computed). A new prompt gets no cached tokens."""
    prompt = "Zebras quietly cache me, please: nobody sent this before."  # no chat template prefix
    first = client.completions.create(model="tiny", prompt=prompt, max_tokens=2, temperature=0)
    again = client.completions.create(model="tiny", prompt=prompt, max_tokens=2, temperature=0)
    n = first.usage.prompt_tokens
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    assert again.usage.prompt_tokens_details.cached_tokens == (n - 1) // 4 * 4
    # A request's cache_salt keeps its blocks apart from unsalted and differently salted ones
    # (each salted request comes right after the blocks it must not see were cached).
    salted = [
        client.completions.create(
            model="tiny", prompt=prompt, max_tokens=2, temperature=0, extra_body={"cache_salt": salt}
        )
        for salt in ("s1", "s1", "s2")
    ]
    assert [r.usage.prompt_tokens_details.cached_tokens for r in salted] == [0, (n - 1) // 4 * 4, 0]


def test_streaming_matches_non_streaming(client):
    kw = {"model": "tiny", "messages": MSG, "max_tokens": 12, "temperature": 0}
    full = client.chat.completions.create(**kw)
    chunks = list(client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kw))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert text == full.choices[0].message.content
    assert finishes == [full.choices[0].finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == full.usage.completion_tokens


def test_async_client_n_samples_and_seed(server):
    async def run():
        aclient = openai.AsyncOpenAI(base_url=f"{server.base_url}/v1", api_key="unused")
        kw = {"model": "tiny", "messages": MSG, "max_tokens": 12, "temperature": 1.0, "seed": 42, "n": 3}
        a = await aclient.chat.completions.create(**kw)
        b = await aclient.chat.completions.create(**kw)
        await aclient.close()
        return a, b

    a, b = asyncio.run(run())
    assert [c.index for c in a.choices] == [0, 1, 2]
    assert [c.message.content for c in a.choices] == [c.message.content for c in b.choices]
    assert len({c.message.content for c in a.choices}) > 1
    assert 3 <= a.usage.completion_tokens <= 36  # summed over the three choices


def test_chat_logprobs(client):
    r = client.chat.completions.create(
        model="tiny", messages=MSG, max_tokens=5, temperature=0, logprobs=True, top_logprobs=3
    )
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens
    for entry in content:
        assert entry.logprob <= 0 and len(entry.top_logprobs) == 3
        # Greedy: the chosen token is the most likely one.
        assert abs(entry.top_logprobs[0].logprob - entry.logprob) < 1e-5


def test_completions_prompt_forms_echo_and_stop(client, server):
    tok = server.engine.tokenizer
    one = client.completions.create(model="tiny", prompt="Lantern serves", max_tokens=8, temperature=0)
    ids = client.completions.create(model="tiny", prompt=tok.encode("Lantern serves"), max_tokens=8, temperature=0)
    assert one.choices[0].text == ids.choices[0].text
    many = client.completions.create(
        model="tiny", prompt=["Lantern serves", "The quick"], max_tokens=8, temperature=0, n=2
    )
    assert [c.index for c in many.choices] == [0, 1, 2, 3]
    assert many.choices[0].text == one.choices[0].text
    echo = client.completions.create(
        model="tiny", prompt="Lantern serves", max_tokens=4, temperature=0, echo=True, logprobs=2
    )
    assert echo.choices[0].text.startswith("Lantern serves")
    n = len(tok.encode("Lantern serves"))  # the prompt's tokens first (tests/server/test_echo_logprobs.py), then 4
    assert len(echo.choices[0].logprobs.tokens) == n + 4 and echo.choices[0].logprobs.token_logprobs[0] is None
    text = one.choices[0].text
    stop = text[3:5]
    cut = client.completions.create(model="tiny", prompt="Lantern serves", max_tokens=8, temperature=0, stop=[stop])
    assert cut.choices[0].text == text[: text.find(stop)] and cut.choices[0].finish_reason == "stop"


def test_32_concurrent_streams_match_offline_generate(server, tiny_model_dir, backend):
    prompts = [f"Request number {i} asks about continuous batching" for i in range(32)]

    async def one(aclient, prompt):
        stream = await aclient.chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": prompt}],
            max_tokens=16,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
        text, usage = "", None
        async for chunk in stream:
            if chunk.choices:
                text += chunk.choices[0].delta.content or ""
            if chunk.usage:
                usage = chunk.usage
        return text, usage

    async def run():
        aclient = openai.AsyncOpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0)
        results = await asyncio.gather(*(one(aclient, p) for p in prompts))
        await aclient.close()
        return results

    results = asyncio.run(run())
    llm = LLM(tiny_model_dir("llama2"), backend=backend, dtype="float32", block_size=4, num_kv_blocks=1024)
    offline = llm.chat(
        [[{"role": "user", "content": p}] for p in prompts], SamplingParams(temperature=0, max_tokens=16)
    )
    for (text, usage), ref in zip(results, offline):
        assert text == ref.outputs[0].text
        assert usage.completion_tokens == len(ref.outputs[0].token_ids)
        assert usage.prompt_tokens == len(ref.prompt_token_ids)
