"""POST /classify and /v1/classify (vLLM's classification API) on a real server, on both backends: a 3-way BERT
sentiment head against transformers' softmax, texts and token ids, the labels, usage; the refusals (400 naming the
field) and each task's routes refusing the others."""

from __future__ import annotations

import httpx
import numpy as np
import pytest
import schemathesis
import torch
from hypothesis import HealthCheck, settings
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from tests.fixtures.tiny_rerankers import build_cross_encoder
from tests.server.conftest import start_server

TEXTS = ["The quick brown fox jumps over the lazy dog.", "Numbers 0123456789 and caf\u00e9", "a"]
SENTIMENT = {0: "negative", 1: "neutral", 2: "positive"}


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> str:
    return str(build_cross_encoder(tmp_path_factory.mktemp("classifier"), "bert", num_labels=3, id2label=SENTIMENT))


@pytest.fixture(scope="module")
def classify_server(folder, backend):
    srv = start_server(folder, backend=backend)
    yield srv
    srv.stop()


def post(server, path: str, **body) -> httpx.Response:
    return httpx.post(f"{server.base_url}{path}", json={"model": "tiny", **body}, timeout=60)


def test_probabilities_and_labels(classify_server, folder):
    r = post(classify_server, "/classify", input=TEXTS)
    assert r.status_code == 200, r.text
    body = r.json()
    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForSequenceClassification.from_pretrained(folder, dtype=torch.float32).eval()
    assert body["object"] == "list" and body["model"] == "tiny" and body["id"].startswith("classify-")
    for item, text in zip(body["data"], TEXTS):
        with torch.no_grad():
            want = torch.softmax(model(**tok(text, return_tensors="pt")).logits[0], 0).numpy()
        np.testing.assert_allclose(item["probs"], want, atol=2e-5, rtol=0)
        assert item["num_classes"] == 3 and item["label"] == SENTIMENT[int(np.argmax(want))]
    tokens = sum(len(tok(t)["input_ids"]) for t in TEXTS)
    assert body["usage"] == {"prompt_tokens": tokens, "total_tokens": tokens, "completion_tokens": 0}
    ids = tok(TEXTS[1])["input_ids"]
    one = post(classify_server, "/v1/classify", input=ids).json()["data"]
    np.testing.assert_allclose(one[0]["probs"], body["data"][1]["probs"], atol=1e-6)


@pytest.mark.parametrize(
    "body,param",
    [
        ({"input": []}, "input"),
        ({"input": ["ok", ""]}, "input"),
        ({"input": [[2, 10**6]]}, "input"),
        ({"input": "hi", "truncate_prompt_tokens": 4}, "truncate_prompt_tokens"),
    ],
    ids=["empty", "empty-item", "bad-id", "unknown-field"],
)
def test_bad_requests_name_the_field(classify_server, body, param):
    r = post(classify_server, "/classify", **body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"].startswith(param)
    assert classify_server.engine.dead_reason is None


def test_each_route_names_the_task(classify_server, server):
    for path, body in (
        ("/v1/embeddings", {"input": "hi"}),
        ("/v1/rerank", {"query": "q", "documents": ["d"]}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
    ):
        err = post(classify_server, path, **body).json()["error"]
        assert err["code"] == "wrong_task" and "serves classification" in err["message"], err
    err = post(server, "/classify", input="hi").json()["error"]  # a generation server
    assert err["code"] == "wrong_task" and "--task classify" in err["message"]


@pytest.fixture(scope="module")
def classify_schema(classify_server):
    return schemathesis.openapi.from_url(f"{classify_server.base_url}/openapi.json")


fuzzed = schemathesis.pytest.from_fixture("classify_schema").include(path_regex="^/(v1/)?classify$")


@fuzzed.parametrize()
@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
def test_fuzzed_requests_never_get_a_5xx(case):
    response = case.call(timeout=120)
    assert response.status_code < 500, f"{case.method} {case.path} -> {response.status_code}: {response.text[:300]}"
    if response.status_code >= 400:
        assert set(response.json()["error"]) == {"message", "type", "param", "code"}
