"""Gemma 4 (KV pool layers of two shapes, the last layers reading earlier layers' K/V, sliding windows
shorter than the prompts) served through the real server and the official openai client on both
backends, the pool sized from memory: concurrent chat streams give what each request gives alone, and
a prompt served from the prefix cache (whose shared layers read cached blocks of their source layers)
gives what it gives uncached."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import openai
import pytest

from tests.server.conftest import start_server

SYSTEM = "You answer briefly. Paged attention stores keys and values in blocks of a shared pool."
QUESTIONS = [
    "Continuous batching lets new requests join",
    "def add(a, b):",
    "Numbers 0123456789",
    "The quick brown fox",
    "Lantern serves language models",
]


@pytest.fixture(scope="module")
def gemma4_server(tiny_model_dir, backend):
    threads = {"num_threads": 1} if backend == "torch" else {}
    srv = start_server(
        tiny_model_dir("gemma4"), backend=backend, num_kv_blocks=None, max_num_seqs=4, prefill_chunk_size=8, **threads
    )
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(gemma4_server):
    return openai.OpenAI(base_url=f"{gemma4_server.base_url}/v1", api_key="unused", max_retries=0)


def _chat(client, question: str, stream: bool = False) -> tuple[str, int]:
    """(the answer, prompt tokens served from the cache)."""
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]
    if not stream:
        out = client.chat.completions.create(model="tiny", messages=messages, max_tokens=20, temperature=0)
        details = out.usage.prompt_tokens_details
        return out.choices[0].message.content, (details.cached_tokens if details else 0) or 0
    chunks = client.chat.completions.create(model="tiny", messages=messages, max_tokens=20, temperature=0, stream=True)
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices), 0


def test_concurrent_streams_equal_each_request_alone(client):
    alone = [_chat(client, q)[0] for q in QUESTIONS]
    assert len(set(alone)) == len(alone), "degenerate model: every question should be answered differently"
    with ThreadPoolExecutor(len(QUESTIONS)) as pool:
        together = [text for text, _ in pool.map(lambda q: _chat(client, q, stream=True), QUESTIONS)]
    assert together == alone


def test_prefix_cached_prompt_answers_as_uncached(client):
    first, _ = _chat(client, "Caf\u00e9 na\u00efve r\u00e9sum\u00e9")
    again, cached = _chat(client, "Caf\u00e9 na\u00efve r\u00e9sum\u00e9")
    assert cached >= 16, "the repeated prompt should come from the prefix cache"
    assert again == first
