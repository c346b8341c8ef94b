"""RoBERTa, XLM-RoBERTa, CamemBERT, MPNet, DistilBERT, Nomic BERT and ModernBERT encoders (bge-m3,
multilingual-e5, all-mpnet-base-v2, msmarco-distilbert, nomic-embed-text, gte-modernbert) served for
embeddings on both backends, against transformers' own model classes on the same weights: RoBERTa's
positions (counted from padding_idx + 1, padding tokens at padding_idx, the table two rows longer than the
context), MPNet's relative-position bias (its buckets past the exact and logarithmic ranges), DistilBERT's
own keys and names, Nomic BERT's rope and SwiGLU (and nomic's released config keys), ModernBERT's rope,
GeGLU and local / global layers (inputs longer than the window), XxxForMaskedLM folders, and the refusals
of what is not an embedding encoder."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoTokenizer

from lantern.app.engine import LLM, InvalidRequestError
from lantern.app.models.family_bert import mpnet_buckets
from lantern.app.models.loader import resolve_model
from lantern.app.models.spec import UnsupportedModelError
from tests.fixtures.tiny_encoders import build_bert

TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "Numbers 0123456789",
    "Continuous batching lets new requests join while others decode, one token at a time. " * 2,
    "a",
]
LONG = "Paged attention keeps every sequence in fixed blocks so memory is never fragmented. " * 4  # ~180 tokens

CASES = {  # name: (model_type, pooling, builder overrides)
    "roberta": ("roberta", "mean", {}),
    "xlm-roberta": ("xlm-roberta", "cls", {"max_position_embeddings": 258}),  # a sentencepiece vocab of ~130
    "camembert": ("camembert", "mean", {}),
    "mpnet": ("mpnet", "mean", {"max_position_embeddings": 258}),  # room for distances past 128
    "nomic": ("nomic_bert", "mean", {"max_position_embeddings": 256}),  # rope, SwiGLU, no biases
    "distilbert": ("distilbert", "cls", {}),
    "distilbert-relu": ("distilbert", "mean", {"activation": "relu"}),
    "modernbert": ("modernbert", "mean", {}),  # local layers of a 16-token window, one global
    "modernbert-biased": (
        "modernbert",
        "cls",
        {"norm_bias": True, "attention_bias": True, "mlp_bias": True, "hidden_activation": "gelu_pytorch_tanh"},
    ),
}


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("encoders")
    built = {
        name: str(build_bert(root / name, pooling, seed=i, model_type=model_type, **extra))
        for i, (name, (model_type, pooling, extra)) in enumerate(CASES.items())
    }
    built["roberta-mlm"] = str(build_bert(root / "roberta-mlm", "mean", seed=7, model_type="roberta", masked_lm=True))
    return built


def engine(folder: str, backend: str, **options) -> LLM:
    return LLM(model=folder, backend=backend, dtype="float32", block_size=4, **options)


def reference(folder: str, ids: list[int], pooling: str) -> np.ndarray:
    """transformers' base model on one unpadded input, pooled and L2-normalized."""
    from transformers import AutoModel

    model = AutoModel.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.no_grad():
        h = model(input_ids=torch.tensor([ids])).last_hidden_state[0]
    return torch.nn.functional.normalize(h[0] if pooling == "cls" else h.mean(0), dim=0).numpy()


@pytest.mark.parametrize("name", [*CASES, "roberta-mlm"])
def test_vectors_match_transformers(folders, backend, name):
    """Inputs of different lengths in one step (padded together), each equal to transformers alone."""
    pooling = CASES.get(name, (None, "mean"))[1]
    llm = engine(folders[name], backend)
    assert (llm.engine.task, llm.engine.embedder.pooling) == ("embed", pooling)
    texts = TEXTS + ([LONG] if name == "mpnet" else [])
    outs = llm.embed(texts)
    folder_tokenizer = AutoTokenizer.from_pretrained(folders[name])
    for text, out in zip(texts, outs):
        ids = llm.tokenizer.encode(text)
        assert ids == folder_tokenizer.encode(text)  # <s> ... </s> (ModernBERT: [CLS] ... [SEP])
        assert out.num_prompt_tokens == len(ids)
        np.testing.assert_allclose(out.embedding, reference(folders[name], ids, pooling), atol=1e-4, rtol=0)


