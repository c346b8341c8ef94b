"""Error envelopes, auth, capacity, disconnects and /metrics, with raw httpx."""

from __future__ import annotations

import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from lantern.server.app import ServerSettings
from tests.server.conftest import start_server

CHAT = "/v1/chat/completions"
OK_MSG = [{"role": "user", "content": "hello"}]


def assert_error(r: httpx.Response, status: int, param: str | None = None) -> dict:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    if param is not None:
        assert err["param"] == param, err
    return err


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.base_url, timeout=60) as c:
        yield c


@pytest.mark.parametrize(
    "body,param",
    [
        ({"model": "tiny", "messages": OK_MSG, "temperature": -0.5}, "temperature"),
        ({"model": "tiny", "messages": OK_MSG, "top_p": 1.5}, "top_p"),
        ({"model": "tiny", "messages": OK_MSG, "n": 0}, "n"),
        ({"model": "tiny", "messages": OK_MSG, "max_tokens": -3}, "max_tokens"),
        ({"model": "tiny", "messages": OK_MSG, "top_logprobs": 50, "logprobs": True}, "top_logprobs"),
        ({"model": "tiny", "messages": []}, "messages"),
        ({"model": "tiny", "messages": [{"role": "wizard", "content": "x"}]}, "messages.0.role"),
        ({"model": "tiny", "messages": OK_MSG, "temperature": "hot"}, "temperature"),
        ({"model": "tiny"}, "messages"),
    ],
)
def test_invalid_values_are_400_naming_the_field(http, body, param):
    assert_error(http.post(CHAT, json=body), 400, param)


def test_malformed_json_and_unknown_model_and_long_prompt(http):
    err = assert_error(http.post(CHAT, content=b"{not json", headers={"content-type": "application/json"}), 400)
    assert "JSON" in err["message"]
    assert_error(http.post(CHAT, json={"model": "gpt-9", "messages": OK_MSG}), 404, "model")
    long = {"model": "tiny", "messages": [{"role": "user", "content": "lorem ipsum " * 400}]}
    err = assert_error(http.post(CHAT, json=long), 400, "messages")
    assert err["code"] == "context_length_exceeded"
    err = assert_error(http.post("/v1/completions", json={"model": "tiny", "prompt": [1, 2, 10**9]}), 400, "prompt")
    assert_error(http.post("/v1/completions", json={"model": "tiny", "prompt": []}), 400, "prompt")
    # Unknown extra fields are ignored, as OpenAI clients send new ones.
    r = http.post(CHAT, json={"model": "tiny", "messages": OK_MSG, "max_tokens": 2, "brand_new_field": {"x": 1}})
    assert r.status_code == 200


def test_tokenize_detokenize_roundtrip(http, tiny_model_dir):
    from transformers import AutoTokenizer

    reference = AutoTokenizer.from_pretrained(tiny_model_dir("llama2"))
    r = http.post("/tokenize", json={"model": "tiny", "prompt": "Paged attention"})
    ids = r.json()["tokens"]
    assert ids == reference.encode("Paged attention")
    assert http.post("/detokenize", json={"model": "tiny", "tokens": ids}).json()["prompt"].endswith("Paged attention")
    assert_error(http.post("/detokenize", json={"tokens": [-1]}), 400, "tokens")
    chat = http.post("/tokenize", json={"messages": OK_MSG}).json()
    assert chat["count"] == len(chat["tokens"]) > 3


def scrape(http) -> dict[str, float]:
    values = {}
    for family in text_string_to_metric_families(http.get("/metrics").text):
        for sample in family.samples:
            values[sample.name] = values.get(sample.name, 0.0) + sample.value
    return values


