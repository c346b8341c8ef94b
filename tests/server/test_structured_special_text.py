"""A constraint whose text spells a special token ("<|channel|>" on a harmony tokenizer) cannot be
followed: llguidance offers the special token, then its matcher refuses it. The request is
answered 400 naming its field (it is the request's constraint, not an engine failure), and the
server goes on serving."""

from __future__ import annotations

import httpx
import pytest

from tests.fixtures.harmony_template import build_harmony_model
from tests.server.conftest import start_server


@pytest.fixture(scope="module")
def harmony_server(tmp_path_factory, backend):
    model = build_harmony_model(tmp_path_factory.mktemp("harmony") / "model")
    threads = {"num_threads": 1} if backend == "torch" else {}
    srv = start_server(str(model), backend=backend, **threads)
    yield srv
    srv.stop()


def test_choice_spelling_a_special_token_is_400_naming_the_field(harmony_server):
    body = {"model": "tiny", "prompt": "hello", "max_tokens": 8, "guided_choice": ["<|channel|>final"]}
    r = httpx.post(f"{harmony_server.base_url}/v1/completions", json=body, timeout=120)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "guided_choice"
    ok = httpx.post(
        f"{harmony_server.base_url}/v1/completions",
        json={"model": "tiny", "prompt": "hello", "max_tokens": 4, "guided_choice": ["yes", "no"]},
        timeout=120,
    )
    assert ok.status_code == 200 and ok.json()["choices"][0]["text"] in ("yes", "no")
