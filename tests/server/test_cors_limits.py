"""Server hardening against a real uvicorn on a tiny model: settings refused at start, CORS
preflights, request body limits (declared and chunked), non-UTF-8 header bytes, /health."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator

import httpx
import pytest

from lantern.app.config import EngineConfig
from lantern.app.engine import AsyncEngine, LLMEngine
from lantern.server.app import ServerSettings, create_app
from tests.server.conftest import LiveServer, start_server

pytest.importorskip("mlx.core")

KEY = "cors-test-key"
GOOD = "http://good.example"
BAD = "http://evil.example"
LIMIT = ServerSettings().max_request_bytes
CHAT = "/v1/chat/completions"
CHAT_BODY = {"model": "tiny", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 2}


@pytest.fixture(scope="module")
def plain(tiny_model_dir):
    """Default settings: no keys, no allowed origins, the default body limit."""
    srv = start_server(tiny_model_dir("llama2"), ServerSettings(served_model_name="tiny"))
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def guarded(tiny_model_dir):
    settings = ServerSettings(served_model_name="tiny", api_keys=[KEY], allowed_origins=[GOOD])
    srv = start_server(tiny_model_dir("llama2"), settings)
    yield srv
    srv.stop()


def assert_envelope(r: httpx.Response, status: int, code: str | None = None) -> dict:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    if code is not None:
        assert err["code"] == code, err
    return err


# ---- settings ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "kwargs",
    [
        {"api_key": ""},
        {"api_keys": ["good", ""]},
        {"api_keys": [" padded"]},
        {"api_key": "   "},
        {"max_request_bytes": 0},
        {"max_n": 0},
    ],
)
def test_settings_refuse_values_that_would_weaken_the_server(kwargs):
    with pytest.raises(ValueError):
        ServerSettings(**kwargs)


def test_keys_merge_and_create_app_revalidates(plain):
    assert ServerSettings(api_key="a", api_keys=["b", "a", "c"]).keys() == ["a", "b", "c"]
    settings = ServerSettings(api_keys=["k"])
    settings.api_keys.append("")  # changed after construction: create_app must still refuse it
    with pytest.raises(ValueError):
        create_app(plain.engine, settings)


# ---- CORS --------------------------------------------------------------------------------------
def preflight(base_url: str, origin: str, key: str | None = None) -> httpx.Response:
    headers = {
        "Origin": origin,
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization, content-type, x-stainless-lang",
    }
    if key:
        headers["Authorization"] = f"Bearer {key}"
    return httpx.options(f"{base_url}{CHAT}", headers=headers, timeout=30)


@pytest.mark.parametrize("key", [None, KEY])
def test_preflight_from_an_allowed_origin_needs_no_key(guarded, key):
    r = preflight(guarded.base_url, GOOD, key)
    assert r.status_code == 200, r.text
    assert r.headers["access-control-allow-origin"] == GOOD
    assert "POST" in r.headers["access-control-allow-methods"]
    allowed = r.headers["access-control-allow-headers"].lower()
    assert "authorization" in allowed and "content-type" in allowed


@pytest.mark.parametrize("key", [None, KEY])
def test_preflight_from_another_origin_is_not_allowed(guarded, key):
    r = preflight(guarded.base_url, BAD, key)
    assert r.status_code == 400  # Starlette's "Disallowed CORS origin"
    assert "access-control-allow-origin" not in r.headers


def test_cross_origin_requests_carry_cors_headers_only_for_allowed_origins(guarded):
    url = f"{guarded.base_url}{CHAT}"
    auth = {"Authorization": f"Bearer {KEY}"}
    # The browser page can read the 401 (CORS is outside the key check) ...
    r = httpx.post(url, json=CHAT_BODY, headers={"Origin": GOOD}, timeout=60)
    assert_envelope(r, 401, "invalid_api_key")
    assert r.headers["access-control-allow-origin"] == GOOD
    r = httpx.post(url, json=CHAT_BODY, headers={"Origin": GOOD, **auth}, timeout=60)
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] == GOOD
    # ... while another origin's page gets an answer its browser will not hand over.
    r = httpx.get(f"{guarded.base_url}/v1/models", headers={"Origin": BAD, **auth}, timeout=30)
    assert r.status_code == 200 and "access-control-allow-origin" not in r.headers


def test_without_allowed_origins_there_are_no_cors_headers(plain):
    r = preflight(plain.base_url, GOOD)
    assert r.status_code != 200
    assert not [h for h in r.headers if h.lower().startswith("access-control-")], r.headers
    r = httpx.get(f"{plain.base_url}/v1/models", headers={"Origin": GOOD}, timeout=30)
    assert r.status_code == 200
    assert not [h for h in r.headers if h.lower().startswith("access-control-")], r.headers


# ---- body limit --------------------------------------------------------------------------------
def repeated(chunk: bytes, total: int) -> Iterator[bytes]:
    """`total` bytes made of one shared chunk: the body is never built in memory."""
    sent = 0
    while sent < total:
        piece = chunk if total - sent >= len(chunk) else chunk[: total - sent]
        sent += len(piece)
        yield piece


def padded_chat(size: int) -> bytes:
    body = json.dumps(CHAT_BODY).encode()
    assert len(body) < size
    return body[:-1] + b" " * (size - len(body)) + b"}"  # whitespace inside the object: still valid JSON


def test_a_64_mib_body_is_refused_with_413(plain):
    total = 64 * 2**20
    r = httpx.post(
        f"{plain.base_url}{CHAT}",
        content=repeated(b" " * 2**20, total),
        headers={"content-type": "application/json", "content-length": str(total)},
        timeout=60,
    )
    err = assert_envelope(r, 413, "request_too_large")
    assert str(LIMIT) in err["message"]
    assert httpx.post(f"{plain.base_url}{CHAT}", json=CHAT_BODY, timeout=60).status_code == 200


def test_a_chunked_body_is_counted(plain):
    url = f"{plain.base_url}{CHAT}"
    headers = {"content-type": "application/json"}  # no content-length: httpx sends it chunked
    r = httpx.post(url, content=repeated(b" " * 65536, LIMIT + 65536), headers=headers, timeout=60)
    assert r.request.headers.get("transfer-encoding") == "chunked"
    assert_envelope(r, 413, "request_too_large")
    # A chunked body within the limit goes through whole.
    ok = padded_chat(LIMIT)
    r = httpx.post(url, content=repeated(ok, len(ok)), headers=headers, timeout=60)
    assert r.status_code == 200, r.text


def test_the_limit_is_exact(plain):
    url = f"{plain.base_url}{CHAT}"
    headers = {"content-type": "application/json"}
    r = httpx.post(url, content=padded_chat(LIMIT), headers=headers, timeout=60)
    assert r.status_code == 200, r.text
    assert_envelope(httpx.post(url, content=padded_chat(LIMIT + 1), headers=headers, timeout=60), 413)


def test_a_client_waiting_for_100_continue_gets_the_413_at_once(plain):
    head = (
        f"POST {CHAT} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {64 * 2**20}\r\nExpect: 100-continue\r\n\r\n"
    ).encode()
    with socket.create_connection(("127.0.0.1", plain.port), timeout=30) as s:
        s.sendall(head)  # and no body: curl sends one only after "100 Continue" (or a timeout)
        data = b""
        while b"\r\n\r\n" not in data:
            data += s.recv(65536)
    assert data.startswith(b"HTTP/1.1 413"), data[:200]


# ---- odd header bytes ----------------------------------------------------------------------------
def raw_request(port: int, method: str, path: str, headers: list[bytes], body: bytes = b"") -> tuple[int, bytes]:
    """One HTTP/1.1 request written byte for byte (httpx refuses to send non-ASCII headers)."""
    head = (
        f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
    ).encode()
    with socket.create_connection(("127.0.0.1", port), timeout=60) as s:
        s.sendall(head + b"".join(h + b"\r\n" for h in headers) + b"\r\n" + body)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    status = int(data.split(b" ", 2)[1])
    return status, data.split(b"\r\n\r\n", 1)[1]


ODD = b"X-Odd: caf\xe9 \xff\xfe"
ROUTES = [
    ("GET", "/v1/models", b""),
    ("GET", "/health", b""),
    ("GET", "/metrics", b""),
    ("POST", CHAT, json.dumps(CHAT_BODY).encode()),
]


@pytest.mark.parametrize("method,path,body", ROUTES)
def test_non_utf8_header_bytes_never_cause_a_500(plain, guarded, method, path, body):
    assert raw_request(plain.port, method, path, [ODD], body)[0] == 200
    assert raw_request(plain.port, method, path, [b"Authorization: Bearer \xff\xfe", ODD], body)[0] == 200
    # With keys: odd bytes in the key are just a wrong key; elsewhere they change nothing.
    status, payload = raw_request(guarded.port, method, path, [b"Authorization: Bearer \xff" + KEY.encode()], body)
    if path == "/health":
        assert status == 200
    else:
        assert status == 401 and json.loads(payload)["error"]["code"] == "invalid_api_key"
    assert raw_request(guarded.port, method, path, [f"Authorization: Bearer {KEY}".encode(), ODD], body)[0] == 200


# ---- /health -----------------------------------------------------------------------------------
def test_health_reports_load_while_the_engine_runs(plain):
    r = httpx.get(f"{plain.base_url}/health", timeout=30)
    assert r.status_code == 200
    body = r.json()
    assert body["status"] == "ok" and body["running"] == 0 and body["kv_blocks_used"] == 0


def test_health_is_503_naming_the_cause_once_the_engine_loop_dies(tiny_model_dir):
    pytest.importorskip("torch")
    inner = LLMEngine(
        EngineConfig(model=tiny_model_dir("llama2"), backend="torch", dtype="float32", block_size=4, num_kv_blocks=64)
    )
    srv = LiveServer(AsyncEngine(engine=inner), ServerSettings(served_model_name="tiny"))
    try:
        assert httpx.get(f"{srv.base_url}/health", timeout=30).status_code == 200

        def broken() -> bool:
            raise RuntimeError("injected fault in the engine loop")

        inner.has_unfinished_requests = broken  # type: ignore[method-assign]  # the loop asks every turn
        srv.engine.abort("wake-up")  # any command wakes the loop at once
        deadline = time.monotonic() + 10
        while (r := httpx.get(f"{srv.base_url}/health", timeout=30)).status_code == 200:
            assert time.monotonic() < deadline, "the engine loop did not die"
            time.sleep(0.05)
        err = assert_envelope(r, 503, "engine_dead")
        assert "injected fault in the engine loop" in err["message"] and err["type"] == "service_unavailable"
        metrics = httpx.get(f"{srv.base_url}/metrics", timeout=30).text
        assert 'lantern:engine_alive{model_name="tiny"} 0.0' in metrics
        # A new request is answered at once with an error, not left hanging.
        r = httpx.post(f"{srv.base_url}{CHAT}", json=CHAT_BODY, timeout=10)
        assert r.status_code == 503, r.text
    finally:
        srv.stop()


def test_health_shows_the_load_only_to_key_holders(tiny_model_dir):
    srv = start_server(
        tiny_model_dir("llama2"), ServerSettings(served_model_name="tiny", api_keys=["k1"]), backend="torch"
    )
    try:
        anonymous = httpx.get(f"{srv.base_url}/health").json()
        assert anonymous == {"status": "ok"}
        keyed = httpx.get(f"{srv.base_url}/health", headers={"Authorization": "Bearer k1"}).json()
        assert keyed["status"] == "ok" and keyed["running"] == 0 and "kv_usage" in keyed
    finally:
        srv.stop()
