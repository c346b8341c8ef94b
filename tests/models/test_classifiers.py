"""Sequence classifiers (`--task classify`, LLM.classify) on both backends, against transformers'
XxxForSequenceClassification on the same weights through the pipeline's activation: a softmax over the labels (a
3-way BERT, a 2-way decoder), a sigmoid each for a multi_label_classification head (RoBERTa) and for a single
label; the labels in id order; and the refusals (the other tasks' calls, a reranker asked to classify)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from lantern.app.engine import LLM, InvalidRequestError
from lantern.app.models.spec import UnsupportedModelError
from tests.fixtures.tiny_rerankers import build_cross_encoder, build_decoder_classifier, build_qwen3_reranker

TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "Paged attention keeps every sequence in fixed blocks so memory is never fragmented.",
    "a",
]
SENTIMENT = {0: "negative", 1: "neutral", 2: "positive"}

CASES = {  # name: (builder, kwargs, activation)
    "bert-3": (build_cross_encoder, {"model_type": "bert", "num_labels": 3, "id2label": SENTIMENT}, "softmax"),
    "roberta-multi": (
        build_cross_encoder,
        {"model_type": "roberta", "num_labels": 4, "problem_type": "multi_label_classification"},
        "sigmoid",
    ),
    "qwen3-2": (build_decoder_classifier, {"model_type": "qwen3", "num_labels": 2}, "softmax"),
    "distilbert-1": (build_cross_encoder, {"model_type": "distilbert"}, "sigmoid"),
}


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("classifiers")
    return {name: str(build(root / name, seed=i, **kw)) for i, (name, (build, kw, _)) in enumerate(CASES.items())}


def engine(folder: str, backend: str, **options) -> LLM:
    return LLM(model=folder, backend=backend, dtype="float32", block_size=4, **options)


def reference(folder: str, texts: list[str], activation: str) -> np.ndarray:
    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForSequenceClassification.from_pretrained(folder, dtype=torch.float32).eval()
    out = []
    for text in texts:
        with torch.no_grad():
            logits = model(**tok(text, return_tensors="pt")).logits[0]
        out.append((torch.softmax(logits, 0) if activation == "softmax" else torch.sigmoid(logits)).numpy())
    return np.array(out)


@pytest.mark.parametrize("name", list(CASES))
def test_probabilities_match_transformers(folders, backend, name):
    activation = CASES[name][2]
    task = {"task": "classify"} if name == "distilbert-1" else {}  # (one label: a score by default)
    llm = engine(folders[name], backend, **task)
    assert llm.engine.task == "classify"
    outs = llm.classify(TEXTS)
    got = np.array([o.probs for o in outs])
    np.testing.assert_allclose(got, reference(folders[name], TEXTS, activation), atol=2e-5, rtol=0)
    if activation == "softmax":
        np.testing.assert_allclose(got.sum(1), 1.0, atol=1e-5)
    tok = AutoTokenizer.from_pretrained(folders[name])
    assert [o.num_prompt_tokens for o in outs] == [len(tok(t)["input_ids"]) for t in TEXTS]
    by_ids = llm.classify(tok(TEXTS[0])["input_ids"])[0]
    np.testing.assert_allclose(by_ids.probs, outs[0].probs, atol=1e-6)  # (alone: another batch, same values)


def test_labels_in_id_order(folders):
    assert engine(folders["bert-3"], "torch").labels == ["negative", "neutral", "positive"]
    assert engine(folders["qwen3-2"], "torch").labels == ["LABEL_0", "LABEL_1"]


def test_refusals(folders, tmp_path):
    classifier = engine(folders["bert-3"], "torch")
    for call in (lambda: classifier.embed("hi"), lambda: classifier.score("q", "d")):
        with pytest.raises(InvalidRequestError, match="serves classification") as err:
            call()
        assert err.value.code == "wrong_task"
    scorer = engine(folders["distilbert-1"], "torch")
    with pytest.raises(InvalidRequestError, match="classification needs a sequence classifier"):
        scorer.classify("hi")
    reranker = build_qwen3_reranker(tmp_path / "Qwen3-Reranker-tiny")
    with pytest.raises(UnsupportedModelError, match="--task classify needs a sequence classifier"):
        engine(str(reranker), "torch", task="classify")
