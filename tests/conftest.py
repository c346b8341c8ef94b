"""Shared fixtures: tiny random models per architecture, built once per test session."""

from __future__ import annotations

import pytest

from tests.fixtures.tiny_models import ARCH_VARIANTS, build_model


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    cache: dict[str, str] = {}

    def get(variant: str = "llama2") -> str:
        if variant not in cache:
            cache[variant] = str(build_model(variant, tmp_path_factory.mktemp(variant)))
        return cache[variant]

    return get


ALL_VARIANTS = list(ARCH_VARIANTS)