@pytest.mark.parametrize("name", ["xlm-roberta", "mpnet"])
def test_padding_ids_inside_an_input(folders, backend, name):
    """Token ids with the padding id (1) inside: that token sits at padding_idx and the positions
    after it skip it, as transformers' create_position_ids_from_input_ids counts."""
    llm = engine(folders[name], backend)
    ids = [0, 40, 1, 41, 1, 1, 42, 43, 2]
    plain = [0, 40, 41, 42, 43, 2]
    got = llm.embed([ids, plain])
    pooling = CASES[name][1]
    np.testing.assert_allclose(got[0].embedding, reference(folders[name], ids, pooling), atol=1e-4, rtol=0)
    np.testing.assert_allclose(got[1].embedding, reference(folders[name], plain, pooling), atol=1e-4, rtol=0)


def test_context_is_the_table_less_the_padding_rows(folders):
    """A RoBERTa table of 66 rows serves 64 tokens: the longest input matches transformers, one more
    is a 400 naming the input."""
    llm = engine(folders["roberta"], "torch")
    assert llm.engine.max_model_len == 64
    longest = [0] + [30 + i % 200 for i in range(62)] + [2]
    np.testing.assert_allclose(
        llm.embed([longest])[0].embedding, reference(folders["roberta"], longest, "mean"), atol=1e-4
    )
    with pytest.raises(InvalidRequestError) as err:
        llm.embed([longest + [2]])
    assert err.value.param == "input" and err.value.code == "context_length_exceeded"


def test_mpnet_buckets_equal_transformers():
    from transformers.models.mpnet.modeling_mpnet import MPNetEncoder

    for length in (1, 9, 300, 700):
        pos = torch.arange(length)
        want = MPNetEncoder.relative_position_bucket(pos[None, :] - pos[:, None]).numpy()
        np.testing.assert_array_equal(mpnet_buckets(length), want)


def _with_config(folder: str, tmp_path, **changes) -> str:
    import shutil

    out = tmp_path / "changed"
    shutil.copytree(folder, out)
    cfg = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**cfg, **changes}))
    return str(out)


@pytest.mark.parametrize(
    "changes,match",
    [
        ({"architectures": ["XLMRobertaForTokenClassification"]}, "XLMRobertaForTokenClassification"),
        ({"position_embedding_type": "relative_key"}, "position_embedding_type"),
        ({"max_position_embeddings": 2}, "max_position_embeddings=2"),
        ({"hidden_act": "silu"}, "hidden_act"),
    ],
    ids=["token-classifier", "relative-key", "no-positions", "act"],
)
def test_refusals_name_the_key(folders, tmp_path, changes, match):
    with pytest.raises(UnsupportedModelError, match=match):
        resolve_model(_with_config(folders["xlm-roberta"], tmp_path, **changes))


def test_modernbert_released_config_keys(folders, tmp_path):
    """ModernBERT-base's config.json states global_rope_theta / local_rope_theta / global_attn_every_n_layers at
    the top (transformers 4.48's keys, no rope_parameters or layer_types): read as transformers reads them."""
    cfg = json.loads((Path(folders["modernbert"]) / "config.json").read_text())
    for key in ("rope_parameters", "layer_types"):
        cfg.pop(key, None)
    old = _with_config(folders["modernbert"], tmp_path, global_rope_theta=900.0, local_rope_theta=300.0)
    (Path(old) / "config.json").write_text(
        json.dumps({**cfg, "global_rope_theta": 900.0, "local_rope_theta": 300.0, "global_attn_every_n_layers": 2})
    )
    llm = engine(old, "torch")
    enc = llm.engine.model_config.encoder
    assert (enc.global_theta, enc.local_theta, enc.local) == (900.0, 300.0, (False, True, False))
    ids = llm.tokenizer.encode(TEXTS[2])
    np.testing.assert_allclose(llm.embed([ids])[0].embedding, reference(old, ids, "mean"), atol=1e-4, rtol=0)


