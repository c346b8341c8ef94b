"""A request that fails inside the engine: a stream ends with an error event and then [DONE] (never
a cut connection), a non-streaming request gets the error envelope (500 for an engine fault, 503
for a dead engine), and other clients' requests carry on.

There is no natural way to make the engine fail one chosen request, so a test double wraps the
real `AsyncEngine.generate` (monkeypatched on the server's engine instance): requests carrying
the marker seed run for real and then raise the given exception after `after` outputs; every other
request is untouched. What is tested is the server's handling of the engine's documented errors.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable

import httpx
import openai
import pytest

from lantern.app.engine import EngineDeadError, RequestFailedError

CHAT = "/v1/chat/completions"
MARK = 424242  # the seed that makes the double fail a request


def chat(**fields) -> dict:
    return {
        "model": "tiny",
        "messages": [{"role": "user", "content": "Tell me about paged attention."}],
        "max_tokens": 40,
        "ignore_eos": True,
        "temperature": 0,
        **fields,
    }


def inject(monkeypatch, server, make_error: Callable[[], Exception], after: int = 2) -> None:
    real = server.engine.generate

    async def generate(prompt, params, request_id=None, prompt_token_ids=None, cache_salt=None, validated=False):
        async with contextlib.aclosing(
            real(
                prompt,
                params,
                request_id,
                prompt_token_ids=prompt_token_ids,
                cache_salt=cache_salt,
                validated=validated,
            )
        ) as outputs:
            n = 0
            async for out in outputs:
                if params.seed == MARK and n >= after:
                    raise make_error()
                n += 1
                yield out

    monkeypatch.setattr(server.engine, "generate", generate)


def stream_events(client: httpx.Client, path: str, body: dict) -> list[str]:
    """Every `data:` payload of a stream read to its end (an unclean end raises in httpx)."""
    with client.stream("POST", path, json={**body, "stream": True}) as r:
        assert r.status_code == 200
        return [line[6:] for line in r.iter_lines() if line.startswith("data: ")]


def wait_idle(server, deadline_s: float = 10.0) -> dict:
    end = time.monotonic() + deadline_s
    while True:
        stats = server.engine.stats()
        if stats["num_running"] == 0 and stats["num_waiting"] == 0 and stats["kv_usage"] == 0:
            return stats
        assert time.monotonic() < end, stats
        time.sleep(0.02)


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.base_url, timeout=60) as c:
        yield c


@pytest.mark.parametrize(
    "make_error,status_type,code,text",
    [
        (lambda: RequestFailedError("injected fault"), "internal_error", "request_failed", "injected fault"),
        (lambda: EngineDeadError("injected death"), "service_unavailable", "engine_dead", "injected death"),
        (lambda: RuntimeError("a bug in the server"), "internal_error", None, "internal server error"),
    ],
)
@pytest.mark.parametrize("after", [0, 3])
def test_failed_stream_ends_with_error_event_then_done(
    server, http, monkeypatch, make_error, status_type, code, text, after
):
    inject(monkeypatch, server, make_error, after=after)
    data = stream_events(http, CHAT, chat(seed=MARK))
    assert data[-1] == "[DONE]" and data.count("[DONE]") == 1
    *chunks, error = [json.loads(d) for d in data[:-1]]
    assert error["error"]["type"] == status_type and error["error"]["code"] == code
    assert text in error["error"]["message"]
    assert all("error" not in c for c in chunks)
    contents = [c["choices"][0]["delta"].get("content") for c in chunks]
    assert contents[0] == ""  # the role chunk
    assert len([c for c in contents[1:] if c]) <= after  # nothing after the failure
    wait_idle(server)  # the failed request's sequence and KV blocks are gone


def test_openai_client_raises_on_the_error_event(server, monkeypatch):
    inject(monkeypatch, server, lambda: RequestFailedError("injected fault"))
    client = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0)
    body = chat(seed=MARK)
    stream = client.chat.completions.create(stream=True, extra_body={"ignore_eos": body.pop("ignore_eos")}, **body)
    with pytest.raises(openai.APIError, match="injected fault"):
        for _ in stream:
            pass


@pytest.mark.parametrize(
    "make_error,status,code",
    [
        (lambda: RequestFailedError("injected fault"), 500, "request_failed"),
        (lambda: EngineDeadError("injected death"), 503, "engine_dead"),
        (lambda: RuntimeError("a bug in the server"), 500, None),
    ],
)
def test_failed_non_streaming_request_gets_envelope_and_keeps_connection(
    server, http, monkeypatch, make_error, status, code
):
    inject(monkeypatch, server, make_error)
    r = http.post(CHAT, json=chat(seed=MARK))
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["code"] == code and err["message"]
    assert r.headers.get("connection", "").lower() != "close"
    # The keep-alive connection survives the error: the next request rides the same one.
    ok = http.post(CHAT, json=chat(max_tokens=2))
    assert ok.status_code == 200
    assert ok.extensions["network_stream"] is r.extensions["network_stream"]
    wait_idle(server)


def test_failing_stream_does_not_cut_a_concurrent_one(server, http, monkeypatch):
    """Two streams in flight together; the engine fails one. The other ends intact and equal to
    the same request answered alone."""
    reference = http.post(CHAT, json=chat(max_tokens=60)).json()["choices"][0]["message"]["content"]
    inject(monkeypatch, server, lambda: RequestFailedError("injected fault"), after=5)

    async def read(client: httpx.AsyncClient, body: dict) -> list[dict | str]:
        out: list[dict | str] = []
        async with client.stream("POST", CHAT, json={**body, "stream": True}) as r:
            async for line in r.aiter_lines():
                if line.startswith("data: "):
                    out.append(line[6:] if line == "data: [DONE]" else json.loads(line[6:]))
        return out

    async def run():
        async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as client:
            return await asyncio.gather(read(client, chat(max_tokens=60)), read(client, chat(seed=MARK)))

    innocent, failed = asyncio.run(run())
    assert failed[-1] == "[DONE]" and "error" in failed[-2]
    assert innocent[-1] == "[DONE]" and not any(isinstance(c, dict) and "error" in c for c in innocent)
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in innocent[:-1])
    assert text == reference
    wait_idle(server)


def test_completion_stream_over_several_prompts_fails_cleanly(server, http, monkeypatch):
    inject(monkeypatch, server, lambda: RequestFailedError("injected fault"), after=1)
    body = {
        "model": "tiny",
        "prompt": ["one", "two", "three"],
        "max_tokens": 30,
        "ignore_eos": True,
        "temperature": 0,
        "seed": MARK,
    }
    data = stream_events(http, "/v1/completions", body)
    assert data[-1] == "[DONE]"
    assert json.loads(data[-2])["error"]["code"] == "request_failed"
    wait_idle(server)  # the sibling prompts' requests were aborted too


def test_dead_engine_is_503_before_a_stream_starts(server, http, monkeypatch):
    """Once the engine loop has stopped, a new request (stream or not) is answered 503 at once,
    with the cause, instead of a 200 whose stream then fails. (The dead state is the engine's
    `dead_reason`, patched here: killing the shared test engine would end the module.)"""
    monkeypatch.setattr(type(server.engine), "dead_reason", property(lambda self: "injected death"))
    for stream in (False, True):
        r = http.post(CHAT, json=chat(stream=stream))
        assert r.status_code == 503, r.text
        err = r.json()["error"]
        assert err["code"] == "engine_dead" and "injected death" in err["message"]
