"""Request lifecycle on both backends: every request ends, one failure fails only its request,
a dead engine says so at once, and n > 1 is a fan-out of seeds seed..seed+n-1."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from lantern.app.engine import (
    LLM,
    AsyncEngine,
    EngineDeadError,
    InvalidRequestError,
    RequestFailedError,
    SamplingParams,
)
from tests.fixtures.failures import wrap_steps

POISON = 7  # a prompt holding this token id makes the patched backend fail


def _opts(backend: str, **extra) -> dict:
    return dict(backend=backend, dtype="float32", block_size=4, num_kv_blocks=256, **extra)


def _poison(engine) -> None:
    """Make the backend raise on any batch that computes the POISON token (a bad request)."""

    def execute(batch, run):
        if POISON in batch.input_ids.tolist():
            raise RuntimeError("poisoned batch")
        return run()

    wrap_steps(engine.backend, execute)


async def _collect(engine: AsyncEngine, prompt, params, rid=None, **kw):
    outs = []
    async for out in engine.generate(prompt, params, rid, **kw):
        outs.append(out)
    return outs


def test_abort_ends_the_stream_with_an_abort_output(tiny_model_dir, backend):
    engine = AsyncEngine(model=tiny_model_dir("llama2"), **_opts(backend))
    try:

        async def run():
            params = SamplingParams(temperature=0, max_tokens=200, ignore_eos=True)
            outs = []
            async for out in engine.generate([1, 2, 3], params, "r1"):
                outs.append(out)
                if len(outs) == 3:
                    engine.abort("r1")
            return outs

        outs = asyncio.run(asyncio.wait_for(run(), 30))
        assert outs[-1].finished and outs[-1].outputs[0].finish_reason == "abort"
        assert len(outs[-1].outputs[0].token_ids) < 200
        assert engine.stats()["num_free_blocks"] == 256
    finally:
        engine.shutdown()


def test_duplicate_request_id_is_refused_and_the_first_runs_on(tiny_model_dir, backend):
    engine = AsyncEngine(model=tiny_model_dir("llama2"), **_opts(backend))
    try:

        async def run():
            params = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
            first = asyncio.create_task(_collect(engine, [1, 2, 3], params, "same"))
            await asyncio.sleep(0)  # the first is registered
            with pytest.raises(InvalidRequestError) as err:
                await _collect(engine, [4, 5, 6], params, "same")
            assert err.value.param == "request_id"
            return await first

        outs = asyncio.run(asyncio.wait_for(run(), 30))
        assert outs[-1].outputs[0].finish_reason == "length" and len(outs[-1].outputs[0].token_ids) == 20
    finally:
        engine.shutdown()


def test_a_failing_request_fails_alone(tiny_model_dir, backend):
    engine = AsyncEngine(model=tiny_model_dir("llama2"), **_opts(backend))
    _poison(engine._engine)
    try:

        async def run():
            params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
            good = [asyncio.create_task(_collect(engine, [1, 2, 3 + i], params)) for i in range(4)]
            bad = asyncio.create_task(_collect(engine, [1, POISON, 3], params))
            with pytest.raises(RequestFailedError, match="poisoned batch"):
                await bad
            return await asyncio.gather(*good)

        results = asyncio.run(asyncio.wait_for(run(), 60))
        assert all(r[-1].outputs[0].finish_reason == "length" for r in results)
        assert all(len(r[-1].outputs[0].token_ids) == 24 for r in results)
        assert engine.dead_reason is None and engine.stats()["requests_failed"] == 1
        assert engine.stats()["num_free_blocks"] == 256
    finally:
        engine.shutdown()


def test_a_dead_engine_loop_fails_pending_and_new_requests(tiny_model_dir, backend):
    engine = AsyncEngine(model=tiny_model_dir("llama2"), **_opts(backend))
    real_step = engine._engine.step
    calls = []

    def dying_step():
        calls.append(1)
        if len(calls) == 3:
            raise MemoryError("scheduler state lost")
        return real_step()

    engine._engine.step = dying_step
    try:

        async def run():
            params = SamplingParams(temperature=0, max_tokens=50, ignore_eos=True)
            with pytest.raises(EngineDeadError, match="scheduler state lost"):
                await _collect(engine, [1, 2, 3], params)
            with pytest.raises(EngineDeadError):
                await _collect(engine, [1, 2, 3], params)

        asyncio.run(asyncio.wait_for(run(), 30))
        assert "MemoryError: scheduler state lost" in engine.dead_reason
    finally:
        engine.shutdown()


def test_generate_works_after_an_interrupted_call(tiny_model_dir, backend):
    llm = LLM(tiny_model_dir("llama2"), **_opts(backend))
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    real_step, calls = llm.engine.step, []

    def interrupted():
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real_step()

    llm.engine.step = interrupted
    with pytest.raises(KeyboardInterrupt):
        llm.generate(["Paged attention", "Continuous batching"], params)
    assert not llm.engine.has_unfinished_requests()
    assert llm.engine.block_manager.num_free_blocks == 256
    out = llm.generate(["Paged attention"], params)
    assert len(out) == 1 and len(out[0].outputs[0].token_ids) == 16


def test_n_samples_equal_single_requests_with_consecutive_seeds(tiny_model_dir, backend):
    llm = LLM(tiny_model_dir("llama2"), **_opts(backend, max_num_seqs=2))
    prompt = "Continuous batching lets new requests join while others decode"
    fanned = llm.generate([prompt], SamplingParams(n=5, seed=11, temperature=1.0, max_tokens=12, ignore_eos=True))
    singles = [
        llm.generate([prompt], SamplingParams(seed=11 + i, temperature=1.0, max_tokens=12, ignore_eos=True))[0]
        for i in range(5)
    ]
    got = [o.token_ids for o in fanned[0].outputs]
    assert got == [s.outputs[0].token_ids for s in singles]
    assert len({tuple(t) for t in got}) > 1  # the seeds really differ


def test_children_count_toward_max_num_seqs(tiny_model_dir, backend):
    llm = LLM(tiny_model_dir("llama2"), **_opts(backend, max_num_seqs=2))
    engine, seen = llm.engine, []
    real_step = engine.step

    def watching_step():
        seen.append(len(engine.scheduler.running))
        return real_step()

    engine.step = watching_step
    out = llm.generate(["Paged attention stores keys"], SamplingParams(n=6, temperature=1.0, max_tokens=8, seed=3))
    assert len(out[0].outputs) == 6 and all(len(o.token_ids) > 0 for o in out[0].outputs)
    assert max(seen) <= 2
    assert engine.block_manager.prefix_hits > 0  # the children read the prompt from the cache


def test_max_model_len_past_the_model_is_refused(tiny_model_dir, backend):
    with pytest.raises(ValueError, match="max_model_len 100000 is beyond the 256 positions"):
        LLM(tiny_model_dir("llama2"), **_opts(backend, max_model_len=100_000))


def test_min_tokens_with_a_stop_string_streams_exactly_the_final_text(tiny_model_dir, backend):
    """A stop string straddling the min_tokens boundary starts in text already streamed: it may
    not end the reply there (that would take back streamed text), so the stream and the final
    text agree."""
    engine = AsyncEngine(model=tiny_model_dir("llama2"), **_opts(backend))
    try:
        prompt = "Lantern serves language models"
        base = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
        outs = asyncio.run(_collect(engine, prompt, base))
        pieces = [o.outputs[0].text_delta for o in outs]
        m = next(i for i in range(5, len(pieces) - 1) if len(pieces[i - 1]) >= 2 and len(pieces[i]) >= 2)
        stop = pieces[m - 1][-2:] + pieces[m][:2]
        params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True, min_tokens=m + 1, stop=[stop])
        streamed = asyncio.run(_collect(engine, prompt, params))
        final = streamed[-1].outputs[0]
        assert "".join(o.outputs[0].text_delta for o in streamed) == final.text
        assert final.text.startswith("".join(pieces[: m + 1]))
    finally:
        engine.shutdown()


def test_shutdown_ends_every_stream_and_refuses_new_ones(tiny_model_dir, backend):
    engine = AsyncEngine(model=tiny_model_dir("llama2"), **_opts(backend))
    real_step = engine._engine.step
    started = threading.Event()

    def slow_step():
        started.set()
        time.sleep(0.05)
        return real_step()

    engine._engine.step = slow_step

    async def run():
        params = SamplingParams(temperature=0, max_tokens=200, ignore_eos=True)
        task = asyncio.create_task(_collect(engine, [1, 2, 3], params))
        await asyncio.to_thread(started.wait, 10)
        await asyncio.to_thread(engine.shutdown)
        with pytest.raises(EngineDeadError, match="shut down"):
            await task
        with pytest.raises(EngineDeadError):
            await _collect(engine, [1, 2, 3], params)

    asyncio.run(asyncio.wait_for(run(), 30))
    assert engine.dead_reason is not None


def test_a_reused_request_id_never_receives_the_old_requests_outputs(tiny_model_dir, backend):
    engine = AsyncEngine(model=tiny_model_dir("llama2"), **_opts(backend))
    try:

        async def run():
            params = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)
            stream = engine.generate([5, 6, 7], params, "same")
            await stream.__anext__()
            await stream.aclose()  # the caller leaves; its abort is still queued
            outs = []
            for _ in range(200):  # the id is refused until the engine has dropped the old request
                try:
                    outs = await _collect(engine, [9, 10, 11], params, "same")
                    break
                except InvalidRequestError:
                    await asyncio.sleep(0.01)
            return outs

        outs = asyncio.run(asyncio.wait_for(run(), 30))
        assert outs[-1].prompt_token_ids == [9, 10, 11]
        assert outs[-1].outputs[0].finish_reason == "length" and len(outs[-1].outputs[0].token_ids) == 30
        assert engine.stats()["num_free_blocks"] == 256
    finally:
        engine.shutdown()


def test_a_backend_failing_every_request_is_reported_dead(tiny_model_dir, backend):
    engine = AsyncEngine(model=tiny_model_dir("llama2"), **_opts(backend))

    def broken(batch, run):
        # Slow enough that the requests sent together queue behind a failing step and meet in the
        # next one: only steps of several requests count towards a dead backend, and without the
        # pause a loaded machine could step each request alone (seen once in CI).
        time.sleep(0.05)
        raise RuntimeError("device lost")

    wrap_steps(engine._engine.backend, broken)
    try:

        async def run():
            params = SamplingParams(temperature=0, max_tokens=8)
            results = await asyncio.gather(
                *[_collect(engine, [1, 2, 3 + i], params) for i in range(4)], return_exceptions=True
            )
            assert all(isinstance(r, RequestFailedError | EngineDeadError) for r in results)
            for _ in range(6):  # steps of several requests, each failing alone
                await asyncio.gather(*[_collect(engine, [4, 5, i], params) for i in range(3)], return_exceptions=True)
                if engine.dead_reason:
                    break

        asyncio.run(asyncio.wait_for(run(), 30))
        assert "device lost" in (engine.dead_reason or "")
    finally:
        engine.shutdown()
