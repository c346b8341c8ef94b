"""ModernBERT GGUF files (llama.cpp's `modern-bert`: gte-modernbert, granite-embedding r2 for embeddings,
gte-reranker-modernbert for scores) on both backends, against transformers' ModernBertModel /
ModernBertForSequenceClassification on the values the file holds: the local window and global period, both rope
bases, the GeGLU, the byte-level BPE tokenizer rebuilt from the file ([CLS] / [SEP] around it, equal to the
folder's), f32 and Q8_0 weights; the reranker's head (cls, cls.norm, cls.output) after mean or [CLS] pooling."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import AutoModel, AutoModelForSequenceClassification, AutoTokenizer

from lantern.app.engine import LLM
from lantern.app.engine.scoring import tokenize_pair
from tests.fixtures.gguf_encoders import convert_modernbert_to_gguf
from tests.fixtures.tiny_encoders import build_bert
from tests.fixtures.tiny_rerankers import build_cross_encoder

TEXTS = [
    "Continuous batching lets new requests join while others decode, one token at a time. " * 2,  # past the window
    "Numbers 0123456789 and caf\u00e9",
    "a",
]
QUERY = "what does paged attention keep"


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("modern-bert-gguf")
    embedder = build_bert(root / "embed", "mean", seed=2, model_type="modernbert", bpe=True)
    out = {
        f"embed-{t}": (embedder, *convert_modernbert_to_gguf(embedder, root / f"embed-{t}", t)) for t in ("f32", "q8_0")
    }
    for pooling in ("mean", "cls"):
        src = build_cross_encoder(
            root / f"rerank-{pooling}", "modernbert", seed=3, bpe=True, classifier_pooling=pooling
        )
        out[f"rerank-{pooling}"] = (src, *convert_modernbert_to_gguf(src, root / f"rerank-{pooling}-gguf", "f32"))
    return out


def engine(path, backend: str) -> LLM:
    return LLM(model=str(path), backend=backend, dtype="float32", block_size=4)


@pytest.mark.parametrize("outtype", ["f32", "q8_0"])
def test_embeddings_match_transformers(files, backend, outtype):
    src, path, ref = files[f"embed-{outtype}"]
    llm = engine(path, backend)
    assert llm.engine.task == "embed" and llm.engine.embedder.pooling == "mean"
    tok = AutoTokenizer.from_pretrained(src)
    model = AutoModel.from_pretrained(ref, dtype=torch.float32).eval()
    tolerance = 1e-4 if outtype == "f32" else 2e-3  # (Q8_0 matmuls on int8 activations in torch)
    for text, out in zip(TEXTS, llm.embed(TEXTS)):
        ids = tok(text)["input_ids"]
        assert llm.engine.tokenizer(text)["input_ids"] == ids
        with torch.no_grad():
            h = model(input_ids=torch.tensor([ids])).last_hidden_state[0].mean(0)
        want = torch.nn.functional.normalize(h, dim=0).numpy()
        np.testing.assert_allclose(out.embedding, want, atol=tolerance, rtol=0)


@pytest.mark.parametrize("pooling", ["mean", "cls"])
def test_reranker_matches_transformers(files, backend, pooling):
    src, path, ref = files[f"rerank-{pooling}"]
    llm = engine(path, backend)
    assert (llm.engine.task, llm.engine.embedder.pooling) == ("score", pooling)
    tok = AutoTokenizer.from_pretrained(src)
    for doc in TEXTS:
        assert tokenize_pair(llm.engine, QUERY, doc)[0] == tok(QUERY, doc)["input_ids"]
    model = AutoModelForSequenceClassification.from_pretrained(ref, dtype=torch.float32).eval()
    with torch.no_grad():
        want = [torch.sigmoid(model(**tok(QUERY, d, return_tensors="pt")).logits[0, 0]).item() for d in TEXTS]
    np.testing.assert_allclose([o.score for o in llm.score(QUERY, TEXTS)], want, atol=2e-5, rtol=0)