def test_a_classifier_without_its_head_is_refused(folders, tmp_path):
    """A config naming a cross-encoder over weights that lack its head: the missing tensor is named at load."""
    changed = _with_config(folders["modernbert"], tmp_path, architectures=["ModernBertForSequenceClassification"])
    with pytest.raises(UnsupportedModelError, match=r"tensor head\.\w+\.weight is missing"):
        engine(changed, "torch")


def test_nomic_released_folder(folders, backend, tmp_path):
    """nomic-ai's released layout (its own config keys, Wqkv / fc11 / fc12 / norm1 names, as transformers'
    conversion mapping reads them): the vectors of the transformers-saved folder. (transformers itself reads
    nomic's keys as its defaults, right only at nomic-embed-text's own 768 x 12 shape.)"""
    from tests.fixtures.tiny_encoders import as_released_nomic

    released = str(as_released_nomic(Path(folders["nomic"]), tmp_path / "released"))
    cfg = json.loads((Path(released) / "config.json").read_text())
    assert "n_embd" in cfg and "hidden_size" not in cfg
    llm = engine(released, backend)
    assert llm.engine.model_config.encoder.rope_theta == 1000.0
    ids = llm.tokenizer.encode(TEXTS[2])
    got = llm.embed([ids])[0].embedding
    np.testing.assert_allclose(got, reference(folders["nomic"], ids, "mean"), atol=1e-4, rtol=0)


@pytest.mark.parametrize(
    "key,value", [("rotary_emb_fraction", 0.5), ("prenorm", True), ("qkv_proj_bias", True), ("moe_every_n_layers", 2)]
)
def test_nomic_variants_are_refused(folders, tmp_path, key, value):
    from tests.fixtures.tiny_encoders import as_released_nomic

    released = as_released_nomic(Path(folders["nomic"]), tmp_path / "released")
    cfg = json.loads((released / "config.json").read_text())
    (released / "config.json").write_text(json.dumps({**cfg, key: value}))
    with pytest.raises(UnsupportedModelError, match=key):
        resolve_model(str(released))


# ---- --isq on encoders: the same quantized layers as the decoders' ------------------------------------
_FLOAT_TABLES = ("position_embeddings", "token_type_embeddings", "relative_attention_bias")


@pytest.mark.parametrize("scheme", ["q8", "q4"])
@pytest.mark.parametrize("name", ["roberta", "mpnet", "nomic", "modernbert"])
def test_isq_encoders_match_the_dequantized_reference(folders, backend, tmp_path, caplog, name, scheme):
    """`--isq` quantizes an encoder's matrices in the backend's layout (its position / token-type tables and MPNet's
    bias stay float): the vectors equal transformers' on the quantized-then-dequantized weights, and the float
    model's are further from them (the quantization is real)."""
    from lantern.app.models.quant.affine import quantize_affine
    from tests.models.quant_logits import reference_folder
    from tests.models.test_isq import COLUMN_UNIT, MODES

    bits, group, symmetric = MODES[(backend, scheme)]
    unit = COLUMN_UNIT.get((backend, scheme), 1)

    def quantized(key, w):
        if w.ndim != 2 or any(t in key for t in _FLOAT_TABLES) or w.shape[1] % max(group, unit, 1):
            return w
        return quantize_affine(w.astype("float32"), bits, group or w.shape[1], symmetric=symmetric).dequantize()

    ref = str(reference_folder(Path(folders[name]), tmp_path / "ref", quantized))
    pooling = CASES[name][1]
    with caplog.at_level(logging.DEBUG, logger="lantern.app.models.isq"):
        quant = engine(folders[name], backend, quantization=scheme)
    assert "were expected" not in caplog.text  # the progress bar counted every matrix (isq_candidates)
    plain = engine(folders[name], backend)
    for text, q, f in zip(TEXTS, quant.embed(TEXTS), plain.embed(TEXTS)):
        want = reference(ref, quant.tokenizer.encode(text), pooling)
        err, err_float = np.abs(q.embedding - want).max(), np.abs(f.embedding - want).max()
        # (the quantized kernels' own rounding: ~1e-3 on these unit vectors; the float model is 10x further off)
        assert err <= 5e-3 and err_float > 10 * err, (text, err, err_float)
