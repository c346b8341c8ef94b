"""EmbeddingGemma (gemma3_text with use_bidirectional_attention): Gemma 3's layers attending both ways, served as
an encoder for embeddings on both backends, against transformers' Gemma3TextModel on the same weights: sliding
layers within |q - k| <= sliding_window // 2 of each query (inputs longer than that), one global layer, GQA,
q/k norms, the sandwich norms and the scaled embedding; then the sentence-transformers folder as released (mean
pooling, two Dense projections without bias, Normalize); `--isq` on it."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from lantern.app.engine import LLM
from lantern.app.models.loader import resolve_model
from lantern.app.models.spec import UnsupportedModelError
from tests.fixtures.tiny_encoders import _randomize, write_sentence_transformers
from tests.fixtures.tiny_models import build_tokenizer

TEXTS = [
    "task: search result | query: The quick brown fox jumps over the lazy dog.",
    "Continuous batching lets new requests join while others decode, one token at a time. " * 2,
    "a",
]


def build_embedding_gemma(out, dense: bool = True, **overrides):
    """A tiny Gemma3TextModel folder with use_bidirectional_attention (window 8: half 4), saved as the base model
    EmbeddingGemma ships, with its sentence-transformers files (mean pooling; two Dense layers 64 -> 96 -> 64
    without bias, as google/embeddinggemma-300m's 768 -> 3072 -> 768)."""
    from safetensors.torch import save_file
    from transformers import Gemma3TextConfig, Gemma3TextModel

    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(out)
    cfg = dict(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        query_pre_attn_scalar=16,
        sliding_window=8,
        layer_types=["sliding_attention", "full_attention", "sliding_attention"],
        max_position_embeddings=512,
        use_bidirectional_attention=True,
        pad_token_id=0,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    cfg.update(overrides)
    torch.manual_seed(0)
    model = Gemma3TextModel(Gemma3TextConfig(**cfg)).eval()
    _randomize(model)
    model.save_pretrained(str(out), safe_serialization=True)
    write_sentence_transformers(out, "mean", 64)
    if dense:
        modules = json.loads((out / "modules.json").read_text())
        layers = [torch.nn.Linear(64, 96, bias=False), torch.nn.Linear(96, 64, bias=False)]
        for i, layer in enumerate(layers):
            where = out / f"{i + 2}_Dense"
            where.mkdir()
            config = {"in_features": layer.in_features, "out_features": layer.out_features, "bias": False}
            config["activation_function"] = "torch.nn.modules.linear.Identity"
            (where / "config.json").write_text(json.dumps(config))
            save_file({"linear.weight": layer.weight.detach().contiguous()}, str(where / "model.safetensors"))
            modules.insert(
                2 + i,
                {"idx": 2 + i, "name": str(2 + i), "path": where.name, "type": "sentence_transformers.models.Dense"},
            )
        (out / "modules.json").write_text(json.dumps(modules))
        return out, layers
    return out, []


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return build_embedding_gemma(tmp_path_factory.mktemp("embeddinggemma"))


def reference(path, layers, ids: list[int]) -> np.ndarray:
    from transformers import AutoModel

    model = AutoModel.from_pretrained(str(path), dtype=torch.float32).eval()
    with torch.no_grad():
        v = model(input_ids=torch.tensor([ids])).last_hidden_state[0].mean(0)
        for layer in layers:
            v = layer(v)
    return torch.nn.functional.normalize(v, dim=0).numpy()


def test_vectors_match_transformers(folder, backend):
    path, layers = folder
    llm = LLM(model=str(path), backend=backend, dtype="float32", block_size=4)
    assert (llm.engine.task, llm.engine.embedder.pooling, llm.engine.embedder.size) == ("embed", "mean", 64)
    assert llm.engine.model_config.encoder.half_window == 4
    for text, out in zip(TEXTS, llm.embed(TEXTS)):
        ids = llm.tokenizer.encode(text)
        assert len(ids) > 9 or text == "a"  # past the sliding layers' reach
        np.testing.assert_allclose(out.embedding, reference(path, layers, ids), atol=1e-4, rtol=0)


def test_isq_q8(folder, backend):
    """--isq q8 on EmbeddingGemma: close to the float vectors (the decoder-style layers quantized)."""
    path, _ = folder
    plain = LLM(model=str(path), backend=backend, dtype="float32", block_size=4)
    quant = LLM(model=str(path), backend=backend, dtype="float32", block_size=4, quantization="q8")
    for a, b in zip(plain.embed(TEXTS), quant.embed(TEXTS)):
        assert 0.99 < float(np.dot(a.embedding, b.embedding)) < 1.0 - 1e-7


def test_generation_and_rope_scaling_are_refused(folder, tmp_path):
    import shutil

    path, _ = folder
    with pytest.raises(ValueError, match="encoder: it serves embeddings only"):
        LLM(model=str(path), backend="torch", dtype="float32", task="generate")
    scaled = tmp_path / "scaled"
    shutil.copytree(path, scaled)
    cfg = json.loads((scaled / "config.json").read_text())
    cfg["rope_parameters"]["full_attention"] = {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6}
    (scaled / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(UnsupportedModelError, match="use_bidirectional_attention"):
        resolve_model(str(scaled))


def test_gguf_gemma_embedding(tmp_path, backend, monkeypatch):
    """llama.cpp's gemma-embedding (Ollama's embeddinggemma), as conversion/gemma.py's EmbeddingGemma writes it:
    norms as 1 + w, the original sliding window (llama.cpp's symmetric window of half of it), five sliding layers
    per full one, mean pooling_type and, converted with --sentence-transformers-dense-modules, dense_2 / dense_3."""
    import gguf

    from tests.fixtures.gguf_families import convert_to_gguf

    monkeypatch.setenv("LANTERN_CACHE", str(tmp_path / "cache"))
    src, layers = build_embedding_gemma(tmp_path / "hf", num_hidden_layers=6, layer_types=None)
    weights = [layer.weight.detach().numpy() for layer in layers]
    path, ref = convert_to_gguf(
        src, tmp_path, "f32", arch="gemma-embedding", pooling_type=int(gguf.PoolingType.MEAN), dense=weights
    )
    llm = LLM(model=str(path), backend=backend, dtype="float32", block_size=4)
    assert (llm.engine.task, llm.engine.embedder.pooling, llm.engine.embedder.size) == ("embed", "mean", 64)
    enc = llm.engine.model_config.encoder
    assert (enc.half_window, enc.local) == (4, (True,) * 5 + (False,))
    for text, out in zip(TEXTS, llm.embed(TEXTS)):
        ids = llm.tokenizer.encode(text)  # (the file's own tokenizer)
        np.testing.assert_allclose(out.embedding, reference(ref, layers, ids), atol=1e-4, rtol=0)
