"""Which task a model serves (text generation, embeddings or relevance scores) and how its states are pooled.

Defaults come from the model folder: a sentence-transformers folder (modules.json), an
architecture named *Embedding* or a BERT encoder serves embeddings; everything else generates.
The pooling is the folder's sentence-transformers Pooling module (1_Pooling/config.json) when it
has one, else last-token for a decoder (Qwen3-Embedding, e5-mistral) and mean for an encoder.
A GGUF file says both in `{arch}.pooling_type`, which llama.cpp's converter writes from that
Pooling module (Qwen3-Embedding and EmbeddingGemma GGUFs): mean, cls or last serve embeddings;
rank (a reranker's classification head: bge-reranker, Qwen3-Reranker) serves scores.
Dense projections after the pooling are applied (st_dense.py); modules that would change the vectors in ways
Lantern does not compute (max pooling, instructions excluded from the mean) are refused naming the key.
A cross-encoder (XxxForSequenceClassification) serves scores, a classifier of several labels classes: its head says
the pooling (score_head.py).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from lantern.app.engine.contract import ModelSpec
from lantern.app.models.spec import UnsupportedModelError

logger = logging.getLogger(__name__)

TASKS = ("auto", "generate", "embed", "score", "classify")
POOLINGS = ("auto", "last", "mean", "cls")
# sentence-transformers' Pooling config keys -> Lantern's pooling; the other modes are refused.
_ST_MODES = {"pooling_mode_cls_token": "cls", "pooling_mode_mean_tokens": "mean", "pooling_mode_lasttoken": "last"}
_ST_REFUSED = ("pooling_mode_max_tokens", "pooling_mode_mean_sqrt_len_tokens", "pooling_mode_weightedmean_tokens")
# Modules whose effect Lantern reproduces: the transformer itself, the pooling, Dense projections after it
# (app/models/st_dense.py) and the L2 normalization every vector gets anyway.
_ST_MODULES = ("Transformer", "Pooling", "Dense", "Normalize")


def embedding_folder(spec: ModelSpec) -> Path | None:
    """The folder whose sentence-transformers files say the pooling (None: a GGUF file)."""
    return spec.weight_files[0].parent if spec.weight_format == "safetensors" and spec.weight_files else None


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise UnsupportedModelError(f"{path}: unreadable ({exc})") from None


def sentence_transformers_pooling(folder: Path) -> str | None:
    """The pooling a sentence-transformers folder declares (None: not such a folder, or no
    Pooling module); refuses modules and modes Lantern does not compute, naming them."""
    modules_file = folder / "modules.json"
    if not modules_file.is_file():
        return None
    pooling: str | None = None
    for module in _read_json(modules_file):
        kind = str(module.get("type", "")).rsplit(".", 1)[-1]
        if kind not in _ST_MODULES:
            raise UnsupportedModelError(
                f"modules.json: module {module.get('type')!r} ({module.get('path')}) is not implemented; "
                f"Lantern computes {', '.join(_ST_MODULES)}"
            )
        if kind == "Dense" and pooling is None:
            raise UnsupportedModelError(
                f"modules.json: a Dense module ({module.get('path')}) before the Pooling module"
            )
        if kind != "Pooling":
            continue
        where = folder / str(module.get("path", "")) / "config.json"
        cfg = _read_json(where) if where.is_file() else {}
        on = [key for key, value in cfg.items() if key.startswith("pooling_mode_") and value is True]
        refused = [key for key in on if key in _ST_REFUSED or key not in _ST_MODES]
        if refused:
            raise UnsupportedModelError(f"{refused[0]}=true in {where} is not implemented")
        if len(on) > 1:
            raise UnsupportedModelError(f"{where}: {' and '.join(on)} (concatenated poolings) are not implemented")
        if cfg.get("include_prompt", True) is not True:
            raise UnsupportedModelError(f"include_prompt=false in {where} is not implemented")
        pooling = _ST_MODES[on[0]] if on else "mean"  # sentence-transformers' default mode
    return pooling


# llama.cpp's enum llama_pooling_type (gguf.PoolingType): NONE 0, MEAN 1, CLS 2, LAST 3, RANK 4.
_GGUF_POOLING = {1: "mean", 2: "cls", 3: "last"}
_GGUF_RANK = 4  # a reranker: its classifier head gives scores (--task score, score_head.py)


def gguf_pooling(spec: ModelSpec) -> str | None:
    """The pooling a GGUF file's metadata declares (None: not a GGUF file, or no pooling stated; "rank": a
    reranker, served for scores)."""
    if spec.weight_format != "gguf" or not spec.weight_files:
        return None
    from lantern.app.models.gguf_names import read_gguf_index

    index = read_gguf_index(str(spec.weight_files[0]))
    key = f"{index.architecture}.pooling_type"
    value = index.metadata.get(key)
    if value is None or int(value) == 0:
        return None
    if int(value) == _GGUF_RANK:
        return "rank"
    if int(value) not in _GGUF_POOLING:
        raise UnsupportedModelError(f"{key}={value} in {spec.weight_files[0].name} is not implemented")
    return _GGUF_POOLING[int(value)]


def _architectures(folder: Path | None) -> list[str]:
    cfg_file = folder / "config.json" if folder else None
    return list(_read_json(cfg_file).get("architectures") or []) if cfg_file and cfg_file.is_file() else []


def _score_task(pooling: str, spec: ModelSpec, task: str = "score") -> tuple[str, str]:
    """("score" or "classify", the pooling its head reads); auto: "classify" for a head of several labels."""
    from lantern.app.models.score_head import head_pooling, label_count

    if task == "auto":
        task = "classify" if label_count(spec) > 1 else "score"
    if pooling != "auto":
        raise ValueError(
            "--pooling applies to embeddings (--task embed); a score head reads the state it was trained on"
        )
    return task, head_pooling(spec)


def resolve_task(task: str, pooling: str, spec: ModelSpec) -> tuple[str, str | None]:
    """(task, pooling) for the model: "generate" with pooling None, or "embed" / "score" / "classify" with one of
    last / mean / cls. task and pooling may be "auto" (the folder's defaults)."""
    if task not in TASKS:
        raise ValueError(f"task must be one of {', '.join(TASKS)}; got {task!r}")
    if pooling not in POOLINGS:
        raise ValueError(f"pooling must be one of {', '.join(POOLINGS)}; got {pooling!r}")
    folder = embedding_folder(spec)
    encoder = spec.config.encoder is not None
    from_gguf = gguf_pooling(spec) if task != "generate" else None
    if task == "auto":
        from lantern.app.models.score_head import is_reranker

        architectures = _architectures(folder)
        if from_gguf == "rank" or is_reranker(spec, architectures):
            return _score_task(pooling, spec, "auto")
        st_folder = folder is not None and (folder / "modules.json").is_file()
        named = any("Embedding" in a for a in architectures)
        task = "embed" if encoder or st_folder or named or from_gguf else "generate"
    if task in ("score", "classify"):
        return _score_task(pooling, spec, task)
    if task == "generate":
        if encoder:
            raise ValueError(
                f"{spec.name} is a {spec.config.architecture} encoder: it serves embeddings only (--task embed)"
            )
        if pooling != "auto":
            raise ValueError("--pooling applies to embeddings (--task embed) only")
        return "generate", None
    if from_gguf == "rank":
        raise ValueError(f"{spec.name} is a reranker (pooling_type rank): it serves scores (--task score)")
    declared = sentence_transformers_pooling(folder) if folder else from_gguf
    if pooling == "auto":
        pooling = declared or ("mean" if encoder else "last")
    source = "the folder's sentence-transformers Pooling module" if folder else "the GGUF file's pooling_type"
    logger.info("task: embeddings, %s pooling%s, L2-normalized", pooling, f" ({source})" if declared == pooling else "")
    return "embed", pooling
