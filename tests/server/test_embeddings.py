"""POST /v1/embeddings on a real server, on both backends, through the official openai client:
BERT and MPNet sentence-transformers folders and a headless decoder (Qwen3-Embedding's layout), each served
for embeddings by default. Vectors against transformers, base64 (the SDK's default) equal to
float, `dimensions`, usage, the errors (400 naming the field), and each task refusing the other."""

from __future__ import annotations

import base64

import httpx
import numpy as np
import openai
import pytest
import schemathesis
import torch
from hypothesis import HealthCheck, settings

from lantern.app.cli import build_parser, engine_options
from tests.fixtures.tiny_encoders import build_base_decoder, build_bert
from tests.server.conftest import start_server

TEXTS = ["The quick brown fox jumps over the lazy dog.", "Numbers 0123456789 and caf\u00e9", "def add(a, b):"]


@pytest.fixture(scope="module", params=["bert", "mpnet", "qwen3"])
def folder(request, tmp_path_factory) -> tuple[str, str]:
    root = tmp_path_factory.mktemp(request.param)
    if request.param in ("bert", "mpnet"):
        return str(build_bert(root, "mean", model_type=request.param)), "mean"
    return str(build_base_decoder(root, "qwen3", "last")), "last"


@pytest.fixture(scope="module")
def embed_server(folder, backend):
    srv = start_server(folder[0], backend=backend)
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(embed_server):
    return openai.OpenAI(base_url=f"{embed_server.base_url}/v1", api_key="unused")


def reference(path: str, ids: list[int], pooling: str) -> np.ndarray:
    from transformers import AutoModel

    model = AutoModel.from_pretrained(path, dtype=torch.float32).eval()
    with torch.no_grad():
        h = model(input_ids=torch.tensor([ids])).last_hidden_state[0]
    v = h.mean(0) if pooling == "mean" else h[-1]
    return torch.nn.functional.normalize(v, dim=0).numpy()


def post(server, **body) -> httpx.Response:
    return httpx.post(f"{server.base_url}/v1/embeddings", json={"model": "tiny", **body}, timeout=60)


def test_sdk_vectors_match_transformers(client, embed_server, folder):
    tok = embed_server.engine.tokenizer
    r = client.embeddings.create(model="tiny", input=TEXTS)  # the SDK asks for base64 and decodes it
    assert r.object == "list" and r.model == "tiny" and [d.index for d in r.data] == [0, 1, 2]
    ids = [tok.encode(t) for t in TEXTS]
    assert r.usage.prompt_tokens == r.usage.total_tokens == sum(map(len, ids))
    for d, one in zip(r.data, ids):
        assert d.object == "embedding" and len(d.embedding) == 64
        np.testing.assert_allclose(d.embedding, reference(folder[0], one, folder[1]), atol=1e-4, rtol=0)
    # Token ids, one list or several, give the same vectors as the texts.
    # (a decoder's second pass reads its prefix from the cache: the same values up to float rounding)
    by_ids = client.embeddings.create(model="tiny", input=ids)
    np.testing.assert_allclose([d.embedding for d in by_ids.data], [d.embedding for d in r.data], atol=1e-5)
    one = client.embeddings.create(model="tiny", input=ids[0])
    np.testing.assert_allclose(one.data[0].embedding, r.data[0].embedding, atol=1e-5)
    assert one.usage.prompt_tokens == len(ids[0])


def test_base64_equals_float(embed_server):
    floats = post(embed_server, input=TEXTS, encoding_format="float").json()["data"]
    encoded = post(embed_server, input=TEXTS, encoding_format="base64").json()["data"]
    for f, b in zip(floats, encoded):
        decoded = np.frombuffer(base64.b64decode(b["embedding"]), dtype="<f4")
        assert decoded.tolist() == f["embedding"]


def test_dimensions_truncate_then_normalize(client):
    full = np.array(client.embeddings.create(model="tiny", input=TEXTS[0]).data[0].embedding)
    short = np.array(client.embeddings.create(model="tiny", input=TEXTS[0], dimensions=16).data[0].embedding)
    assert short.shape == (16,)
    np.testing.assert_allclose(short, full[:16] / np.linalg.norm(full[:16]), atol=1e-6)
    same = client.embeddings.create(model="tiny", input=TEXTS[0], dimensions=64).data[0].embedding
    assert same == full.tolist()


@pytest.mark.parametrize(
    "body,param,code",
    [
        ({"input": ""}, "input", None),
        ({"input": []}, "input", None),
        ({"input": ["ok", ""]}, "input", None),
        ({"input": [[1, 2], []]}, "input", None),
        ({"input": [1, 10**7]}, "input", None),
        ({"input": [1] * 300}, "input", "context_length_exceeded"),
        ({"input": [1, "a"]}, "input", None),
        ({"input": "x", "dimensions": 65}, "dimensions", None),
        ({"input": "x", "dimensions": 0}, "dimensions", None),
        ({"input": "x", "encoding_format": "int8"}, "encoding_format", None),
        ({}, "input", None),
    ],
    ids=["empty", "empty-list", "empty-item", "empty-ids", "bad-id", "long", "mixed", "dims", "dims0", "fmt", "none"],
)
def test_bad_input_is_a_400_naming_the_field(embed_server, body, param, code):
    r = post(embed_server, **body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"].split(".")[0] == param and err["type"] == "invalid_request_error"  # "input.0": its item
    assert code is None or err["code"] == code


def test_unknown_model_is_404(embed_server):
    assert httpx.post(f"{embed_server.base_url}/v1/embeddings", json={"model": "x", "input": "a"}).status_code == 404


def test_generation_endpoints_name_the_task(embed_server):
    for path, body in (
        ("/v1/completions", {"prompt": "hi", "max_tokens": 2}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "stream": True}),
    ):
        r = httpx.post(f"{embed_server.base_url}{path}", json={"model": "tiny", **body}, timeout=60)
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["param"] == "model" and "serves embeddings" in err["message"] and err["code"] == "wrong_task"


def test_a_generation_server_refuses_embeddings(server):
    r = post(server, input="hello")
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["param"] == "model" and "--task embed" in err["message"]


def test_task_and_pooling_flags_reach_the_engine():
    args = build_parser().parse_args(["serve", "--w", "/models/x", "--task", "embed", "--pooling", "mean"])
    options = engine_options(args)
    assert (options["task"], options["pooling"]) == ("embed", "mean")
    defaults = engine_options(build_parser().parse_args(["serve", "--w", "/models/x"]))
    assert (defaults["task"], defaults["pooling"]) == ("auto", "auto")


@pytest.fixture(scope="module")
def embed_schema(embed_server):
    return schemathesis.openapi.from_url(f"{embed_server.base_url}/openapi.json")


fuzzed = schemathesis.pytest.from_fixture("embed_schema").include(path="/v1/embeddings")


@fuzzed.parametrize()
@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
def test_fuzzed_requests_never_get_a_5xx(case):
    """Requests generated from /openapi.json against a server that does serve embeddings."""
    response = case.call(timeout=120)
    assert response.status_code < 500, f"{case.method} {case.path} -> {response.status_code}: {response.text[:300]}"
    if response.status_code >= 400:
        assert set(response.json()["error"]) == {"message", "type", "param", "code"}
