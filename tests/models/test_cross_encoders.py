"""Cross-encoders and rerankers (`--task score`, LLM.score) on both backends, against transformers'
XxxForSequenceClassification on the same weights: BERT (ms-marco MiniLM: the pooler, token types 1 on the
document), XLM-RoBERTa / RoBERTa / MPNet (bge-reranker's classification head), DistilBERT, ModernBERT (gte-reranker:
[CLS] or mean pooling, its prediction head), and decoders' `score` heads (Qwen3-Reranker converted to seq-cls,
Llama). The activation sentence-transformers' CrossEncoder applies, long documents cut to the context, the pairs a
call names, and the refusals (a classifier with several labels, --pooling, the other tasks)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from lantern.app.engine import LLM, InvalidRequestError, SamplingParams
from lantern.app.engine.scoring import pairs_of, tokenize_pair
from lantern.app.models.loader import resolve_model
from lantern.app.models.pooling import resolve_task
from lantern.app.models.spec import UnsupportedModelError
from tests.fixtures.tiny_rerankers import build_cross_encoder, build_decoder_classifier

QUERY = "what does paged attention keep"
DOCS = [
    "Paged attention keeps every sequence in fixed blocks so memory is never fragmented.",
    "The quick brown fox jumps over the lazy dog.",
    "Numbers 0123456789",
    "a",
]
SIGMOID = "torch.nn.modules.activation.Sigmoid"
IDENTITY = "torch.nn.modules.linear.Identity"

CASES = {  # name: (builder, kwargs)
    "bert": (build_cross_encoder, {"model_type": "bert"}),
    "xlm-roberta": (build_cross_encoder, {"model_type": "xlm-roberta", "max_position_embeddings": 258}),
    "roberta": (build_cross_encoder, {"model_type": "roberta"}),
    "mpnet": (build_cross_encoder, {"model_type": "mpnet"}),
    "distilbert": (build_cross_encoder, {"model_type": "distilbert"}),
    "modernbert": (build_cross_encoder, {"model_type": "modernbert"}),
    "modernbert-mean": (
        build_cross_encoder,
        {
            "model_type": "modernbert",
            "classifier_pooling": "mean",
            "classifier_bias": True,
            "norm_bias": True,
            "classifier_activation": "gelu_pytorch_tanh",
        },
    ),
    "qwen3": (build_decoder_classifier, {"model_type": "qwen3"}),
    "llama": (build_decoder_classifier, {"model_type": "llama"}),
    "bert-identity": (build_cross_encoder, {"model_type": "bert", "activation": IDENTITY, "old_key": True}),
    "bert-sigmoid": (build_cross_encoder, {"model_type": "bert", "activation": SIGMOID}),
}


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("rerankers")
    return {name: str(build(root / name, seed=i, **kw)) for i, (name, (build, kw)) in enumerate(CASES.items())}


def engine(folder: str, backend: str, **options) -> LLM:
    return LLM(model=folder, backend=backend, dtype="float32", block_size=4, **options)


def reference(folder: str, pairs: list[tuple[str, str]], activation: str = "sigmoid", **truncation) -> list[float]:
    """transformers' classifier on each pair alone (no padding), through the activation."""
    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForSequenceClassification.from_pretrained(folder, dtype=torch.float32).eval()
    out = []
    for a, b in pairs:
        with torch.no_grad():
            logit = model(**tok(a, b, return_tensors="pt", **truncation)).logits[0, 0]
        out.append(float(torch.sigmoid(logit) if activation == "sigmoid" else logit))
    return out


@pytest.mark.parametrize("name", list(CASES))
def test_scores_match_transformers(folders, backend, name):
    """One query against documents of different lengths in one step, each equal to transformers alone."""
    llm = engine(folders[name], backend)
    assert llm.engine.task == "score"
    outs = llm.score(QUERY, DOCS)
    activation = "identity" if name == "bert-identity" else "sigmoid"
    want = reference(folders[name], [(QUERY, d) for d in DOCS], activation)
    got = [o.score for o in outs]
    np.testing.assert_allclose(got, want, atol=2e-5, rtol=0)
    if activation == "identity":  # raw logits, not their sigmoids (the tiny tokenizer's training is not
        # deterministic, so whether a logit falls outside (0, 1) changes from build to build)
        assert np.abs(np.array(got) - 1 / (1 + np.exp(-np.array(want)))).max() > 1e-3
    assert [o.num_prompt_tokens for o in outs] == [len(tokenize_pair(llm.engine, QUERY, d)[0]) for d in DOCS]
    stats = llm.engine.stats_snapshot()
    decoder = llm.engine.model_config.encoder is None  # (a last-token head: its inputs use the prefix cache)
    assert (stats["prefix_cache_queries"] > 0) == decoder and stats["num_free_blocks"] == stats["num_blocks"]


def test_bert_pairs_carry_token_types(folders):
    """BERT's pair: [CLS] query [SEP] as segment 0, document [SEP] as 1; a scored pair differs from the same ids
    all in segment 0 (the token-type table is read)."""
    llm = engine(folders["bert"], "torch")
    ids, types = tokenize_pair(llm.engine, QUERY, DOCS[0])
    tok = AutoTokenizer.from_pretrained(folders["bert"])
    want = tok(QUERY, DOCS[0])
    assert ids == want["input_ids"] and types == want["token_type_ids"] and 0 < sum(types) < len(types)
    embedder = llm.engine.embedder
    from lantern.app.engine.embedding import run_offline

    typed, flat = run_offline(llm.engine, embedder, [(ids, types), (ids, None)])
    assert abs(typed.score - flat.score) > 1e-4
    # RoBERTa's single-row table: no types at all.
    xlmr = engine(folders["xlm-roberta"], "torch")
    assert tokenize_pair(xlmr.engine, QUERY, DOCS[0])[1] is None


