"""Lantern: local LLM inference and serving (paged KV cache, continuous batching, MLX and torch).

The public API is importable from here; the engine loads on first use, so `import lantern` (and
the `lantern` command's start-up) stays light:

    from lantern import LLM, SamplingParams, AsyncEngine
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__all__ = [
    "LLM",
    "AsyncEngine",
    "CompletionOutput",
    "EngineConfig",
    "EngineDeadError",
    "InvalidRequestError",
    "LLMEngine",
    "RequestFailedError",
    "RequestOutput",
    "SamplingParams",
    "TokenLogprob",
]
__version__ = "0.1.0"

if TYPE_CHECKING:
    from lantern.app.engine import (
        LLM,
        AsyncEngine,
        CompletionOutput,
        EngineConfig,
        EngineDeadError,
        InvalidRequestError,
        LLMEngine,
        RequestFailedError,
        RequestOutput,
        SamplingParams,
        TokenLogprob,
    )


def __getattr__(name: str) -> Any:
    if name in __all__:
        from lantern.app import engine

        return getattr(engine, name)
    raise AttributeError(f"module 'lantern' has no attribute {name!r}")
