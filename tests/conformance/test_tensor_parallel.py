"""Tensor parallelism with 2 gloo ranks on CPU gives the same greedy tokens as 1 rank."""

from __future__ import annotations

import pytest

from lantern.app.engine import LLM, SamplingParams

pytest.importorskip("torch")


@pytest.mark.parametrize("variant", ["llama2", "qwen2", "qwen3", "exaone4", "arcee"])
def test_two_ranks_match_one(tiny_model_dir, variant):
    path = tiny_model_dir(variant)
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    prompts = ["Continuous batching lets new requests join", "def add(a, b):", "Paged attention"]
    opts = dict(backend="torch", dtype="float32", block_size=4, num_kv_blocks=64, prefill_chunk_size=8)
    single = [o.outputs[0].token_ids for o in LLM(path, **opts).generate(prompts, params)]
    tp = LLM(path, tensor_parallel_size=2, **opts)
    try:
        assert len(tp.engine.backend.workers) == 1
        # Each rank holds half the heads, so its KV blocks are half the size.
        assert tp.engine.backend.local_cfg.num_kv_heads == 1
        sharded = [o.outputs[0].token_ids for o in tp.generate(prompts, params)]
    finally:
        tp.engine.shutdown()
    assert sharded == single
    assert not tp.engine.backend.workers


def test_a_dead_rank_is_reported_not_waited_on(tiny_model_dir):
    import asyncio
    import time

    from lantern.app.engine import AsyncEngine, EngineDeadError

    opts = dict(backend="torch", dtype="float32", block_size=4, num_kv_blocks=64)
    engine = AsyncEngine(model=tiny_model_dir("llama2"), tensor_parallel_size=2, **opts)
    try:
        worker = engine._engine.backend.workers[0]
        worker.kill()
        worker.join(timeout=10)

        async def run():
            async for _ in engine.generate([1, 2, 3], SamplingParams(max_tokens=4)):
                pass

        start = time.monotonic()
        with pytest.raises(EngineDeadError, match="rank 1 died"):
            asyncio.run(asyncio.wait_for(run(), 60))
        assert time.monotonic() - start < 30
        assert "rank 1 died" in engine.dead_reason
    finally:
        engine.shutdown()


def test_ranks_outlive_an_idle_spell_longer_than_the_collective_timeout(tiny_model_dir, monkeypatch):
    """Workers wait for the next command without a deadline: only forward collectives time out."""
    import time

    monkeypatch.setenv("LANTERN_TP_TIMEOUT_S", "2")
    opts = dict(backend="torch", dtype="float32", block_size=4, num_kv_blocks=64, num_threads=1)
    tp = LLM(tiny_model_dir("llama2"), tensor_parallel_size=2, **opts)
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    try:
        first = tp.generate(["Paged attention"], params)[0].outputs[0].token_ids
        time.sleep(4)
        assert tp.generate(["Paged attention"], params)[0].outputs[0].token_ids == first
        assert all(w.is_alive() for w in tp.engine.backend.workers)
    finally:
        tp.engine.shutdown()


@pytest.mark.parametrize(
    ("variant", "what"),
    [
        ("mixtral", "mixture-of-experts"),
        ("qwen2_moe", "mixture-of-experts"),
        ("qwen3_moe", "mixture-of-experts"),
        ("deepseek_v2", "multi-head latent attention and mixture-of-experts"),
        ("deepseek_v3", "multi-head latent attention and mixture-of-experts"),
        ("gpt_oss", "mixture-of-experts"),
        ("olmo2", r"whole-projection q/k norm \(OLMo\)"),
    ],
)
def test_moe_and_mla_models_are_refused_before_any_rank_starts(tiny_model_dir, monkeypatch, variant, what):
    """Only heads and dense MLP rows are sharded: the refusal names what cannot be split and the
    flag, and comes from local_config before a worker process is spawned."""
    from lantern.backends.torch.runner import TorchBackend

    spawned: list = []
    monkeypatch.setattr(TorchBackend, "_start_workers", lambda self, spec: spawned.append(spec))
    message = f"tensor parallelism is not implemented for {what} models .* --tensor-parallel-size 1$"
    with pytest.raises(ValueError, match=message):
        LLM(tiny_model_dir(variant), backend="torch", dtype="float32", tensor_parallel_size=2, num_kv_blocks=8)
    assert spawned == []


def test_the_cli_refuses_tensor_parallel_moe_in_one_line(tiny_model_dir, caplog, capsys):
    import logging

    from lantern.app.cli import main

    argv = ["generate", "hi", "--w", tiny_model_dir("qwen3_moe"), "--backend", "torch", "--tensor-parallel-size", "2"]
    with caplog.at_level(logging.ERROR, logger="lantern"):
        assert main(argv) == 1
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "\n" not in errors[0].getMessage()
    assert errors[0].getMessage().startswith("tensor parallelism is not implemented for mixture-of-experts models")
    assert capsys.readouterr().out == ""