def test_long_documents_are_cut_to_the_context(folders, backend):
    """A pair past the context keeps the query whole and loses the document's last tokens: the score equals
    transformers on the pair truncated "only_second" to the context."""
    llm = engine(folders["bert"], backend)
    limit = llm.engine.max_model_len
    long_doc = DOCS[0] * 8  # ~150 tokens against a context of 64
    out = llm.score(QUERY, [long_doc, DOCS[1]])
    want = reference(folders["bert"], [(QUERY, long_doc)], truncation="only_second", max_length=limit)
    assert out[0].num_prompt_tokens == limit
    np.testing.assert_allclose(out[0].score, want[0], atol=2e-5, rtol=0)
    # Cohere's max_tokens_per_doc: the document cut to its first n tokens before the pair is built.
    ids, _ = tokenize_pair(llm.engine, QUERY, long_doc, max_document_tokens=5)
    tok = AutoTokenizer.from_pretrained(folders["bert"])
    assert ids == tok(QUERY, tok.decode(tok(long_doc, add_special_tokens=False)["input_ids"][:5]))["input_ids"]
    with pytest.raises(InvalidRequestError) as err:
        llm.score(QUERY * 20, DOCS[0])
    assert err.value.param == "query" and err.value.code == "context_length_exceeded"


def test_pairs_a_call_names():
    assert pairs_of("q", ["a", "b"]) == [("q", "a"), ("q", "b")]
    assert pairs_of("q", "a") == [("q", "a")]
    assert pairs_of(["q1", "q2"], ["a", "b"]) == [("q1", "a"), ("q2", "b")]
    assert pairs_of(["q"], ["a", "b"]) == [("q", "a"), ("q", "b")]
    with pytest.raises(InvalidRequestError) as err:
        pairs_of(["q1", "q2"], ["a", "b", "c"])
    assert err.value.param == "text_2"
    with pytest.raises(InvalidRequestError) as err:
        pairs_of([], ["a"])
    assert err.value.param == "text_1"


def test_task_defaults_and_refusals(folders, tmp_path):
    spec = resolve_model(folders["bert"]).spec
    assert resolve_task("auto", "auto", spec) == ("score", "cls")
    assert resolve_task("auto", "auto", resolve_model(folders["modernbert-mean"]).spec) == ("score", "mean")
    assert resolve_task("auto", "auto", resolve_model(folders["qwen3"]).spec) == ("score", "last")
    assert resolve_task("embed", "auto", spec) == ("embed", "mean")  # asked for: the encoder's [CLS]-free mean
    with pytest.raises(ValueError, match="--pooling applies to embeddings"):
        resolve_task("score", "mean", spec)
    labels = build_cross_encoder(tmp_path / "labels", "bert", num_labels=3, id2label={0: "neg", 1: "neu", 2: "pos"})
    assert resolve_task("auto", "auto", resolve_model(str(labels)).spec) == ("classify", "cls")
    with pytest.raises(UnsupportedModelError, match=r"3 labels \(neg, neu, pos\): it classifies"):
        engine(str(labels), "torch", task="score")
    bad = build_cross_encoder(tmp_path / "tanhish", "bert", activation="torch.nn.modules.activation.Softplus")
    with pytest.raises(UnsupportedModelError, match="Softplus"):
        engine(str(bad), "torch")


def test_each_task_refuses_the_others(folders):
    scorer = engine(folders["bert"], "torch")
    for call in (lambda: scorer.generate("hi", SamplingParams(max_tokens=2)), lambda: scorer.embed("hi")):
        with pytest.raises(InvalidRequestError, match="serves relevance scores") as err:
            call()
        assert err.value.param == "model" and err.value.code == "wrong_task"
    embedder = engine(folders["bert"], "torch", task="embed")
    with pytest.raises(InvalidRequestError, match=r"serves embeddings.*scores need a cross-encoder"):
        embedder.score(QUERY, DOCS)


def test_a_tokenizer_json_saved_with_truncation_and_padding(folders, tmp_path):
    """A tokenizer.json may carry truncation and padding settings (saved from a tokenizer that had them enabled):
    pairs are built without them, whatever other calls did to the shared tokenizer before."""
    import json
    import shutil

    folder = tmp_path / "saved-settings"
    shutil.copytree(folders["bert"], folder)
    tok_file = folder / "tokenizer.json"
    saved = json.loads(tok_file.read_text())
    saved["truncation"] = {"direction": "Right", "max_length": 10, "strategy": "LongestFirst", "stride": 0}
    pad = {"strategy": {"Fixed": 48}, "direction": "Right", "pad_to_multiple_of": None}
    saved["padding"] = {**pad, "pad_id": 0, "pad_type_id": 0, "pad_token": "[PAD]"}
    tok_file.write_text(json.dumps(saved))
    llm = engine(str(folder), "torch")
    ids, _ = tokenize_pair(llm.engine, QUERY, DOCS[0])
    want_ids = AutoTokenizer.from_pretrained(folders["bert"])(QUERY, DOCS[0])["input_ids"]
    assert ids == want_ids and len(ids) > 10
    got = [o.score for o in llm.score(QUERY, DOCS)]
    np.testing.assert_allclose(got, reference(folders["bert"], [(QUERY, d) for d in DOCS]), atol=2e-5, rtol=0)
