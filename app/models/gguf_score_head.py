"""Reranker heads from GGUF files (`{arch}.pooling_type` 4, RANK), as llama.cpp's converter writes them:

- XLM-RoBERTa / RoBERTa rerankers (bge-reranker-base / large / v2-m3, written as `bert`): the classification
  head's dense as `cls` and its out_proj as `cls.output`: tanh(cls . h_cls) then cls.output, transformers' head.
  A BertForSequenceClassification file holds only `cls.output`: the converter drops BERT's pooler, which the head
  reads through, so such a file cannot give the model's scores and is refused saying so.
- ModernBERT rerankers (gte-reranker-modernbert, `modern-bert`): the prediction head's dense as `cls`, its LayerNorm
  as `cls.norm`, the classifier as `cls.output`, read after mean or [CLS] pooling (classifier.pooling_type).
- Qwen3-Reranker (`qwen3`): `cls.output` holds the LM head's rows for "yes" and "no" (in that order), softmaxed
  at the last token; the prompt is the file's `tokenizer.chat_template.rerank` with {query} and {document}.
  softmax(...)[0] = sigmoid((w_yes - w_no) . h): one row under a sigmoid (qwen3_reranker.py says the same of the
  released folders).

The encoders' score is the logit through a sigmoid (sentence-transformers' CrossEncoder default for one label;
llama-server's /rerank returns the raw logit, the same order). The head's tensors are small: dequantized with the
gguf package's reference and run on the host like the safetensors heads (score_head.py).
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from lantern.app.engine.contract import ModelSpec
from lantern.app.models.errors import UnsupportedModelError

logger = logging.getLogger(__name__)

_RANK = 4  # gguf.PoolingType.RANK
_DECODER_RERANKERS = ("qwen3",)  # the architectures llama.cpp softmaxes a yes / no head for


def _tensors(spec: ModelSpec) -> tuple[Any, dict[str, np.ndarray]]:
    import gguf

    from lantern.app.models.gguf_names import read_gguf_index

    index = read_gguf_index(str(spec.weight_files[0]))
    heads = {}
    for t in index.tensors:
        if t.name.startswith("cls."):
            heads[t.name] = np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float64)
    return index, heads


def gguf_head_parts(spec: ModelSpec) -> tuple[list[Any], str | None]:
    """The head as steps ((weight, bias) linears, "tanh" / "gelu", ("norm", (weight, bias), eps) LayerNorms) and the
    decoder's prompt template (None for encoders)."""
    index, heads = _tensors(spec)
    name = spec.weight_files[0].name
    if index.metadata.get(f"{index.architecture}.pooling_type") != _RANK:
        raise UnsupportedModelError(
            f"{name} is not a reranker ({index.architecture}.pooling_type is not 4, rank): --task score needs one"
        )
    out, out_b = heads.get("cls.output.weight"), heads.get("cls.output.bias")
    if out is None:
        raise UnsupportedModelError(f"{name}: a reranker GGUF without its cls.output tensor is not implemented")
    if spec.config.encoder is None:
        if index.architecture not in _DECODER_RERANKERS or out.shape[0] != 2:
            raise UnsupportedModelError(
                f"{name}: a {index.architecture} reranker with {out.shape[0]} outputs is not implemented "
                "(Qwen3-Reranker's yes / no rows are)"
            )
        template = index.metadata.get("tokenizer.chat_template.rerank")
        if not isinstance(template, str) or "{query}" not in template or "{document}" not in template:
            raise UnsupportedModelError(f"{name}: no tokenizer.chat_template.rerank with {{query}} and {{document}}")
        return [((out[0] - out[1])[None, :], None)], template
    dense = heads.get("cls.weight")
    if dense is None:
        raise UnsupportedModelError(
            f"{name}: a BERT cross-encoder GGUF (cls.output without cls) lacks BertForSequenceClassification's "
            "pooler, which llama.cpp's converter drops; its scores cannot be computed: serve the safetensors folder"
        )
    if out.shape[0] != 1:
        raise UnsupportedModelError(f"{name}: a classifier with {out.shape[0]} labels: it classifies, not scores")
    if index.architecture == "modern-bert":  # ModernBertPredictionHead: dense, GELU, LayerNorm, then the classifier
        norm = (heads["cls.norm.weight"], heads.get("cls.norm.bias"))
        eps = float(index.metadata.get("modern-bert.attention.layer_norm_epsilon", 1e-5))
        return [(dense, heads.get("cls.bias")), "gelu", ("norm", norm, eps), (out, out_b)], None
    return [(dense, heads.get("cls.bias")), "tanh", (out, out_b)], None


def gguf_head_pooling(spec: ModelSpec) -> str:
    """The state an encoder reranker's head reads: [CLS], or ModernBERT's classifier_pooling (mean when the file
    states none, as llama.cpp reads gte-reranker-modernbert's)."""
    from lantern.app.models.gguf_names import read_gguf_index

    index = read_gguf_index(str(spec.weight_files[0]))
    if index.architecture != "modern-bert":
        return "cls"
    return {1: "mean", 2: "cls"}.get(int(index.metadata.get("modern-bert.classifier.pooling_type", 1)), "mean")
