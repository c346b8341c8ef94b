"""AsyncEngine loads the model on its engine thread, so every tensor op runs on one thread."""

from __future__ import annotations

import threading

import pytest

pytest.importorskip("torch")

from lantern.app.engine import (
    AsyncEngine,
    SamplingParams,
    async_engine,
)


def test_model_is_loaded_and_run_on_the_engine_thread(tiny_model_dir, monkeypatch):
    seen = []
    real_init = async_engine.LLMEngine.__init__

    def recording_init(self, *args, **kwargs):
        seen.append(threading.current_thread().name)
        real_init(self, *args, **kwargs)

    monkeypatch.setattr(async_engine.LLMEngine, "__init__", recording_init)
    eng = AsyncEngine(model=tiny_model_dir("llama2"), backend="torch", dtype="float32", num_kv_blocks=64)
    try:
        assert seen == ["lantern-engine"]
        steps = []
        real_step = eng._engine.step
        eng._engine.step = lambda: steps.append(threading.current_thread().name) or real_step()

        async def run():
            async for out in eng.generate([1, 2, 3], SamplingParams(max_tokens=3, ignore_eos=True)):
                last = out
            return last

        import asyncio

        assert len(asyncio.run(run()).outputs[0].token_ids) == 3
        assert steps and set(steps) == {"lantern-engine"}
    finally:
        eng.shutdown()
    assert not eng._thread.is_alive()


def test_load_errors_reach_the_constructor(tmp_path):
    with pytest.raises(Exception, match="not a model folder"):
        AsyncEngine(model=str(tmp_path / "missing"), backend="torch")
