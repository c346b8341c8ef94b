"""Models with recurrent layers (Qwen3-Next's linear attention, Granite 4.0-H's, Nemotron-H's and Falcon-H1's
Mamba-2 mixers, Mamba's Mamba-1 mixers and RWKV-7's mixes (with RWKV's World tokenizer) with no KV cache at all: a
state per sequence beside the paged KV cache)
served through the real server and the official openai client, on both backends: concurrent streams, more of them
than state slots, give what each request gives alone; a client that leaves mid-stream gives its slot back and
leaves nothing behind for the next request; a follow-up turn starts from the prefix cache's snapshot of the state
and answers as if computed afresh."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest

from tests.server.conftest import start_server

PROMPTS = [
    "Continuous batching lets new requests join",
    "def add(a, b):",
    "Paged attention stores keys and values in blocks",
    "Numbers 0123456789",
    "The quick brown fox",
    "Lantern serves language models",
]


@pytest.fixture(
    scope="module", params=["qwen3_next", "granite_hybrid_moe", "nemotron_h_moe", "falcon_h1", "mamba", "rwkv7"]
)
def hybrid_server(tiny_model_dir, tmp_path_factory, backend, request):
    threads = {"num_threads": 1} if backend == "torch" else {}
    if request.param == "rwkv7":  # (no transformers class: the tests' own folder, with the World vocabulary cut)
        from tests.models.test_rwkv7 import rwkv7_folder

        path = rwkv7_folder(tmp_path_factory.mktemp("rwkv7"), world=2000)
    else:
        path = tiny_model_dir(request.param)
    # 4 slots for 6 concurrent requests: some wait, then take a slot another sequence just gave back.
    srv = start_server(path, backend=backend, max_num_seqs=4, prefill_chunk_size=8, **threads)
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(hybrid_server):
    return openai.OpenAI(base_url=f"{hybrid_server.base_url}/v1", api_key="unused", max_retries=0)


def _alone(client, prompt: str) -> str:
    return client.completions.create(model="tiny", prompt=prompt, max_tokens=24, temperature=0).choices[0].text


def _streamed(client, prompt: str) -> str:
    stream = client.completions.create(model="tiny", prompt=prompt, max_tokens=24, temperature=0, stream=True)
    return "".join(chunk.choices[0].text for chunk in stream if chunk.choices)


def _slots_back(server, timeout: float = 10.0) -> bool:
    scheduler = server.engine._engine.scheduler  # (test-only peek at the engine thread's scheduler)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not scheduler.has_work and len(scheduler.free_state_slots) == scheduler.config.state_slots:
            return True
        time.sleep(0.05)
    return False


def test_concurrent_streams_equal_each_request_alone(client, hybrid_server):
    alone = [_alone(client, p) for p in PROMPTS]
    assert len(set(alone)) == len(alone), "degenerate model: every prompt should continue differently"
    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        together = list(pool.map(lambda p: _streamed(client, p), PROMPTS))
    assert together == alone
    assert _slots_back(hybrid_server)


def test_a_client_leaving_mid_stream_gives_its_state_slot_back(client, hybrid_server):
    before = _alone(client, PROMPTS[0])
    stream = client.completions.create(model="tiny", prompt=PROMPTS[1], max_tokens=200, temperature=0, stream=True)
    for i, _ in enumerate(stream):
        if i == 3:
            break
    stream.close()
    assert _slots_back(hybrid_server), "the abandoned request still holds its recurrent-state slot"
    assert _alone(client, PROMPTS[0]) == before


def test_a_follow_up_turn_is_served_from_the_prefix_cache_and_answers_as_computed_afresh(client):
    """Turn 2 extends turn 1's prompt and reply; the server reports the cached prompt tokens (the recurrent
    state restored from the snapshot at turn 1's last block boundary), and its answer is the one a request
    under another cache_salt gets, which no cached prefix serves."""
    first = "Paged attention stores keys and values in blocks, so continuous batching lets new requests join"
    reply = client.completions.create(model="tiny", prompt=first, max_tokens=12, temperature=0)
    n = reply.usage.prompt_tokens
    follow_up = first + reply.choices[0].text + " and then"
    cached = client.completions.create(model="tiny", prompt=follow_up, max_tokens=12, temperature=0)
    afresh = client.completions.create(
        model="tiny", prompt=follow_up, max_tokens=12, temperature=0, extra_body={"cache_salt": "afresh"}
    )
    assert cached.usage.prompt_tokens_details.cached_tokens >= (n - 1) // 4 * 4 > 0
    assert afresh.usage.prompt_tokens_details.cached_tokens == 0
    assert cached.choices[0].text == afresh.choices[0].text