def test_metrics_move_and_disconnect_frees_blocks(http):
    before = scrape(http)
    http.post(CHAT, json={"model": "tiny", "messages": OK_MSG, "max_tokens": 5})
    after = scrape(http)
    assert after["lantern:generation_tokens_total"] > before["lantern:generation_tokens_total"]
    assert after["lantern:prompt_tokens_total"] > before["lantern:prompt_tokens_total"]
    assert (
        after["lantern:time_to_first_token_seconds_count"]
        == before.get("lantern:time_to_first_token_seconds_count", 0) + 1
    )
    assert after["lantern:e2e_request_latency_seconds_count"] > before.get(
        "lantern:e2e_request_latency_seconds_count", 0
    )
    # A client that drops a long stream: its request is aborted and the KV cache empties.
    body = {"model": "tiny", "messages": OK_MSG, "max_tokens": 200, "ignore_eos": True, "stream": True}
    with http.stream("POST", CHAT, json=body) as r:
        lines = r.iter_lines()
        got = [next(lines) for _ in range(6)]
        assert any(line.startswith("data: ") for line in got)
        mid = scrape(http)
        assert mid["lantern:num_requests_running"] == 1 and mid["lantern:kv_cache_usage_perc"] > 0
    for _ in range(100):
        m = scrape(http)
        if m["lantern:num_requests_running"] == 0 and m["lantern:kv_cache_usage_perc"] == 0:
            break
        time.sleep(0.05)
    assert m["lantern:num_requests_running"] == 0 and m["lantern:kv_cache_usage_perc"] == 0
    assert m["lantern:generation_tokens_total"] < mid["lantern:generation_tokens_total"] + 150


def test_api_key_and_capacity(tiny_model_dir, backend):
    srv = start_server(
        tiny_model_dir("llama2"),
        ServerSettings(served_model_name="tiny", api_key="s3cret", max_waiting=0),
        backend=backend,
    )
    try:
        with httpx.Client(base_url=srv.base_url) as c:
            assert c.get("/health").status_code == 200  # open without the key
            assert_error(c.get("/v1/models"), 401)
            assert_error(
                c.post(CHAT, json={"model": "tiny", "messages": OK_MSG}, headers={"Authorization": "Bearer wrong"}), 401
            )
            assert_error(c.get("/metrics"), 401)
            auth = {"Authorization": "Bearer s3cret"}
            assert c.get("/v1/models", headers=auth).status_code == 200
            # max_waiting=0: the queue is always full, so generation is refused with 503.
            err = assert_error(c.post(CHAT, json={"model": "tiny", "messages": OK_MSG}, headers=auth), 503)
            assert "capacity" in err["message"]
    finally:
        srv.stop()


def test_non_streaming_client_that_leaves_is_aborted(tmp_path_factory, backend):
    # A 4k context, so the reply runs long after the client has gone (a 256-token one could finish first).
    from tests.fixtures.tiny_models import build_model

    path = build_model("llama2", tmp_path_factory.mktemp("long"), max_position_embeddings=4096)
    srv = start_server(str(path), block_size=16, num_kv_blocks=300, backend=backend)
    try:
        with httpx.Client(base_url=srv.base_url, timeout=60) as http:
            body = {"model": "tiny", "messages": OK_MSG, "max_tokens": 4000, "ignore_eos": True}
            with pytest.raises(httpx.TimeoutException):
                httpx.post(f"{srv.base_url}{CHAT}", json=body, timeout=0.5)
            for _ in range(100):
                m = scrape(http)
                if m["lantern:num_requests_running"] == 0:
                    break
                time.sleep(0.05)
            assert m["lantern:num_requests_running"] == 0 and m["lantern:kv_cache_usage_perc"] == 0
            assert m["lantern:generation_tokens_total"] < 4000  # stopped early, not run to the end
    finally:
        srv.stop()


def test_a_prompt_is_validated_once(server, http, monkeypatch):
    inner = server.engine._engine  # test-only reach-in: count the engine's own checks
    calls = []
    real = inner.validate
    monkeypatch.setattr(inner, "validate", lambda ids, params: calls.append(len(ids)) or real(ids, params))
    body = {"model": "tiny", "messages": OK_MSG, "max_tokens": 2}
    assert http.post(CHAT, json=body).status_code == 200
    assert http.post(CHAT, json={**body, "stream": True}).status_code == 200
    assert len(calls) == 2  # one check per request, whichever path it took
    too_long = {"model": "tiny", "messages": [{"role": "user", "content": "word " * 5000}]}
    assert_error(http.post(CHAT, json=too_long), 400, "messages")
