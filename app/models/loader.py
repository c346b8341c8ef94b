"""Resolve a model argument (HF folder, HF hub id, or .gguf file) to a ModelSpec and a tokenizer."""
from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.models.spec import ModelConfig, ModelSpec

logger = logging.getLogger(__name__)

_HUB_PATTERNS = ["*.json", "*.safetensors", "tokenizer.model", "*.jinja", "*.txt"]


class ModelNotFoundError(RuntimeError):
    pass


@dataclass
class LoadedModel:
    spec: ModelSpec
    tokenizer: Any  # a transformers fast tokenizer
    eos_token_ids: list[int]
    chat_template: str | None


def resolve_model(model: str, dtype: str = "float32") -> LoadedModel:
    path = Path(model).expanduser()
    if path.suffix.lower() == ".gguf":
        if not path.is_file():
            raise ModelNotFoundError(f"GGUF file not found: {path}")
        return _load_gguf(path, dtype)
    if path.is_dir():
        return _load_hf_dir(path, path.resolve().name, dtype)
    if path.exists() or model.startswith((".", "/", "~")):
        raise ModelNotFoundError(f"not a model folder or .gguf file: {path}")
    return _load_hf_dir(_download(model), model, dtype)


def _download(repo_id: str) -> Path:
    """From the user's HF cache when present; otherwise from the hub; one clear line on failure."""
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(repo_id, allow_patterns=_HUB_PATTERNS, local_files_only=True))
    except Exception:
        pass
    if os.environ.get("HF_HUB_OFFLINE") == "1":
        raise ModelNotFoundError(f"model {repo_id!r} is not in the local Hugging Face cache (HF_HUB_OFFLINE=1)")
    logger.info("downloading %s from the Hugging Face hub", repo_id)
    try:
        return Path(snapshot_download(repo_id, allow_patterns=_HUB_PATTERNS))
    except Exception as exc:  # network down, no such repo, gated...
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelNotFoundError(
            f"model {repo_id!r} is not cached locally and could not be downloaded: {reason}"
        ) from None


def _collect_eos(config: ModelConfig, tokenizer: Any, gen_cfg: dict[str, Any]) -> list[int]:
    ids: list[int] = []
    for source in (gen_cfg.get("eos_token_id"), config.eos_token_ids, tokenizer.eos_token_id):
        for t in [source] if isinstance(source, int) else list(source or []):
            if t not in ids:
                ids.append(t)
    return ids


def _load_hf_dir(path: Path, name: str, dtype: str) -> LoadedModel:
    from transformers import AutoTokenizer

    cfg_file = path / "config.json"
    if not cfg_file.is_file():
        raise ModelNotFoundError(f"{path} has no config.json")
    config = ModelConfig.from_hf(json.loads(cfg_file.read_text()))
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ModelNotFoundError(f"{path} has no *.safetensors weights")
    gen_file = path / "generation_config.json"
    gen_cfg = json.loads(gen_file.read_text()) if gen_file.is_file() else {}
    tokenizer = AutoTokenizer.from_pretrained(str(path))
    spec = ModelSpec(name=name, config=config, weight_format="safetensors", weight_files=files, dtype=dtype)
    return LoadedModel(spec, tokenizer, _collect_eos(config, tokenizer, gen_cfg), tokenizer.chat_template)


def _load_gguf(path: Path, dtype: str) -> LoadedModel:
    """Hyper-parameters and tokenizer come from the file; transformers maps GGUF metadata to HF."""
    from transformers import AutoConfig, AutoTokenizer

    logger.info("reading GGUF metadata and tokenizer from %s", path)
    hf_cfg = AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name).to_dict()
    config = ModelConfig.from_hf(hf_cfg)
    tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    spec = ModelSpec(name=path.stem, config=config, weight_format="gguf", weight_files=[path], dtype=dtype)
    return LoadedModel(spec, tokenizer, _collect_eos(config, tokenizer, {}), tokenizer.chat_template)
