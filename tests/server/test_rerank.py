"""/v1/rerank, /v2/rerank, /rerank and /v1/score on a real server, on both backends: Cohere's official SDK (its v2
client on /v2/rerank, its v1 client on /v1/rerank), Jina-shaped bodies ({"text": ...} documents) and vLLM's score
API, for a BERT cross-encoder and a decoder's seq-cls reranker. Scores against transformers' classifiers, the
order, top_n, return_documents, max_tokens_per_doc, usage, and the refusals: a field these APIs name but the
server does not honour, bad values (400 naming the field), and each task refusing the others' routes."""

from __future__ import annotations

import cohere
import httpx
import numpy as np
import pytest
import schemathesis
import torch
from hypothesis import HealthCheck, settings
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from tests.fixtures.tiny_encoders import build_bert
from tests.fixtures.tiny_rerankers import build_cross_encoder, build_decoder_classifier, build_qwen3_reranker
from tests.server.conftest import start_server

QUERY = "what does paged attention keep"
DOCS = [
    "The quick brown fox jumps over the lazy dog.",
    "Paged attention keeps every sequence in fixed blocks so memory is never fragmented.",
    "Numbers 0123456789 and caf\u00e9",
    "def add(a, b): return a + b",
]


@pytest.fixture(scope="module", params=["bert", "qwen3", "qwen3-reranker"])
def folder(request, tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp(request.param)
    if request.param == "bert":
        return str(build_cross_encoder(root, "bert", seed=3))
    if request.param == "qwen3-reranker":  # Qwen3-Reranker as released: a causal LM's yes / no after its prompt
        return str(build_qwen3_reranker(root / "Qwen3-Reranker-tiny", seed=3))
    return str(build_decoder_classifier(root, "qwen3", seed=3))


@pytest.fixture(scope="module")
def score_server(folder, backend):
    srv = start_server(folder, backend=backend)
    yield srv
    srv.stop()


def reference(folder: str, query: str, docs: list[str]) -> np.ndarray:
    tok = AutoTokenizer.from_pretrained(folder)
    if "Reranker" in folder:
        from tests.models.test_rerankers import prompt_ids, yes_probability

        return np.array(yes_probability(folder, [prompt_ids(folder, query, d) for d in docs]))
    model = AutoModelForSequenceClassification.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.no_grad():
        return np.array([torch.sigmoid(model(**tok(query, d, return_tensors="pt")).logits[0, 0]).item() for d in docs])


def post(server, path: str, **body) -> httpx.Response:
    return httpx.post(f"{server.base_url}{path}", json={"model": "tiny", **body}, timeout=60)


def test_cohere_v2_sdk(score_server, folder):
    client = cohere.ClientV2(api_key="unused", base_url=score_server.base_url)
    r = client.rerank(model="tiny", query=QUERY, documents=DOCS)
    want = reference(folder, QUERY, DOCS)
    assert [x.index for x in r.results] == list(np.argsort(-want))  # best first
    np.testing.assert_allclose([x.relevance_score for x in r.results], np.sort(want)[::-1], atol=2e-5, rtol=0)
    top = client.rerank(model="tiny", query=QUERY, documents=DOCS, top_n=2)
    assert [x.index for x in top.results] == [x.index for x in r.results[:2]]
    every = post(score_server, "/v2/rerank", query=QUERY, documents=DOCS, top_n=0).json()  # (vLLM: 0 is all)
    assert len(every["results"]) == len(DOCS)


def test_cohere_v1_sdk_returns_documents(score_server, folder):
    client = cohere.Client(api_key="unused", base_url=score_server.base_url)
    r = client.rerank(model="tiny", query=QUERY, documents=DOCS, top_n=3, return_documents=True)
    want = reference(folder, QUERY, DOCS)
    assert len(r.results) == 3
    for x in r.results:
        assert x.document.text == DOCS[x.index]
        assert abs(x.relevance_score - want[x.index]) < 2e-5


def pair_ids(folder: str, query: str, doc: str) -> list[int]:
    if "Reranker" in folder:
        from tests.models.test_rerankers import prompt_ids

        return prompt_ids(folder, query, doc)
    return AutoTokenizer.from_pretrained(folder)(query, doc)["input_ids"]


def test_jina_shape_and_usage(score_server, folder):
    r = post(score_server, "/v1/rerank", query=QUERY, documents=[{"text": d} for d in DOCS], return_documents=False)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["model"] == "tiny" and body["id"].startswith("rerank-")
    assert all("document" not in x for x in body["results"])
    assert sorted(x["index"] for x in body["results"]) == [0, 1, 2, 3]
    assert body["usage"]["total_tokens"] == sum(len(pair_ids(folder, QUERY, d)) for d in DOCS)
    titled = [{"text": d, "title": f"doc {i}"} for i, d in enumerate(DOCS)]  # (Cohere v1: only text is ranked)
    carried = post(score_server, "/v1/rerank", query=QUERY, documents=titled, return_documents=False).json()
    assert [x["index"] for x in carried["results"]] == [x["index"] for x in body["results"]]
    np.testing.assert_allclose(
        [x["relevance_score"] for x in carried["results"]], [x["relevance_score"] for x in body["results"]], atol=1e-6
    )
    same = post(score_server, "/rerank", query=QUERY, documents=DOCS).json()  # Jina's / vLLM's path
    np.testing.assert_allclose(
        [x["relevance_score"] for x in same["results"]], [x["relevance_score"] for x in body["results"]], atol=1e-6
    )


def test_max_tokens_per_doc_cuts_documents(score_server, folder):
    tok = AutoTokenizer.from_pretrained(folder)
    cut = tok.decode(tok(DOCS[1], add_special_tokens=False)["input_ids"][:4])
    r = post(score_server, "/v2/rerank", query=QUERY, documents=[DOCS[1]], max_tokens_per_doc=4)
    assert r.status_code == 200, r.text
    want = reference(folder, QUERY, [cut])[0]
    assert abs(r.json()["results"][0]["relevance_score"] - want) < 2e-5


def test_vllm_score_api(score_server, folder):
    r = post(score_server, "/v1/score", text_1=QUERY, text_2=DOCS)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "list" and [d["index"] for d in body["data"]] == [0, 1, 2, 3]
    np.testing.assert_allclose([d["score"] for d in body["data"]], reference(folder, QUERY, DOCS), atol=2e-5, rtol=0)
    zipped = post(score_server, "/score", text_1=[QUERY, DOCS[2]], text_2=[DOCS[0], DOCS[3]]).json()["data"]
    assert abs(zipped[0]["score"] - body["data"][0]["score"]) < 1e-6
    assert abs(zipped[1]["score"] - reference(folder, DOCS[2], [DOCS[3]])[0]) < 2e-5


@pytest.mark.parametrize(
    "path,body,param",
    [
        ("/v1/rerank", {"query": QUERY, "documents": DOCS, "rank_fields": ["text"]}, "rank_fields"),
        ("/v1/rerank", {"query": QUERY, "documents": DOCS, "max_chunks_per_doc": 2}, "max_chunks_per_doc"),
        ("/v2/rerank", {"query": QUERY, "documents": DOCS, "relevant_spans": {"enabled": True}}, "relevant_spans"),
        ("/v2/rerank", {"query": QUERY, "documents": DOCS, "priority": 3}, "priority"),
        ("/v1/rerank", {"query": QUERY, "documents": []}, "documents"),
        ("/v1/rerank", {"query": "", "documents": DOCS}, "query"),
        ("/v1/rerank", {"query": QUERY, "documents": DOCS, "top_n": -1}, "top_n"),
        ("/v1/rerank", {"query": QUERY, "documents": [{"title": "x"}]}, "documents"),
        ("/v1/rerank", {"query": QUERY * 40, "documents": DOCS}, "query"),
        ("/v1/score", {"text_1": [QUERY, QUERY], "text_2": DOCS}, "text_2"),
        ("/v1/score", {"text_1": QUERY * 40, "text_2": DOCS}, "text_1"),
        ("/v1/score", {"text_1": [QUERY, QUERY * 40], "text_2": DOCS[:2]}, "text_1[1]"),
        ("/v1/score", {"text_1": QUERY, "text_2": DOCS, "truncate_prompt_tokens": 5}, "truncate_prompt_tokens"),
    ],
    ids=[
        "rank_fields",
        "chunks",
        "spans",
        "priority",
        "no-docs",
        "no-query",
        "top_n",
        "doc-shape",
        "long",
        "lists",
        "long-text_1",
        "long-text_1-item",
        "tpt",
    ],
)
def test_bad_requests_name_the_field(score_server, path, body, param):
    r = post(score_server, path, **body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] is not None and err["param"].startswith(param), err
    if param.startswith("text_1"):  # the field itself, item included
        assert err["param"] == param, err
    assert score_server.engine.dead_reason is None


def test_other_routes_name_the_task(score_server):
    for path, body in (
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
        ("/v1/completions", {"prompt": "hi", "max_tokens": 2}),
        ("/v1/embeddings", {"input": "hi"}),
    ):
        r = post(score_server, path, **body)
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["code"] == "wrong_task" and "serves relevance scores" in err["message"], err


def test_generation_and_embedding_servers_refuse_rerank(server, tmp_path, backend):
    r = post(server, "/v1/rerank", query=QUERY, documents=DOCS)
    assert r.status_code == 400 and r.json()["error"]["code"] == "wrong_task"
    embed = start_server(str(build_bert(tmp_path / "embed", "mean")), backend=backend)
    try:
        r = post(embed, "/v1/score", text_1=QUERY, text_2=DOCS)
        assert r.status_code == 400
        assert "serves embeddings" in r.json()["error"]["message"] and "--task score" in r.json()["error"]["message"]
    finally:
        embed.stop()


def test_tei_shape(score_server, folder):
    """TEI's /rerank: `texts`, a bare list best first, `return_text`, `raw_scores` (the logits), `truncate`."""
    r = post(score_server, "/rerank", query=QUERY, texts=DOCS, return_text=True)
    assert r.status_code == 200, r.text
    ranked = r.json()
    want = reference(folder, QUERY, DOCS)
    assert [x["index"] for x in ranked] == list(np.argsort(-want))
    assert all(x["text"] == DOCS[x["index"]] for x in ranked)
    np.testing.assert_allclose([x["score"] for x in ranked], np.sort(want)[::-1], atol=2e-5, rtol=0)
    raw = post(score_server, "/rerank", query=QUERY, texts=DOCS, raw_scores=True).json()
    logits = np.log(want) - np.log1p(-want)
    np.testing.assert_allclose([x["score"] for x in raw], logits[[x["index"] for x in raw]], atol=2e-4, rtol=0)
    assert all("text" not in x for x in raw)
    long_doc = DOCS[1] * 40
    refused = post(score_server, "/rerank", query=QUERY, texts=[DOCS[0], long_doc])
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "texts[1]", refused.text
    assert refused.json()["error"]["code"] == "context_length_exceeded"
    assert post(score_server, "/rerank", query=QUERY, texts=[long_doc], truncate=True).status_code == 200
    left = post(score_server, "/rerank", query=QUERY, texts=DOCS, truncation_direction="Left")
    assert left.status_code == 400 and left.json()["error"]["param"] == "truncation_direction"


def test_instruction(score_server, folder):
    """Lantern's `instruction`: Qwen3-Reranker's task in its prompt; refused by a cross-encoder, naming it."""
    task = "Given a code question, retrieve the snippet that answers it"
    r = post(score_server, "/v1/rerank", query=QUERY, documents=DOCS, instruction=task)
    if "Reranker" not in folder:
        assert r.status_code == 400 and r.json()["error"]["param"] == "instruction", r.text
        return
    from lantern.app.models.qwen3_reranker import DEFAULT_INSTRUCTION, TEMPLATE
    from tests.models.test_rerankers import yes_probability

    tok = AutoTokenizer.from_pretrained(folder)
    text = TEMPLATE.replace(DEFAULT_INSTRUCTION, task).replace("{query}", QUERY)
    want = yes_probability(folder, [tok(text.replace("{document}", d))["input_ids"] for d in DOCS])
    got = {x["index"]: x["relevance_score"] for x in r.json()["results"]}
    np.testing.assert_allclose([got[i] for i in range(len(DOCS))], want, atol=2e-5, rtol=0)


def test_task_flag_reaches_the_engine():
    from lantern.app.cli import build_parser, engine_options

    for task in ("score", "classify"):
        args = build_parser().parse_args(["serve", "--w", "/models/x", "--task", task])
        assert engine_options(args)["task"] == task


@pytest.fixture(scope="module")
def score_schema(score_server):
    return schemathesis.openapi.from_url(f"{score_server.base_url}/openapi.json")


fuzzed = schemathesis.pytest.from_fixture("score_schema").include(path_regex="^/(v1/|v2/)?(rerank|score)$")


@fuzzed.parametrize()
@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
def test_fuzzed_requests_never_get_a_5xx(case):
    """Requests generated from /openapi.json against a server that serves scores: a 4xx in OpenAI's envelope (or,
    for TEI's bare-list answer, a list), never a 5xx."""
    response = case.call(timeout=120)
    assert response.status_code < 500, f"{case.method} {case.path} -> {response.status_code}: {response.text[:300]}"
    if response.status_code >= 400:
        assert set(response.json()["error"]) == {"message", "type", "param", "code"}
