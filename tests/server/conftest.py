"""A real uvicorn on 127.0.0.1 serving a tiny model, shared by the server tests."""
from __future__ import annotations

import socket
import threading
import time

import pytest
import uvicorn

from app.engine import AsyncEngine
from server.app import ServerSettings, create_app


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

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
        self.engine.shutdown()


def start_server(model_dir: str, settings: ServerSettings | None = None, **engine_opts) -> LiveServer:
    opts = dict(model=model_dir, backend="mlx", dtype="float32", block_size=4, num_kv_blocks=1024)
    opts.update(engine_opts)
    return LiveServer(AsyncEngine(**opts), settings or ServerSettings(served_model_name="tiny"))


@pytest.fixture(scope="module")
def server(tiny_model_dir):
    srv = start_server(tiny_model_dir("llama2"))
    yield srv
    srv.stop()
