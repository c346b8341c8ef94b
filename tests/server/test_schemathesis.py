"""Property-based requests generated from our own /openapi.json: user input never yields a 5xx.

Its own server, on both backends, with a short context and a small `max_n`: generated requests
ask for the largest n and max_tokens the schema allows, and what matters here is how every field
combination is answered, not how long the longest one takes to generate.
"""

from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, settings

from lantern.server.app import ServerSettings
from tests.server.conftest import start_server


@pytest.fixture(scope="module")
def server(tiny_model_dir, backend):
    srv = start_server(
        tiny_model_dir("llama2"), ServerSettings(served_model_name="tiny", max_n=4), backend=backend, max_model_len=32
    )
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def api_schema(server):
    return schemathesis.openapi.from_url(f"{server.base_url}/openapi.json")


schema = schemathesis.pytest.from_fixture("api_schema")
ANTHROPIC_ERROR_TYPES = {
    "invalid_request_error",
    "authentication_error",
    "permission_error",
    "not_found_error",
    "request_too_large",
    "rate_limit_error",
    "api_error",
    "overloaded_error",
}


@schema.parametrize()
@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
def test_no_server_errors(case):
    response = case.call(timeout=120)
    assert response.status_code < 500, (
        f"{case.method} {case.path} {case.body!r:.600} -> {response.status_code}: {response.text[:300]}"
    )
    if response.status_code >= 400:
        body = response.json()
        if case.path.startswith("/v1/messages"):
            # Anthropic's routes answer in Anthropic's envelope (what its SDK parses); the field
            # that is wrong leads the message, since that envelope has no param slot.
            assert body.get("type") == "error" and set(body.get("error", {})) == {"type", "message"}, body
            assert body["error"]["type"] in ANTHROPIC_ERROR_TYPES, body
        else:
            assert set(body["error"]) == {"message", "type", "param", "code"}, body
