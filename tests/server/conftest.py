"""A real uvicorn on 127.0.0.1 serving a tiny model, shared by the server tests.

The module-scoped `server` fixture runs every test that uses it on both backends: torch (the
Linux default, what `lantern serve` ships with there) and MLX (skipped where it is missing).
"""

from __future__ import annotations

import importlib.util
import socket
import threading
import time

import pytest
import uvicorn

from lantern.app.engine import AsyncEngine
from lantern.server.app import ServerSettings, create_app

BACKENDS = [
    "torch",
    pytest.param("mlx", marks=pytest.mark.skipif(importlib.util.find_spec("mlx") is None, reason="no MLX")),
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LiveServer:
    def __init__(self, engine: AsyncEngine, settings: ServerSettings):
        self.engine = engine
        self.app = create_app(engine, settings)
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(self.app, host="127.0.0.1", port=self.port, log_level="warning")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.time() + 30
        while not self.server.started:
            if time.time() > deadline:
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.05)

    @property
    def backend(self) -> str:
        return self.engine.backend_name

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
        self.engine.shutdown()


def engine_options(model_dir: str, **engine_opts) -> dict:
    """What the tests' engines share: float32 (exact comparisons), small blocks, a fixed pool."""
    opts = {"model": model_dir, "backend": "mlx", "dtype": "float32", "block_size": 4, "num_kv_blocks": 1024}
    opts.update(engine_opts)
    return opts


def start_server(model_dir: str, settings: ServerSettings | None = None, **engine_opts) -> LiveServer:
    return LiveServer(
        AsyncEngine(**engine_options(model_dir, **engine_opts)), settings or ServerSettings(served_model_name="tiny")
    )


@pytest.fixture(scope="module", params=BACKENDS)
def backend(request) -> str:
    return request.param


@pytest.fixture(scope="module")
def server(tiny_model_dir, backend):
    srv = start_server(tiny_model_dir("llama2"), backend=backend)
    yield srv
    srv.stop()
