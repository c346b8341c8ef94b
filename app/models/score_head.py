"""Sequence-classification heads: what turns a cross-encoder's or a reranker's pooled hidden state into its
relevance score (`--task score`, /v1/rerank and /v1/score).

A XxxForSequenceClassification checkpoint is its base model plus a small head on one pooled state. The base model
runs on the backend like an embedding model (the head's tensors are skipped by the model files' name maps); the
head runs here on the pooled vector in float32 on the CPU, like sentence-transformers' Dense modules (st_dense.py):
one or two [H, H] products per input next to the forward pass. The heads, as transformers computes them:

- BertForSequenceClassification: the [CLS] state through the pooler (dense, tanh), then `classifier`.
- Roberta / XLM-RoBERTa / CamemBERT / MPNet (bge-reranker-base / large / v2-m3): `classifier.dense`, tanh,
  `classifier.out_proj` on the [CLS] state.
- DistilBertForSequenceClassification: `pre_classifier`, ReLU, `classifier` on the [CLS] state.
- ModernBertForSequenceClassification (gte-reranker-modernbert): the [CLS] state or the mean
  (classifier_pooling), `head.dense`, classifier_activation, `head.norm` (a LayerNorm), `classifier`.
- A decoder's XxxForSequenceClassification (Qwen3-Reranker converted to seq-cls, Llama / Qwen2 / Gemma
  classifiers): `score` (no bias) on the last token's state after the final norm.

The score is the logit through the activation sentence-transformers' CrossEncoder applies: the one config.json names
(`sentence_transformers.activation_fn`, or the older `sbert_ce_default_activation_function`), else a sigmoid for
one label, as CrossEncoder and vLLM do. A head with more than one label classifies rather than scores, and is
refused for --task score naming its labels. Two more sources give the same one-row head: Qwen3-Reranker as
released (qwen3_reranker.py: its LM head's "yes" row less its "no" row, after its prompt template) and reranker
GGUF files (gguf_score_head.py).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from lantern.app.engine.contract import ModelSpec
from lantern.app.models.errors import UnsupportedModelError

logger = logging.getLogger(__name__)

CLASSIFIER_SUFFIX = "ForSequenceClassification"
# sentence-transformers' activation class paths -> what the head applies to its logits
_ACTIVATIONS = {
    "torch.nn.modules.activation.Sigmoid": "sigmoid",
    "torch.nn.modules.linear.Identity": "identity",
    "torch.nn.modules.activation.Tanh": "tanh",
}
_ROBERTA_LIKE = ("roberta", "xlm-roberta", "camembert", "mpnet")
_GELU = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "relu": "relu", "silu": "silu"}


def classifier_architecture(cfg: dict[str, Any]) -> str | None:
    """The config's XxxForSequenceClassification architecture, or None."""
    return next((a for a in cfg.get("architectures") or [] if str(a).endswith(CLASSIFIER_SUFFIX)), None)


def _read_config(spec: ModelSpec) -> dict[str, Any]:
    if spec.weight_format != "safetensors" or not spec.weight_files:
        raise UnsupportedModelError("a score head needs a safetensors folder with its config.json")
    path = spec.weight_files[0].parent / "config.json"
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise UnsupportedModelError(f"{path}: unreadable ({exc})") from None


def head_pooling(spec: ModelSpec) -> str:
    """The state a classifier head reads: "cls" (encoders' first token), "mean" (ModernBERT's classifier_pooling
    "mean") or "last" (decoders)."""
    if spec.config.encoder is None:
        return "last"
    if spec.weight_format == "gguf":
        from lantern.app.models.gguf_score_head import gguf_head_pooling

        return gguf_head_pooling(spec)
    cfg = _read_config(spec)
    if cfg.get("model_type") == "modernbert":
        pooling = cfg.get("classifier_pooling", "cls")
        if pooling not in ("cls", "mean"):
            raise UnsupportedModelError(f"classifier_pooling={json.dumps(pooling)} in config.json is not implemented")
        return str(pooling)
    return "cls"


def activation_of(cfg: dict[str, Any], num_labels: int) -> str:
    """The activation sentence-transformers' CrossEncoder applies to the logits (its default: a sigmoid for one
    label, none for more)."""
    named = (cfg.get("sentence_transformers") or {}).get("activation_fn") or cfg.get(
        "sbert_ce_default_activation_function"
    )
    if named is None:
        return "sigmoid" if num_labels == 1 else "identity"
    if named not in _ACTIVATIONS:
        raise UnsupportedModelError(f"the cross-encoder activation {named!r} in config.json is not implemented")
    return _ACTIVATIONS[named]


@dataclass(frozen=True)
class Linear:
    weight: np.ndarray  # [out, in] float64 (the head runs in float64)
    bias: np.ndarray | None

    def __call__(self, x: np.ndarray) -> np.ndarray:
        out = self.weight @ x
        return out if self.bias is None else out + self.bias


