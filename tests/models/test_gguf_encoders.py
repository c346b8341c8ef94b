"""BERT-style encoder GGUFs (llama.cpp's `bert` architecture: all-MiniLM / bge / mxbai-embed-large, and XLM-R's
bge-m3 / multilingual-e5, which the converter writes as `bert` too; `nomic-bert`: nomic-embed-text) served for
embeddings on both backends:
written as conversion/bert.py writes them (tests/fixtures/gguf_encoders.py), in f32 and Q8_0. The tokenizer rebuilt
from the file's WordPiece or Unigram vocabulary gives the folder's own tokenizer's ids; the vectors equal
transformers' on the values the file holds; the pooling is the file's pooling_type."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lantern.app.engine import LLM
from lantern.app.models.loader import resolve_model
from lantern.app.models.pooling import resolve_task
from tests.fixtures.gguf_encoders import convert_encoder_to_gguf
from tests.fixtures.tiny_encoders import build_bert

TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "Numbers 0123456789 and caf\u00e9, na\u00efve   spaces\tand\nlines",
    "  leading and trailing  ",
    "Continuous batching lets new requests join while others decode. [SEP] <s> not special here",
    "a",
]
KINDS = {  # name: (model_type, pooling, builder overrides)
    "bert": ("bert", "mean", {}),
    "xlm-roberta": ("xlm-roberta", "cls", {"max_position_embeddings": 258}),
    "nomic": ("nomic_bert", "mean", {"max_position_embeddings": 256}),  # llama.cpp's nomic-bert
    "distilbert": ("distilbert", "mean", {}),  # llama.cpp's bert without token types
}


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("LANTERN_CACHE", str(tmp_path / "cache"))


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    cache: dict[tuple[str, str], tuple] = {}

    def get(kind: str, outtype: str):
        if (kind, outtype) not in cache:
            model_type, pooling, extra = KINDS[kind]
            root = tmp_path_factory.mktemp(f"{kind}-{outtype}")
            src = build_bert(root / "hf", pooling, seed=3, model_type=model_type, **extra)
            path, ref = convert_encoder_to_gguf(src, root, outtype)
            cache[(kind, outtype)] = (src, path, ref, pooling)
        return cache[(kind, outtype)]

    return get


def reference(folder, ids: list[int], pooling: str) -> np.ndarray:
    from transformers import AutoModel

    model = AutoModel.from_pretrained(str(folder), dtype=torch.float32).eval()
    with torch.no_grad():
        h = model(input_ids=torch.tensor([ids])).last_hidden_state[0]
    return torch.nn.functional.normalize(h[0] if pooling == "cls" else h.mean(0), dim=0).numpy()


@pytest.mark.parametrize("outtype", ["f32", "q8_0"])
@pytest.mark.parametrize("kind", list(KINDS))
def test_vectors_match_transformers(files, backend, kind, outtype):
    from transformers import AutoTokenizer

    src, path, ref, pooling = files(kind, outtype)
    llm = LLM(model=str(path), backend=backend, dtype="float32", block_size=4)
    assert (llm.engine.task, llm.engine.embedder.pooling) == ("embed", pooling)  # the file's pooling_type
    folder_tokenizer = AutoTokenizer.from_pretrained(str(src))
    for text, out in zip(TEXTS, llm.embed(TEXTS)):
        ids = llm.tokenizer.encode(text)
        assert ids == folder_tokenizer.encode(text), text
        np.testing.assert_allclose(out.embedding, reference(ref, ids, pooling), atol=1e-4, rtol=0)


def test_config_and_task(files):
    _, path, _, _ = files("xlm-roberta", "q8_0")
    spec = resolve_model(str(path)).spec
    enc = spec.config.encoder
    # The file's position table starts at row padding_idx + 1: served as BERT's, 256 positions.
    assert (spec.config.architecture, enc.padding_idx, enc.position_rows) == ("bert", None, 256)
    assert spec.config.max_position_embeddings == 256 and enc.type_vocab_size == 1
    assert resolve_task("auto", "auto", spec) == ("embed", "cls")
    with pytest.raises(ValueError, match="encoder: it serves embeddings only"):
        resolve_task("generate", "auto", spec)
