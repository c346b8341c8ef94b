"""Shared pieces of the terminal-chat tests: the backends they run on, the recording client, and a
deadline-bounded wait under Textual's pilot."""

from __future__ import annotations

import asyncio
import importlib.util
import time

import pytest

from lantern.tui.client import ChatSettings, EngineClient


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ImportError:  # the parent package is missing
        return False


# torch first: it is what `lantern chat` picks on Linux. Each test runs on both where installed.
BACKENDS = [
    pytest.param("torch", marks=pytest.mark.skipif(not _installed("torch"), reason="torch not installed")),
    pytest.param("mlx", marks=pytest.mark.skipif(not _installed("mlx.core"), reason="mlx not installed")),
]


# AsyncEngine's public surface (the contract front ends are held to; no reach into `.engine`).
PUBLIC_ENGINE_API = frozenset(
    {
        "model_name",
        "max_model_len",
        "vocab_size",
        "tokenizer",
        "chat_template",
        "encode",
        "encode_chat",
        "validate",
        "generate",
        "abort",
        "dead_reason",
        "stats",
        "shutdown",
    }
)


class PublicSurface:
    """Hands the client the real engine but only its public API: anything else the TUI touched
    fails the test at once instead of working by accident."""

    def __init__(self, engine):
        self._engine = engine

    def __getattr__(self, name: str):
        if name not in PUBLIC_ENGINE_API:
            raise AttributeError(f"the TUI used AsyncEngine.{name}, which is not public API")
        return getattr(self._engine, name)


class RecordingClient(EngineClient):
    """The real engine client (held to the engine's public API), remembering what each request
    asked for."""

    def __init__(self, engine, *a, **kw):
        super().__init__(PublicSurface(engine), *a, **kw)
        self.sent: list[tuple[list[dict], ChatSettings]] = []

    def stream_chat(self, messages, settings):
        self.sent.append((messages, settings))
        return super().stream_chat(messages, settings)

    async def close(self) -> None:  # the engine is shared by the tests of a module
        pass


async def wait_for(predicate, pilot, timeout: float = 30.0) -> None:
    """Let the app run until `predicate()` holds; fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached")
        await pilot.pause(0.05)


async def wait_idle(engine, timeout: float = 10.0) -> None:
    """Until the engine runs no request (an aborted one is dropped on the engine's next pass)."""
    deadline = time.monotonic() + timeout
    while engine.stats()["num_running"] != 0:
        if time.monotonic() > deadline:
            raise AssertionError(f"engine still running requests: {engine.stats()}")
        await asyncio.sleep(0.05)