def _layer_norm(weight: np.ndarray, bias: np.ndarray | None, eps: float) -> Callable[[np.ndarray], np.ndarray]:
    def norm(x: np.ndarray) -> np.ndarray:
        centred = x - x.mean()
        out = centred / np.sqrt((centred * centred).mean() + eps) * weight
        return out if bias is None else out + bias

    return norm


def _act(name: str) -> Callable[[np.ndarray], np.ndarray]:
    from math import erf, pi, sqrt

    if name == "tanh":
        return np.tanh
    if name == "relu":
        return lambda x: np.maximum(x, 0.0)
    if name == "silu":
        return lambda x: x / (1.0 + np.exp(-x))
    if name == "gelu":
        verf = np.vectorize(erf, otypes=[np.float64])
        return lambda x: 0.5 * x * (1.0 + verf(x / sqrt(2.0)))
    if name == "gelu_tanh":
        return lambda x: 0.5 * x * (1.0 + np.tanh(sqrt(2.0 / pi) * (x + 0.044715 * x**3)))
    raise UnsupportedModelError(f"classifier activation {name!r} is not implemented")


@dataclass
class ScoreHead:
    """pooled [H] -> (the activated logits, the logits) [num_labels] in float32 (outputs), computed in float64."""

    pooling: str  # "cls" | "mean" | "last": the pooled state the head reads
    steps: list[Callable[[np.ndarray], np.ndarray]]
    num_labels: int
    activation: str  # "sigmoid" | "identity" | "tanh" | "softmax"
    # A prompt reranker's (Qwen3-Reranker) text around each pair, with {query} and {document}; None: the
    # tokenizer's own pair encoding (cross-encoders)
    template: str | None = None
    labels: list[str] | None = None  # a classifier's id2label, in id order (task classify)

    def outputs(self, pooled: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(the activated logits, the logits) in float32: an Embedder's finish."""
        logits = self.logits(pooled)
        return self.activate(logits), logits.astype(np.float32)

    def logits(self, pooled: np.ndarray) -> np.ndarray:
        """The head's logits [num_labels] in float64, before the activation (TEI's raw_scores)."""
        x = np.asarray(pooled, dtype=np.float64)
        for step in self.steps:
            x = step(x)
        return x

    def activate(self, logits: np.ndarray) -> np.ndarray:
        x = logits
        if self.activation == "sigmoid":
            x = 1.0 / (1.0 + np.exp(-x))
        elif self.activation == "tanh":
            x = np.tanh(x)
        elif self.activation == "softmax":
            e = np.exp(x - x.max())
            x = e / e.sum()
        return x.astype(np.float32)


class _Tensors:
    """The head's tensors across a folder's safetensors files, as float64 (bf16 widened)."""

    def __init__(self, files: list[Path]):
        from lantern.app.models.weight_stream import RawSafetensors

        self.where: dict[str, Any] = {}
        self.files = [RawSafetensors(f) for f in files]
        for raw in self.files:
            for name in raw.names:
                self.where[name] = raw

    def find(self, *names: str) -> np.ndarray | None:
        for name in names:
            if name in self.where:
                return self.where[name].numpy(name).astype(np.float64)
        return None

    def need(self, *names: str) -> np.ndarray:
        got = self.find(*names)
        if got is None:
            raise UnsupportedModelError(f"the classifier head's tensor {names[0]} is missing from the checkpoint")
        return got

    def linear(self, module: str, *prefixes: str, bias: bool = True) -> Linear:
        heads = (module, *(f"{p}{module}" for p in prefixes))
        b = self.find(*(f"{h}.bias" for h in heads)) if bias else None
        return Linear(self.need(*(f"{h}.weight" for h in heads)), b)

    def close(self) -> None:
        for raw in self.files:
            raw.close()


def _steps(cfg: dict[str, Any], model_type: str, tensors: _Tensors, decoder: bool) -> list[Callable]:
    if decoder:
        return [tensors.linear("score", bias=False)]
    if model_type == "bert":
        return [tensors.linear("pooler.dense", "bert."), np.tanh, tensors.linear("classifier")]
    if model_type in _ROBERTA_LIKE:
        return [tensors.linear("classifier.dense"), np.tanh, tensors.linear("classifier.out_proj")]
    if model_type == "distilbert":
        return [tensors.linear("pre_classifier"), _act("relu"), tensors.linear("classifier")]
    if model_type == "modernbert":
        act = cfg.get("classifier_activation", "gelu")  # (ModernBertConfig's default, whatever hidden_activation)
        if act not in _GELU:
            raise UnsupportedModelError(f"classifier_activation={json.dumps(act)} in config.json is not implemented")
        norm = _layer_norm(
            tensors.need("head.norm.weight"), tensors.find("head.norm.bias"), float(cfg.get("norm_eps", 1e-5))
        )
        return [tensors.linear("head.dense"), _act(_GELU[act]), norm, tensors.linear("classifier")]
    raise UnsupportedModelError(f"{model_type} sequence classifiers are not implemented")


def is_reranker(spec: ModelSpec, architectures: list[str]) -> bool:
    """A checkpoint that serves scores by default: a cross-encoder (XxxForSequenceClassification) or a released
    Qwen3-Reranker (a causal LM: qwen3_reranker.py)."""
    from lantern.app.models.qwen3_reranker import is_qwen3_reranker

    return any(str(a).endswith(CLASSIFIER_SUFFIX) for a in architectures) or is_qwen3_reranker(spec)


def _gguf_head(spec: ModelSpec) -> ScoreHead:
    from lantern.app.models.gguf_score_head import gguf_head_parts

    parts, template = gguf_head_parts(spec)
    steps: list[Callable[[np.ndarray], np.ndarray]] = []
    for part in parts:
        if isinstance(part, str):
            steps.append(_act(part))
        elif isinstance(part[0], str):  # ("norm", (weight, bias), eps)
            steps.append(_layer_norm(*part[1], part[2]))
        else:
            steps.append(Linear(*part))
    pooling = head_pooling(spec)
    logger.info("task: scores from the GGUF file's reranker head (%s pooling, sigmoid)", pooling)
    return ScoreHead(pooling, steps, 1, "sigmoid", template)


def _yes_no_head(spec: ModelSpec, tokenizer: Any) -> ScoreHead:
    from lantern.app.models.qwen3_reranker import TEMPLATE, yes_no_row

    row = yes_no_row(spec, tokenizer)
    logger.info("task: scores as Qwen3-Reranker's P(yes) against P(no) at the prompt's last token")
    return ScoreHead("last", [Linear(row[None, :], None)], 1, "sigmoid", TEMPLATE)


def label_count(spec: ModelSpec) -> int:
    """The labels a classifier folder's config states (transformers' default: 2); 1 for the other rerankers."""
    if spec.weight_format != "safetensors" or classifier_architecture(cfg := _read_config(spec)) is None:
        return 1
    if cfg.get("id2label"):
        return len(cfg["id2label"])
    return int(cfg.get("num_labels", 2))


def _labels(cfg: dict[str, Any], count: int) -> list[str]:
    named = {int(k): str(v) for k, v in (cfg.get("id2label") or {}).items()}
    return [named.get(i, f"LABEL_{i}") for i in range(count)]


def load_score_head(spec: ModelSpec, tokenizer: Any, task: str = "score") -> ScoreHead:
    """The checkpoint's head for --task score (a XxxForSequenceClassification folder's, a reranker GGUF's, or a
    Qwen3-Reranker's yes / no rows) or --task classify (a sequence classifier's: softmax over its labels, or a
    sigmoid each for one label or a multi_label_classification problem_type, as transformers' pipeline)."""
    cfg = _read_config(spec) if spec.weight_format == "safetensors" else {}
    arch = classifier_architecture(cfg)
    if task == "classify" and arch is None:
        raise UnsupportedModelError(f"--task classify needs a sequence classifier ({CLASSIFIER_SUFFIX}) with labels")
    if spec.weight_format == "gguf":
        return _gguf_head(spec)
    if arch is None and spec.config.encoder is None and spec.config.architecture == "qwen3":
        return _yes_no_head(spec, tokenizer)  # (--task score on a qwen3 causal LM: Qwen3-Reranker's format)
    if arch is None:
        names = ", ".join(cfg.get("architectures") or []) or "none"
        raise UnsupportedModelError(
            f"--task score needs a cross-encoder ({CLASSIFIER_SUFFIX}) or a Qwen3-Reranker; the folder's "
            f"architectures: {names}"
        )
    tensors = _Tensors(spec.weight_files)
    try:
        steps = _steps(cfg, str(cfg.get("model_type", "")), tensors, spec.config.encoder is None)
    finally:
        tensors.close()
    last = next(s for s in reversed(steps) if isinstance(s, Linear))
    num_labels = int(last.weight.shape[0])
    if task == "classify":
        multi = cfg.get("problem_type") == "multi_label_classification" or num_labels == 1
        head = ScoreHead(head_pooling(spec), steps, num_labels, "sigmoid" if multi else "softmax")
        head.labels = _labels(cfg, num_labels)
        logger.info("task: classes from %s's head (%d labels, %s)", arch, num_labels, head.activation)
        return head
    if num_labels != 1:
        labels = cfg.get("id2label") or {}
        shown = ", ".join(str(v) for v in labels.values()) if labels else f"{num_labels} labels"
        raise UnsupportedModelError(
            f"{arch} has {num_labels} labels ({shown}): it classifies (--task classify); --task score needs one "
            "relevance logit"
        )
    activation = activation_of(cfg, num_labels)
    head = ScoreHead(head_pooling(spec), steps, num_labels, activation)
    logger.info("task: scores from %s's classifier head (%s pooling, %s)", arch, head.pooling, activation)
    return head
